/* test_property: seeded random sequences of every public operation on two
 * pools of one process, checked from outside after every step.
 *
 * Each seed creates two pools (A and B) and runs `steps` random operations:
 * fabpool_alloc / alloc_aligned / free, fabpool_record_stream, buffer create /
 * resize / resize_set / destroy, export / export_done / peers_ack, view open /
 * apply / close of the other pool's buffers (a pool exports, the other
 * imports, both ways; POSIX fds are dup'ed within the process), a block
 * exported and viewed by the other pool, a dma-buf of a buffer's range, trim,
 * collect, thread_flush, reset_peak, the stream pair (on two streams, the
 * NULL stream and the per-thread default stream), the owner mode's end
 * (fabpool_stream_owner_end), sleep (offload or discard) and wake, and
 * streams held and released (fabsim_stream_hold / fabsim_stream_release).  A
 * few variants are bad input that must be refused with nothing changed:
 * resize_set naming a buffer twice, an ack of a generation never issued, a
 * view apply whose import fails (fault injection).  Some sleeps meet a driver
 * that refuses an unmap (twice, or every one from a chunk on): the sleep
 * rolls back with every sample in place, or answers FABPOOL_ERR_PARTIAL
 * asleep as fabpool.h says, and a wake completes it; some pool destroys meet
 * a driver that cannot say which context is current: the calling thread's
 * context must stay.  After every step:
 *   - the sim's ledger matches the pools' stats: bytes mapped, mappings,
 *     handles, exported fds;
 *   - no two live objects overlap (blocks, buffer and view windows, and memory
 *     of destroyed buffers that must stay mapped);
 *   - memory retired on a held stream, or dropped from an exported buffer that
 *     its peers have not acked, stays mapped (the pool's mapped and retiring
 *     bytes cover it) and keeps its data until the stream is released (or the
 *     ack comes); then a collect(wait) leaves nothing retiring;
 *   - every live object's data (a pattern of its own, written with
 *     cuMemcpyHtoD at a few sample points) reads back (cuMemcpyDtoH): one
 *     sample of every object each step, every sample of what the step touched
 *     and, every 64 steps, every sample of everything;
 *   - a shrunk buffer that was never exported maps at most the hysteresis over
 *     its new size (docs/config.md: shrink_hysteresis);
 *   - each pool's high-water marks are at least what the steps saw since its
 *     last fabpool_reset_peak (which starts them from the values then);
 *   - check_pools(): fabpool_check of each pool: the pool's own
 *     structures and counters agree with each other.
 * At the end of each seed everything is freed, both pools are destroyed (OK,
 * not BUSY) and the ledger is zero.  How often each operation ran is printed;
 * each must be at least 1% of the steps.
 *
 *   test_property [first_seed [n_seeds [steps]]]     (default 1 300 2000)
 *   test_property -v SEED 1 STEPS                    prints every step of one seed
 * FABPOOL_TEST_SKIP_OPS=operation,... leaves operations out (property_model.h).
 * Sim only (the ledger, stream holds and fault injection are the sim's). */
#include <time.h>
#include <unistd.h>

#define NPOOL 2
#define MAXBLK 24
#define MAXBUF 5
#define MAXVIEW 4
#define NSTREAM 2
#define MAXREC 256
#define MAXPEND 64
#define MAXFD 256

#include "property_model.h"

/* ------------------------------------------------------------ the sim */

typedef int (*fault_set_fn)(const char *, uint64_t, int, int);
typedef void (*fault_clear_fn)(void);
typedef uint64_t (*calls_fn)(const char *);
typedef int (*hold_fn)(void *);
static fault_set_fn fault_set;
static fault_clear_fn fault_clear;
static calls_fn sim_calls;
static hold_fn stream_hold, stream_release;

/* ------------------------------------------------------------ the model */

static uint32_t hysteresis = 25;
/* totals */
static long n_slept, n_sleep_busy, n_host_reused, n_slept_discard, n_sleep_faulted, n_sleep_rolled_back,
    n_sleep_partial, n_destroy_faulted, n_dmabufs;

static long n_dup, n_bad_ack, n_fault_apply, n_quiet;
static uint64_t peak_mapped;
static fabpool_handle_type htype;

/* ------------------------------------------------------------ model helpers */

static uint64_t n_dead_ack;

/* Synchronizing calls made so far: after one, the work it waited for is done
 * and what was retired on it may go, although the stream still reads held. */
static uint64_t sync_calls(void)
{
    static uint64_t (*calls)(const char *);
    if (!calls)
        *(void **)&calls = dlsym(RTLD_DEFAULT, "fabsim_calls");
    return calls ? calls("cuStreamSynchronize") + calls("cuEventSynchronize") + calls("cuCtxSynchronize") : 0;
}

/* Retired on a stream that is still held: the GPU may still use it, so it
 * stays mapped at its address with its data. */
static int stream_busy(int s) { return s >= 0 && cuStreamQuery(streams[s]) == CUDA_ERROR_NOT_READY; }

static uint64_t stuck_bytes(int pool)
{
    uint64_t s = 0;
    for (int i = 0; i < nrec; i++)
        if (rec[i].pool == pool && rec[i].ack_wait)
            s += rec[i].dropped;
    return s;
}

static void *stream_ptr(int s) { return s < 0 ? NULL : (void *)streams[s]; }

/* ------------------------------------------------ the pools' own check */

/* ------------------------------------------------------------ the checks */

/* Whether pend[i]'s block is listed before it too: a block freed on one held stream and recorded on another
 * waits for both, and counts once. */
static int pend_listed_before(int i)
{
    for (int j = 0; j < i; j++)
        if (pend[j].b.id == pend[i].b.id)
            return 1;
    return 0;
}

/* After every step.  full: every sample of everything. */
static void check_step(int full)
{
    refresh_streams();
    /* memory still retired: its data reads back */
    int w = 0;
    for (int i = 0; i < nrec; i++) {
        rec_t *r = &rec[i];
        if (!rec_pending(r))
            continue;
        rec[w++] = *r;
        if (!rec_stream_pending(r))
            continue;
        uint64_t lo = r->lo; /* the samples of the retired chunks, not of the hysteresis before them */
        if (r->va_lo - r->base > lo)
            lo = r->va_lo - r->base;
        if (!r->destroyed) {
            buf_t *b = find_buf(r->id, NULL);
            if (b && b->size > lo)
                lo = b->size; /* below size: live again, checked as the buffer */
            if (b && b->broken)
                continue;
        }
        check_points("retired.data", r->destroyed ? "retired memory of destroyed buffer" : "retired chunk of buffer",
                     r->id, r->base, r->pts, lo, r->hi, full ? -1 : (int)cur_step);
    }
    nrec = w;
    w = 0;
    for (int i = 0; i < npend; i++) {
        pend_t *q = &pend[i];
        if (!(held[q->stream] && epoch[q->stream] == q->epoch))
            continue; /* its work is done: the pool may give it out again */
        pend[w++] = *q;
        if (q->owner) { /* its memory may hold the owner's new blocks, but it stays mapped */
            uint64_t x = 0;
            EXPECT(cuMemcpyDtoH(&x, (CUdeviceptr)(uintptr_t)q->b.p, sizeof x) == CUDA_SUCCESS, "owner.mapped",
                   "block %p, freed on the owner stream %d, which is still held, is no longer mapped", q->b.p,
                   q->stream);
            continue;
        }
        check_points("pending.data", "block freed on a held stream", q->b.id, (uint64_t)(uintptr_t)q->b.p,
                     (uint64_t[NPTS]){0, q->b.usable - 8, 0, q->b.usable - 8, 0, q->b.usable - 8}, 0, q->b.usable,
                     full ? -1 : (int)cur_step);
    }
    npend = w;

    /* the ledger against the pools' stats; the high-water marks never below what a step saw */
    fabpool_stats S[NPOOL];
    fabsim_ledger L = check_ledger(S, 0);
    if (L.bytes_mapped > peak_mapped)
        peak_mapped = L.bytes_mapped;
    for (int p = 0; p < NPOOL; p++)
        check_peak(p, &S[p]);

    /* what must be mapped: live objects and pending retirements */
    for (int p = 0; p < NPOOL; p++) {
        pool_t *q = &P[p];
        uint64_t need = 0, retiring = 0;
        for (int i = 0; i < q->nblk; i++)
            need += q->blk[i].usable;
        for (int i = 0; i < q->nbuf; i++) {
            fabpool_buffer_info bi = binfo(&q->buf[i]);
            EXPECT(bi.size == q->buf[i].size && bi.mapped >= bi.size && (uint64_t)(uintptr_t)bi.base == q->buf[i].base,
                   "buffer.info", "buffer %llu: info says size %zu, mapped %zu, base %p; the model has size %zu at 0x%llx",
                   (unsigned long long)q->buf[i].id, bi.size, bi.mapped, bi.base, q->buf[i].size,
                   (unsigned long long)q->buf[i].base);
            need += bi.mapped;
        }
        for (int i = 0; i < q->nview; i++)
            need += q->view[i].broken ? 0 : q->view[i].live; /* a broken view: what it maps is unknown */
        uint64_t npending = 0;
        for (int i = 0; i < npend; i++)
            if (pend[i].pool == p && !pend[i].owner && !pend_listed_before(i)) {
                need += pend[i].b.usable;
                npending++;
            }
        EXPECT(S[p].stream_pending_blocks >= npending, "stream.pending", "pool %c: %llu blocks pending on streams, "
               "but %llu were freed on a stream that is still held", 'A' + p,
               (unsigned long long)S[p].stream_pending_blocks, (unsigned long long)npending);
        for (int i = 0; i < nrec; i++)
            if (rec[i].pool == p && rec_stream_pending(&rec[i])) {
                need += rec[i].dropped;
                if (!rec[i].destroyed)
                    retiring += rec[i].dropped;
            }
        EXPECT(S[p].mapped_bytes >= need, "mapped.lower_bound", "pool %c maps %llu bytes, less than its live blocks, "
               "buffers, views and retirements still pending (%llu)", 'A' + p, (unsigned long long)S[p].mapped_bytes,
               (unsigned long long)need);
        EXPECT(S[p].retiring_bytes >= retiring, "retiring.lower_bound", "pool %c: retiring_bytes %llu, but chunks of "
               "%llu bytes retired on a held stream or awaiting an ack are pending", 'A' + p,
               (unsigned long long)S[p].retiring_bytes, (unsigned long long)retiring);
    }

    /* no two live objects overlap; every 64th step sorts them all */
    check_overlap(full);

    /* data: one sample of each object (all of them when full) */
    int which = full ? -1 : (int)cur_step;
    for (int p = 0; p < NPOOL; p++) {
        pool_t *q = &P[p];
        for (int i = 0; i < q->nblk; i++)
            check_blk(&q->blk[i], which);
        for (int i = 0; i < q->nbuf; i++)
            check_buf(&q->buf[i], which);
        for (int i = 0; i < q->nview; i++)
            check_view(&q->view[i], which);
    }
    check_pools(~0u); /* every pool after every step */
}

/* collect(wait) with nothing pending in the pool: nothing stays retiring and
 * every destroyed buffer is gone */
static void check_quiet(int p)
{
    for (int i = 0; i < nrec; i++)
        if (rec[i].pool == p)
            return;
    for (int i = 0; i < npend; i++)
        if (pend[i].pool == p)
            return;
    n_quiet++;
    ack_dead(p, P[p].p); /* the peers of destroyed buffers are gone too */
    EXPECT_OK(fabpool_collect(P[p].p, 1), "collect", "fabpool_collect(wait) after the acks of destroyed buffers");
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(P[p].p, &s);
    EXPECT(s.stream_pending_blocks == 0 && s.stream_pending_bytes == 0, "collect.stream_pending", "pool %c: %llu "
           "blocks (%llu bytes) still pending on streams after collect(wait)", 'A' + p,
           (unsigned long long)s.stream_pending_blocks, (unsigned long long)s.stream_pending_bytes);
    EXPECT(s.retiring_bytes == 0, "collect.retiring", "pool %c: %llu bytes still retiring after collect(wait) with no "
           "stream held and every exported buffer acked", 'A' + p, (unsigned long long)s.retiring_bytes);
    EXPECT(s.buffers == (uint64_t)P[p].nbuf, "collect.buffers", "pool %c: %llu buffers after collect(wait), %d live "
           "(a destroyed buffer kept its memory)", 'A' + p, (unsigned long long)s.buffers, P[p].nbuf);
}

/* ------------------------------------------------------------ the steps */

static int has_room_blk(int p) { return P[p].nblk < MAXBLK; }
static int has_room_buf(int p) { return P[p].nbuf < MAXBUF; }
static int has_shared(int p)
{
    for (int i = 0; i < P[p].nbuf; i++)
        if (P[p].buf[i].shared)
            return 1;
    return 0;
}
static int can_open(int p) { return P[p].nbuf > 0 && P[1 - p].nview < MAXVIEW; }
static int has_appliable(int p)
{
    for (int i = 0; i < P[p].nview; i++)
        if (!P[p].view[i].broken && find_buf(P[p].view[i].id, NULL))
            return 1;
    return 0;
}

static int stream_chosen = -9; /* a scenario's stream for the next stream_choice (-9: none) */
static int stream_choice(void)
{
    int s = stream_chosen;
    stream_chosen = -9;
    return s != -9 ? s : chance(30) ? -1 : (int)below(NSTREAM);
}
static const char *stream_name(int s) { return s < 0 ? "NULL" : held[s] ? "held" : "free"; }

/* A shrunk buffer that was never exported maps at most the hysteresis over its new size, rounded up to the
 * granularity (docs/design.md: a last chunk reaching beyond it is refitted). */
static void check_hysteresis(buf_t *b, int s)
{
    if (b->shared)
        return;
    fabpool_buffer_info bi = binfo(b);
    uint64_t keep = b->size + b->size / 100 * hysteresis + b->size % 100 * hysteresis / 100;
    keep = (keep + gran - 1) / gran * gran;
    EXPECT(bi.mapped <= keep, "shrink.hysteresis", "buffer %llu shrunk from %zu to %zu (%s) maps %zu bytes in %u "
           "chunk%s, more than the %u%% hysteresis allows (%llu)", (unsigned long long)b->id, b->hyst_from, b->size,
           s < 0 ? "no stream" : "on a stream, checked at a collect(wait) after it", bi.mapped, bi.n_chunks,
           bi.n_chunks == 1 ? "" : "s", hysteresis, (unsigned long long)keep);
}

static void after_resize(int p, buf_t *b, const fabpool_buffer_info *before, size_t old, int s)
{
    fabpool_buffer_info bi = binfo(b);
    EXPECT(bi.size == b->size, "resize.size", "buffer %llu: size %zu after a resize to %zu", (unsigned long long)b->id,
           bi.size, b->size);
    if (b->size > old) {
        grow_took_back(b, b->base + bi.mapped, s); /* live again: rewritten */
        write_points(b->id, b->base, b->pts, old, b->size);
    } else if (b->size < old) {
        if (before->mapped > bi.mapped)
            add_rec(p, b, b->size, old, bi.mapped, before->mapped - bi.mapped, s, 0, bi.generation);
        /* without a stream at once; on a stream the pool may wait for the stream's work first (a first chunk
         * it replaces is in use until then): checked at the next collect(wait) with the stream released */
        b->hyst_stream = s < 0 ? -1 : s;
        b->hyst_from = old;
        if (s < 0)
            check_hysteresis(b, -1);
    } else {
        b->hyst_stream = -1;
    }
    check_buf(b, -1);
}

/* a buffer the lib changed against the rules: make the model agree again */
static void resync_buf(buf_t *b)
{
    int w = 0; /* what it retired is unknown now */
    for (int i = 0; i < nrec; i++)
        if (rec[i].id != b->id)
            rec[w++] = rec[i];
    nrec = w;
    fabpool_buffer_info bi = binfo(b);
    if (bi.mapped < bi.size)
        (void)fabpool_buffer_resize(b->h, bi.size, NULL);
    b->size = bi.size;
    write_points(b->id, b->base, b->pts, 0, b->size);
}

/* 1 while a plain call goes through the per-thread default stream (CU_STREAM_PER_THREAD): an allocation on it is
 * fabpool_alloc's, a free on it waits for the calling thread's stream and is fabpool_free's (fabpool.h). */
static int per_thread;

/* fabpool_alloc, or with on_stream fabpool_alloc_on_stream, or with al (a power of two) fabpool_alloc_aligned, on
 * pool p */
static void alloc_block(int p, int on_stream, uint64_t al)
{
    fabpool_status st;
    int i;
    /* up to 96 MiB: a growth that large is cut into chunks capped beside what the arena holds */
    size_t sz = chance(80)   ? (size_t)logsize(1, 256 * KB)
                : chance(70) ? (size_t)logsize(256 * KB, 4 * MB)
                : chance(85) ? (size_t)logsize(4 * MB, 16 * MB)
                             : (size_t)logsize(32 * MB, 96 * MB);
    int s = on_stream ? stream_choice() : -1;
    int owner_call = on_stream ? own_claim(p, s) : (P[p].own >= -1 ? (P[p].own = OWN_OFF, 0) : 0);
    snprintf(cur_what, sizeof cur_what, "pool %c, %zu bytes%s%s, alignment %llu", 'A' + p, sz,
             on_stream ? ", stream " : "", on_stream ? stream_name(s) : per_thread ? ", the per-thread stream" : "",
             (unsigned long long)al);
    blk_t b = {NULL, sz, 0, next_id++, 0};
    st = on_stream    ? fabpool_alloc_on_stream(P[p].p, sz, stream_ptr(s), &b.p)
         : al         ? fabpool_alloc_aligned(P[p].p, sz, al, &b.p)
         : per_thread ? fabpool_alloc_on_stream(P[p].p, sz, CU_STREAM_PER_THREAD, &b.p)
                      : fabpool_alloc(P[p].p, sz, &b.p);
    EXPECT_OK(st, "alloc", on_stream ? "fabpool_alloc_on_stream" : al ? "fabpool_alloc_aligned" : "fabpool_alloc");
    if (st != FABPOOL_OK)
        return;
    for (i = 0; i < npend; i++) {
        pend_t *q = &pend[i];
        if (q->owner && q->pool == p && (uintptr_t)b.p < (uintptr_t)q->b.p + q->b.usable &&
            (uintptr_t)q->b.p < (uintptr_t)b.p + sz) {
            /* the owner's freed memory: the owner may have it in any shape; anyone else only after a fence
             * (which completes the owner's work) */
            EXPECT(owner_call || !stream_busy(q->stream), "stream.owner_reuse", "block %p (%zu bytes) overlaps "
                   "block %p, freed on the owner stream %d whose work may still use it, and went to %s", b.p, sz,
                   q->b.p, q->stream, on_stream ? "another stream" : "fabpool_alloc");
            pend[i--] = pend[--npend];
            continue;
        }
        if (q->owner || q->pool != p || q->b.p != b.p || !(held[q->stream] && epoch[q->stream] == q->epoch) ||
            !stream_busy(q->stream)) /* (not busy: the pool waited for it, e.g. at an out-of-memory retry) */
            continue;
        /* a block still pending on a held stream: only that stream may have it back */
        EXPECT(on_stream && s == q->stream, "stream.reuse", "block %p, freed on held stream %d, given to "
               "%s while that stream's work may still use it", b.p, q->stream,
               on_stream ? (s < 0 ? "the NULL stream" : "another stream") : "fabpool_alloc");
        pend[i] = pend[--npend];
        break;
    }
    st = fabpool_usable_size(P[p].p, b.p, &b.usable);
    /* aligned to 256 B, or to its class's own alignment below 1 KiB (320 B: 64, 384 B: 128; fabpool.h) */
    size_t align = b.usable & (~b.usable + 1);
    if (align > 256 || !align)
        align = 256;
    EXPECT(st == FABPOOL_OK && b.usable >= sz && ((uintptr_t)b.p & (align - 1)) == 0, "alloc.usable",
           "block %p of %zu bytes: usable size %zu (%s)", b.p, sz, b.usable, fabpool_status_name(st));
    EXPECT(!al || ((uintptr_t)b.p & (al - 1)) == 0, "alloc.aligned", "fabpool_alloc_aligned of %zu bytes, alignment "
           "%llu, gave %p", sz, (unsigned long long)al, b.p);
    if (b.usable < 8)
        b.usable = sz < 8 ? 8 : sz;
    uint64_t pts[NPTS] = {0, b.usable - 8, 0, 0, 0, 0};
    write_points(b.id, (uint64_t)(uintptr_t)b.p, pts, 0, b.usable);
    P[p].blk[P[p].nblk++] = b;
}

static void op_alloc(int p) { alloc_block(p, 0, 0); }
static void op_alloc_on_stream(int p) { alloc_block(p, 1, 0); }
static void op_alloc_per_thread(int p)
{
    per_thread = 1;
    alloc_block(p, 0, 0);
    per_thread = 0;
}
/* an alignment of 1 B to 2 MiB (the sim's granularity) */
static void op_alloc_aligned(int p) { alloc_block(p, 0, 1ull << below(22)); }

static void op_free(int p)
{
    fabpool_status st;
    int i;
    i = (int)below((uint64_t)P[p].nblk);
    blk_t *b = &P[p].blk[i];
    snprintf(cur_what, sizeof cur_what, "pool %c, block %llu (%zu bytes)", 'A' + p, (unsigned long long)b->id,
             b->size);
    check_blk(b, -1);
    st = per_thread ? fabpool_free_on_stream(P[p].p, b->p, CU_STREAM_PER_THREAD) : fabpool_free(P[p].p, b->p);
    EXPECT_OK(st, "free", per_thread ? "fabpool_free_on_stream(CU_STREAM_PER_THREAD)" : "fabpool_free");
    if (st == FABPOOL_OK)
        pend_on_record(p, b, -2);
    P[p].blk[i] = P[p].blk[--P[p].nblk];
}

static void op_free_per_thread(int p)
{
    per_thread = 1;
    op_free(p);
    per_thread = 0;
}

static void free_on(int p, int i, int s);

/* fabpool_stream_owner_end: the owner mode over for good (none comes to a pool without one), and every block the
 * owner freed safe for anyone on return: its stream's work done. */
static void op_owner_end(int p)
{
    if (P[p].own == OWN_NONE && P[p].nblk < MAXBLK) { /* no owner yet: most times, one first */
        stream_chosen = (int)below(NSTREAM);
        if (chance(75))
            alloc_block(p, 1, 0);
        stream_chosen = -9;
    }
    int s = P[p].own;
    if (s >= 0 && P[p].nblk > 0) { /* the owner mode holds: a free of the owner while its work pends, to fence */
        if (!held[s]) {
            EXPECT(stream_hold(streams[s]) == 0, "stream_hold", "fabsim_stream_hold failed");
            held[s] = 1;
            epoch[s]++;
        }
        free_on(p, (int)below((uint64_t)P[p].nblk), s);
    }
    snprintf(cur_what, sizeof cur_what, "pool %c (the owner %d)", 'A' + p, P[p].own);
    fabpool_status st = fabpool_stream_owner_end(P[p].p);
    EXPECT_OK(st, "owner_end", "fabpool_stream_owner_end");
    P[p].own = OWN_OFF;
    for (int i = 0; i < npend; i++)
        EXPECT(pend[i].pool != p || !pend[i].owner || !stream_busy(pend[i].stream), "owner_end.unfenced",
               "pool %c: block %p, freed on the owner stream %d, still pends after fabpool_stream_owner_end", 'A' + p,
               pend[i].b.p, pend[i].stream);
}

/* block i of pool p freed on stream s */
static void free_on(int p, int i, int s)
{
    fabpool_status st;
    blk_t *b = &P[p].blk[i];
    snprintf(cur_what, sizeof cur_what, "pool %c, block %llu (%zu bytes), stream %s", 'A' + p,
             (unsigned long long)b->id, b->size, stream_name(s));
    check_blk(b, -1);
    int owner_call = own_claim(p, s);
    st = fabpool_free_on_stream(P[p].p, b->p, stream_ptr(s));
    EXPECT_OK(st, "free_on_stream", "fabpool_free_on_stream");
    if (st == FABPOOL_OK && s >= 0 && held[s] && npend < MAXPEND)
        pend[npend++] = (pend_t){p, s, epoch[s], *b, owner_call, 0};
    if (st == FABPOOL_OK)
        pend_on_record(p, b, s);
    P[p].blk[i] = P[p].blk[--P[p].nblk];
}

static void op_free_on_stream(int p) { free_on(p, (int)below((uint64_t)P[p].nblk), stream_choice()); }

static void op_buffer_create(int p)
{
    fabpool_status st;
    buf_t b;
    memset(&b, 0, sizeof b);
    b.id = next_id++;
    uint64_t max = (uint64_t)logsize(4 * KB, 128 * MB);
    b.window = (max + gran - 1) / gran * gran;
    b.size = buf_size(max);
    snprintf(cur_what, sizeof cur_what, "pool %c, max %llu, size %zu", 'A' + p, (unsigned long long)max, b.size);
    st = fabpool_buffer_create(P[p].p, (size_t)max, b.size, &b.h);
    EXPECT_OK(st, "buffer_create", "fabpool_buffer_create");
    if (st != FABPOOL_OK)
        return;
    b.base = (uint64_t)(uintptr_t)fabpool_buffer_ptr(b.h);
    b.hyst_stream = -1;
    fabpool_buffer_info bi = binfo(&b);
    EXPECT(bi.max_size == b.window && bi.size == b.size && bi.mapped >= b.size, "buffer_create.info",
           "max_size %zu (expected %llu), size %zu, mapped %zu", bi.max_size, (unsigned long long)b.window,
           bi.size, bi.mapped);
    gen_points(b.id, b.window, b.pts);
    write_points(b.id, b.base, b.pts, 0, b.size);
    P[p].buf[P[p].nbuf++] = b;
}

static void op_buffer_resize(int p)
{
    fabpool_status st;
    buf_t *b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    size_t old = b->size, sz = buf_size(b->window);
    int s = stream_choice();
    snprintf(cur_what, sizeof cur_what, "pool %c, buffer %llu, %zu -> %zu, stream %s%s", 'A' + p,
             (unsigned long long)b->id, old, sz, stream_name(s), b->shared ? ", exported" : "");
    fabpool_buffer_info before = binfo(b);
    st = fabpool_buffer_resize(b->h, sz, stream_ptr(s));
    EXPECT_OK(st, "buffer_resize", "fabpool_buffer_resize");
    if (st != FABPOOL_OK) {
        same_info("resize.failed_changed", b, &before);
        return;
    }
    b->size = sz;
    after_resize(p, b, &before, old, s);
}

static void op_buffer_resize_set(int p)
{
    fabpool_status st;
    pool_t *q = &P[p];
    fabpool_buffer_t *hs[4];
    size_t sizes[4];
    int idx[4], n = 0, dup = chance(15);
    int want = 1 + (int)below((uint64_t)(q->nbuf < 3 ? q->nbuf : 3));
    int start = (int)below((uint64_t)q->nbuf);
    for (int k = 0; k < want; k++)
        idx[n++] = (start + k) % q->nbuf;
    if (dup) { /* the same buffer twice: refused, nothing changed */
        int again = idx[below((uint64_t)n)];
        idx[n++] = again;
    }
    int s = stream_choice();
    fabpool_buffer_info before[4];
    size_t old[4];
    int len = 0;
    len += snprintf(cur_what, sizeof cur_what, "pool %c, stream %s, ", 'A' + p, stream_name(s));
    for (int k = 0; k < n; k++) {
        buf_t *b = &q->buf[idx[k]];
        hs[k] = b->h;
        sizes[k] = buf_size(b->window);
        old[k] = b->size;
        before[k] = binfo(b);
        if (len < (int)sizeof cur_what - 40)
            len += snprintf(cur_what + len, sizeof cur_what - (size_t)len, "%sbuffer %llu %zu -> %zu", k ? "; " : "",
                            (unsigned long long)b->id, old[k], sizes[k]);
    }
    st = fabpool_buffer_resize_set(hs, sizes, (size_t)n, stream_ptr(s));
    if (dup) {
        n_dup++;
        EXPECT(st != FABPOOL_OK, "resize_set.duplicate", "a buffer named twice was accepted (%s); sizes after: %zu",
               fabpool_status_name(st), binfo(&q->buf[idx[n - 1]]).size);
        if (st != FABPOOL_OK) {
            for (int k = 0; k < n; k++)
                same_info("resize_set.duplicate_changed", &q->buf[idx[k]], &before[k]);
        } else {
            for (int k = 0; k < n; k++)
                resync_buf(&q->buf[idx[k]]);
        }
        return;
    }
    EXPECT_OK(st, "buffer_resize_set", "fabpool_buffer_resize_set");
    if (st != FABPOOL_OK) {
        for (int k = 0; k < n; k++)
            same_info("resize_set.failed_changed", &q->buf[idx[k]], &before[k]);
        return;
    }
    for (int k = 0; k < n; k++) {
        q->buf[idx[k]].size = sizes[k];
        after_resize(p, &q->buf[idx[k]], &before[k], old[k], s);
    }
}

static void op_buffer_destroy(int p)
{
    fabpool_status st;
    int i;
    i = (int)below((uint64_t)P[p].nbuf);
    if (chance(80)) /* mostly a buffer whose peers are all acked: what an un-acked destroy pins stays
                       until pool destroy, and a collect(wait) checks for leftovers only with none */
        for (int k = 0, o = (int)below((uint64_t)P[p].nbuf); k < P[p].nbuf; k++) {
            buf_t *c = &P[p].buf[(k + o) % P[p].nbuf];
            if (!c->shared || c->acked >= binfo(c).generation) {
                i = (k + o) % P[p].nbuf;
                break;
            }
        }
    for (int k = 0; k < P[p].nbuf; k++)
        if (P[p].buf[k].broken)
            i = k;
    buf_t *b = &P[p].buf[i];
    fabpool_buffer_info before = binfo(b);
    if (b->shared && b->acked < before.generation && stuck_bytes(p) > 512 * MB && !b->broken) {
        /* keep what un-acked destroys pin until pool destroy bounded: ack first (the views' generation) */
        uint64_t g = before.generation;
        for (int k = 0; k < P[1 - p].nview; k++)
            if (P[1 - p].view[k].id == b->id && P[1 - p].view[k].gen < g)
                g = P[1 - p].view[k].gen;
        if (fabpool_buffer_peers_ack(b->h, g) == FABPOOL_OK && g > b->acked)
            b->acked = g;
    }
    int s = stream_choice();
    snprintf(cur_what, sizeof cur_what, "pool %c, buffer %llu (size %zu, mapped %zu, gen %llu, %s), stream %s",
             'A' + p, (unsigned long long)b->id, b->size, before.mapped, (unsigned long long)before.generation,
             !b->shared ? "not exported" : b->acked >= before.generation ? "exported, acked" : "exported, un-acked",
             stream_name(s));
    check_buf(b, -1);
    st = fabpool_buffer_destroy(b->h, stream_ptr(s));
    EXPECT_OK(st, "buffer_destroy", "fabpool_buffer_destroy");
    if (st != FABPOOL_OK)
        return; /* the buffer is still the pool's: destroyed at the end */
    for (int k = 0; k < nrec; k++)
        if (rec[k].id == b->id) {
            if (b->acked >= rec[k].gen_after)
                rec[k].ack_wait = 0; /* acked before the destroy */
            rec[k].destroyed = 1;
        }
    add_rec(p, b, 0, b->size, 0, before.mapped, s, 1, before.generation);
    if (b->shared && ndead < MAXDEAD) {
        dead[ndead].pool = p;
        dead[ndead++].id = before.export_id;
    }
    P[p].buf[i] = P[p].buf[--P[p].nbuf];
}

static void op_export(int p)
{
    fabpool_status st;
    buf_t *b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    fabpool_buffer_info bi = binfo(b);
    uint64_t since = chance(50) ? 0 : below(bi.generation + 1);
    snprintf(cur_what, sizeof cur_what, "pool %c, buffer %llu since %llu (gen %llu)", 'A' + p,
             (unsigned long long)b->id, (unsigned long long)since, (unsigned long long)bi.generation);
    size_t len, nfds;
    st = do_export(p, b, since, &len, &nfds);
    EXPECT_OK(st, "export", "fabpool_buffer_export");
    if (st == FABPOOL_OK) {
        for (size_t k = 0; k < nfds; k++)
            close(mine[k]);
        if (since == 0) { /* a full descriptor covers what is mapped */
            uint64_t sum = 0;
            uint32_t nr;
            memcpy(&nr, desc + 12, 4);
            for (uint32_t k = 0; k < nr; k++) {
                uint64_t sz;
                memcpy(&sz, desc + FABPOOL_DESC_HEADER_BYTES + (size_t)k * FABPOOL_DESC_RECORD_BYTES + 8, 8);
                sum += sz;
            }
            EXPECT(sum == bi.mapped, "export.full", "a full descriptor of buffer %llu covers %llu bytes, it maps "
                   "%zu", (unsigned long long)b->id, (unsigned long long)sum, bi.mapped);
        }
    }
}

static void op_peers_ack(int p)
{
    fabpool_status st;
    if (ndead && chance(30)) { /* a destroyed buffer, by its export id */
        int k = (int)below((uint64_t)ndead);
        p = dead[k].pool;
        uint64_t g = chance(50) ? UINT64_MAX : below(64);
        snprintf(cur_what, sizeof cur_what, "pool %c, destroyed buffer 0x%llx by export id, ack %llu", 'A' + p,
                 (unsigned long long)dead[k].id, (unsigned long long)g);
        st = fabpool_peers_ack(P[p].p, dead[k].id, g);
        n_dead_ack++;
        EXPECT(st == FABPOOL_OK || st == FABPOOL_ERR_NOT_FOUND || st == FABPOOL_ERR_INVALID_ARG, "ack.dead",
               "fabpool_peers_ack by export id -> %s: %s", fabpool_status_name(st), fabpool_last_error());
        if (st == FABPOOL_ERR_NOT_FOUND || g == UINT64_MAX)
            dead[k] = dead[--ndead];
        return;
    }
    buf_t *b;
    do
        b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    while (!b->shared);
    fabpool_buffer_info before = binfo(b);
    uint64_t g = before.generation;
    int views = 0;
    for (int k = 0; k < P[1 - p].nview; k++)
        if (P[1 - p].view[k].id == b->id) {
            views++;
            if (P[1 - p].view[k].gen < g)
                g = P[1 - p].view[k].gen;
        }
    int bad = chance(20);
    if (bad)
        g = before.generation + 1 + below(1000);
    else if (!views && chance(25))
        g = UINT64_MAX; /* no peer is left */
    snprintf(cur_what, sizeof cur_what, "pool %c, buffer %llu, ack %llu (generation %llu, %d view%s)%s", 'A' + p,
             (unsigned long long)b->id, (unsigned long long)g, (unsigned long long)before.generation, views,
             views == 1 ? "" : "s", bad ? ", never issued" : "");
    st = fabpool_buffer_peers_ack(b->h, g);
    if (bad) {
        n_bad_ack++;
        EXPECT(st != FABPOOL_OK, "ack.never_issued", "an ack of generation %llu, past the buffer's %llu, was "
               "accepted", (unsigned long long)g, (unsigned long long)before.generation);
        if (st == FABPOOL_OK && g > b->acked)
            b->acked = g; /* the lib took it: follow it, so that one defect is reported once */
        if (st != FABPOOL_OK)
            same_info("ack.never_issued_changed", b, &before);
    } else {
        EXPECT_OK(st, "peers_ack", "fabpool_buffer_peers_ack");
        if (st == FABPOOL_OK && g > b->acked)
            b->acked = g;
    }
}

static void op_view_open(int p)
{
    fabpool_status st;
    int t = 1 - p;
    buf_t *b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    fabpool_buffer_info bi = binfo(b);
    snprintf(cur_what, sizeof cur_what, "pool %c opens buffer %llu of pool %c (size %zu, gen %llu)", 'A' + t,
             (unsigned long long)b->id, 'A' + p, b->size, (unsigned long long)bi.generation);
    size_t len, nfds;
    st = do_export(p, b, 0, &len, &nfds);
    EXPECT_OK(st, "view_open.export", "fabpool_buffer_export(since 0)");
    if (st != FABPOOL_OK)
        return;
    view_t v;
    memset(&v, 0, sizeof v);
    v.vouched = chance(75); /* the peer is this process */
    if (v.vouched && P[t].nkview)
        kept_drop(t, 0, 1, 1); /* an open of a vouched peer gives back kept views past keep_ms first */
    int due = v.vouched && kept_view_of(t, b->id);
    st = v.vouched ? fabpool_view_open_peer(P[t].p, getpid(), desc, len, mine, nfds, &v.h)
                   : fabpool_view_open(P[t].p, desc, len, mine, nfds, &v.h);
    EXPECT_OK(st, "view_open", v.vouched ? "fabpool_view_open_peer" : "fabpool_view_open");
    if (chance(75)) /* the fds reached the peer (the sim checks every open one at each ledger) */
        fabpool_buffer_export_done(b->h);
    if (st != FABPOOL_OK)
        return;
    v.src_pool = p;
    v.id = b->id;
    v.vid = next_id++;
    v.window = b->window;
    v.base = (uint64_t)(uintptr_t)fabpool_view_ptr(v.h);
    if (v.vouched) { /* a kept view of the buffer is taken back (its address), and only then */
        kview_t was;
        int took = kept_view_taken(t, v.base, &was);
        EXPECT(took == due && (!took || (was.v.id == b->id && !was.block)), "view_open.kept", "pool %c opened "
               "buffer %llu at 0x%llx: %s", 'A' + t, (unsigned long long)b->id, (unsigned long long)v.base,
               due ? "not at a kept view of it" : "at a kept view, none of it was due");
        if (took)
            v.vid = was.v.vid;
    }
    v.live = bi.mapped;
    v.gen = bi.generation;
    v.src_size = b->size;
    memcpy(v.pts, b->pts, sizeof v.pts);
    fabpool_buffer_info vi = {.struct_size = sizeof vi};
    fabpool_view_get_info(v.h, &vi);
    EXPECT(vi.generation == v.gen && vi.mapped == v.live && vi.max_size == b->window, "view_open.info",
           "view of buffer %llu: generation %llu, mapped %zu, window %zu; the buffer: %llu, %zu, %llu",
           (unsigned long long)b->id, (unsigned long long)vi.generation, vi.mapped, vi.max_size,
           (unsigned long long)v.gen, (size_t)v.live, (unsigned long long)b->window);
    check_view(&v, -1);
    P[t].view[P[t].nview++] = v;
}

static void op_view_apply(int p)
{
    fabpool_status st;
    view_t *v;
    buf_t *b;
    int sp;
    do {
        v = &P[p].view[below((uint64_t)P[p].nview)];
        b = find_buf(v->id, &sp);
    } while (!b || v->broken);
    fabpool_buffer_info bi = binfo(b);
    size_t len, nfds;
    st = do_export(sp, b, v->gen, &len, &nfds);
    EXPECT_OK(st, "view_apply.export", "fabpool_buffer_export(since the view's generation)");
    if (st != FABPOOL_OK)
        return;
    uint32_t nr;
    memcpy(&nr, desc + 12, 4);
    int fault = nr > 0 && fault_set && chance(15);
    snprintf(cur_what, sizeof cur_what, "pool %c, view of buffer %llu: gen %llu -> %llu, %u new chunk%s%s", 'A' + p,
             (unsigned long long)b->id, (unsigned long long)v->gen, (unsigned long long)bi.generation, nr,
             nr == 1 ? "" : "s", fault ? ", an import fails" : "");
    fabpool_buffer_info vb = {.struct_size = sizeof vb};
    fabpool_view_get_info(v->h, &vb);
    uint64_t c0 = 0;
    uint64_t nth = 1 + below(nr);
    if (fault) {
        c0 = sim_calls("cuMemImportFromShareableHandle");
        fault_set("cuMemImportFromShareableHandle", nth, 0, CUDA_ERROR_INVALID_VALUE);
    }
    st = fabpool_view_apply(v->h, desc, len, mine, nfds);
    if (fault) {
        fault_clear();
        if (sim_calls("cuMemImportFromShareableHandle") - c0 < nth)
            fault = 0; /* not reached */
    }
    if (chance(75)) /* the fds reached the peer (the sim checks every open one at each ledger) */
        fabpool_buffer_export_done(b->h);
    if (fault) {
        n_fault_apply++;
        EXPECT(st != FABPOOL_OK, "view_apply.fault_ignored", "an import failed and the apply answered OK");
        fabpool_buffer_info va = {.struct_size = sizeof va};
        fabpool_view_get_info(v->h, &va);
        EXPECT(va.generation == vb.generation && va.mapped == vb.mapped && va.n_chunks == vb.n_chunks,
               "view_apply.failed_changed", "after a failed apply the view says generation %llu -> %llu, "
               "mapped %zu -> %zu, chunks %u -> %u", (unsigned long long)vb.generation,
               (unsigned long long)va.generation, vb.mapped, va.mapped, vb.n_chunks, va.n_chunks);
        int changed = va.n_chunks != vb.n_chunks || va.generation != vb.generation;
        if (check_points("view_apply.failed_hole", "view (after a failed apply) of buffer", v->id, v->base,
                         v->pts, 0, v->src_size < v->live ? v->src_size : v->live, -1) || changed)
            v->broken = 1;
        return;
    }
    EXPECT_OK(st, "view_apply", "fabpool_view_apply");
    if (st != FABPOOL_OK) {
        v->broken = 1;
        return;
    }
    v->gen = bi.generation;
    v->live = bi.mapped;
    v->src_size = b->size;
    fabpool_buffer_info va = {.struct_size = sizeof va};
    fabpool_view_get_info(v->h, &va);
    EXPECT(va.generation == v->gen && va.mapped == v->live, "view_apply.info", "view of buffer %llu: generation "
           "%llu, mapped %zu after applying generation %llu of %llu bytes", (unsigned long long)b->id,
           (unsigned long long)va.generation, va.mapped, (unsigned long long)v->gen, (unsigned long long)v->live);
    check_view(v, -1);
}

/* HybridEP's free of a buffer: fabpool_buffer_release keeps it (keep_ms) for a later fabpool_buffer_reuse, which
 * the steps between may meet: other operations, trim, sleep, an out-of-memory retry, keep_ms passing, the pool's
 * destroy.  Its peers, if any, are acknowledged first (fabric: no peer may still import a released buffer).  The
 * released handle is refused from then on; the pool's kept_bytes counts what it maps (check_ledger). */
static int can_release(int p) { return has_releasable(p); }
static void op_buffer_release(int p)
{
    int i = (int)below((uint64_t)P[p].nbuf);
    while (!buf_releasable(&P[p].buf[i]))
        i = (i + 1) % P[p].nbuf;
    buf_t *b = &P[p].buf[i];
    fabpool_buffer_info before = binfo(b);
    snprintf(cur_what, sizeof cur_what, "pool %c, buffer %llu (size %zu, mapped %zu)%s, %d kept before", 'A' + p,
             (unsigned long long)b->id, b->size, before.mapped, b->shared ? ", exported and acked" : "", P[p].nkbuf);
    check_buf(b, -1);
    fabpool_status st = fabpool_buffer_release(b->h);
    EXPECT_OK(st, "buffer_release", "fabpool_buffer_release");
    if (st != FABPOOL_OK)
        return;
    kept_drop(p, 1, 0, 1); /* a release gives back those past keep_ms */
    fabpool_buffer_t *gone = b->h;
    fabpool_status again = fabpool_buffer_resize(gone, 1, NULL);
    EXPECT(!fabpool_buffer_ptr(gone) && again == FABPOOL_ERR_INVALID_ARG && fabpool_buffer_get_info(gone, &(
               fabpool_buffer_info){.struct_size = sizeof(fabpool_buffer_info)}) == FABPOOL_ERR_INVALID_ARG,
           "buffer_release.handle", "the released handle %p still answers: ptr %p, resize -> %s", (void *)gone,
           fabpool_buffer_ptr(gone), fabpool_status_name(again));
    P[p].kbuf[P[p].nkbuf++] = (kbuf_t){*b, before.mapped, gone, before.export_id, 0};
    P[p].buf[i] = P[p].buf[--P[p].nbuf];
}

/* fabpool_buffer_reuse: the kept buffer whose window holds the size and whose mapped bytes are nearest to it
 * comes back at its base under a new handle, resized as fabpool_buffer_resize would from the size it was released
 * with (its data below the smaller of the two stays); none fits: FABPOOL_ERR_NOT_FOUND, and every kept buffer
 * of the pool is given back. */
static int can_reuse(int p) { return P[p].nbuf < MAXBUF; }
static void op_buffer_reuse(int p)
{
    kept_drop(p, 1, 0, 1); /* a reuse gives back those past keep_ms first */
    uint64_t win = P[p].nkbuf ? P[p].kbuf[below((uint64_t)P[p].nkbuf)].b.window : 128 * MB;
    size_t sz = chance(85) ? buf_size(win) : (size_t)logsize(1, 128 * MB);
    int s = stream_choice(), best = -1;
    uint64_t best_d = UINT64_MAX;
    for (int k = 0; k < P[p].nkbuf; k++) {
        uint64_t live = P[p].kbuf[k].live, d = live > sz ? live - sz : sz - live;
        if (P[p].kbuf[k].b.window >= sz && d < best_d)
            best = k, best_d = d;
    }
    snprintf(cur_what, sizeof cur_what, "pool %c, %zu bytes, stream %s, %d kept%s", 'A' + p, sz, stream_name(s),
             P[p].nkbuf, best < 0 ? ", none fits" : "");
    fabpool_buffer_t *r = NULL;
    fabpool_status st = fabpool_buffer_reuse(P[p].p, sz, stream_ptr(s), &r);
    if (best < 0) {
        EXPECT(st == FABPOOL_ERR_NOT_FOUND && !r, "buffer_reuse.miss", "no kept buffer's window holds %zu bytes, "
               "the reuse answered %s (%p)", sz, fabpool_status_name(st), (void *)r);
        if (st == FABPOOL_OK)
            (void)fabpool_buffer_destroy(r, NULL);
        kept_drop(p, 1, 0, 0); /* a miss gives every kept buffer back */
        return;
    }
    EXPECT_OK(st, "buffer_reuse", "fabpool_buffer_reuse");
    if (st != FABPOOL_OK)
        return;
    uint64_t at = (uint64_t)(uintptr_t)fabpool_buffer_ptr(r);
    int k = 0;
    while (k < P[p].nkbuf && P[p].kbuf[k].b.base != at)
        k++;
    kbuf_t *e = &P[p].kbuf[k];
    uint64_t d = k < P[p].nkbuf ? (e->live > sz ? e->live - sz : sz - e->live) : UINT64_MAX;
    EXPECT(k < P[p].nkbuf && d == best_d && e->b.window >= sz && r != e->gone && !fabpool_buffer_ptr(e->gone),
           "buffer_reuse.best_fit", "the reuse of %zu bytes gave %p at 0x%llx: %s (the nearest kept buffer maps %llu "
           "bytes from that size)", sz, (void *)r, (unsigned long long)at, k == P[p].nkbuf ? "no kept buffer is there" :
           d != best_d ? "not the nearest kept buffer" : "its released handle answers, or it is the same handle",
           (unsigned long long)best_d);
    if (k == P[p].nkbuf) {
        (void)fabpool_buffer_destroy(r, NULL);
        return;
    }
    buf_t b = e->b;
    fabpool_buffer_info before = {.struct_size = sizeof before, .size = b.size, .mapped = (size_t)e->live};
    size_t old = b.size;
    P[p].kbuf[k] = P[p].kbuf[--P[p].nkbuf];
    b.h = r;
    b.size = sz;
    b.hyst_stream = -1;
    P[p].buf[P[p].nbuf++] = b;
    after_resize(p, &P[p].buf[P[p].nbuf - 1], &before, old, s);
}

/* fabpool_view_release of one of pool t's views: one a vouched peer opened is kept (keep_ms) for a later open of
 * the same buffer's descriptor, meanwhile meeting the exporter's resizes, exports and destroy and the importer's
 * sleep and trim; one fabpool_view_open opened is closed.  The released handle is refused. */
static int can_release_view(int t)
{
    for (int i = 0; i < P[t].nview; i++)
        if (!P[t].view[i].broken)
            return P[t].nkview < MAXKEPT;
    return 0;
}
static int view_release_pick = -1; /* the view op_view_release takes (-1: one at random) */
static void op_view_release(int t)
{
    int i = (int)below((uint64_t)P[t].nview);
    while (P[t].view[i].broken)
        i = (i + 1) % P[t].nview;
    if (view_release_pick >= 0)
        i = view_release_pick;
    view_t *v = &P[t].view[i];
    fabpool_buffer_info vi = {.struct_size = sizeof vi};
    fabpool_view_get_info(v->h, &vi);
    snprintf(cur_what, sizeof cur_what, "pool %c, view of buffer %llu%s (mapped %zu)%s", 'A' + t,
             (unsigned long long)v->id, find_buf(v->id, NULL) ? "" : " (not live)", vi.mapped,
             v->vouched ? ", a vouched peer's" : ", not vouched for: closed");
    check_view(v, -1);
    fabpool_status st = fabpool_view_release(v->h);
    EXPECT_OK(st, "view_release", "fabpool_view_release");
    if (st != FABPOOL_OK)
        return;
    EXPECT(!fabpool_view_ptr(v->h) && fabpool_view_close(v->h) == FABPOOL_ERR_INVALID_ARG, "view_release.handle",
           "the released view's handle %p still answers", (void *)v->h);
    kept_drop(t, 0, 1, 1); /* a release gives back those past keep_ms */
    EXPECT(vi.mapped == v->live, "view_release.info", "view of buffer %llu maps %zu bytes, the model %llu",
           (unsigned long long)v->id, vi.mapped, (unsigned long long)v->live);
    if (v->vouched)
        P[t].kview[P[t].nkview++] = (kview_t){*v, 0, 0};
    drop_view(t, i);
}

/* fabpool_view_open_peer of a buffer whose view pool t keeps: the kept view comes back at its address under a new
 * handle, imports only the chunks it lacks, and reads the buffer's data now (a kept view past keep_ms is closed
 * first: a view afresh). */
static int can_take_back(int t)
{
    for (int i = 0; i < P[t].nkview; i++)
        if (!P[t].kview[i].block && find_buf(P[t].kview[i].v.id, NULL) && !find_buf(P[t].kview[i].v.id, NULL)->broken)
            return P[t].nview < MAXVIEW;
    return 0;
}
/* a vouched peer's view of a live buffer, to release first where no kept view can be taken back; -1: none */
static int releasable_view(int t)
{
    for (int i = 0; i < P[t].nview && P[t].nkview < MAXKEPT; i++) {
        buf_t *b = find_buf(P[t].view[i].id, NULL);
        if (P[t].view[i].vouched && !P[t].view[i].broken && b && !b->broken)
            return i;
    }
    return -1;
}
static int can_reopen(int t) { return can_take_back(t) || releasable_view(t) >= 0; }
static void op_view_reopen(int t)
{
    if (!can_take_back(t)) { /* released in this step */
        view_release_pick = releasable_view(t);
        op_view_release(t);
        view_release_pick = -1;
        if (!can_take_back(t))
            return;
    }
    int i = (int)below((uint64_t)P[t].nkview), sp;
    buf_t *b;
    while (P[t].kview[i].block || !(b = find_buf(P[t].kview[i].v.id, &sp)) || b->broken)
        i = (i + 1) % P[t].nkview;
    fabpool_buffer_info bi = binfo(b);
    snprintf(cur_what, sizeof cur_what, "pool %c, kept view of buffer %llu of pool %c opened again (gen %llu -> %llu)%s",
             'A' + t, (unsigned long long)b->id, 'A' + sp, (unsigned long long)P[t].kview[i].v.gen,
             (unsigned long long)bi.generation, P[t].kview[i].expired ? ", past keep_ms" : "");
    size_t len, nfds;
    fabpool_status st = do_export(sp, b, 0, &len, &nfds);
    EXPECT_OK(st, "view_reopen.export", "fabpool_buffer_export(since 0)");
    if (st != FABPOOL_OK)
        return;
    kept_drop(t, 0, 1, 1); /* an open gives back those past keep_ms first */
    int due = kept_view_of(t, b->id);
    view_t v = {0};
    st = fabpool_view_open_peer(P[t].p, getpid(), desc, len, mine, nfds, &v.h);
    EXPECT_OK(st, "view_reopen", "fabpool_view_open_peer");
    if (chance(75))
        fabpool_buffer_export_done(b->h);
    if (st != FABPOOL_OK)
        return;
    kview_t was;
    uint64_t at = (uint64_t)(uintptr_t)fabpool_view_ptr(v.h);
    int took = kept_view_taken(t, at, &was);
    EXPECT(took == due && (!took || (was.v.id == b->id && !was.block && v.h != was.v.h && !fabpool_view_ptr(was.v.h))),
           "view_reopen.same", "the open of buffer %llu's descriptor gave view %p at 0x%llx: %s", (unsigned long long)b->id,
           (void *)v.h, (unsigned long long)at, due ? "not a kept view of it, or under its released handle" :
           "a kept view although none of it was due");
    if (took) {
        fabpool_view_t *h = v.h;
        v = was.v;
        v.h = h;
    } else {
        v.src_pool = sp;
        v.id = b->id;
        v.vid = next_id++;
        v.window = b->window;
        v.base = at;
        memcpy(v.pts, b->pts, sizeof v.pts);
    }
    v.vouched = 1;
    v.gen = bi.generation;
    v.live = bi.mapped;
    v.src_size = b->size;
    fabpool_buffer_info vi = {.struct_size = sizeof vi};
    fabpool_view_get_info(v.h, &vi);
    EXPECT(vi.generation == v.gen && vi.mapped == v.live, "view_reopen.info", "view of buffer %llu: generation %llu, "
           "mapped %zu; the buffer %llu, %llu", (unsigned long long)b->id, (unsigned long long)vi.generation,
           vi.mapped, (unsigned long long)v.gen, (unsigned long long)v.live);
    P[t].view[P[t].nview++] = v;
    check_view(&P[t].view[P[t].nview - 1], -1);
    view_reads_buffer(&v, b);
}

/* keep_ms passes (the pools' clock moves on), then a call that gives back what is kept past it: a collect (every
 * kept buffer and view), a release or a reuse (kept buffers), a view release (kept views); then each pool's collect
 * gives back the rest. */
static void op_keep_expire(int p)
{
    kept_expire_all(600000 + 1000);
    int how = (int)below(4);
    snprintf(cur_what, sizeof cur_what, "pool %c: %d buffers and %d views kept, keep_ms passes, then %s", 'A' + p,
             P[p].nkbuf, P[p].nkview, how == 1 ? "a buffer release" : how == 2 ? "a reuse" : how == 3 ?
             "a view release" : "a collect");
    if (how == 1 && can_release(p))
        op_buffer_release(p);
    else if (how == 2 && P[p].nbuf < MAXBUF)
        op_buffer_reuse(p);
    else if (how == 3 && can_release_view(p))
        op_view_release(p);
    for (int k = 0; k < NPOOL; k++) {
        int q = (p + k) % NPOOL;
        fabpool_status st = fabpool_collect(P[q].p, 0);
        EXPECT_OK(st, "collect", "fabpool_collect after keep_ms passed");
        kept_drop(q, 1, 1, 1);
    }
}

/* An out-of-memory retry meets kept buffers: every cuMemCreate answers CUDA_ERROR_OUT_OF_MEMORY while pool p
 * allocates a block larger than its cache may hold, or grows a buffer.  Where the call needed new memory it fails
 * (FABPOOL_ERR_OUT_OF_MEMORY, the buffer as it was) and its retry gave the kept buffers back (not the kept views:
 * their memory is the exporter's); where it did not, it succeeds and nothing kept goes. */
static int has_kept_buf(int p) { return P[p].nblk < MAXBLK; }
static void op_oom(int p)
{
    int grow = P[p].nbuf > 0 && chance(50);
    buf_t *b = grow ? &P[p].buf[below((uint64_t)P[p].nbuf)] : NULL;
    size_t sz = grow ? (size_t)b->window : (size_t)(80 * MB + below(16 * MB));
    snprintf(cur_what, sizeof cur_what, "pool %c, %d buffers kept, %s %zu bytes, cuMemCreate out of memory", 'A' + p,
             P[p].nkbuf, grow ? "a buffer grown to" : "fabpool_alloc of", sz);
    if (grow && (b->broken || b->size >= sz))
        return;
    fabpool_buffer_info before = grow ? binfo(b) : (fabpool_buffer_info){0};
    blk_t nb = {NULL, sz, 0, next_id++, 0};
    fault_set("cuMemCreate", 1, 1, CUDA_ERROR_OUT_OF_MEMORY);
    fabpool_status st = grow ? fabpool_buffer_resize(b->h, sz, NULL) : fabpool_alloc(P[p].p, sz, &nb.p);
    fault_clear();
    EXPECT(st == FABPOOL_OK || st == FABPOOL_ERR_OUT_OF_MEMORY, "oom", "%s with every cuMemCreate out of memory -> "
           "%s: %s", grow ? "fabpool_buffer_resize" : "fabpool_alloc", fabpool_status_name(st), fabpool_last_error());
    if (!grow && st == FABPOOL_OK && P[p].own >= -1)
        P[p].own = OWN_OFF; /* fabpool_alloc ends the owner mode; a refused one does not */
    if (st != FABPOOL_OK) {
        kept_drop(p, 1, 0, 0);
        if (grow)
            same_info("oom.changed", b, &before);
        return;
    }
    if (grow) {
        size_t old = b->size;
        b->size = sz;
        after_resize(p, b, &before, old, -1);
        return;
    }
    fabpool_usable_size(P[p].p, nb.p, &nb.usable);
    write_blk(&nb);
    P[p].blk[P[p].nblk++] = nb;
}

static void op_collect(int p)
{
    fabpool_status st;
    int wait = chance(50);
    snprintf(cur_what, sizeof cur_what, "pool %c, wait %d", 'A' + p, wait);
    st = fabpool_collect(P[p].p, wait);
    EXPECT_OK(st, "collect", "fabpool_collect");
    if (wait) {
        check_step(0);
        check_quiet(p);
        for (int k = 0; k < P[p].nbuf; k++) {
            buf_t *b = &P[p].buf[k];
            if (b->hyst_stream >= 0 && !held[b->hyst_stream]) {
                check_hysteresis(b, b->hyst_stream);
                b->hyst_stream = -1;
            }
        }
    }
}

/* After a discard sleep's wake the pool's contents are unspecified: the program writes them again. */
static void rewrite_pool(int p)
{
    for (int i = 0; i < P[p].nblk; i++)
        write_blk(&P[p].blk[i]);
    for (int i = 0; i < P[p].nbuf; i++)
        if (!P[p].buf[i].broken)
            write_points(P[p].buf[i].id, P[p].buf[i].base, P[p].buf[i].pts, 0, P[p].buf[i].size);
}

/* A driver that will not unmap during pool p's next sleep: every unmap from the sleep's nth on (every 1), or the
 * nth alone, refused twice (every 2: the library tries each unmap twice), after a collect(wait) and a trim (what
 * the collect gave back included), so that every unmap of the sleep is one of its chunks and the nth chunk is the
 * first refused.  Returns the unmaps
 * made so far. */
static uint64_t sleep_fault_arm(int p, uint64_t nth, int every)
{
    EXPECT_OK(fabpool_collect(P[p].p, 1), "collect", "fabpool_collect(wait) before a sleep");
    EXPECT_OK(fabpool_trim(P[p].p, 0), "trim", "fabpool_trim(0) before a sleep");
    kept_drop(p, 1, 1, 0);
    uint64_t c0 = sim_calls("cuMemUnmap");
    fault_set("cuMemUnmap", nth, every, CUDA_ERROR_UNKNOWN);
    return c0;
}

/* A sleep whose nth chunk the driver would not unmap (and every one after it with every 1).  Where a rollback
 * gives the pool back as it was (an offload: its copies are there, and its wake frees them where no unmap is
 * refused any more or keeps them, sleep_keep_host: pool B; a discard refused at its first chunk), the sleep
 * answers an error with the pool awake and every sample in place.  A discard that has dropped contents goes on,
 * and an offload whose rollback cannot free its host copies stays asleep: FABPOOL_ERR_PARTIAL, the sim's ledger
 * equal to what the pools count, and a wake completes it. */
static void sleep_refused(int p, fabpool_status st, fabpool_sleep_mode mode, uint64_t nth, int every)
{
    n_sleep_faulted++;
    int partial = mode == FABPOOL_SLEEP_DISCARD ? nth > 1 : every == 1 && p == 0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    fabpool_sleep_info si = {.struct_size = sizeof si};
    fabpool_sleep_state(P[p].p, &si);
    EXPECT(st != FABPOOL_OK && strstr(msg, "cuMemUnmap") && (st == FABPOOL_ERR_PARTIAL) == partial &&
               si.asleep == partial && (!si.asleep || mode == FABPOOL_SLEEP_OFFLOAD || si.discarded_bytes > 0),
           "sleep.refused", "pool %c: the sleep answered %s, %s (discarded %llu bytes), where %s: %s", 'A' + p,
           fabpool_status_name(st), si.asleep ? "asleep" : "awake", (unsigned long long)si.discarded_bytes,
           partial ? "FABPOOL_ERR_PARTIAL and asleep was due" : "another error and awake was due", msg);
    if (!si.asleep) { /* rolled back: every sample in place */
        n_sleep_rolled_back++;
        for (int i = 0; i < P[p].nblk; i++)
            check_blk(&P[p].blk[i], -1);
        for (int i = 0; i < P[p].nbuf; i++)
            check_buf(&P[p].buf[i], -1);
        return;
    }
    n_sleep_partial++;
    fabpool_stats S[NPOOL];
    check_ledger(S, 0);
    st = fabpool_wake(P[p].p, NULL);
    EXPECT_OK(st, "wake", "fabpool_wake after a sleep that answered FABPOOL_ERR_PARTIAL");
    if (mode == FABPOOL_SLEEP_DISCARD) {
        rewrite_pool(p);
        return;
    }
    for (int i = 0; i < P[p].nblk; i++) /* an offload's copies restored */
        check_blk(&P[p].blk[i], -1);
    for (int i = 0; i < P[p].nbuf; i++)
        check_buf(&P[p].buf[i], -1);
}

static void op_sleep_wake(int p)
{
    fabpool_status st;
    int i;
    /* sleep with offload, checked asleep, then wake: the data is kept (check_step reads it back) */
    int viewed = 0;
    for (i = 0; i < P[1 - p].nview; i++)
        viewed |= P[1 - p].view[i].src_pool == p;
    if (!viewed && chance(60)) { /* no view of its buffers is open: its peers say they are gone */
        ack_dead(p, P[p].p);
        for (i = 0; i < P[p].nbuf; i++)
            if (P[p].buf[i].shared) {
                fabpool_buffer_export_done(P[p].buf[i].h);
                st = fabpool_buffer_peers_ack(P[p].buf[i].h, UINT64_MAX);
                EXPECT_OK(st, "peers_ack", "fabpool_buffer_peers_ack(UINT64_MAX) before a sleep");
                if (st == FABPOOL_OK)
                    P[p].buf[i].acked = UINT64_MAX;
            }
        kept_peers_gone(p);
    }
    int must = 1; /* no exported buffer, no destroyed one waiting for its peers: sleep must work */
    for (i = 0; i < P[p].nbuf; i++)
        must &= !P[p].buf[i].shared || P[p].buf[i].acked == UINT64_MAX;
    for (i = 0; i < ndead; i++)
        must &= dead[i].pool != p;
    must &= !kept_shared(p);
    fabpool_sleep_mode mode = chance(35) ? FABPOOL_SLEEP_DISCARD : FABPOOL_SLEEP_OFFLOAD;
    int fault = must && chance(40), every = chance(50) ? 1 : 2;
    uint64_t nth = 1 + below(6), c0 = 0;
    snprintf(cur_what, sizeof cur_what, "pool %c, %s, %s", 'A' + p, mode == FABPOOL_SLEEP_OFFLOAD ? "offload" :
             "discard", must ? "nothing exported" : "exported buffers");
    if (fault) {
        snprintf(cur_what + strlen(cur_what), sizeof cur_what - strlen(cur_what), ", unmap %llu%s refused",
                 (unsigned long long)nth, every == 1 ? " and on" : " (twice)");
        c0 = sleep_fault_arm(p, nth, every);
    }
    fabpool_stats s0 = {.struct_size = sizeof s0};
    fabpool_get_stats(P[p].p, &s0);
    st = fabpool_sleep(P[p].p, mode, NULL);
    if (fault) {
        fault_clear();
        if (sim_calls("cuMemUnmap") - c0 >= nth) {
            sleep_refused(p, st, mode, nth, every);
            return;
        }
    }
    if (st == FABPOOL_ERR_BUSY && !must) {
        fabpool_stats s1 = {.struct_size = sizeof s1};
        fabpool_get_stats(P[p].p, &s1);
        EXPECT(s1.mapped_bytes == s0.mapped_bytes, "sleep.busy", "pool %c: a refused sleep changed the mapping "
               "(%llu -> %llu bytes)", 'A' + p, (unsigned long long)s0.mapped_bytes,
               (unsigned long long)s1.mapped_bytes);
        n_sleep_busy++;
        return;
    }
    kept_drop(p, 1, 1, 0); /* a sleep gives back what was kept for reuse, whatever it answers but BUSY */
    EXPECT_OK(st, "sleep", mode == FABPOOL_SLEEP_OFFLOAD ? "fabpool_sleep(offload)" : "fabpool_sleep(discard)");
    if (st != FABPOOL_OK)
        return;
    n_slept++;
    /* asleep: the pool maps nothing of its own (its views of the other pool's buffers stay), the driver
     * holds its host copies and nothing more */
    fabpool_stats S[NPOOL];
    fabpool_sleep_info si = {.struct_size = sizeof si};
    fabpool_sleep_state(P[p].p, &si);
    uint64_t mapped = 0, chunks = 0;
    for (int k = 0; k < NPOOL; k++) {
        S[k].struct_size = sizeof S[k];
        fabpool_get_stats(P[k].p, &S[k]);
        mapped += S[k].mapped_bytes;
        chunks += S[k].chunks_mapped;
    }
    fabsim_ledger L = t_ledger();
    EXPECT(si.asleep && S[p].mapped_bytes == S[p].view_bytes, "sleep.mapped", "pool %c asleep maps %llu bytes, "
           "its views %llu", 'A' + p, (unsigned long long)S[p].mapped_bytes, (unsigned long long)S[p].view_bytes);
    uint64_t hcopies = 0, hbytes = host_held(&hcopies);
    EXPECT(L.bytes_mapped == mapped + hbytes && L.mappings == chunks + hcopies && L.bytes_held_host == hbytes &&
               (si.host_reused_bytes == 0 || p == 1), "sleep.ledger",
           "the sim maps %llu bytes in %llu mappings and holds %llu host bytes; the pools say %llu bytes in %llu "
           "chunks, the sleeping one %llu host bytes in %llu copies (both %llu in %llu), %llu reused",
           (unsigned long long)L.bytes_mapped, (unsigned long long)L.mappings,
           (unsigned long long)L.bytes_held_host, (unsigned long long)mapped, (unsigned long long)chunks,
           (unsigned long long)si.host_bytes, (unsigned long long)si.host_copies, (unsigned long long)hbytes,
           (unsigned long long)hcopies, (unsigned long long)si.host_reused_bytes);
    n_host_reused += si.host_reused_bytes > 0;
    void *x = NULL;
    fabpool_status ast = fabpool_alloc(P[p].p, 1 + below(20 * MB), &x);
    EXPECT(ast == FABPOOL_ERR_ASLEEP, "sleep.alloc", "fabpool_alloc while asleep -> %s",
           fabpool_status_name(ast));
    st = fabpool_wake(P[p].p, chance(50) ? NULL : (void *)streams[below(NSTREAM)]);
    EXPECT_OK(st, "wake", "fabpool_wake");
    fabpool_sleep_state(P[p].p, &si);
    /* awake: pool A (no sleep_keep_host) holds no host memory, pool B keeps its copies */
    EXPECT(!si.asleep && (p == 1 || si.host_bytes == 0) && t_ledger().bytes_held_host == host_held(NULL),
           "wake.host", "pool %c awake holds %llu host bytes, the sim %llu", 'A' + p,
           (unsigned long long)si.host_bytes, (unsigned long long)t_ledger().bytes_held_host);
    if (mode == FABPOOL_SLEEP_DISCARD) {
        n_slept_discard++;
        rewrite_pool(p);
    }
}

/* fabpool_record_stream: the block is used on stream s too, so that its free waits for s's work as a free on s
 * does (pend_on_record).  Not while the owner rule decides (test_record_stream models a recorded owner's free). */
static int can_record(int p) { return has_blk(p) && P[p].own == OWN_OFF; }
static void op_record_stream(int p)
{
    blk_t *b = &P[p].blk[below((uint64_t)P[p].nblk)];
    int s = (int)below(NSTREAM);
    snprintf(cur_what, sizeof cur_what, "pool %c, block %llu (%zu bytes), stream %d (%s)", 'A' + p,
             (unsigned long long)b->id, b->size, s, stream_name(s));
    fabpool_status st = fabpool_record_stream(P[p].p, b->p, streams[s]);
    EXPECT_OK(st, "record_stream", "fabpool_record_stream");
    if (st == FABPOOL_OK)
        b->recorded = s + 1;
}

/* fabpool_block_export of one of pool p's blocks, opened as a view in the other pool (from this process as a
 * vouched peer, or not): the view reads the block's samples and a word written through it reaches the block;
 * then it is released (kept by its pool, until a trim, where a peer was vouched for) or closed. */
static void op_block_export(int p)
{
    int t = 1 - p;
    blk_t *b = &P[p].blk[below((uint64_t)P[p].nblk)];
    int vouched = chance(50);
    snprintf(cur_what, sizeof cur_what, "pool %c, block %llu (%zu bytes at %p), viewed in pool %c%s", 'A' + p,
             (unsigned long long)b->id, b->size, b->p, 'A' + t, vouched ? " (a vouched peer)" : "");
    check_blk(b, -1);
    size_t len = 0, nfds = 0, off = 0;
    fabpool_status st = fabpool_block_export(P[p].p, b->p, desc, sizeof desc, &len, fds, MAXFD, &nfds, &off);
    EXPECT_OK(st, "block_export", "fabpool_block_export");
    if (st != FABPOOL_OK)
        return;
    uint32_t nr;
    memcpy(&nr, desc + 12, 4);
    EXPECT(nr >= 1 && len == fabpool_desc_size(nr) && nfds == (P[p].htype == FABPOOL_HANDLE_POSIX_FD ? nr : 0),
           "block_export.shape", "descriptor of %zu bytes, %zu fds, %u records", len, nfds, nr);
    (void)t_ledger(); /* the sim forgets the exported fds closed so far, before a dup may take their numbers */
    for (size_t i = 0; i < nfds; i++)
        mine[i] = dup(fds[i]); /* the pool keeps its own: the view takes these */
    fabpool_view_t *v = NULL;
    st = vouched ? fabpool_view_open_peer(P[t].p, getpid(), desc, len, mine, nfds, &v)
                 : fabpool_view_open(P[t].p, desc, len, mine, nfds, &v);
    EXPECT_OK(st, "block_export.view_open", vouched ? "fabpool_view_open_peer" : "fabpool_view_open");
    if (st != FABPOOL_OK)
        return;
    block_view_opened(t, v, vouched);
    uint64_t at = (uint64_t)(uintptr_t)fabpool_view_ptr(v) + off, pts[NPTS], tag = pat(next_id++, 0), got = 0;
    blk_points(b, pts);
    check_points("block_export.data", "block (read through a view of its export)", b->id, at, pts, 0, b->usable, -1);
    t_checks++;
    if (!put(at, tag) || probe((uint64_t)(uintptr_t)b->p, tag, &got) != 1)
        fail_("block_export.write", __LINE__, "a write through the view of block %llu at %p did not reach it (reads "
              "0x%llx, wrote 0x%llx)", (unsigned long long)b->id, b->p, (unsigned long long)got,
              (unsigned long long)tag);
    write_blk(b);
    st = block_view_let_go_as(t, v, b->id, vouched, chance(50));
    EXPECT_OK(st, "block_export.let_go", "fabpool_view_release / fabpool_view_close of a block's view");
}

/* fabpool_buffer_dmabuf of a page-aligned range in one of pool p's buffers' mapped bytes: an fd of that size,
 * counted by the sim while it is open (closed here). */
static void op_dmabuf(int p)
{
    buf_t *b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    fabpool_buffer_info bi = binfo(b);
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), pages = bi.mapped / pg;
    if (!pages)
        return;
    uint64_t first = below(pages), n = logsize(1, pages - first < 16384 ? pages - first : 16384);
    snprintf(cur_what, sizeof cur_what, "pool %c, buffer %llu (mapped %zu), bytes [%llu, +%llu)", 'A' + p,
             (unsigned long long)b->id, bi.mapped, (unsigned long long)(first * pg), (unsigned long long)(n * pg));
    int fd = -1;
    fabpool_status st = fabpool_buffer_dmabuf(b->h, (size_t)(first * pg), (size_t)(n * pg), &fd);
    if (st == FABPOOL_ERR_NOT_SUPPORTED)
        return;
    EXPECT_OK(st, "dmabuf", "fabpool_buffer_dmabuf");
    if (st != FABPOOL_OK)
        return;
    n_dmabufs++;
    EXPECT(fd >= 0 && lseek(fd, 0, SEEK_END) == (off_t)(n * pg) && t_ledger().dmabuf_fds == 1, "dmabuf.fd",
           "fd %d of %lld bytes (asked %llu), the sim counts %llu dma-buf fds", fd, fd >= 0 ? (long long)lseek(fd, 0,
           SEEK_END) : -1ll, (unsigned long long)(n * pg), (unsigned long long)t_ledger().dmabuf_fds);
    if (fd >= 0)
        close(fd);
}

static void op_hold(int p)
{
    (void)p; /* streams are the process's, not a pool's */
    int s = (int)below(NSTREAM);
    snprintf(cur_what, sizeof cur_what, "stream %d", s);
    EXPECT(stream_hold(streams[s]) == 0, "stream_hold", "fabsim_stream_hold failed");
    held[s] = 1;
    epoch[s]++;
}

static void op_release(int p)
{
    (void)p; /* streams are the process's, not a pool's */
    int s = (int)below(NSTREAM);
    if (!held[s])
        s = 1 - s;
    snprintf(cur_what, sizeof cur_what, "stream %d (%s)", s, held[s] ? "held" : "not held");
    EXPECT(stream_release(streams[s]) == 0, "stream_release", "fabsim_stream_release failed");
    held[s] = 0;
}

/* ------------------------------------------------------------ the table of operations */

static const op_def ops[] = {
    {"alloc", 12, has_room_blk, op_alloc},
    {"free", 10, has_blk, op_free},
    {"buffer_create", 5, has_room_buf, op_buffer_create},
    {"buffer_resize", 12, has_buf, op_buffer_resize},
    {"buffer_resize_set", 6, has_buf, op_buffer_resize_set},
    {"buffer_destroy", 4, has_buf, op_buffer_destroy},
    {"buffer_export", 5, has_buf, op_export},
    {"buffer_export_done", 4, has_buf, export_done},
    {"buffer_peers_ack", 6, has_shared, op_peers_ack},
    {"view_open", 6, can_open, op_view_open},
    {"view_apply", 8, has_appliable, op_view_apply},
    {"view_close", 5, has_view, close_view},
    {"buffer_release", 6, can_release, op_buffer_release},
    {"buffer_reuse", 6, can_reuse, op_buffer_reuse},
    {"view_release", 6, can_release_view, op_view_release},
    {"view_reopen", 8, can_reopen, op_view_reopen},
    {"keep_expire", 3, always, op_keep_expire},
    {"oom_retry", 3, has_kept_buf, op_oom},
    {"trim", 3, always, trim_pool},
    {"collect", 5, always, op_collect},
    {"thread_flush", 3, always, flush_thread_cache},
    {"stream_hold", 5, always, op_hold},
    {"stream_release", 5, always, op_release},
    {"alloc_on_stream", 6, has_room_blk, op_alloc_on_stream},
    {"free_on_stream", 6, has_blk, op_free_on_stream},
    {"sleep_wake", 3, always, op_sleep_wake},
    {"alloc_per_thread", 3, has_room_blk, op_alloc_per_thread},
    {"free_per_thread", 3, has_blk, op_free_per_thread},
    {"owner_end", 3, always, op_owner_end},
    {"alloc_aligned", 3, has_room_blk, op_alloc_aligned},
    {"record_stream", 3, can_record, op_record_stream},
    {"block_export", 3, has_blk, op_block_export},
    {"dmabuf", 3, has_buf, op_dmabuf},
    {"reset_peak", 3, always, reset_peak_pool},
};
#define NOPS ((int)(sizeof ops / sizeof ops[0]))
static unsigned op_weight[NOPS];
static long op_count[NOPS];

/* Synchronizing calls before the step's operation: when it made one, the pool waited for the GPU (a refit,
 * a NULL stream) and that work is done. */
static uint64_t step_syncs;
static void before_step(int p)
{
    (void)p;
    step_syncs = sync_calls();
}
static void after_step(int p)
{
    (void)p;
    if (sync_calls() == step_syncs)
        return;
    for (int i = 0; i < nrec; i++)
        rec[i].stream = -1;
    npend = 0;
}

/* nothing drawn applies: a collect, which always does */
static const op_run steps_of = {ops, NOPS, op_weight, op_count, 16, op_collect, before_step, after_step, check_step};

/* ------------------------------------------------------------ one seed */

static int setup_pools(void)
{
    for (int p = 0; p < NPOOL; p++) {
        memset(&P[p], 0, sizeof P[p]);
        fabpool_options o;
        fabpool_options_init(&o);
        o.handle_type = FABPOOL_HANDLE_POSIX_FD; /* FABPOOL_CONF=handle_type:fabric overrides it */
        o.reserve_bytes = 8ull << 30; /* windows of at most 128 MiB; under valgrind two pools of 32 GiB a seed fragmented its address space */
        o.cache_limit_bytes = 64 * MB; /* frees reach the driver now and then */
        o.max_chunk_bytes = 32 * MB;   /* buffers of several chunks */
        o.stream_owner = p == 0;       /* A: the owner stream; B: every stream queues */
        o.sleep_keep_host = p == 1;    /* B: wake keeps the host copies for the next sleep */
        o.keep_ms = 600000;            /* a release is reused at once, however slow the run (valgrind) */
        P[p].own = p == 0 ? OWN_NONE : OWN_OFF;
        fabpool_status st = fabpool_create(&o, &P[p].p);
        EXPECT_OK(st, "pool_create", "fabpool_create");
        if (st != FABPOOL_OK)
            return -1;
        fabpool_options got = {.struct_size = sizeof got};
        fabpool_get_options(P[p].p, &got);
        hysteresis = got.shrink_hysteresis_percent;
        htype = P[p].htype = fabpool_handle_type_of(P[p].p);
    }
    nrec = 0;
    npend = 0;
    ndead = 0;
    memset(peak_seen, 0, sizeof peak_seen);
    for (int s = 0; s < NSTREAM; s++) {
        stream_release(streams[s]);
        held[s] = 0;
    }
    return 0;
}

/* fabpool_destroy of pool p (which has kept the records and spare events of the streams it met), some while the
 * driver cannot say which context is current (every call from the n-th on): whatever the destroy answers then,
 * the pool is gone (the ledger at the end), and the calling thread's context is the one it had. */
static void destroy_pool(int p)
{
    int fault = chance(50);
    uint64_t nth = 1 + below(3);
    CUcontext ctx0 = NULL, ctx1 = NULL;
    cuCtxGetCurrent(&ctx0);
    snprintf(cur_what, sizeof cur_what, "pool %c%s", 'A' + p, fault ? ", cuCtxGetCurrent failing" : "");
    if (fault)
        fault_set("cuCtxGetCurrent", nth, 1, CUDA_ERROR_UNKNOWN);
    fabpool_status st = fabpool_destroy(P[p].p);
    if (fault)
        fault_clear();
    n_destroy_faulted += fault;
    if (!fault || st == FABPOOL_OK || !strstr(fabpool_last_error(), "cuCtxGetCurrent"))
        EXPECT_OK(st, "pool_destroy", "fabpool_destroy");
    cuCtxGetCurrent(&ctx1);
    EXPECT(ctx1 == ctx0, "pool_destroy.context", "fabpool_destroy of pool %c%s left the thread's current context %p "
           "(it was %p)", 'A' + p, fault ? " (cuCtxGetCurrent failing)" : "", (void *)ctx1, (void *)ctx0);
    if (ctx1 != ctx0) /* the seeds that follow need it */
        cuCtxSetCurrent(ctx0);
    P[p].p = NULL;
}

static void teardown(void)
{
    cur_op = "teardown";
    cur_step = -1;
    snprintf(cur_what, sizeof cur_what, "all views closed, buffers acked and destroyed, blocks freed");
    for (int s = 0; s < NSTREAM; s++)
        stream_release(streams[s]);
    for (int p = 0; p < NPOOL; p++)
        while (P[p].nview) {
            fabpool_status st = fabpool_view_close(P[p].view[0].h);
            EXPECT_OK(st, "teardown.view_close", "fabpool_view_close");
            drop_view(p, 0);
        }
    for (int p = 0; p < NPOOL; p++) {
        pool_t *q = &P[p];
        while (q->nbuf) {
            buf_t *b = &q->buf[0];
            if (b->shared) {
                fabpool_buffer_info bi = binfo(b);
                fabpool_buffer_export_done(b->h);
                fabpool_status st = fabpool_buffer_peers_ack(b->h, bi.generation); /* no view is left */
                EXPECT_OK(st, "teardown.ack", "fabpool_buffer_peers_ack");
                if (st == FABPOOL_OK && bi.generation > b->acked)
                    b->acked = bi.generation;
            }
            fabpool_status st = fabpool_buffer_destroy(b->h, NULL);
            EXPECT_OK(st, "teardown.buffer_destroy", "fabpool_buffer_destroy");
            q->buf[0] = q->buf[--q->nbuf];
        }
        while (q->nblk) {
            fabpool_status st = fabpool_free(q->p, q->blk[0].p);
            EXPECT_OK(st, "teardown.free", "fabpool_free");
            q->blk[0] = q->blk[--q->nblk];
        }
    }
    int trimmed[NPOOL] = {0};
    for (int p = 0; p < NPOOL; p++) {
        ack_dead(p, P[p].p);
        fabpool_status st = fabpool_collect(P[p].p, 1);
        EXPECT_OK(st, "teardown.collect", "fabpool_collect(wait)");
        if ((trimmed[p] = chance(50))) { /* else the pools' destroy meets what is kept, and the cache */
            st = fabpool_trim(P[p].p, 0);
            EXPECT_OK(st, "teardown.trim", "fabpool_trim(0)");
            kept_drop(p, 1, 1, 0);
        }
    }
    check_step(1);
    for (int p = 0; p < NPOOL; p++) {
        int excused = 0; /* exported buffers destroyed un-acked keep their memory until pool destroy */
        for (int i = 0; i < nrec; i++)
            excused += rec[i].pool == p;
        fabpool_stats s = {.struct_size = sizeof s};
        fabpool_get_stats(P[p].p, &s);
        EXPECT(s.stream_pending_blocks == 0, "teardown.stream_pending", "pool %c: %llu blocks still pending on "
               "streams after collect(wait)", 'A' + p, (unsigned long long)s.stream_pending_blocks);
        EXPECT(excused || ((trimmed[p] ? s.mapped_bytes == 0 : s.mapped_bytes >= kept_model(p)) && s.buffers == 0 &&
                           s.retiring_bytes == 0),
               "teardown.leak", "pool %c: %llu bytes mapped (%llu kept for reuse), %llu retiring and %llu buffers "
               "left after everything was freed, collect(wait) and trim(0) or not", 'A' + p,
               (unsigned long long)s.mapped_bytes, (unsigned long long)kept_model(p),
               (unsigned long long)s.retiring_bytes, (unsigned long long)s.buffers);
    }
    for (int p = 0; p < NPOOL; p++)
        destroy_pool(p);
    nrec = 0;
    ndead = 0;
    check_ledger_empty();
}

static void run_seed(unsigned long long seed, long steps)
{
    cur_seed = seed;
    cur_step = -1;
    cur_op = "setup";
    next_id = 1; /* object numbers in messages are the same when a seed runs alone */
    if (setup_pools() != 0) {
        for (int p = 0; p < NPOOL; p++)
            if (P[p].p)
                fabpool_destroy(P[p].p);
        return;
    }
    /* the handle type takes part: the posix_fd and fabric runs of one seed are different sequences */
    rng_s = mix(seed * 0x9e3779b97f4a7c15ull + 12345 + (uint64_t)htype);
    run_steps(&steps_of, seed, steps);
    teardown();
}

int main(int argc, char **argv)
{
    int a = 1;
    if (argc > a && strcmp(argv[a], "-v") == 0) {
        verbose = 1;
        a++;
    }
    unsigned long long first = argc > a ? strtoull(argv[a], NULL, 0) : 1;
    long n_seeds = argc > a + 1 ? atol(argv[a + 1]) : 300;
    long steps = argc > a + 2 ? atol(argv[a + 2]) : 2000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    say_where_on_crash();
    int sim = t_driver_init();
    fault_set = (fault_set_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    fault_clear = (fault_clear_fn)dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    sim_calls = (calls_fn)dlsym(RTLD_DEFAULT, "fabsim_calls");
    stream_hold = (hold_fn)dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    stream_release = (hold_fn)dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    if (!sim || !stream_hold || !fault_set || !sim_calls) {
        printf("test_property: needs the simulated driver (ledger, stream holds, faults); skipped\n");
        return 0;
    }
    if (SANITIZED && n_seeds > 30) {
        printf("test_property: sanitizer build: %ld seeds instead of %ld\n", n_seeds / 10, n_seeds);
        n_seeds /= 10;
    }
    gran = granularity();
    for (int s = 0; s < NSTREAM; s++)
        CHECK_CU(cuStreamCreate(&streams[s], 0));
    const char *conf = getenv("FABPOOL_CONF");
    known_failures = getenv("FABPOOL_TEST_KNOWN_FAILURES");
    op_weights(&steps_of, "test_property");
    printf("test_property: seeds %llu..%llu, %ld steps each, FABPOOL_CONF=%s\n", first,
           first + (unsigned long long)n_seeds - 1, steps, conf ? conf : "");
    double t0 = now();
    for (long k = 0; k < n_seeds; k++)
        run_seed(first + (unsigned long long)k, steps);
    double dt = now() - t0;
    printf("test_property: handle type %s; %ld seeds x %ld steps = %ld steps in %.1f s (%.1f us a step), %d checks\n",
           htype == FABPOOL_HANDLE_FABRIC ? "fabric" : "posix_fd", n_seeds, steps, total_steps, dt,
           total_steps ? dt * 1e6 / (double)total_steps : 0.0, t_checks);
    printf("  fabpool_check: %llu calls (each pool after every step), none failed unless said below\n",
           (unsigned long long)n_pool_checks);
    printf("  bad input refused or not: %ld resize_set with a buffer twice, %ld acks of a generation never issued, "
           "%ld view applies with a failing import\n", n_dup, n_bad_ack, n_fault_apply);
    printf("  retirements followed: %ld on a held stream, %ld awaiting an ack; %ld collect(wait) with nothing "
           "pending checked for leftovers; peak mapped %.1f MiB (both pools)\n", n_rec_stream, n_rec_ack, n_quiet,
           (double)peak_mapped / (double)MB);
    printf("  sleep_wake: %ld slept and woke (%ld with discard, their data written again; %ld into host copies kept "
           "from the last wake), %ld refused (exported buffers); %ld met a refused unmap: %ld rolled back with their "
           "data, %ld answered FABPOOL_ERR_PARTIAL asleep and woke\n", n_slept, n_slept_discard, n_host_reused,
           n_sleep_busy, n_sleep_faulted, n_sleep_rolled_back, n_sleep_partial);
    printf("  pool destroys while cuCtxGetCurrent failed: %ld; dma-bufs opened: %ld\n", n_destroy_faulted, n_dmabufs);
    CHECK(n_slept > 0);
    print_op_shares(&steps_of, 1.0, "test_property");
    print_kinds("test_property", NULL, 0);
    for (int s = 0; s < NSTREAM; s++)
        cuStreamDestroy(streams[s]);
    return t_done("test_property");
}
