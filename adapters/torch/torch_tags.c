/* torch_tags.c - tags for PyTorch: one fabpool pool per tag, and sleep /
 * wake of a tag's pool (fabpool_sleep / fabpool_wake) for the Python module.
 *
 * The tag "default" is the installed allocator's pool (fabpool_torch_pool).
 * Other tags back torch.cuda.MemPool objects: a pluggable allocator is a pair
 * of C symbols, so there are FP_TORCH_TAG_SLOTS fixed pairs,
 * fabpool_torch_tag<k>_alloc / _free, each bound to one tag and one device by
 * fabpool_torch_tag_slot().  Public headers only: fabpool.h and
 * fabpool_torch.h; no driver call.
 *
 * Allocations and frees are stream-ordered (fabpool_alloc_on_stream /
 * fabpool_free_on_stream): PyTorch frees a MemPool's segment when it gives
 * cached memory back (empty_cache, an OOM retry), and the GPU work queued on
 * its stream may still use it; the pool reuses such a block at once on the
 * same stream and elsewhere only after that work, and never unmaps it before
 * (fabpool_sleep waits for it too). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabpool.h"
#include "fabpool_torch.h"
#include "torch_tags.h"

#define FP_TORCH_TAG_SLOTS 8
#define FP_TORCH_TAG_NAME 64

#if defined(__GNUC__)
#define FP_EXPORT __attribute__((visibility("default")))
#else
#define FP_EXPORT
#endif

typedef struct tag_slot {
    char name[FP_TORCH_TAG_NAME];
    int device;
    fabpool_t *pool;
} tag_slot;

static pthread_mutex_t tags_lock = PTHREAD_MUTEX_INITIALIZER;
static tag_slot slots[FP_TORCH_TAG_SLOTS];
static _Thread_local char tag_msg[1024];

FP_EXPORT const char *fabpool_torch_tag_last_error(void) { return tag_msg; }

/* The slot of (tag, device), or -1.  tags_lock held. */
static int find_slot(const char *tag, int device)
{
    for (int k = 0; k < FP_TORCH_TAG_SLOTS; k++)
        if (slots[k].pool && slots[k].device == device && strcmp(slots[k].name, tag) == 0)
            return k;
    return -1;
}

/* The slot for a MemPool of `tag` on `device`, its pool made on first use:
 * returns k (use fabpool_torch_tag<k>_alloc / _free), or -1 with the message
 * in fabpool_torch_tag_last_error(). */
FP_EXPORT int fabpool_torch_tag_slot(const char *tag, int device)
{
    if (!tag || !tag[0] || strlen(tag) >= FP_TORCH_TAG_NAME || strcmp(tag, "default") == 0) {
        snprintf(tag_msg, sizeof tag_msg, "fabpool_torch: tag '%.80s' cannot name a MemPool: give a name of 1 to 63 "
                 "bytes other than 'default' (the installed allocator's pool)", tag ? tag : "(null)");
        return -1;
    }
    pthread_mutex_lock(&tags_lock);
    int k = find_slot(tag, device);
    if (k < 0) {
        for (k = 0; k < FP_TORCH_TAG_SLOTS && slots[k].pool; k++)
            ;
        if (k == FP_TORCH_TAG_SLOTS) {
            pthread_mutex_unlock(&tags_lock);
            snprintf(tag_msg, sizeof tag_msg, "fabpool_torch: no slot left for tag '%s': %d tags (and devices) are "
                     "in use already", tag, FP_TORCH_TAG_SLOTS);
            return -1;
        }
        fabpool_options o;
        fabpool_options_init(&o);
        o.device = device;
        /* A tag's memory is never exported (tensors shared with other processes come from the installed
         * allocator's pool, which refuses MemPools of tags): handle type none makes its pool without the
         * fabric probe (a chunk created, exported and imported) that auto runs at every pool's creation, and
         * its chunks without shareable handles.  FABPOOL_CONF still wins. */
        o.handle_type = FABPOOL_HANDLE_NONE;
        /* Its blocks are PyTorch's segments (2 MiB multiples, mostly 2 MiB to 2 GiB) kept for the process's
         * life: each is mapped as one chunk, as torch_memory_saver maps one per segment, and the first fill of
         * a region (3 GiB of weights, a 2 GiB KV cache) maps about 60 chunks instead of about 460, each a
         * create, a map and a set access (docs/rl-serving.md).  FABPOOL_CONF still wins. */
        o.large_chunks = FABPOOL_LARGE_CHUNKS_WHOLE;
        fabpool_t *p = NULL;
        fabpool_status st = fabpool_create(&o, &p);
        if (st != FABPOOL_OK) {
            pthread_mutex_unlock(&tags_lock);
            snprintf(tag_msg, sizeof tag_msg, "fabpool_torch: the pool of tag '%s' on device %d: %s", tag, device,
                     fabpool_last_error());
            return -1;
        }
        memset(&slots[k], 0, sizeof slots[k]);
        snprintf(slots[k].name, sizeof slots[k].name, "%s", tag);
        slots[k].device = device;
        slots[k].pool = p;
    }
    pthread_mutex_unlock(&tags_lock);
    return k;
}

/* The pool of a tag on a device: "default" is the installed allocator's. */
static fabpool_t *tag_pool(const char *tag, int device, int *slot)
{
    *slot = -1;
    if (!tag || strcmp(tag, "default") == 0)
        return fabpool_torch_pool(device);
    pthread_mutex_lock(&tags_lock);
    int k = find_slot(tag, device);
    fabpool_t *p = k >= 0 ? slots[k].pool : NULL;
    pthread_mutex_unlock(&tags_lock);
    *slot = k;
    return p;
}

static void *tag_alloc(int k, size_t size, int device, void *stream)
{
    tag_slot *s = &slots[k];
    if (!s->pool || s->device != device) {
        snprintf(tag_msg, sizeof tag_msg, "fabpool_torch: tag slot %d is not bound to device %d: "
                 "fabpool_torch_tag_slot binds it (first, and again after fabpool_torch_shutdown)", k, device);
        return NULL;
    }
    void *p = NULL;
    if (fabpool_alloc_on_stream(s->pool, size, stream, &p) != FABPOOL_OK) {
        snprintf(tag_msg, sizeof tag_msg, "fabpool_torch: tag '%s': %s", s->name, fabpool_last_error());
        return NULL;
    }
    return p;
}

/* A tag's free: stream-ordered (see the file's comment). */
static void tag_free(int k, void *ptr, size_t size, int device, void *stream)
{
    (void)size;
    (void)device;
    tag_slot *s = &slots[k];
    if (!ptr || !s->pool)
        return;
    if (fabpool_free_on_stream(s->pool, ptr, stream) != FABPOOL_OK)
        snprintf(tag_msg, sizeof tag_msg, "fabpool_torch: tag '%s': %s", s->name, fabpool_last_error());
}

#define FP_TAG_PAIR(k)                                                                                       \
    FP_EXPORT void *fabpool_torch_tag##k##_alloc(size_t size, int device, void *stream)                     \
    {                                                                                                        \
        return tag_alloc(k, size, device, stream);                                                           \
    }                                                                                                        \
    FP_EXPORT void fabpool_torch_tag##k##_free(void *ptr, size_t size, int device, void *stream)            \
    {                                                                                                        \
        tag_free(k, ptr, size, device, stream);                                                              \
    }
FP_TAG_PAIR(0)
FP_TAG_PAIR(1)
FP_TAG_PAIR(2)
FP_TAG_PAIR(3)
FP_TAG_PAIR(4)
FP_TAG_PAIR(5)
FP_TAG_PAIR(6)
FP_TAG_PAIR(7)

static int no_pool(const char *fn, const char *tag, int device)
{
    snprintf(tag_msg, sizeof tag_msg, "%s: no pool for tag '%s' on device %d (\"default\" is the installed "
             "allocator's, made at its first allocation; other tags come from fabpool_torch.mempool(tag=...))", fn,
             tag ? tag : "default", device);
    return FABPOOL_ERR_NOT_FOUND;
}

static void pool_error(const char *tag)
{
    snprintf(tag_msg, sizeof tag_msg, "tag '%s': %s", tag ? tag : "default", fabpool_last_error());
}

/* fabpool_sleep of the tag's pool: offload != 0 copies its memory to pinned
 * host memory, else discards it.  stream: a CUstream or NULL (the context). */
FP_EXPORT int fabpool_torch_tag_sleep(const char *tag, int device, int offload, void *stream)
{
    int k;
    fabpool_t *p = tag_pool(tag, device, &k);
    if (!p)
        return no_pool("fabpool_torch_tag_sleep", tag, device);
    fabpool_sleep_info si = {.struct_size = sizeof si};
    if (fabpool_sleep_state(p, &si) == FABPOOL_OK && si.asleep) {
        snprintf(tag_msg, sizeof tag_msg, "tag '%s' on device %d is asleep already; wake it first",
                 tag ? tag : "default", device);
        return FABPOOL_ERR_ASLEEP;
    }
    fabpool_status st = fabpool_sleep(p, offload ? FABPOOL_SLEEP_OFFLOAD : FABPOOL_SLEEP_DISCARD, stream);
    if (st != FABPOOL_OK)
        pool_error(tag);
    return st;
}

FP_EXPORT int fabpool_torch_tag_wake(const char *tag, int device, void *stream)
{
    int k;
    fabpool_t *p = tag_pool(tag, device, &k);
    if (!p)
        return no_pool("fabpool_torch_tag_wake", tag, device);
    fabpool_status st = fabpool_wake(p, stream);
    if (st != FABPOOL_OK)
        pool_error(tag);
    return st;
}

FP_EXPORT int fabpool_torch_tag_state(const char *tag, int device, fabpool_sleep_info *out)
{
    int k;
    fabpool_t *p = tag_pool(tag, device, &k);
    if (!p)
        return no_pool("fabpool_torch_tag_state", tag, device);
    fabpool_status st = fabpool_sleep_state(p, out);
    if (st != FABPOOL_OK)
        pool_error(tag);
    return st;
}

/* The pool's stats of a tag (mapped bytes and the rest), for the Python module. */
FP_EXPORT int fabpool_torch_tag_stats_json(const char *tag, int device, char *buf, size_t cap, size_t *needed)
{
    int k;
    fabpool_t *p = tag_pool(tag, device, &k);
    if (!p)
        return no_pool("fabpool_torch_tag_stats_json", tag, device);
    fabpool_status st = fabpool_stats_json(p, buf, cap, needed);
    if (st != FABPOOL_OK && st != FABPOOL_ERR_LIMIT)
        pool_error(tag);
    return st;
}

/* The tags with a pool on `device`, comma-separated ("default" first if the
 * installed allocator has one). */
FP_EXPORT int fabpool_torch_tag_list(int device, char *buf, size_t cap)
{
    if (!buf || !cap)
        return FABPOOL_ERR_INVALID_ARG;
    buf[0] = 0;
    size_t n = 0;
    if (fabpool_torch_pool(device))
        n += (size_t)snprintf(buf, cap, "default");
    pthread_mutex_lock(&tags_lock);
    for (int k = 0; k < FP_TORCH_TAG_SLOTS; k++)
        if (slots[k].pool && slots[k].device == device && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? "," : "", slots[k].name);
    pthread_mutex_unlock(&tags_lock);
    return n < cap ? FABPOOL_OK : FABPOOL_ERR_LIMIT;
}

void ft_tags_report(void)
{
    pthread_mutex_lock(&tags_lock);
    for (int k = 0; k < FP_TORCH_TAG_SLOTS; k++)
        ft_report(slots[k].pool);
    pthread_mutex_unlock(&tags_lock);
}

void ft_tags_fork_child(void) { pthread_mutex_init(&tags_lock, NULL); }

fabpool_status ft_tags_shutdown(char *msg, size_t cap)
{
    fabpool_status st = FABPOOL_OK;
    size_t n = 0;
    msg[0] = 0;
    pthread_mutex_lock(&tags_lock);
    for (int k = 0; k < FP_TORCH_TAG_SLOTS; k++) {
        tag_slot *s = &slots[k];
        if (!s->pool)
            continue;
        /* blocks freed on streams back to the pool first, so that only what
         * PyTorch still holds counts as live */
        fabpool_collect(s->pool, 1);
        fabpool_stats ps = {.struct_size = sizeof ps};
        uint64_t blocks = 0, bytes = 0;
        if (fabpool_get_stats(s->pool, &ps) == FABPOOL_OK) {
            blocks = ps.blocks - ps.stream_pending_blocks + ps.buffers;
            bytes = ps.in_use_bytes - ps.stream_pending_bytes;
        }
        if (blocks) {
            st = FABPOOL_ERR_BUSY;
            if (n < cap)
                n += (size_t)snprintf(msg + n, cap - n, "%stag '%s' on device %d still has %llu live block%s "
                                      "(%llu bytes), so its pool stays: free the tensors of its MemPools first",
                                      n ? "; " : "", s->name, s->device, (unsigned long long)blocks,
                                      blocks == 1 ? "" : "s", (unsigned long long)bytes);
            continue;
        }
        fabpool_destroy(s->pool);
        memset(s, 0, sizeof *s);
    }
    pthread_mutex_unlock(&tags_lock);
    return st;
}
