/* test_messages_name_call: a failure's message names the public call, the object and what to do.
 *  - the device out of memory (every cuMemCreate refused) for a block (fabpool_alloc, the stream pair,
 *    fabpool_alloc_aligned) and for a buffer (create, resize, a set's resize): the message names the call and
 *    the size asked, and its advice names what the pool holds: blocks to free where it holds blocks, buffers to
 *    shrink where it holds buffers, neither where it holds nothing; a map the driver refuses otherwise names
 *    the call too;
 *  - a growable buffer's memory given to the calls of blocks (fabpool_free, fabpool_usable_size,
 *    fabpool_free_on_stream, fabpool_record_stream, fabpool_block_export): NOT_FOUND saying it is a buffer's,
 *    to be given back with fabpool_buffer_destroy; an address no mapping of the pool's holds says the pool did
 *    not give it out;
 *  - a child forked after its parent made a pool: fabpool_create and fabpool_device_count answer
 *    FABPOOL_ERR_NOT_SUPPORTED, saying the process was forked and to start it with exec or spawn;
 *  - a descriptor refused (NULL, truncated, without its fds, another buffer's) by fabpool_view_open,
 *    fabpool_view_open_peer and fabpool_view_apply: the message names the call that refused it;
 *  - an export given a NULL descriptor or fd array with a capacity above 0: the message counts no room for it
 *    (the array is NULL), not the capacity given;
 *  - the stream pair on the per-thread default stream, which allocates and frees as fabpool_alloc and
 *    fabpool_free do: a refusal names the stream pair's call too. */
#include <sys/wait.h>

#include "testutil.h"

#define MB (1ull << 20)

static t_sim_hooks h;

/* st is want, and the message holds every one of the strings up to NULL and none of `nots` (NULL ends). */
static void says(const char *what, fabpool_status st, fabpool_status want, const char *const *has,
                 const char *const *nots)
{
    const char *m = fabpool_last_error();
    int ok = st == want;
    for (const char *const *s = has; *s; s++)
        ok &= strstr(m, *s) != NULL;
    for (const char *const *s = nots; s && *s; s++)
        ok &= strstr(m, *s) == NULL;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  %s -> %s (%s expected): '%s'\n", what, fabpool_status_name(st), fabpool_status_name(want),
                m);
}

#define SAYS(expr, want, nots, ...)                                                                           \
    do {                                                                                                      \
        fabpool_status s_ = (expr);                                                                           \
        says(#expr, s_, want, (const char *const[]){__VA_ARGS__, NULL}, nots);                                \
    } while (0)

static const char *const no_buffers[] = {"shrink or destroy buffers", NULL};
static const char *const no_blocks[] = {"ree blocks", NULL};
static const char *const neither[] = {"ree blocks", "shrink or destroy buffers", NULL};

/* Three pools live at once: each reserves a little, so that their address space fits where it is scarce (under
 * valgrind a default reservation of 8x the device's memory each is too much for three). */
#define SMALL "handle_type:none,reserve:4GiB"

/* A pool that holds a block only, one that holds a buffer only, one that holds nothing: every chunk refused. */
static void out_of_memory_names_call_and_size(void)
{
    fabpool_t *p = t_pool(SMALL), *q = t_pool(SMALL), *e = t_pool(SMALL);
    CUstream s = NULL;
    if (!p || !q || !e || cuStreamCreate(&s, 0) != CUDA_SUCCESS)
        return;
    void *a = NULL, *b = NULL;
    fabpool_buffer_t *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(fabpool_alloc(p, 1 * MB, &a));
    CHECK_OK(fabpool_buffer_create(q, 64 * MB, 2 * MB, &x));
    CHECK_OK(fabpool_buffer_create(q, 64 * MB, 2 * MB, &y));
    CHECK_OK(fabpool_trim(p, 0));
    CHECK_OK(fabpool_trim(q, 0));
    h.fault_set("cuMemCreate", 1, 1, CUDA_ERROR_OUT_OF_MEMORY);
    SAYS(fabpool_alloc(p, 40 * MB, &b), FABPOOL_ERR_OUT_OF_MEMORY, no_buffers, "fabpool_alloc of 41943040 bytes",
         "is out of memory", "Free blocks");
    SAYS(fabpool_alloc(p, 3000, &b), FABPOOL_ERR_OUT_OF_MEMORY, no_buffers, "fabpool_alloc of 3000 bytes");
    SAYS(fabpool_alloc_on_stream(p, 40 * MB, s, &b), FABPOOL_ERR_OUT_OF_MEMORY, no_buffers,
         "fabpool_alloc_on_stream of 41943040 bytes", "Free blocks");
    SAYS(fabpool_alloc_aligned(p, 40 * MB, 4096, &b), FABPOOL_ERR_OUT_OF_MEMORY, no_buffers,
         "fabpool_alloc_aligned: 41943040 bytes");
    SAYS(fabpool_buffer_create(p, 64 * MB, 40 * MB, &z), FABPOOL_ERR_OUT_OF_MEMORY, no_buffers,
         "fabpool_buffer_create: growing a buffer from 0 to 41943040 bytes; no buffer was made", "Free blocks");
    SAYS(fabpool_buffer_resize(x, 40 * MB, NULL), FABPOOL_ERR_OUT_OF_MEMORY, no_blocks,
         "fabpool_buffer_resize: growing a buffer from 2097152 to 41943040 bytes; it keeps its size and data",
         "Shrink or destroy buffers");
    fabpool_buffer_t *set[2] = {x, y};
    size_t sizes[2] = {1 * MB, 40 * MB};
    SAYS(fabpool_buffer_resize_set(set, sizes, 2, NULL), FABPOOL_ERR_OUT_OF_MEMORY, no_blocks,
         "fabpool_buffer_resize_set: growing a buffer from 2097152 to 41943040 bytes; every buffer keeps",
         "Shrink or destroy buffers");
    SAYS(fabpool_alloc(e, 40 * MB, &b), FABPOOL_ERR_OUT_OF_MEMORY, neither, "fabpool_alloc of 41943040 bytes",
         "This pool holds none of the device's memory");
    h.fault_clear();
    /* a map the driver refuses for another reason */
    h.fault_set("cuMemMap", 1, 1, CUDA_ERROR_UNKNOWN);
    SAYS(fabpool_alloc(p, 40 * MB, &b), FABPOOL_ERR_DRIVER, NULL, "fabpool_alloc of 41943040 bytes");
    h.fault_clear();
    CHECK_OK(fabpool_free(p, a));
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK_OK(fabpool_buffer_destroy(y, NULL));
    cuStreamDestroy(s);
    CHECK_OK(fabpool_destroy(p));
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(e));
}

static void buffer_memory_is_no_block(void)
{
    fabpool_t *p = t_pool("handle_type:posix_fd");
    if (!p)
        return;
    fabpool_buffer_t *x = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &x));
    if (!x)
        return;
    char *base = fabpool_buffer_ptr(x);
    size_t us = 0, len = 0, nfds = 0, off = 0;
    unsigned char desc[4096];
    int fds[16];
    SAYS(fabpool_free(p, base), FABPOOL_ERR_NOT_FOUND, NULL, "fabpool_free(", "the base of a growable buffer",
         "fabpool_buffer_destroy");
    SAYS(fabpool_usable_size(p, base, &us), FABPOOL_ERR_NOT_FOUND, NULL, "fabpool_usable_size(",
         "the base of a growable buffer", "fabpool_buffer_destroy");
    SAYS(fabpool_free_on_stream(p, base, NULL), FABPOOL_ERR_NOT_FOUND, NULL, "fabpool_free_on_stream(",
         "the base of a growable buffer", "fabpool_buffer_destroy");
    SAYS(fabpool_record_stream(p, base, NULL), FABPOOL_ERR_NOT_FOUND, NULL, "fabpool_record_stream(",
         "the base of a growable buffer");
    SAYS(fabpool_block_export(p, base, desc, sizeof desc, &len, fds, 16, &nfds, &off), FABPOOL_ERR_NOT_FOUND, NULL,
         "fabpool_block_export(", "the base of a growable buffer", "fabpool_buffer_export");
    char at[64];
    snprintf(at, sizeof at, "is 65536 bytes into a growable buffer's memory (the buffer at %p", (void *)base);
    SAYS(fabpool_free(p, base + 65536), FABPOOL_ERR_NOT_FOUND, NULL, at, "fabpool_buffer_destroy");
    int host = 0;
    SAYS(fabpool_free(p, &host), FABPOOL_ERR_NOT_FOUND, NULL, "did not give out that pointer");
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK_OK(fabpool_destroy(p));
}

/* n dup()s of fds into out: fabpool_view_open and _apply close the fds they are given, whatever the outcome. */
static const int *dups(const int *fds, size_t n, int *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = dup(fds[i]);
    return out;
}

static void descriptor_refusals_name_the_call(void)
{
    fabpool_t *p = t_pool("handle_type:posix_fd");
    if (!p)
        return;
    fabpool_buffer_t *x = NULL, *y = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 4 * MB, &x));
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 2 * MB, &y));
    if (!x || !y)
        return;
    unsigned char desc[4096], other[4096];
    int fds[16], ofds[16], d[16];
    size_t len = 0, nfds = 0, olen = 0, onfds = 0;
    CHECK_OK(fabpool_buffer_export(x, 0, desc, sizeof desc, &len, fds, 16, &nfds));
    CHECK_OK(fabpool_buffer_export(y, 0, other, sizeof other, &olen, ofds, 16, &onfds));
    fabpool_view_t *v = NULL;
    SAYS(fabpool_view_open(p, NULL, len, NULL, 0, &v), FABPOOL_ERR_INVALID_ARG, NULL, "descriptor is NULL",
         "fabpool_view_open");
    SAYS(fabpool_view_open(p, desc, len - 1, dups(fds, nfds, d), nfds, &v), FABPOOL_ERR_DESCRIPTOR, NULL,
         "descriptor refused", "truncated", "fabpool_view_open");
    static const char *const not_plain_open[] = {"fabpool_view_open)", "fabpool_view_open:", NULL};
    SAYS(fabpool_view_open_peer(p, (int)getpid(), desc, len - 1, dups(fds, nfds, d), nfds, &v),
         FABPOOL_ERR_DESCRIPTOR, not_plain_open, "descriptor refused", "fabpool_view_open_peer");
    CHECK(v == NULL);
    CHECK_OK(fabpool_view_open(p, desc, len, dups(fds, nfds, d), nfds, &v));
    if (v) {
        SAYS(fabpool_view_apply(v, desc, len, NULL, 0), FABPOOL_ERR_DESCRIPTOR, NULL, "descriptor refused",
             "fds came", "fabpool_view_apply");
        SAYS(fabpool_view_apply(v, other, olen, dups(ofds, onfds, d), onfds), FABPOOL_ERR_DESCRIPTOR, NULL,
             "another buffer", "fabpool_view_apply");
        SAYS(fabpool_view_apply(v, NULL, 0, NULL, 0), FABPOOL_ERR_INVALID_ARG, NULL, "fabpool_view_apply");
        CHECK_OK(fabpool_view_close(v));
    }
    CHECK_OK(fabpool_buffer_export_done(x));
    CHECK_OK(fabpool_buffer_export_done(y));
    /* a NULL array is room for nothing, whatever capacity comes with it */
    SAYS(fabpool_buffer_export(x, 0, NULL, sizeof desc, &len, fds, 16, &nfds), FABPOOL_ERR_LIMIT, NULL,
         "fabpool_buffer_export: the descriptor takes", "the caller gave room for 0 and 16");
    SAYS(fabpool_buffer_export(x, 0, desc, sizeof desc, &len, NULL, 16, &nfds), FABPOOL_ERR_LIMIT, NULL,
         "the caller gave room for 4096 and 0");
    void *blk = NULL;
    size_t off = 0;
    CHECK_OK(fabpool_alloc(p, 4 * MB, &blk));
    SAYS(fabpool_block_export(p, blk, NULL, sizeof desc, &len, fds, 16, &nfds, &off), FABPOOL_ERR_LIMIT, NULL,
         "fabpool_block_export", "the caller gave room for 0 and 16");
    CHECK_OK(fabpool_free(p, blk));
    CHECK_OK(fabpool_buffer_destroy(x, NULL));
    CHECK_OK(fabpool_buffer_destroy(y, NULL));
    CHECK_OK(fabpool_destroy(p));
}

static void per_thread_stream_refusals_name_the_call(void)
{
    /* 1 GiB of address space, so that a block of 2 GiB is refused for the reservation, not for the device's
     * memory (valgrind's CI step gives the simulated devices 6 GiB) */
    fabpool_t *p = t_pool("handle_type:none,reserve:1GiB");
    if (!p)
        return;
    void *pts = (void *)CU_STREAM_PER_THREAD, *a = NULL, *b = NULL;
    int host = 0;
    SAYS(fabpool_free_on_stream(p, &host, pts), FABPOOL_ERR_NOT_FOUND, NULL, "did not give out that pointer",
         "fabpool_free_on_stream on the per-thread default stream");
    CHECK_OK(fabpool_alloc_on_stream(p, 1000, pts, &a));
    CHECK_OK(fabpool_free_on_stream(p, a, pts));
    SAYS(fabpool_free_on_stream(p, a, pts), FABPOOL_ERR_DOUBLE_FREE, NULL, "already free",
         "fabpool_free_on_stream on the per-thread default stream");
    SAYS(fabpool_alloc_on_stream(p, 2ull << 30, pts, &b), FABPOOL_ERR_LIMIT, NULL, "raise reserve",
         "fabpool_alloc_on_stream of 2147483648 bytes on the per-thread default stream");
    CHECK(b == NULL);
    CHECK_OK(fabpool_destroy(p));
}

/* In a child forked after the parent made a pool: exits 0 where both calls say so. */
static int child_refuses(void)
{
    static const char *const nots[] = {"cuDeviceGetCount", NULL};
    int failed = t_failures; /* the parent's, copied by the fork */
    fabpool_t *c = NULL;
    int n = -1;
    SAYS(fabpool_create(NULL, &c), FABPOOL_ERR_NOT_SUPPORTED, nots, "fabpool_create: this process was forked",
         "CUDA does not carry over a fork", "exec or spawn");
    CHECK(c == NULL);
    SAYS(fabpool_device_count(&n), FABPOOL_ERR_NOT_SUPPORTED, nots, "fabpool_device_count: this process was forked");
    return t_failures != failed;
}

static void forked_child_told(void)
{
    fabpool_t *p = t_pool(NULL);
    if (!p)
        return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(child_refuses());
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fabpool_t *q = NULL; /* the parent's driver is as it was */
    CHECK_OK(fabpool_create(NULL, &q));
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    h = t_sim_required("test_messages_name_call", "faults");
    out_of_memory_names_call_and_size();
    buffer_memory_is_no_block();
    forked_child_told();
    descriptor_refusals_name_the_call();
    per_thread_stream_refusals_name_the_call();
    return t_done("test_messages_name_call");
}
