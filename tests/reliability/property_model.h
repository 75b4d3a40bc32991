/* property_model.h - the model both property tests keep of what they did
 * (test_property, test_combined), and what reads it the same way in both:
 *   - the pools with their blocks, buffers and views (pool_t P[]);
 *   - buffer memory that must stay: retired on a held stream, or dropped
 *     from an exported buffer its peers have not acked (rec[]);
 *   - blocks freed on a held stream (pend[]);
 *   - the streams, held or not (fabsim_stream_hold), with an epoch per hold;
 * the data checks of blocks, buffers and views, the ledger against the
 * pools' stats, the overlap of live ranges, exports, and the owner rule.
 * The program defines NPOOL, NSTREAM, MAXBLK, MAXBUF, MAXVIEW, MAXREC,
 * MAXPEND and MAXFD, and includes it once, after property.h. */
#ifndef FP_PROPERTY_MODEL_H
#define FP_PROPERTY_MODEL_H

#include "property.h"

/* ------------------------------------------------------------ the pools' options */

enum { TRACE_NONE, TRACE_MIXED, TRACE_STREAM_ONLY };
typedef struct pool_conf {
    fabpool_handle_type handle;
    int stream_owner, thread_cache, small_reserve, keep_host, trace;
    int slab_max_kib; /* 0: the default slab_max */
    int whole;        /* 1: large_chunks:whole (a large block's growth as one chunk of up to max_chunk) */
} pool_conf;

/* ------------------------------------------------------------ the model */

typedef struct {
    fabpool_buffer_t *h;
    uint64_t id, base, window;
    size_t size;
    uint64_t pts[NPTS];  /* sample offsets in the window; those below size hold pat(id, x) */
    int shared;          /* exported at least once */
    uint64_t acked;      /* the highest generation acked */
    uint64_t shrunk_gen; /* the generation its last shrink made */
    int broken;          /* a check already failed on it: not checked again, destroyed next */
    int hyst_stream;     /* shrunk on this stream: the hysteresis bound is checked at a collect(wait) after it */
    size_t hyst_from;    /* (the size before that shrink; hyst_stream -1: nothing due) */
} buf_t;

typedef struct {
    fabpool_view_t *h;
    int src_pool;
    uint64_t id, gen, live; /* id: the source buffer's */
    uint64_t vid, base, window;
    size_t src_size;        /* the source's size at the generation the view has: samples below it hold the pattern */
    uint64_t pts[NPTS];
    int broken;
    int vouched;            /* opened with fabpool_view_open_peer: a release keeps it for a reopen from the peer */
} view_t;

/* Buffer memory a shrink or destroy dropped while it must stay: retired on
 * a held stream (mapped, with its data, until the stream's work is done),
 * or dropped from an exported buffer before its peers acked (kept for them:
 * the views' checks cover it). */
typedef struct {
    int pool;
    uint64_t id, base;
    size_t lo, hi;         /* offsets in the buffer's window whose samples must still read back */
    uint64_t dropped;      /* bytes the buffer stopped counting as mapped */
    uint64_t va_lo, va_hi; /* where they are: no other object may be given this range meanwhile */
    int destroyed;         /* the buffer is gone */
    int stream;            /* -1: none */
    uint64_t epoch;        /* the stream's hold when it was retired */
    int ack_wait;          /* an exported buffer: until acked >= gen_after */
    uint64_t gen_after;
    uint64_t pts[NPTS];
} rec_t;

/* A block freed with fabpool_free_on_stream while its stream was held: the
 * GPU may still use it, so until the stream's work is done it stays mapped
 * with its data, no other object may overlap it, and only an allocation on
 * the same stream may get it back. */
typedef struct {
    int pool, stream;
    uint64_t epoch;
    blk_t b;
    int owner;  /* freed on the pool's owner stream: freed into the pool at once (retire.h); the owner may
                 * reuse its memory in any shape, nobody else may while the stream is held, and nothing may
                 * unmap it until then */
    int nodata; /* a discard sleep dropped its contents */
} pend_t;

enum { OWN_NONE = -3, OWN_OFF = -2 }; /* else the owner stream (-1: NULL) */

/* Released and kept for reuse (keep_ms, fabpool.h): a buffer given up with fabpool_buffer_release, as the model
 * had it then, and its mapped bytes then; a view given up with fabpool_view_release that a vouched peer opened
 * (a buffer's view, or a block export's).  Each keeps its window (no other object may overlap it) and maps what
 * it mapped, counted in fabpool_stats.kept_bytes, until a reuse or an open takes it back or the pool gives it back
 * (keep_ms passed, a reuse that finds none, trim, an out-of-memory retry for buffers, sleep, pool destroy). */
#define MAXKEPT 16
typedef struct {
    buf_t b;
    uint64_t live;          /* mapped at the release */
    fabpool_buffer_t *gone; /* the released handle: refused from then on */
    uint64_t export_id;     /* its peers are acknowledged by it (fabpool_peers_ack) while it is kept */
    int expired;            /* keep_ms has passed (the pools' clock moved on): the pool's next drop gives it back */
} kbuf_t;
typedef struct {
    view_t v;               /* v.live: mapped at the release */
    int block;              /* a block export's view (v.id: the block's) */
    int expired;
} kview_t;

typedef struct {
    fabpool_t *p;
    pool_conf c;
    fabpool_handle_type htype;
    blk_t blk[MAXBLK];
    int nblk;
    buf_t buf[MAXBUF];
    int nbuf;
    view_t view[MAXVIEW];
    int nview;
    int asleep;
    int partial;            /* asleep by a sleep that answered FABPOOL_ERR_PARTIAL: the chunks the driver would not
                             * unmap stay mapped until the wake */
    fabpool_sleep_mode mode;
    int own;                /* the owner stream as the library's rule makes it */
    const char *refused;    /* a refused call that may have changed the owner since it was last seen: its key */
    char trace_path[FABPOOL_TRACE_PATH_MAX];
    uint64_t tr_allocs, tr_live, tr_peak; /* allocations that succeeded, live bytes asked, and their peak */
    int tr_streams;         /* the stream pair was used */
    uint64_t tr_bad_frees;  /* frees of bad pointers: a trace may record them (a free is recorded before it is
                             * checked) */
    kbuf_t kbuf[MAXKEPT];   /* buffers released and kept */
    int nkbuf;
    kview_t kview[MAXKEPT]; /* views released and kept (views of the other pools' buffers and blocks) */
    int nkview;
} pool_t;

static pool_t P[NPOOL];
static pend_t pend[MAXPEND];
static int npend;
static rec_t rec[MAXREC];
static int nrec;
static CUstream streams[NSTREAM];
static int held[NSTREAM];
static uint64_t epoch[NSTREAM];
static uint64_t next_id = 1;
static uint64_t step_first_id; /* objects numbered from here on were created by this step */
static uint64_t gran = 2 * MB;
static int verbose;
/* retirements followed (on a held stream, awaiting an ack); grows while a retirement of the same buffer pends
 * on another stream */
static long n_rec_stream, n_rec_ack, n_cross_grow;

/* ------------------------------------------------------------ patterns */

/* a block's samples: its first and last 8 bytes */
static inline void blk_points(const blk_t *b, uint64_t *pts)
{
    for (int i = 0; i < NPTS; i++)
        pts[i] = i % 2 ? b->usable - 8 : 0;
}
static inline void write_blk(const blk_t *b)
{
    uint64_t pts[NPTS];
    blk_points(b, pts);
    write_points(b->id, (uint64_t)(uintptr_t)b->p, pts, 0, b->usable);
}
static inline int check_blk(const blk_t *b, int which)
{
    uint64_t pts[NPTS];
    blk_points(b, pts);
    return check_points("data.block", "block", b->id, (uint64_t)(uintptr_t)b->p, pts, 0, b->usable, which);
}
/* 1 if a sample of b fails now (b is broken from then on: not checked again) */
static inline int check_buf(buf_t *b, int which)
{
    if (b->broken)
        return 0;
    b->broken = check_points("data.buffer", "buffer", b->id, b->base, b->pts, 0, b->size, which);
    return b->broken;
}
static inline int check_view(view_t *v, int which)
{
    if (v->broken)
        return 0;
    uint64_t hi = v->src_size < v->live ? v->src_size : v->live;
    v->broken = check_points("data.view", "view of buffer", v->id, v->base, v->pts, 0, hi, which);
    return v->broken;
}

/* ------------------------------------------------------------ streams and the model */

/* The sim's view: a synchronizing call (a fence, a sleep, a NULL-stream shrink) completes a stream. */
static inline void refresh_streams(void)
{
    for (int s = 0; s < NSTREAM; s++)
        held[s] = cuStreamQuery(streams[s]) == CUDA_ERROR_NOT_READY;
}
/* the hold of stream s at epoch ep still lasts */
static inline int pending_on(int s, uint64_t ep) { return s >= 0 && held[s] && epoch[s] == ep; }

static inline fabpool_buffer_info binfo(const buf_t *b)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    fabpool_buffer_get_info(b->h, &i);
    return i;
}

static inline buf_t *find_buf(uint64_t id, int *pool)
{
    for (int p = 0; p < NPOOL; p++)
        for (int i = 0; i < P[p].nbuf; i++)
            if (P[p].buf[i].id == id) {
                if (pool)
                    *pool = p;
                return &P[p].buf[i];
            }
    return NULL;
}

/* The host memory the pools hold for sleep: copies of a sleeping pool, and the copies a pool with
 * sleep_keep_host kept from its last wake. */
static inline uint64_t host_held(uint64_t *copies)
{
    uint64_t b = 0, c = 0;
    for (int k = 0; k < NPOOL; k++) {
        fabpool_sleep_info si = {.struct_size = sizeof si};
        if (P[k].p && fabpool_sleep_state(P[k].p, &si) == FABPOOL_OK) {
            b += si.host_bytes;
            c += si.host_copies;
        }
    }
    if (copies)
        *copies = c;
    return b;
}

/* The owner rule (fabpool.h): 1 if stream s is pool p's owner (it claims a pool without one); any other
 * stream ends the owner mode for good. */
static inline int own_would(int p, int s) { return P[p].own == OWN_NONE || P[p].own == s; }
static inline int own_claim(int p, int s)
{
    int r = own_would(p, s);
    P[p].own = r || P[p].own == OWN_NONE ? s : OWN_OFF;
    return r;
}

static inline int rec_stream_pending(const rec_t *r) { return pending_on(r->stream, r->epoch); }

/* Pending: on a held stream, or awaiting the peers' ack.  Memory awaiting an
 * ack only must stay held for the peers (a late import must work, and the
 * views read it), not mapped in the exporter's window: a shrink that refits
 * a buffer moves it out and keeps it by a handle (held_for_peers_bytes), and
 * the pool may unmap what no unacknowledged generation names
 * (docs/design.md, Lifetime rules); the views' data checks cover it. */
static inline int rec_pending(rec_t *r)
{
    if (rec_stream_pending(r))
        return 1;
    if (r->ack_wait) {
        if (r->destroyed)
            return 0; /* the pool unmaps what no unacknowledged generation names; the rest waits for
                       * fabpool_peers_ack by export id (dead[]) or pool destroy */
        buf_t *b = find_buf(r->id, NULL);
        if (b && b->acked < r->gen_after)
            return 1;
        r->ack_wait = 0;
    }
    return 0;
}

/* `dropped` bytes of buffer b at offset `at` (its samples in [lo, hi)) that a shrink or destroy on stream s
 * gave up, followed while they must stay (a held stream, or peers that have not acked gen_after). */
static inline void add_rec(int pool, const buf_t *b, size_t lo, size_t hi, uint64_t at, uint64_t dropped, int stream,
                           int destroyed, uint64_t gen_after)
{
    int sw = stream >= 0 && held[stream];
    int aw = b->shared && b->acked < gen_after;
    if (!dropped || (!sw && !aw) || nrec == MAXREC)
        return;
    n_rec_stream += sw;
    n_rec_ack += aw;
    rec[nrec++] = (rec_t){pool, b->id, b->base, lo, hi, dropped, b->base + at, b->base + at + dropped, destroyed,
                          sw ? stream : -1, sw ? epoch[stream] : 0, aw, gen_after, {0}};
    memcpy(rec[nrec - 1].pts, b->pts, sizeof b->pts);
}

/* A grow of b on stream s that maps up to live_end: the retired ranges it took back (inside the live
 * mapping now) are live again, and no longer followed. */
static inline void grow_took_back(const buf_t *b, uint64_t live_end, int s)
{
    int w = 0;
    for (int i = 0; i < nrec; i++) {
        rec_t *r = &rec[i];
        if (r->id == b->id && !r->destroyed && rec_stream_pending(r) && r->stream != s)
            n_cross_grow++;
        if (r->id == b->id && !r->destroyed && r->va_lo < live_end) {
            if (r->va_hi <= live_end)
                continue; /* all of it came back */
            r->dropped -= live_end - r->va_lo; /* the chunks behind those that came back stay retired */
            r->va_lo = live_end;
        }
        rec[w++] = *r;
    }
    nrec = w;
}

/* A block freed (on stream s; -2: by fabpool_free) with a stream recorded on it (fabpool_record_stream) whose work
 * pends waits for that work, as a block freed on that stream does: only that stream may have it back meanwhile. */
static inline void pend_on_record(int p, const blk_t *b, int s)
{
    int rs = b->recorded - 1;
    refresh_streams();
    if (rs >= 0 && rs != s && held[rs] && npend < MAXPEND && !P[p].asleep)
        pend[npend++] = (pend_t){p, rs, epoch[rs], *b, 0, 0};
}

/* 1 if buffer b changed since `before` although the call failed or was refused (reported as `key`). */
static inline int same_info(const char *key, const buf_t *b, const fabpool_buffer_info *before)
{
    fabpool_buffer_info bi = binfo(b);
    int same = bi.size == before->size && bi.mapped == before->mapped && bi.generation == before->generation &&
               bi.n_chunks == before->n_chunks;
    EXPECT(same, key, "buffer %llu changed although the call failed or was refused: size %zu -> %zu, "
           "mapped %zu -> %zu, generation %llu -> %llu", (unsigned long long)b->id, before->size, bi.size,
           before->mapped, bi.mapped, (unsigned long long)before->generation, (unsigned long long)bi.generation);
    return !same;
}

static inline void drop_view(int p, int i) { P[p].view[i] = P[p].view[--P[p].nview]; }

/* ------------------------------------------------------------ kept buffers and views */

/* What pool p's kept buffers and views map: fabpool_stats.kept_bytes. */
static inline uint64_t kept_model(int p)
{
    uint64_t n = 0;
    for (int i = 0; i < P[p].nkbuf; i++)
        n += P[p].kbuf[i].live;
    for (int i = 0; i < P[p].nkview; i++)
        n += P[p].kview[i].v.live;
    return n;
}

/* Pool p gives back its kept buffers (bufs) and views (views): every one, or (expired) those past keep_ms. */
static inline void kept_drop(int p, int bufs, int views, int expired)
{
    pool_t *q = &P[p];
    for (int i = 0; bufs && i < q->nkbuf;)
        if (!expired || q->kbuf[i].expired)
            q->kbuf[i] = q->kbuf[--q->nkbuf];
        else
            i++;
    for (int i = 0; views && i < q->nkview;)
        if (!expired || q->kview[i].expired)
            q->kview[i] = q->kview[--q->nkview];
        else
            i++;
}

/* Pool p's kept buffers that were exported: their peers acknowledged as gone (fabpool_peers_ack by export id with
 * UINT64_MAX), as a program does before a sleep once its peers closed their views. */
static inline void kept_peers_gone(int p)
{
    for (int i = 0; i < P[p].nkbuf; i++) {
        kbuf_t *k = &P[p].kbuf[i];
        if (!k->b.shared || k->b.acked == UINT64_MAX)
            continue;
        fabpool_status st = fabpool_peers_ack(P[p].p, k->export_id, UINT64_MAX);
        EXPECT(st == FABPOOL_OK, "kept.peers_ack", "fabpool_peers_ack of kept buffer 0x%llx (export id) -> %s: %s",
               (unsigned long long)k->export_id, fabpool_status_name(st), fabpool_last_error());
        if (st == FABPOOL_OK)
            k->b.acked = UINT64_MAX;
    }
}
/* 1 if pool p keeps a buffer that was exported and whose peers may still import it (a sleep is refused) */
static inline int kept_shared(int p)
{
    for (int i = 0; i < P[p].nkbuf; i++)
        if (P[p].kbuf[i].b.shared && P[p].kbuf[i].b.acked != UINT64_MAX)
            return 1;
    return 0;
}

/* Buffer b may be released: its model is sound, and its peers (if exported) acked its generation (fabric: no peer
 * may still import a released buffer). */
static inline int buf_releasable(const buf_t *b)
{
    return !b->broken && (!b->shared || b->acked >= binfo(b).generation);
}
/* Pool p has a buffer to release and room to keep it. */
static inline int has_releasable(int p)
{
    for (int i = 0; i < P[p].nbuf && P[p].nkbuf < MAXKEPT; i++)
        if (buf_releasable(&P[p].buf[i]))
            return 1;
    return 0;
}

/* keep_ms passes for every kept buffer and view of every pool: the pools' clock moves on by `ms` (> keep_ms). */
static inline void kept_expire_all(uint64_t ms)
{
    clock_skew_ns += ms * 1000000ull;
    for (int p = 0; p < NPOOL; p++) {
        for (int i = 0; i < P[p].nkbuf; i++)
            P[p].kbuf[i].expired = 1;
        for (int i = 0; i < P[p].nkview; i++)
            P[p].kview[i].expired = 1;
    }
}

/* A view opened at `base` in pool t by fabpool_view_open_peer: 1 (and the kept view forgotten, *was a copy of it)
 * if it is a kept view taken back (the same address). */
static inline int kept_view_taken(int t, uint64_t base, kview_t *was)
{
    for (int i = 0; i < P[t].nkview; i++)
        if (P[t].kview[i].v.base == base) {
            if (was)
                *was = P[t].kview[i];
            P[t].kview[i] = P[t].kview[--P[t].nkview];
            return 1;
        }
    return 0;
}

/* Whether pool t keeps a view of buffer `id` (not a block's) that an open of its descriptor by the same peer must
 * take back. */
static inline int kept_view_of(int t, uint64_t id)
{
    for (int i = 0; i < P[t].nkview; i++)
        if (!P[t].kview[i].block && P[t].kview[i].v.id == id)
            return 1;
    return 0;
}

/* A view of block `id` opened in pool t by a vouched peer (or not): a kept view of the block's chunks that it took
 * back (its address) is no longer kept. */
static inline void block_view_opened(int t, fabpool_view_t *v, int vouched)
{
    if (vouched)
        (void)kept_view_taken(t, (uint64_t)(uintptr_t)fabpool_view_ptr(v), NULL);
}

/* Pool t's view v of block `id` let go: released (kept where a vouched peer opened it and the model has room for
 * it) or closed. */
static inline fabpool_status block_view_let_go_as(int t, fabpool_view_t *v, uint64_t id, int vouched, int release)
{
    fabpool_buffer_info vi = {.struct_size = sizeof vi};
    fabpool_view_get_info(v, &vi);
    release &= !vouched || P[t].nkview < MAXKEPT;
    fabpool_status st = release ? fabpool_view_release(v) : fabpool_view_close(v);
    if (st == FABPOOL_OK && release)
        kept_drop(t, 0, 1, 1); /* a release gives back kept views past keep_ms */
    if (st == FABPOOL_OK && release && vouched) {
        kview_t k = {{0}, 1, 0};
        k.v.id = id;
        k.v.vid = next_id++;
        k.v.base = (uint64_t)(uintptr_t)vi.base;
        k.v.window = vi.max_size;
        k.v.live = vi.mapped;
        k.v.vouched = 1;
        k.v.src_pool = -1;
        P[t].kview[P[t].nkview++] = k;
    }
    return st;
}

/* ------------------------------------------------------------ exports */

static uint8_t desc[FABPOOL_DESC_HEADER_BYTES + MAXFD * FABPOOL_DESC_RECORD_BYTES];
static int fds[MAXFD], mine[MAXFD];

/* fabpool_buffer_export of pool p's buffer b into desc and fds; mine[] gets the peer's copies of the fds
 * (dup'ed: the view takes them). */
static inline fabpool_status do_export(int p, buf_t *b, uint64_t since, size_t *len, size_t *nfds)
{
    fabpool_status st = fabpool_buffer_export(b->h, since, desc, sizeof desc, len, fds, MAXFD, nfds);
    if (st == FABPOOL_OK) {
        b->shared = 1;
        if (b->acked == UINT64_MAX) /* "no peer is left", then a new export: a new peer may import (fabpool.h) */
            b->acked = binfo(b).generation - 1;
        uint32_t nr;
        memcpy(&nr, desc + 12, 4);
        EXPECT(*len == fabpool_desc_size(nr) && (P[p].htype != FABPOOL_HANDLE_POSIX_FD || *nfds == nr),
               "export.shape", "descriptor of %zu bytes, %zu fds for %u records", *len, *nfds, nr);
        (void)t_ledger(); /* the sim forgets the exported fds closed so far, before a dup may take their numbers */
        for (size_t i = 0; i < *nfds; i++)
            mine[i] = dup(fds[i]);
    }
    return st;
}

/* ------------------------------------------------------------ checks */

/* The sim's ledger against the pools' stats (in S, filled here): bytes mapped, mappings, handles and
 * exported fds; host copies of sleeping pools count as mappings; `dmabufs` dma-buf fds are open.  Each
 * pool's blocks and buffers as the model has them; a sleeping pool maps its views only.  Returns the
 * ledger it read. */
static inline fabsim_ledger check_ledger(fabpool_stats S[NPOOL], uint64_t dmabufs)
{
    fabsim_ledger L = t_ledger();
    uint64_t mapped = 0, handles = 0, efds = 0, chunks = 0;
    for (int p = 0; p < NPOOL; p++) {
        S[p] = (fabpool_stats){.struct_size = sizeof S[p]};
        fabpool_get_stats(P[p].p, &S[p]);
        mapped += S[p].mapped_bytes;
        handles += S[p].handles_outstanding;
        efds += S[p].exported_fds_open;
        chunks += S[p].chunks_mapped;
    }
    uint64_t hcopies = 0, hbytes = host_held(&hcopies);
    EXPECT(L.bytes_held_host == hbytes, "ledger.host", "the sim holds %llu host bytes, the pools' sleep state %llu",
           (unsigned long long)L.bytes_held_host, (unsigned long long)hbytes);
    EXPECT(L.bytes_mapped == mapped + hbytes, "ledger.bytes_mapped", "the sim maps %llu bytes, the pools say %llu + "
           "%llu host", (unsigned long long)L.bytes_mapped, (unsigned long long)mapped, (unsigned long long)hbytes);
    EXPECT(L.mappings == chunks + hcopies, "ledger.mappings", "the sim has %llu mappings, the pools' chunks %llu + "
           "%llu host copies", (unsigned long long)L.mappings, (unsigned long long)chunks,
           (unsigned long long)hcopies);
    EXPECT(L.handles == handles, "ledger.handles", "the sim has %llu handles, the pools' handles_outstanding %llu",
           (unsigned long long)L.handles, (unsigned long long)handles);
    EXPECT(L.exported_fds == efds, "ledger.exported_fds", "the sim counts %llu exported fds open, the pools %llu",
           (unsigned long long)L.exported_fds, (unsigned long long)efds);
    EXPECT(L.dmabuf_fds == dmabufs, "ledger.dmabuf_fds", "the sim counts %llu dma-buf fds, the test holds %llu",
           (unsigned long long)L.dmabuf_fds, (unsigned long long)dmabufs);
    for (int p = 0; p < NPOOL; p++) {
        EXPECT(S[p].kept_bytes == kept_model(p) && S[p].kept_bytes <= S[p].mapped_bytes, "kept.bytes", "pool %d "
               "says %llu bytes kept for reuse (of %llu mapped); its %d kept buffers and %d kept views mapped %llu at "
               "their release", p, (unsigned long long)S[p].kept_bytes, (unsigned long long)S[p].mapped_bytes,
               P[p].nkbuf, P[p].nkview, (unsigned long long)kept_model(p));
        EXPECT(S[p].blocks == (uint64_t)P[p].nblk + S[p].stream_pending_blocks, "stats.blocks", "pool %d says %llu "
               "blocks live (%llu of them pending on streams), the test holds %d", p, (unsigned long long)S[p].blocks,
               (unsigned long long)S[p].stream_pending_blocks, P[p].nblk);
        EXPECT(S[p].buffers >= (uint64_t)P[p].nbuf, "stats.buffers", "pool %d says %llu buffers, the test holds %d", p,
               (unsigned long long)S[p].buffers, P[p].nbuf);
        if (P[p].asleep)
            EXPECT(P[p].partial ? S[p].mapped_bytes >= S[p].view_bytes : S[p].mapped_bytes == S[p].view_bytes,
                   "asleep.mapped", "pool %d asleep%s maps %llu bytes, its views %llu", p,
                   P[p].partial ? " (a partial sleep)" : "", (unsigned long long)S[p].mapped_bytes,
                   (unsigned long long)S[p].view_bytes);
    }
    return L;
}

/* fabpool_check, the library's own consistency check, of the pools in `mask` (a bit each) that exist. */
static uint64_t n_pool_checks;
static inline void check_pools(unsigned mask)
{
    for (int p = 0; p < NPOOL; p++) {
        if (!(mask & (1u << p)) || !P[p].p)
            continue;
        n_pool_checks++;
        fabpool_status st = fabpool_check(P[p].p);
        EXPECT_OK(st, "fabpool_check", "fabpool_check");
    }
}

/* After every pool is destroyed the sim holds nothing. */
static inline void check_ledger_empty(void)
{
    fabsim_ledger l = t_ledger();
    EXPECT(l.handles == 0 && l.allocations == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 &&
           l.bytes_held == 0 && l.bytes_mapped == 0 && l.bytes_held_host == 0 && l.dmabuf_fds == 0, "ledger.end",
           "after every pool is destroyed the sim holds %llu handles, %llu allocations, %llu mappings, %llu "
           "reservations, %llu exported fds, %llu bytes, %llu host bytes, %llu dma-bufs",
           (unsigned long long)l.handles, (unsigned long long)l.allocations, (unsigned long long)l.mappings,
           (unsigned long long)l.reservations, (unsigned long long)l.exported_fds, (unsigned long long)l.bytes_held,
           (unsigned long long)l.bytes_held_host, (unsigned long long)l.dmabuf_fds);
}

/* No two live objects overlap: blocks, buffer and view windows, memory of destroyed buffers that must stay
 * and blocks pending on a held stream (the owner's freed blocks may hold the owner's new ones). */
static inline void check_overlap(int full)
{
    static ival_t iv[NPOOL * (MAXBLK + MAXBUF + MAXVIEW + 2 * MAXKEPT) + MAXREC + MAXPEND];
    int n = 0;
    for (int p = 0; p < NPOOL; p++) {
        pool_t *q = &P[p];
        for (int i = 0; i < q->nblk; i++)
            iv[n++] = (ival_t){(uint64_t)(uintptr_t)q->blk[i].p, (uint64_t)(uintptr_t)q->blk[i].p + q->blk[i].usable,
                               "block", q->blk[i].id};
        for (int i = 0; i < q->nbuf; i++)
            iv[n++] = (ival_t){q->buf[i].base, q->buf[i].base + q->buf[i].window, "buffer window", q->buf[i].id};
        for (int i = 0; i < q->nview; i++)
            iv[n++] = (ival_t){q->view[i].base, q->view[i].base + q->view[i].window, "view window", q->view[i].vid};
        for (int i = 0; i < q->nkbuf; i++)
            iv[n++] = (ival_t){q->kbuf[i].b.base, q->kbuf[i].b.base + q->kbuf[i].b.window, "kept buffer window",
                               q->kbuf[i].b.id};
        for (int i = 0; i < q->nkview; i++)
            iv[n++] = (ival_t){q->kview[i].v.base, q->kview[i].v.base + q->kview[i].v.window, "kept view window",
                               q->kview[i].v.vid};
    }
    for (int i = 0; i < nrec; i++)
        if (rec[i].destroyed) /* (retirements of one destroyed buffer may repeat each other) */
            iv[n++] = (ival_t){rec[i].va_lo, rec[i].va_hi, "retired memory of destroyed buffer", rec[i].id};
    for (int i = 0; i < npend; i++)
        if (!pend[i].owner)
            iv[n++] = (ival_t){(uint64_t)(uintptr_t)pend[i].b.p, (uint64_t)(uintptr_t)pend[i].b.p + pend[i].b.usable,
                               "block pending on a held stream", pend[i].b.id};
    check_overlaps(iv, n, step_first_id, full);
}


/* The view reads its buffer's memory, not memory it mapped before at the same offsets (the points hold the same
 * values in both): a word written through the buffer reads back through the view. */
static inline void view_reads_buffer(const view_t *v, const buf_t *b)
{
    uint64_t at = (b->size - 8) & ~(uint64_t)7, was = 0, token = 0x5eedull << 32 | (uint32_t)next_id++, seen = 0;
    if (b->size >= 8 && cuMemcpyDtoH(&was, (CUdeviceptr)(b->base + at), 8) == CUDA_SUCCESS &&
        cuMemcpyHtoD((CUdeviceptr)(b->base + at), &token, 8) == CUDA_SUCCESS && cuCtxSynchronize() == CUDA_SUCCESS) {
        cuMemcpyDtoH(&seen, (CUdeviceptr)(v->base + at), 8);
        EXPECT(seen == token, "view_reopen.stale", "view of buffer %llu reads %llx at +%llu where the buffer holds %llx "
               "(it kept a chunk the buffer no longer maps)", (unsigned long long)b->id, (unsigned long long)seen,
               (unsigned long long)at, (unsigned long long)token);
        cuMemcpyHtoD((CUdeviceptr)(b->base + at), &was, 8);
        cuCtxSynchronize();
    }
}

/* the most mapped_bytes each pool had at a step since its creation or its last fabpool_reset_peak */
static uint64_t peak_seen[NPOOL];

/* Pool p's high-water marks (in s, its stats now) are at least what the steps saw since its last reset. */
static inline void check_peak(int p, const fabpool_stats *s)
{
    if (s->mapped_bytes > peak_seen[p])
        peak_seen[p] = s->mapped_bytes;
    EXPECT(s->mapped_bytes_peak >= peak_seen[p] && s->in_use_bytes_peak >= s->in_use_bytes, "peak.below",
           "pool %d: mapped_bytes_peak %llu, but it mapped %llu since the last reset; in use %llu, peak %llu", p,
           (unsigned long long)s->mapped_bytes_peak, (unsigned long long)peak_seen[p],
           (unsigned long long)s->in_use_bytes, (unsigned long long)s->in_use_bytes_peak);
}

/* ------------------------------------------------------------ operations both tables hold */

static inline int has_blk(int p) { return P[p].nblk > 0; }
static inline int has_buf(int p) { return P[p].nbuf > 0; }
static inline int has_view(int t) { return P[t].nview > 0; }
static inline int always(int p) { return p >= 0; }

/* fabpool_trim of pool p, keeping 0, 1 MiB or 256 MiB */
static inline void trim_pool(int p)
{
    static const size_t keeps[] = {0, 1 * MB, 256 * MB};
    size_t keep = keeps[below(3)];
    snprintf(cur_what, sizeof cur_what, "pool %d, keep %zu", p, keep);
    fabpool_status st = fabpool_trim(P[p].p, keep);
    EXPECT_OK(st, "trim", "fabpool_trim");
    if (st == FABPOOL_OK)
        kept_drop(p, 1, 1, 0); /* whatever keep says: kept buffers and views are given back */
}

static inline void flush_thread_cache(int p)
{
    snprintf(cur_what, sizeof cur_what, "pool %d", p);
    fabpool_status st = fabpool_thread_flush(P[p].p);
    EXPECT_OK(st, "thread_flush", "fabpool_thread_flush");
}

/* fabpool_buffer_export_done of one of pool p's buffers */
static inline void export_done(int p)
{
    buf_t *b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    snprintf(cur_what, sizeof cur_what, "pool %d, buffer %llu", p, (unsigned long long)b->id);
    fabpool_status st = fabpool_buffer_export_done(b->h);
    EXPECT_OK(st, "export_done", "fabpool_buffer_export_done");
}

/* fabpool_reset_peak: both marks start again from now (the calling thread's cached blocks back in their classes:
 * this test's only thread); check_step holds the mapped mark to what it saw since. */
static inline void reset_peak_pool(int p)
{
    snprintf(cur_what, sizeof cur_what, "pool %d", p);
    fabpool_status st = fabpool_reset_peak(P[p].p);
    EXPECT_OK(st, "reset_peak", "fabpool_reset_peak");
    if (st != FABPOOL_OK)
        return;
    fabpool_stats s = t_stats(P[p].p);
    EXPECT(s.mapped_bytes_peak == s.mapped_bytes && s.in_use_bytes_peak == s.in_use_bytes, "reset_peak.marks",
           "pool %d after fabpool_reset_peak: mapped %llu (peak %llu), in use %llu (peak %llu)", p,
           (unsigned long long)s.mapped_bytes, (unsigned long long)s.mapped_bytes_peak,
           (unsigned long long)s.in_use_bytes, (unsigned long long)s.in_use_bytes_peak);
    peak_seen[p] = s.mapped_bytes;
}

/* fabpool_view_close of one of pool t's views (a broken one first), its data checked before; a refused close
 * leaves the view open with the chunks it still maps (fabpool.h), so the model keeps it and a later close frees
 * it */
static inline void close_view(int t)
{
    int i = (int)below((uint64_t)P[t].nview);
    for (int k = 0; k < P[t].nview; k++)
        if (P[t].view[k].broken)
            i = k;
    snprintf(cur_what, sizeof cur_what, "pool %d%s, view of buffer %llu%s", t, P[t].asleep ? " (asleep)" : "",
             (unsigned long long)P[t].view[i].id, find_buf(P[t].view[i].id, NULL) ? "" : " (destroyed)");
    check_view(&P[t].view[i], -1);
    fabpool_status st = fabpool_view_close(P[t].view[i].h);
    EXPECT_OK(st, "view_close", "fabpool_view_close");
    if (st == FABPOOL_OK)
        drop_view(t, i);
}

/* ------------------------------------------------------------ the steps */

/* A program's table of operations and what its steps do around them. */
typedef struct op_run {
    const op_def *ops;
    int n;
    unsigned *weight;          /* each operation's weight, 0: never drawn (FABPOOL_TEST_SKIP_OPS) */
    long *count;               /* how often each ran */
    int tries;                 /* draws before a step gives up and runs `fallback` */
    void (*fallback)(int pool); /* an operation that always applies (a collect), on a pool at random */
    void (*before)(int pool);  /* before the step's operation, on its pool (NULL: nothing) */
    void (*after)(int pool);   /* after it (NULL: nothing) */
    void (*check)(int full);   /* the checks after every step; full: every sample (each 64th step) */
} op_run;

static long total_steps;

/* The weights of t's operations: their table's, 0 for those FABPOOL_TEST_SKIP_OPS=name,name... names (one
 * that crashes the process on a branch without its fix, say), each said on stdout by `prog`. */
static inline void op_weights(const op_run *t, const char *prog)
{
    const char *skip = getenv("FABPOOL_TEST_SKIP_OPS");
    for (int o = 0; o < t->n; o++) {
        size_t n = strlen(t->ops[o].name);
        const char *at = skip ? strstr(skip, t->ops[o].name) : NULL;
        int skipped = at && (at == skip || at[-1] == ',') && (at[n] == 0 || at[n] == ',');
        t->weight[o] = skipped ? 0 : t->ops[o].weight;
        if (skipped)
            printf("%s: %s is not drawn (FABPOOL_TEST_SKIP_OPS)\n", prog, t->ops[o].name);
    }
}

/* `steps` steps of seed `seed`: each draws an operation of t by weight and a pool it applies to (else
 * t->fallback on a pool at random), runs it between t->before and t->after, counts it and checks. */
static inline void run_steps(const op_run *t, unsigned long long seed, long steps)
{
    unsigned total = 0;
    int fallback = 0;
    for (int o = 0; o < t->n; o++)
        total += t->weight[o];
    while (t->ops[fallback].run != t->fallback)
        fallback++;
    for (long s = 0; s < steps; s++) {
        cur_step = s;
        int p, o = draw_op(t->ops, t->weight, total, NPOOL, t->tries, &p);
        if (o < 0) {
            o = fallback;
            p = (int)below(NPOOL);
        }
        cur_op = t->ops[o].name;
        cur_what[0] = 0;
        step_first_id = next_id;
        if (t->before)
            t->before(p);
        t->ops[o].run(p);
        if (t->after)
            t->after(p);
        t->count[o]++;
        total_steps++;
        if (verbose)
            printf("seed %llu step %ld: %s (%s)\n", seed, s, cur_op, cur_what);
        t->check(s % 64 == 63);
    }
}

/* How often each operation ran, and its share of the steps; with min_share > 0 a share below it fails
 * the run (said on stderr by `prog`). */
static inline void print_op_shares(const op_run *t, double min_share, const char *prog)
{
    printf("  %-20s %10s %7s\n", "operation", "ran", "share");
    for (int o = 0; o < t->n; o++) {
        double share = total_steps ? 100.0 * (double)t->count[o] / (double)total_steps : 0;
        printf("  %-20s %10ld %6.2f%%\n", t->ops[o].name, t->count[o], share);
        if (min_share > 0) {
            CHECK(share >= min_share);
            if (share < min_share)
                fprintf(stderr, "%s: %s ran in %.2f%% of the steps, less than %.0f%%\n", prog, t->ops[o].name, share,
                        min_share);
        }
    }
}

#endif
