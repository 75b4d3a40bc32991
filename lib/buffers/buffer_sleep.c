/* buffer_sleep.c - a buffer's part in a pool's sleep and wake
 * (buffer_sleep.h). */
#include "buffer_sleep.h"

#include "error.h"

fabpool_status fp_buffers_sleep_refused(const fp_buffers *bs)
{
    fp_lock_assert_held(&bs->sp->lock);
    for (const struct fabpool_buffer *b = bs->list; b; b = b->next) {
        if (!b->n_peer_holds && (!b->shared || b->acked == UINT64_MAX))
            continue;
        /* a destroyed or released buffer's handle is refused: only its export id acknowledges it */
        int gone = b->destroyed || b->kept;
        return fp_error(FABPOOL_ERR_BUSY, "fabpool_sleep: the buffer at 0x%llx (export id 0x%llx%s) was exported "
                        "and its peers may still map it: their views would read memory that sleep takes away. "
                        "Close the views, call %s with UINT64_MAX, then sleep; nothing changed",
                        (unsigned long long)b->base, (unsigned long long)b->uid,
                        b->destroyed ? ", destroyed" : b->kept ? ", released and kept for reuse" : "",
                        gone ? "fabpool_peers_ack with that export id"
                             : "fabpool_buffer_peers_ack (or fabpool_peers_ack)");
    }
    return FABPOOL_OK;
}

static fp_bchunk *chunk_at(struct fabpool_buffer *b, uint64_t va)
{
    for (uint32_t i = 0; i < b->n; i++)
        if (b->base + b->chunks[i].off == va)
            return &b->chunks[i];
    return NULL;
}

void fp_buffer_chunk_slept(void *owner, uint64_t va)
{
    struct fabpool_buffer *b = owner;
    fp_bchunk *c = chunk_at(b, va);
    if (c)
        fp_bchunk_forget_export(b->owner, c);
}

void fp_buffer_chunk_renewed(void *owner, uint64_t va)
{
    struct fabpool_buffer *b = owner;
    fp_lock_assert_held(&b->owner->sp->lock);
    fp_bchunk *c = chunk_at(b, va);
    if (c) {
        c->gen = ++b->generation;
        c->named = 0;
    }
}
