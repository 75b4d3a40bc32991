/* export.c - a buffer out to other processes (export.h): descriptors,
 * the pool's copies of exported fds, and the peers' acknowledgements. */
#include "export.h"

#include <string.h>
#include <unistd.h>

#include "chunk.h"
#include "conf.h"
#include "desc.h"
#include "error.h"

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
    if (!b || !len || !nfds)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export: the buffer, len or nfds is NULL");
    fp_buffers *bs = b->owner;
    if (bs->sp->ch->handle_type != FABPOOL_HANDLE_POSIX_FD && bs->sp->ch->handle_type != FABPOOL_HANDLE_FABRIC)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "fabpool_buffer_export: the pool's handle type is %s: create it "
                        "with handle_type:posix_fd, fabric or auto to share its buffers",
                        fp_handle_type_name(bs->sp->ch->handle_type));
    fp_lock(&bs->sp->lock);
    fabpool_status st = FABPOOL_OK;
    if (b->destroyed) {
        st = fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export: the buffer is destroyed");
        goto out;
    }
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
        st = fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_export: the descriptor takes %zu bytes and %zu fds; the "
                      "caller gave room for %zu and %zu", *len, *nfds, cap, fd_cap);
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
    if (!b)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export_done: the buffer is NULL");
    fp_space *sp = b->owner->sp;
    fp_lock(&sp->lock);
    for (fp_bchunk *c = b->chunks; c < b->chunks + b->n; c++)
        fp_chunk_close_fd(sp->ch, &c->fd); /* the peers have theirs: the pool's copies go */
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
    uint64_t held = atomic_load(&bs->ghost_bytes);
    fp_chunk_tally t = fp_chunk_tally_begin();
    fabpool_status st = fp_collect_locked(bs, 0);
    t = fp_chunk_tally_end(t);
    FP_LOG_CH(FP_LOG_INFO, bs->sp->ch, "peer ack: buffer 0x%llx (export id 0x%llx%s) acknowledged at generation "
              "%llu%s; %llu bytes in %llu chunks unmapped, held for peers %llu -> %llu bytes",
              (unsigned long long)b->base, (unsigned long long)b->uid, b->destroyed ? ", destroyed" : "",
              (unsigned long long)generation, generation == UINT64_MAX ? " (no peer left)" : "",
              (unsigned long long)t.bytes, (unsigned long long)t.chunks,
              (unsigned long long)held, (unsigned long long)atomic_load(&bs->ghost_bytes));
    return st;
}

fabpool_status fabpool_buffer_peers_ack(fabpool_buffer_t *b, uint64_t generation)
{
    if (!b)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_peers_ack: the buffer is NULL");
    fp_buffers *bs = b->owner;
    fp_lock(&bs->sp->lock);
    fabpool_status st = b->destroyed ? fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_peers_ack: the buffer is "
                                                "destroyed; acknowledge by its export id (fabpool_peers_ack)")
                                     : ack_locked(bs, b, generation, "fabpool_buffer_peers_ack");
    fp_unlock(&bs->sp->lock);
    return st;
}

fabpool_status fp_buffers_peers_ack(fp_buffers *bs, uint64_t export_id, uint64_t generation)
{
    if (!bs)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_peers_ack: the pool is NULL");
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

