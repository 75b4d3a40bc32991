/* export.c - a buffer out to other processes (export.h): descriptors,
 * the pool's copies of exported fds, and the peers' acknowledgements. */
#include "export.h"

#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "chunk.h"
#include "conf_options.h"
#include "desc.h"
#include "error.h"
#include "handles.h"

/* ------------------------------------------------------------ export */

/* Exports chunk c once: retain its handle, export, release at once (chunk.c). */
static fabpool_status export_chunk(fp_buffers *bs, struct fabpool_buffer *b, fp_bchunk *c)
{
    int fabric = bs->sp->ch->handle_type == FABPOOL_HANDLE_FABRIC;
    if (fabric ? c->has_fabric : c->fd >= 0)
        return FABPOOL_OK;
    fabpool_status st = fp_chunk_export(bs->sp->ch, b->base + c->off, c->size, &c->fd, fabric ? &c->fabric : NULL);
    if (st == FABPOOL_OK && fabric)
        c->has_fabric = 1;
    return st;
}

fabpool_status fabpool_buffer_export(fabpool_buffer_t *b, uint64_t since, void *desc, size_t cap, size_t *len,
                                     int *fds, size_t fd_cap, size_t *nfds)
{
    if (!len || !nfds)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export: len or nfds is NULL");
    fabpool_status st = fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_export", "the buffer");
    if (st != FABPOOL_OK)
        return st;
    fp_buffers *bs = b->owner;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_export");
    if (bs->sp->ch->handle_type != FABPOOL_HANDLE_POSIX_FD && bs->sp->ch->handle_type != FABPOOL_HANDLE_FABRIC)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "fabpool_buffer_export: the pool's handle type is %s: create it "
                        "with handle_type:posix_fd, fabric or auto to share its buffers",
                        fp_handle_type_name(bs->sp->ch->handle_type));
    fp_lock(&bs->sp->lock);
    if (fp_chunks_asleep(bs->sp->ch)) {
        st = fp_chunk_asleep_error("fabpool_buffer_export");
        goto out;
    }
    if (since > b->generation) {
        st = fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export: since %llu is past the buffer's generation "
                      "%llu", (unsigned long long)since, (unsigned long long)b->generation);
        goto out;
    }
    size_t n = 0;
    for (uint32_t i = 0; i < b->n; i++)
        n += !b->chunks[i].retiring && b->chunks[i].gen > since;
    int posix = bs->sp->ch->handle_type == FABPOOL_HANDLE_POSIX_FD;
    *len = fabpool_desc_size(n);
    *nfds = posix ? n : 0;
    if (!desc || cap < *len || (posix && (!fds || fd_cap < n))) {
        /* a NULL array is room for nothing, whatever capacity came with it */
        st = fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_export: the descriptor takes %zu bytes and %zu fds; the "
                      "caller gave room for %zu and %zu", *len, *nfds, desc ? cap : 0, fds ? fd_cap : 0);
        goto out;
    }
    uint8_t *d = desc;
    memset(d, 0, *len);
    uint32_t k = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        fp_bchunk *c = &b->chunks[i];
        if (c->retiring || c->gen <= since)
            continue;
        if ((st = export_chunk(bs, b, c)) != FABPOOL_OK)
            goto out;
        fp_desc_rec r = {.off = c->off, .size = c->size, .gen = c->gen, .fd_index = k};
        if (posix)
            fds[k] = c->fd;
        else
            memcpy(r.fabric, &c->fabric, sizeof r.fabric);
        fp_desc_put_record(d, k, &r);
        c->named = b->generation;
        k++;
    }
    fp_desc h = {.n = (uint32_t)n, .handle_type = (uint32_t)bs->sp->ch->handle_type, .generation = b->generation,
                 .since = since, .window = b->window, .live = b->live, .uid = b->uid, .pid = (int)getpid(),
                 .device = bs->sp->ch->device, .gran = bs->sp->gran};
    fp_desc_put_header(d, &h);
    if (b->acked == UINT64_MAX) /* a new peer after "no peer is left": it may map what this names */
        b->acked = b->generation;
    b->shared = 1;
    b->exported_gen = b->generation;
out:
    fp_unlock(&bs->sp->lock);
    return st;
}

fabpool_status fabpool_buffer_export_done(fabpool_buffer_t *b)
{
    fabpool_status st = fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_export_done", "the buffer");
    if (st != FABPOOL_OK)
        return st;
    fp_space *sp = b->owner->sp;
    if (fp_device_forked(sp->ch))
        return fp_device_forked_error(sp->ch, "fabpool_buffer_export_done");
    fp_lock(&sp->lock);
    for (fp_bchunk *c = b->chunks; c < b->chunks + b->n; c++)
        fp_chunk_close_export(sp->ch, b->base + c->off, c->size, &c->fd); /* the peers have theirs */
    fp_unlock(&sp->lock);
    return FABPOOL_OK;
}

/* Records that every peer has applied `generation`, and unmaps what they no
 * longer need. */
static fabpool_status ack_locked(fp_buffers *bs, struct fabpool_buffer *b, uint64_t generation, const char *fn)
{
    fp_lock_assert_held(&bs->sp->lock);
    if (generation != UINT64_MAX && generation > b->generation)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: generation %llu was never issued (the buffer is at generation "
                        "%llu, its last descriptor has %llu): acknowledge the generation a peer applied, or "
                        "UINT64_MAX when no peer is left", fn, (unsigned long long)generation,
                        (unsigned long long)b->generation, (unsigned long long)b->exported_gen);
    if (generation > b->acked || generation == UINT64_MAX)
        b->acked = generation;
    uint64_t held = atomic_load(&bs->held_for_peers_bytes);
    fp_chunk_tally t = fp_chunk_tally_begin();
    /* the acknowledgement stands whatever the unmaps do: what the driver refuses to unmap now, the next
     * collect unmaps (answering the refusal would tell the caller the ack was not taken) */
    fp_msg_hold h;
    fp_error_hold(&h);
    if (fp_collect_locked(bs, 0) != FABPOOL_OK)
        FP_LOG_CH(FP_LOG_WARN, bs->sp->ch, "peer ack: an unmap is left for the next collect: %s",
                  fabpool_last_error());
    fp_error_unhold(&h, FABPOOL_OK);
    t = fp_chunk_tally_end(t);
    FP_LOG_CH(FP_LOG_INFO, bs->sp->ch, "peer ack: buffer 0x%llx (export id 0x%llx%s) acknowledged at generation "
              "%llu%s; %llu bytes in %llu chunks unmapped, held for peers %llu -> %llu bytes",
              (unsigned long long)b->base, (unsigned long long)b->uid, b->destroyed ? ", destroyed" : "",
              (unsigned long long)generation, generation == UINT64_MAX ? " (no peer left)" : "",
              (unsigned long long)t.bytes, (unsigned long long)t.chunks,
              (unsigned long long)held, (unsigned long long)atomic_load(&bs->held_for_peers_bytes));
    return FABPOOL_OK;
}

fabpool_status fabpool_buffer_peers_ack(fabpool_buffer_t *b, uint64_t generation)
{
    fabpool_status st = fp_handle_check(b, FP_HANDLE_BUFFER, "fabpool_buffer_peers_ack", "the buffer");
    if (st != FABPOOL_OK) {
        if (b)
            fp_error_append(" (a destroyed or released buffer is acknowledged by its export id: fabpool_peers_ack)");
        return st;
    }
    fp_buffers *bs = b->owner;
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_buffer_peers_ack");
    fp_lock(&bs->sp->lock);
    st = ack_locked(bs, b, generation, "fabpool_buffer_peers_ack");
    fp_unlock(&bs->sp->lock);
    return st;
}

fabpool_status fp_buffers_peers_ack(fp_buffers *bs, uint64_t export_id, uint64_t generation)
{
    if (!bs)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_peers_ack: the pool is NULL");
    if (fp_device_forked(bs->sp->ch))
        return fp_device_forked_error(bs->sp->ch, "fabpool_peers_ack");
    fp_lock(&bs->sp->lock);
    struct fabpool_buffer *b = bs->list;
    while (b && b->uid != export_id)
        b = b->next;
    fabpool_status st = b ? ack_locked(bs, b, generation, "fabpool_peers_ack")
                          : fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_peers_ack: no buffer of this pool has export id "
                                     "0x%llx (a destroyed buffer whose memory is all gone needs no more acks)",
                                     (unsigned long long)export_id);
    fp_unlock(&bs->sp->lock);
    return st;
}


/* ------------------------------------------------------------ blocks */

typedef struct run {
    uint64_t *va, *size;               /* the chunks under the block, in address order */
    uint8_t *fresh;                    /* exported by this call */
    size_t n, cap;
} run;

static void run_free(fp_meta *m, run *r)
{
    if (r->cap)
        fp_meta_free(m, r->va, r->cap * (2 * sizeof(uint64_t) + 1));
}

static int run_push(fp_meta *m, run *r, uint64_t va, uint64_t size)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        uint64_t *a = fp_meta_alloc(m, cap * (2 * sizeof(uint64_t) + 1));
        if (!a)
            return -1;
        if (r->n) {
            memcpy(a, r->va, r->n * sizeof *a);
            memcpy(a + cap, r->size, r->n * sizeof *a);
        }
        run_free(m, r);
        r->va = a;
        r->size = a + cap;
        r->fresh = (uint8_t *)(a + 2 * cap);
        r->cap = cap;
    }
    r->va[r->n] = va;
    r->size[r->n] = size;
    r->fresh[r->n] = 0;
    r->n++;
    return 0;
}

/* The chunks mapped under [addr, addr + usable), one after the other. */
static fabpool_status block_chunks(fp_space *sp, uint64_t addr, uint64_t usable, run *r)
{
    uint64_t at = addr, end = addr + usable;
    while (at < end) {
        uint64_t b = 0, n = 0;
        fabpool_status st = fp_chunk_range(sp->ch, at, &b, &n);
        if (st != FABPOOL_OK)
            return st;
        if (b > at || b + n <= at || (r->n && b != r->va[r->n - 1] + r->size[r->n - 1]))
            return fp_error(FABPOOL_ERR_CORRUPT, "fabpool_block_export: the driver maps 0x%llx + %llu bytes at "
                            "0x%llx, not a chunk that follows the ones before it under the block at 0x%llx",
                            (unsigned long long)b, (unsigned long long)n, (unsigned long long)at,
                            (unsigned long long)addr);
        if (run_push(sp->meta, r, b, n) != 0)
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_block_export: no host memory for the list of chunks");
        at = b + n;
    }
    return FABPOOL_OK;
}

/* The newest identity of the run's chunks (*newest).  A record's generation is its chunk's identity: memory
 * mapped anew at the same address (freed, trimmed and allocated again, or woken) has a new one, so a peer's kept
 * view never takes it for the memory it maps. */
static fabpool_status run_newest(const fp_chunks *ch, const run *r, const void *ptr, uint64_t *newest)
{
    for (size_t k = 0; k < r->n; k++) {
        uint64_t ident = fp_chunk_ident(ch, r->va[k]);
        if (!ident)
            return fp_error(FABPOOL_ERR_CORRUPT, "fabpool_block_export: the driver maps a chunk at 0x%llx under "
                            "the block at %p that the pool's registry does not hold", (unsigned long long)r->va[k],
                            ptr);
        *newest = ident > *newest ? ident : *newest;
    }
    return FABPOOL_OK;
}

fabpool_status fp_block_export(fp_alloc *a, const void *ptr, void *desc, size_t cap, size_t *len, int *fds,
                               size_t fd_cap, size_t *nfds, size_t *offset)
{
    static const char fn[] = "fabpool_block_export";
    if (!a || !ptr || !len || !nfds || !offset)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: the pool, the pointer, len, nfds or offset is NULL", fn);
    fp_space *sp = a->sp;
    fp_chunks *ch = sp->ch;
    if (fp_device_forked(ch))
        return fp_device_forked_error(ch, fn);
    int posix = ch->handle_type == FABPOOL_HANDLE_POSIX_FD;
    if (!posix && ch->handle_type != FABPOOL_HANDLE_FABRIC)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "%s: the pool's handle type is %s: its memory cannot be shared "
                        "with other processes; create the pool with handle_type:posix_fd, fabric or auto", fn,
                        fp_handle_type_name(ch->handle_type));
    uint64_t addr = (uint64_t)(uintptr_t)ptr, usable = 0;
    run r;
    memset(&r, 0, sizeof r);
    CUcontext saved = NULL;
    int pushed = 0;
    fp_lock(&sp->lock);
    fabpool_status st = fp_chunks_asleep(ch) ? fp_chunk_asleep_error(fn) : fp_alloc_live_block(a, addr, &usable, fn);
    if (st == FABPOOL_OK && (st = fp_ctx_push(ch, &saved)) == FABPOOL_OK)
        pushed = 1;
    if (st == FABPOOL_OK)
        st = block_chunks(sp, addr, usable, &r);
    if (st != FABPOOL_OK)
        goto out;
    *len = fabpool_desc_size(r.n);
    *nfds = posix ? r.n : 0;
    if (!desc || cap < *len || (posix && (!fds || fd_cap < r.n))) {
        st = fp_error(FABPOOL_ERR_LIMIT, "%s: the descriptor of the block at %p takes %zu bytes and %zu fds; the "
                      "caller gave room for %zu and %zu", fn, ptr, *len, *nfds, desc ? cap : 0, fds ? fd_cap : 0);
        goto out;
    }
    uint8_t *d = desc;
    memset(d, 0, *len);
    uint64_t base = r.va[0], newest = 0;
    if ((st = run_newest(ch, &r, ptr, &newest)) != FABPOOL_OK)
        goto out;
    for (size_t k = 0; k < r.n; k++) {
        int fd = -1, fresh = 0;
        fp_desc_rec rec = {.off = r.va[k] - base, .size = r.size[k], .gen = fp_chunk_ident(ch, r.va[k]),
                           .fd_index = (uint32_t)k};
        CUmemFabricHandle fh;
        st = fp_chunk_export_kept(ch, r.va[k], r.size[k], &fd, posix ? NULL : &fh, &fresh);
        if (st != FABPOOL_OK) {
            for (size_t i = 0; i < k; i++) /* nothing changes on failure: the exports made here go */
                if (r.fresh[i])
                    fp_chunk_export_drop(ch, r.va[i]);
            fp_error_append(" (exporting chunk %zu of %zu under the block at %p)", k + 1, r.n, ptr);
            goto out;
        }
        r.fresh[k] = (uint8_t)fresh;
        if (posix)
            fds[k] = fd;
        else
            memcpy(rec.fabric, &fh, sizeof rec.fabric);
        fp_desc_put_record(d, (uint32_t)k, &rec);
    }
    uint64_t window = r.va[r.n - 1] + r.size[r.n - 1] - base;
    /* the export id: the exporter's address of the run, unique among what the process maps; the generation:
     * the newest chunk's identity, so that a descriptor of new memory is never older than one of the old */
    fp_desc h = {.n = (uint32_t)r.n, .handle_type = (uint32_t)ch->handle_type, .generation = newest, .since = 0,
                 .window = window, .live = window, .uid = base, .pid = (int)getpid(), .device = ch->device,
                 .gran = sp->gran};
    fp_desc_put_header(d, &h);
    *offset = (size_t)(addr - base);
out:
    if (pushed)
        fp_ctx_pop(ch, saved);
    fp_unlock(&sp->lock);
    run_free(sp->meta, &r);
    return st;
}
