/* trace_viz.c - a trace as memory over time (trace_viz.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fabpool.h"
#include "trace_viz.h"

/* ------------------------------------------------------------ the walk */

enum { EV_ALLOC, EV_FREE, EV_MAP, EV_UNMAP, EV_NOTE };

typedef struct viz_ev {
    const fabpool_trace_rec *r;
    int kind;                /* EV_*; EV_NOTE: a record that changes neither (a trim, a failed allocation) */
    const char *name;        /* what the CSV calls it */
    uint64_t addr, size, stream;
    uint64_t in_use, mapped; /* bytes after it: the level's blocks and buffers, the chunks mapped */
} viz_ev;

typedef int (*viz_fn)(void *ctx, const viz_ev *e);

/* 1 if the trace has map records (a trace written before them has none: its mapped bytes are unknown). */
static int has_maps(const trace_data *d)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->recs[i].op == FABPOOL_TR_MAP)
            return 1;
    return 0;
}

static int walk_emit(viz_fn fn, void *ctx, viz_ev *e, int kind, const char *name, uint64_t addr, uint64_t size,
                     uint64_t stream)
{
    e->kind = kind;
    e->name = name;
    e->addr = addr;
    e->size = size;
    e->stream = stream;
    return fn(ctx, e);
}

/* Calls fn for each event of d's level in order: 0, -1 (no host memory, a record the reader would refuse, or
 * more bytes than 64 bits count; in err) or what fn returned (not 0). */
static int walk(const trace_data *d, viz_fn fn, void *ctx, char *err, size_t cap)
{
    u64map live = {0}, chunks = {0};
    viz_ev e = {0};
    int rc = 0;
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        const fabpool_trace_rec *r = &d->recs[i];
        /* every range below is a true one (trace_rec_bad), and every sum of them fits in 64 bits */
        const char *bad = trace_rec_bad(r);
        if (!bad && i && r->t_ns < d->recs[i - 1].t_ns)
            bad = "a time stamp earlier than the record before it";
        if (!bad && (r->size > UINT64_MAX - e.in_use || r->size > UINT64_MAX - e.mapped))
            bad = "more bytes live or mapped than 64 bits count";
        if (bad) {
            snprintf(err, cap, "record %zu (op %u, ptr 0x%llx, size %llu) has %s", i, r->op,
                     (unsigned long long)r->ptr, (unsigned long long)r->size, bad);
            rc = -1;
            break;
        }
        int ok = r->status == FABPOOL_TRACE_STATUS_UNKNOWN || r->status == FABPOOL_OK;
        int level = d->has_app ? trace_rec_app(d, r) : r->op <= FABPOOL_TR_FREE;
        uint64_t v = 0;
        e.r = r;
        switch (r->op) {
        case FABPOOL_TR_ALLOC:
        case FABPOOL_TR_APP_ALLOC:
            if (!level)
                break;
            if (!ok) {
                rc = walk_emit(fn, ctx, &e, EV_NOTE, "alloc_failed", 0, r->size, 0);
                break;
            }
            if (u64map_put(&live, r->ptr, r->size))
                goto nomem;
            e.in_use += r->size;
            rc = walk_emit(fn, ctx, &e, EV_ALLOC, "alloc", r->ptr, r->size, r->op == FABPOOL_TR_APP_ALLOC ? r->arg : 0);
            break;
        case FABPOOL_TR_FREE:
        case FABPOOL_TR_APP_FREE:
            if (!level || !u64map_del(&live, r->ptr, &v))
                break; /* the pool's own, or a pointer the trace never gave (a double free) */
            e.in_use -= v;
            rc = walk_emit(fn, ctx, &e, EV_FREE, "free", r->ptr, v, r->op == FABPOOL_TR_APP_FREE ? r->arg : 0);
            break;
        case FABPOOL_TR_BUF_CREATE:
            if (u64map_put(&live, r->ptr, r->size))
                goto nomem;
            e.in_use += r->size;
            rc = walk_emit(fn, ctx, &e, EV_ALLOC, "buffer_create", r->ptr, r->size, 0);
            break;
        case FABPOOL_TR_BUF_RESIZE: /* the old size freed, the new one allocated, on its stream */
            if (!u64map_get(&live, r->ptr, &v))
                break;
            e.in_use -= v;
            if ((rc = walk_emit(fn, ctx, &e, EV_FREE, "buffer_resize", r->ptr, v, r->arg)) != 0)
                break;
            if (u64map_put(&live, r->ptr, r->size))
                goto nomem;
            e.in_use += r->size;
            rc = walk_emit(fn, ctx, &e, EV_ALLOC, "buffer_resize", r->ptr, r->size, r->arg);
            break;
        case FABPOOL_TR_BUF_DESTROY:
            if (!u64map_del(&live, r->ptr, &v))
                break;
            e.in_use -= v;
            rc = walk_emit(fn, ctx, &e, EV_FREE, "buffer_destroy", r->ptr, v, r->arg);
            break;
        case FABPOOL_TR_MAP:
            if (u64map_get(&chunks, r->ptr, NULL))
                break; /* mapped twice without an unmap: not a trace the pool writes */
            if (u64map_put(&chunks, r->ptr, r->size))
                goto nomem;
            e.mapped += r->size;
            rc = walk_emit(fn, ctx, &e, EV_MAP, "map", r->ptr, r->size, 0);
            break;
        case FABPOOL_TR_UNMAP:
            if (!u64map_get(&chunks, r->ptr, &v) || v != r->size)
                break; /* a range no map gave */
            u64map_del(&chunks, r->ptr, NULL);
            e.mapped -= r->size;
            rc = walk_emit(fn, ctx, &e, EV_UNMAP, "unmap", r->ptr, r->size, 0);
            break;
        case FABPOOL_TR_TRIM:
            rc = walk_emit(fn, ctx, &e, EV_NOTE, "trim", 0, r->size, 0);
            break;
        case FABPOOL_TR_APP_EMPTY:
            rc = walk_emit(fn, ctx, &e, EV_NOTE, "empty_cache", 0, 0, 0);
            break;
        default:
            break;
        }
    }
    u64map_free(&live);
    u64map_free(&chunks);
    return rc;
nomem:
    snprintf(err, cap, "no host memory to walk the trace's %zu records", d->n);
    u64map_free(&live);
    u64map_free(&chunks);
    return -1;
}

/* ------------------------------------------------------------ CSV */

typedef struct csv_ctx {
    FILE *f;
    uint64_t t0;
    int maps;
} csv_ctx;

static int csv_row(void *p, const viz_ev *e)
{
    csv_ctx *c = p;
    uint64_t t = e->r->t_ns - c->t0;
    fprintf(c->f, "%" PRIu64 ".%09" PRIu64 ",%s,%" PRIu64 ",%" PRIu64 ",", t / 1000000000u, t % 1000000000u, e->name,
            e->size, e->in_use);
    if (c->maps)
        fprintf(c->f, "%" PRIu64, e->mapped);
    fputc('\n', c->f);
    return 0;
}

static int finish(FILE *f, int rc, char *err, size_t cap)
{
    if (rc == 0 && (fflush(f) != 0 || ferror(f))) {
        snprintf(err, cap, "writing failed (a full disk?)");
        return -1;
    }
    return rc;
}

int trace_write_csv(const trace_data *d, FILE *f, char *err, size_t cap)
{
    csv_ctx c = {f, d->n ? d->recs[0].t_ns : 0, has_maps(d)};
    fprintf(f, "time_s,event,size,in_use,mapped\n");
    return finish(f, walk(d, csv_row, &c, err, cap), err, cap);
}

/* ------------------------------------------------------------ pickle */

/* Python's pickle, protocol 2: only what the snapshot needs (dicts, lists, a tuple, ints, strings, booleans),
 * the keys written once and then named by their memo slot. */
enum {
    K_ACTION, K_ADDR, K_SIZE, K_STREAM, K_FRAMES, K_TIME_US, K_ALLOC, K_FREE_REQUESTED, K_FREE_COMPLETED,
    K_SEGMENT_MAP, K_SEGMENT_UNMAP, K_DEVICE, K_ADDRESS, K_TOTAL_SIZE, K_ALLOCATED_SIZE, K_ACTIVE_SIZE,
    K_REQUESTED_SIZE, K_SEGMENT_TYPE, K_SEGMENT_POOL_ID, K_IS_EXPANDABLE, K_BLOCKS, K_STATE, K_ACTIVE_ALLOCATED,
    K_INACTIVE, K_LARGE, K_SEGMENTS, K_DEVICE_TRACES, K_N
};
static const char *const key_text[K_N] = {
    "action", "addr", "size", "stream", "frames", "time_us", "alloc", "free_requested", "free_completed",
    "segment_map", "segment_unmap", "device", "address", "total_size", "allocated_size", "active_size",
    "requested_size", "segment_type", "segment_pool_id", "is_expandable", "blocks", "state", "active_allocated",
    "inactive", "large", "segments", "device_traces"};

typedef struct pk {
    FILE *f;
    unsigned char memo[K_N];
    size_t in_batch; /* items since the last MARK of the open list */
} pk;

#define PK_MARK '('
#define PK_STOP '.'
#define PK_EMPTY_DICT '}'
#define PK_EMPTY_LIST ']'
#define PK_SETITEMS 'u'
#define PK_APPENDS 'e'
#define PK_TUPLE2 '\x86'
#define PK_TRUE '\x88'
#define PK_FALSE '\x89'
#define PK_LIST_BATCH 1000u

static void pk_u64(pk *p, uint64_t v)
{
    unsigned char b[12];
    if (v < 256) {
        b[0] = 'K'; /* BININT1 */
        b[1] = (unsigned char)v;
        fwrite(b, 1, 2, p->f);
    } else if (v < 65536) {
        b[0] = 'M'; /* BININT2 */
        fabpool_le_put32(b + 1, (uint32_t)v);
        fwrite(b, 1, 3, p->f);
    } else if (v < 0x80000000u) {
        b[0] = 'J'; /* BININT, signed 32 */
        fabpool_le_put32(b + 1, (uint32_t)v);
        fwrite(b, 1, 5, p->f);
    } else {
        /* LONG1: n little-endian bytes, two's complement, so the last byte's top bit must be clear */
        unsigned n = 0;
        for (uint64_t x = v; x; x >>= 8)
            n++;
        if (v >> (8 * n - 1))
            n++;
        b[0] = 0x8a;
        b[1] = (unsigned char)n;
        for (unsigned i = 0; i < n; i++)
            b[2 + i] = i < 8 ? (unsigned char)(v >> (8 * i)) : 0;
        fwrite(b, 1, 2 + n, p->f);
    }
}

static void pk_str(pk *p, const char *s)
{
    unsigned char b[5] = {'X'}; /* BINUNICODE: a 32-bit length, then UTF-8 */
    size_t n = strlen(s);
    fabpool_le_put32(b + 1, (uint32_t)n);
    fwrite(b, 1, 5, p->f);
    fwrite(s, 1, n, p->f);
}

/* A key (or a value that repeats, as an action's name): its text the first time, then the memo's copy. */
static void pk_key(pk *p, int k)
{
    unsigned char b[2] = {'h', (unsigned char)k}; /* BINGET */
    if (!p->memo[k]) {
        pk_str(p, key_text[k]);
        b[0] = 'q'; /* BINPUT */
        p->memo[k] = 1;
    }
    fwrite(b, 1, 2, p->f);
}

static void pk_op(pk *p, char op) { fputc((unsigned char)op, p->f); }

static void pk_kv_u64(pk *p, int k, uint64_t v)
{
    pk_key(p, k);
    pk_u64(p, v);
}

/* Opening a list: EMPTY_LIST MARK; pk_item after each item; pk_list_end. */
static void pk_list_begin(pk *p)
{
    pk_op(p, PK_EMPTY_LIST);
    pk_op(p, PK_MARK);
    p->in_batch = 0;
}
static void pk_item(pk *p)
{
    if (++p->in_batch == PK_LIST_BATCH) {
        pk_op(p, PK_APPENDS);
        pk_op(p, PK_MARK);
        p->in_batch = 0;
    }
}
static void pk_list_end(pk *p) { pk_op(p, PK_APPENDS); }

typedef struct range {
    uint64_t a, n;
} range;

/* ------------------------------------------------------------ the snapshot's sets */

/* What is mapped and what the snapshot shows mapped.  Every range a map or unmap record names begins and ends at
 * one of the trace's cuts (the addresses where such a range begins or ends, sorted), so both sets are unions of
 * pieces, a piece [x[j], x[j + 1]) between two neighbouring cuts.  A tree over the pieces holds both, so that
 * each change and each question (the first piece from j on that is shown, or not) costs O(log n) in a trace of
 * n records, not a pass over every range. */
typedef struct seg_node {
    size_t shown, mapped;              /* the node's pieces shown, mapped (a mapped piece is always shown) */
    signed char set_shown, set_mapped; /* a change its children have yet to take: -1 none, else 0 or 1 */
} seg_node;

typedef struct segset {
    uint64_t *x;  /* the cuts */
    size_t np;    /* pieces: one fewer than the cuts, 0 without map records */
    seg_node *t;  /* node 1 the root over [0, np), node k's halves 2k and 2k + 1 */
} segset;

/* What a search looks for in a piece: not shown, shown, gone (shown but no longer mapped), not gone. */
enum { P_HIDDEN, P_SHOWN, P_GONE, P_KEPT };

static int node_has(const seg_node *k, size_t len, int p)
{
    switch (p) {
    case P_HIDDEN:
        return k->shown < len;
    case P_SHOWN:
        return k->shown > 0;
    case P_GONE:
        return k->shown > k->mapped;
    default:
        return k->shown - k->mapped < len;
    }
}

static void node_set(seg_node *k, size_t len, int shown, int mapped)
{
    if (shown >= 0) {
        k->shown = shown ? len : 0;
        k->set_shown = (signed char)shown;
    }
    if (mapped >= 0) {
        k->mapped = mapped ? len : 0;
        k->set_mapped = (signed char)mapped;
    }
}

static void node_push(seg_node *t, size_t k, size_t l, size_t m, size_t r)
{
    node_set(&t[2 * k], m - l, t[k].set_shown, t[k].set_mapped);
    node_set(&t[2 * k + 1], r - m, t[k].set_shown, t[k].set_mapped);
    t[k].set_shown = t[k].set_mapped = -1;
}

/* Pieces [lo, hi) of node k (over [l, r)) made shown or not (shown 0 or 1, -1: left) and mapped or not. */
static void seg_set(seg_node *t, size_t k, size_t l, size_t r, size_t lo, size_t hi, int shown, int mapped)
{
    if (hi <= l || r <= lo)
        return;
    if (lo <= l && r <= hi) {
        node_set(&t[k], r - l, shown, mapped);
        return;
    }
    size_t m = l + (r - l) / 2;
    node_push(t, k, l, m, r);
    seg_set(t, 2 * k, l, m, lo, hi, shown, mapped);
    seg_set(t, 2 * k + 1, m, r, lo, hi, shown, mapped);
    t[k].shown = t[2 * k].shown + t[2 * k + 1].shown;
    t[k].mapped = t[2 * k].mapped + t[2 * k + 1].mapped;
}

/* The first piece of [from, hi) in node k (over [l, r)) that has p, or hi. */
static size_t seg_first(seg_node *t, size_t k, size_t l, size_t r, size_t from, size_t hi, int p)
{
    if (r <= from || hi <= l || !node_has(&t[k], r - l, p))
        return hi;
    if (r - l == 1)
        return l;
    size_t m = l + (r - l) / 2;
    node_push(t, k, l, m, r);
    size_t j = seg_first(t, 2 * k, l, m, from, hi, p);
    return j < hi ? j : seg_first(t, 2 * k + 1, m, r, from, hi, p);
}

/* The last piece before `before` in node k (over [l, r)) that has p, or SIZE_MAX. */
static size_t seg_last(seg_node *t, size_t k, size_t l, size_t r, size_t before, int p)
{
    if (before <= l || !node_has(&t[k], r - l, p))
        return SIZE_MAX;
    if (r - l == 1)
        return l;
    size_t m = l + (r - l) / 2;
    node_push(t, k, l, m, r);
    size_t j = seg_last(t, 2 * k + 1, m, r, before, p);
    return j != SIZE_MAX ? j : seg_last(t, 2 * k, l, m, before, p);
}

static void ss_set(segset *ss, size_t lo, size_t hi, int shown, int mapped)
{
    if (lo < hi)
        seg_set(ss->t, 1, 0, ss->np, lo, hi, shown, mapped);
}
static size_t ss_first(segset *ss, size_t from, size_t hi, int p)
{
    return from < hi ? seg_first(ss->t, 1, 0, ss->np, from, hi, p) : hi;
}
/* 1 if some memory is shown mapped that is no longer mapped */
static int ss_gone(const segset *ss) { return ss->np && ss->t[1].shown > ss->t[1].mapped; }

static int by_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* The first of v[0, n) (sorted) at or above a (above: strictly above a), or n. */
static size_t bound(const uint64_t *v, size_t n, uint64_t a, int above)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t m = lo + (hi - lo) / 2;
        if (v[m] < a || (above && v[m] == a))
            lo = m + 1;
        else
            hi = m;
    }
    return lo;
}

/* The starts and ends of the ranges of d's records of the ops in mask (a bit an op), sorted, each once; those
 * that run past the end of the address space are left out (walk refuses them before they are used). */
static int cuts_of(const trace_data *d, unsigned mask, uint64_t **out, size_t *n)
{
    size_t k = 0;
    for (size_t i = 0; i < d->n; i++)
        k += d->recs[i].op < 32 && (mask >> d->recs[i].op & 1u);
    *out = NULL;
    *n = 0;
    if (!k)
        return 0;
    uint64_t *x = k <= SIZE_MAX / 2 / sizeof *x ? malloc(2 * k * sizeof *x) : NULL;
    if (!x)
        return -1;
    k = 0;
    for (size_t i = 0; i < d->n; i++) {
        const fabpool_trace_rec *r = &d->recs[i];
        if (r->op < 32 && (mask >> r->op & 1u) && r->size <= UINT64_MAX - r->ptr) {
            x[k++] = r->ptr;
            x[k++] = r->ptr + r->size;
        }
    }
    qsort(x, k, sizeof *x, by_u64);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (!u || x[i] != x[u - 1])
            x[u++] = x[i];
    *out = x;
    *n = u;
    return 0;
}

static int ss_init(segset *ss, const trace_data *d)
{
    size_t nx = 0;
    if (cuts_of(d, 1u << FABPOOL_TR_MAP | 1u << FABPOOL_TR_UNMAP, &ss->x, &nx))
        return -1;
    ss->np = nx > 1 ? nx - 1 : 0;
    if (!ss->np)
        return 0;
    if (ss->np > SIZE_MAX / 4 / sizeof *ss->t || !(ss->t = malloc(4 * ss->np * sizeof *ss->t)))
        return -1;
    for (size_t k = 0; k < 4 * ss->np; k++)
        ss->t[k] = (seg_node){0, 0, -1, -1};
    return 0;
}

/* The pieces [*lo, *hi) that make [a, a + n): 0, or -1 where a range does not begin and end at cuts. */
static int ss_pieces(const segset *ss, uint64_t a, uint64_t n, size_t *lo, size_t *hi)
{
    if (!ss->np || n > UINT64_MAX - a)
        return -1;
    *lo = bound(ss->x, ss->np + 1, a, 0);
    *hi = bound(ss->x, ss->np + 1, a + n, 0);
    return *lo <= ss->np && ss->x[*lo] == a && *hi <= ss->np && ss->x[*hi] == a + n ? 0 : -1;
}

/* The live blocks of the level: a map of address to size, and how many begin and end at or below each of the
 * places a block of the trace may begin or end (two Fenwick trees), to ask in O(log n) whether one lies in a
 * range. */
typedef struct blocks {
    u64map at;
    uint64_t *y;          /* where a block of the trace may begin or end, sorted */
    size_t ny;
    size_t *starts, *ends; /* the Fenwick trees over y */
} blocks;

static int blocks_init(blocks *b, const trace_data *d)
{
    unsigned ops = 1u << FABPOOL_TR_ALLOC | 1u << FABPOOL_TR_APP_ALLOC | 1u << FABPOOL_TR_BUF_CREATE |
                   1u << FABPOOL_TR_BUF_RESIZE;
    if (cuts_of(d, ops, &b->y, &b->ny))
        return -1;
    b->starts = calloc(b->ny + 1, sizeof *b->starts);
    b->ends = calloc(b->ny + 1, sizeof *b->ends);
    return b->starts && b->ends ? 0 : -1;
}

static void fen_add(size_t *f, size_t n, size_t i, int up)
{
    for (i++; i <= n; i += i & (~i + 1))
        f[i] = up ? f[i] + 1 : f[i] - 1;
}

/* The sum of f's first i places. */
static size_t fen_sum(const size_t *f, size_t i)
{
    size_t s = 0;
    for (; i; i -= i & (~i + 1))
        s += f[i];
    return s;
}

static int blocks_count(blocks *b, uint64_t a, uint64_t n, int up)
{
    size_t i = bound(b->y, b->ny, a, 0), j = bound(b->y, b->ny, a + n, 0);
    if (i == b->ny || b->y[i] != a || j == b->ny || b->y[j] != a + n)
        return -1; /* not a block of the trace's records */
    fen_add(b->starts, b->ny, i, up);
    fen_add(b->ends, b->ny, j, up);
    return 0;
}

/* A block at a of n bytes, over no live one (blocks_over): 0, or -1 (no memory). */
static int blocks_put(blocks *b, uint64_t a, uint64_t n)
{
    if (!a) /* no key of the map (walk passes none) */
        return 0;
    return u64map_put(&b->at, a, n) || blocks_count(b, a, n, 1) ? -1 : 0;
}

/* The place of f (over n places) where its sum first reaches c (1 <= c <= the sum of all n). */
static size_t fen_find(const size_t *f, size_t n, size_t c)
{
    size_t at = 0, step = 1;
    while (step <= n / 2)
        step <<= 1;
    for (; step; step >>= 1)
        if (at + step <= n && f[at + step] < c) {
            at += step;
            c -= f[at];
        }
    return at;
}

/* 1 if a live block [k, k + v) begins at a or holds some of [a, a + n) (k < a + n and k + v > a: a block of 0
 * bytes inside the range counts, as does a range of 0 bytes inside a block), the first such in *k and *v; else 0.
 * Those are the blocks that begin below a + n less the c that end at or below a (each begins at or below a, and
 * none at a).  No two live blocks overlap (snap_over), so they end in the order they begin: the first of those
 * is the (c + 1)-th to begin. */
static int blocks_over(const blocks *b, uint64_t a, uint64_t n, uint64_t *k, uint64_t *v)
{
    if (!a) /* no key of the map (walk passes none) */
        return 0;
    *k = a;
    if (u64map_get(&b->at, a, v))
        return 1;
    size_t c = fen_sum(b->ends, bound(b->y, b->ny, a, 1));
    if (fen_sum(b->starts, bound(b->y, b->ny, a + n, 0)) <= c)
        return 0;
    *k = b->y[fen_find(b->starts, b->ny, c + 1)];
    u64map_get(&b->at, *k, v);
    return 1;
}

static void blocks_del(blocks *b, uint64_t a)
{
    uint64_t old = 0;
    if (u64map_del(&b->at, a, &old))
        blocks_count(b, a, old, 0);
}

/* 1 if a live block [k, k + v) lies in [a, e) (a < e): k < e and k + v > a.  Those with k + v <= a all have
 * k <= a < e, so they are the blocks that begin below e less those that end at or below a. */
static int blocks_within(const blocks *b, uint64_t a, uint64_t e)
{
    return fen_sum(b->starts, bound(b->y, b->ny, e, 0)) > fen_sum(b->ends, bound(b->y, b->ny, a, 1));
}

static void blocks_free(blocks *b)
{
    u64map_free(&b->at);
    free(b->y);
    free(b->starts);
    free(b->ends);
}

typedef struct snap_ctx {
    pk p;
    const trace_data *d;
    char *err;      /* why snap_event refused a record, "" where it ran out of memory */
    size_t cap;
    blocks live;    /* the blocks of the level live now */
    segset sets;    /* what the chunk records say is mapped now, what the segment events have mapped so far */
    range *dirty;   /* where what is shown but no longer mapped may have changed since snap_sync: [a, a + n] */
    size_t ndirty, cap_dirty;
    range *runs;    /* snap_sync's runs of gone pieces, [a, n) as piece numbers */
    size_t nruns, cap_runs;
} snap_ctx;

static int range_push(range **v, size_t *n, size_t *cap, uint64_t a, uint64_t b)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        range *w = nc <= SIZE_MAX / sizeof *w ? realloc(*v, nc * sizeof *w) : NULL;
        if (!w)
            return -1;
        *v = w;
        *cap = nc;
    }
    (*v)[(*n)++] = (range){a, b};
    return 0;
}

static void pk_entry(pk *p, int action, uint64_t addr, uint64_t size, uint64_t stream, uint64_t t_ns)
{
    pk_op(p, PK_EMPTY_DICT);
    pk_op(p, PK_MARK);
    pk_key(p, K_ACTION);
    pk_key(p, action);
    pk_kv_u64(p, K_ADDR, addr);
    pk_kv_u64(p, K_SIZE, size);
    pk_kv_u64(p, K_STREAM, stream);
    pk_key(p, K_FRAMES);
    pk_op(p, PK_EMPTY_LIST);
    pk_kv_u64(p, K_TIME_US, t_ns / 1000);
    pk_op(p, PK_SETITEMS);
    pk_item(p);
}

static int by_addr(const void *x, const void *y)
{
    uint64_t a = ((const range *)x)->a, b = ((const range *)y)->a;
    return a < b ? -1 : a > b;
}

/* The runs of gone pieces (shown, no longer mapped, each as long as it goes) that touch [a, a + n], pushed to
 * s->runs. */
static int gone_runs(snap_ctx *s, uint64_t a, uint64_t n)
{
    segset *ss = &s->sets;
    size_t lo = bound(ss->x, ss->np + 1, a, 0), hi = bound(ss->x, ss->np + 1, a + n, 1);
    lo = lo ? lo - 1 : 0;  /* the piece that ends at a, or holds it */
    hi = hi < ss->np ? hi : ss->np; /* the pieces that begin at or below a + n */
    for (size_t j = lo; (j = ss_first(ss, j, hi, P_GONE)) < hi;) {
        size_t first = seg_last(ss->t, 1, 0, ss->np, j, P_KEPT);
        size_t end = ss_first(ss, j, ss->np, P_KEPT);
        if (range_push(&s->runs, &s->nruns, &s->cap_runs, first == SIZE_MAX ? 0 : first + 1, end))
            return -1;
        j = end;
    }
    return 0;
}

/* The viewer draws every live block inside a segment, so memory is shown unmapped only once no live block is
 * in it: a buffer that shrinks is remapped under its live range before its resize record, and a pool asleep
 * keeps its blocks over no memory.  Unmaps, in address order, each run of what is shown but no longer mapped
 * that holds no live block.  A run that held one at the last call still does unless the memory around it or a
 * block in it changed since, so only the runs that touch those changes (s->dirty) are looked at. */
static int snap_sync(snap_ctx *s, uint64_t t_ns)
{
    segset *ss = &s->sets;
    size_t nd = s->ndirty;
    s->ndirty = 0;
    s->nruns = 0;
    if (!ss_gone(ss))
        return 0;
    for (size_t i = 0; i < nd; i++)
        if (gone_runs(s, s->dirty[i].a, s->dirty[i].n))
            return -1;
    qsort(s->runs, s->nruns, sizeof *s->runs, by_addr);
    for (size_t i = 0; i < s->nruns; i++) {
        if (i && s->runs[i].a == s->runs[i - 1].a)
            continue; /* the same run, touched twice */
        size_t lo = (size_t)s->runs[i].a, hi = (size_t)s->runs[i].n;
        uint64_t a = ss->x[lo], e = ss->x[hi];
        if (blocks_within(&s->live, a, e))
            continue;
        pk_entry(&s->p, K_SEGMENT_UNMAP, a, e - a, 0, t_ns);
        ss_set(ss, lo, hi, 0, -1);
    }
    return 0;
}

static int snap_dirty(snap_ctx *s, uint64_t a, uint64_t n)
{
    return range_push(&s->dirty, &s->ndirty, &s->cap_dirty, a, n);
}

/* A map of the parts not shown yet.  A record of 0 bytes (a failed one's: walk refuses the others) maps nothing. */
static int snap_map(snap_ctx *s, const viz_ev *e, uint64_t t)
{
    segset *ss = &s->sets;
    size_t lo, hi;
    if (!e->size)
        return 0;
    if (ss_pieces(ss, e->addr, e->size, &lo, &hi))
        return -1;
    int gone = ss_gone(ss);
    for (size_t j = lo; (j = ss_first(ss, j, hi, P_HIDDEN)) < hi;) {
        size_t k = ss_first(ss, j, hi, P_SHOWN);
        pk_entry(&s->p, K_SEGMENT_MAP, ss->x[j], ss->x[k] - ss->x[j], 0, t);
        j = k;
    }
    ss_set(ss, lo, hi, 1, 1);
    return gone ? snap_dirty(s, e->addr, e->size) : 0; /* a gone run cut in two: each part may hold no block */
}

/* A pool never gives out a block over memory a live block holds, and a snapshot's segment cannot show two blocks
 * in one place.  Nor could the sync stay cheap: while no two live blocks overlap, a free's change finds runs that
 * still hold a block only at its two ends, but under a block piled over many small ones it would look at every
 * small one's run at each change (time quadratic in the records).  -1 (the reason in s->err) if e's block lies
 * over a live one, else 0. */
static int snap_over(snap_ctx *s, const viz_ev *e)
{
    uint64_t k = 0, v = 0;
    if (!blocks_over(&s->live, e->addr, e->size, &k, &v))
        return 0;
    const fabpool_trace_rec *r = e->r;
    snprintf(s->err, s->cap, "record %zu (op %u, ptr 0x%llx, size %llu) has a block over memory that the live "
             "block at 0x%llx (%llu bytes) holds: a pool never gives out one block over another",
             (size_t)(r - s->d->recs), r->op, (unsigned long long)r->ptr, (unsigned long long)r->size,
             (unsigned long long)k, (unsigned long long)v);
    return -1;
}

static int snap_event(void *c, const viz_ev *e)
{
    snap_ctx *s = c;
    uint64_t t = e->r->t_ns;
    size_t lo, hi;
    switch (e->kind) {
    case EV_ALLOC:
        if (snap_over(s, e))
            return -1;
        pk_entry(&s->p, K_ALLOC, e->addr, e->size, e->stream, t);
        return blocks_put(&s->live, e->addr, e->size);
    case EV_FREE: /* fabpool's free is done when it returns: requested and completed at once */
        pk_entry(&s->p, K_FREE_REQUESTED, e->addr, e->size, e->stream, t);
        pk_entry(&s->p, K_FREE_COMPLETED, e->addr, e->size, e->stream, t);
        blocks_del(&s->live, e->addr);
        if (!ss_gone(&s->sets))
            return 0;
        return snap_dirty(s, e->addr, e->size) || snap_sync(s, t) ? -1 : 0;
    case EV_MAP:
        return snap_map(s, e, t);
    case EV_UNMAP:
        if (!e->size)
            return 0;
        if (ss_pieces(&s->sets, e->addr, e->size, &lo, &hi))
            return -1;
        ss_set(&s->sets, lo, hi, -1, 0);
        return snap_dirty(s, e->addr, e->size) || snap_sync(s, t) ? -1 : 0;
    default:
        return 0;
    }
}

/* The map's entries as ranges sorted by address (*out NULL and n 0 when empty); -1: no memory. */
static int ranges_of(const u64map *m, range **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!m->n)
        return 0;
    range *r = malloc(m->n * sizeof *r);
    if (!r)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            r[k++] = (range){m->keys[i], m->vals[i]};
    qsort(r, k, sizeof *r, by_addr);
    *out = r;
    *n = k;
    return 0;
}

static void pk_block(pk *p, uint64_t addr, uint64_t size, int live)
{
    pk_op(p, PK_EMPTY_DICT);
    pk_op(p, PK_MARK);
    pk_kv_u64(p, K_ADDRESS, addr);
    pk_kv_u64(p, K_SIZE, size);
    pk_kv_u64(p, K_REQUESTED_SIZE, live ? size : 0);
    pk_key(p, K_STATE);
    pk_key(p, live ? K_ACTIVE_ALLOCATED : K_INACTIVE);
    pk_key(p, K_FRAMES);
    pk_op(p, PK_EMPTY_LIST);
    pk_op(p, PK_SETITEMS);
    pk_item(p);
}

/* One segment [a, a + n) holding the live blocks blk[from, to), gaps as inactive blocks. */
static void pk_segment(pk *p, int device, uint64_t a, uint64_t n, const range *blk, size_t from, size_t to)
{
    uint64_t used = 0;
    for (size_t j = from; j < to; j++)
        used = blk[j].n > UINT64_MAX - used ? UINT64_MAX : used + blk[j].n;
    pk_op(p, PK_EMPTY_DICT);
    pk_op(p, PK_MARK);
    pk_kv_u64(p, K_DEVICE, (uint64_t)device);
    pk_kv_u64(p, K_ADDRESS, a);
    pk_kv_u64(p, K_TOTAL_SIZE, n);
    pk_kv_u64(p, K_ALLOCATED_SIZE, used);
    pk_kv_u64(p, K_ACTIVE_SIZE, used);
    pk_kv_u64(p, K_REQUESTED_SIZE, used);
    pk_kv_u64(p, K_STREAM, 0);
    pk_key(p, K_SEGMENT_TYPE);
    pk_key(p, K_LARGE);
    pk_key(p, K_SEGMENT_POOL_ID);
    pk_u64(p, 0);
    pk_u64(p, 0);
    pk_op(p, PK_TUPLE2);
    pk_key(p, K_IS_EXPANDABLE);
    pk_op(p, PK_TRUE);
    pk_key(p, K_FRAMES);
    pk_op(p, PK_EMPTY_LIST);
    pk_key(p, K_BLOCKS);
    size_t outer = p->in_batch;
    pk_list_begin(p);
    uint64_t at = a;
    for (size_t j = from; j < to; j++) { /* the ranges are true ones (walk), so no end below wraps */
        if (blk[j].a > at)
            pk_block(p, at, blk[j].a - at, 0);
        pk_block(p, blk[j].a, blk[j].n, 1);
        if (blk[j].a + blk[j].n > at)
            at = blk[j].a + blk[j].n;
    }
    if (at < a + n)
        pk_block(p, at, a + n - at, 0);
    pk_list_end(p);
    p->in_batch = outer;
    pk_op(p, PK_SETITEMS);
    pk_item(p);
}

/* The segments at the end: each contiguous range shown mapped, with the live blocks that lie in it.  A live
 * block outside every range (a trace without map records) is a segment of its own.  Each turn takes a range
 * or at least one block, so the list ends. */
static int pk_segments(snap_ctx *s, int device)
{
    range *blk = NULL, *ch = NULL;
    size_t nblk = 0, nch = 0, cap = 0;
    segset *ss = &s->sets;
    for (size_t j = 0; (j = ss_first(ss, j, ss->np, P_SHOWN)) < ss->np;) {
        size_t k = ss_first(ss, j, ss->np, P_HIDDEN);
        if (range_push(&ch, &nch, &cap, ss->x[j], ss->x[k] - ss->x[j])) {
            free(ch);
            return -1;
        }
        j = k;
    }
    if (ranges_of(&s->live.at, &blk, &nblk)) {
        free(ch);
        return -1;
    }
    pk *p = &s->p;
    pk_list_begin(p);
    size_t bi = 0, ci = 0;
    while (ci < nch || bi < nblk) {
        if (ci < nch && (bi == nblk || ch[ci].a <= blk[bi].a)) {
            uint64_t a = ch[ci].a, end = a + ch[ci].n;
            ci++;
            /* the blocks that start in [a, end) must end there too (they do in a trace the pool wrote) */
            size_t j = bi;
            while (j < nblk && blk[j].a < end && blk[j].a + blk[j].n <= end)
                j++;
            pk_segment(p, device, a, end - a, blk, bi, j);
            bi = j;
        } else {
            pk_segment(p, device, blk[bi].a, blk[bi].n, blk, bi, bi + 1);
            bi++;
        }
    }
    pk_list_end(p);
    free(blk);
    free(ch);
    return 0;
}

static void snap_free(snap_ctx *s)
{
    blocks_free(&s->live);
    free(s->sets.x);
    free(s->sets.t);
    free(s->dirty);
    free(s->runs);
}

int trace_write_snapshot(const trace_data *d, FILE *f, char *err, size_t cap)
{
    snap_ctx s;
    memset(&s, 0, sizeof s);
    s.p.f = f;
    s.d = d;
    s.err = err;
    s.cap = cap;
    if (d->h.device < 0 || d->h.device > TRACE_MAX_DEVICE) { /* one empty list a device before it */
        snprintf(err, cap, "the trace names device %d; a device ordinal is 0 to %d", d->h.device, TRACE_MAX_DEVICE);
        return -1;
    }
    if (ss_init(&s.sets, d) || blocks_init(&s.live, d)) {
        snprintf(err, cap, "no host memory for the snapshot of the trace's %zu records", d->n);
        snap_free(&s);
        return -1;
    }
    int device = d->h.device;
    pk *p = &s.p;
    fputs("\x80\x02", f); /* PROTO 2 */
    pk_op(p, PK_EMPTY_DICT);
    pk_op(p, PK_MARK);
    pk_key(p, K_DEVICE_TRACES);
    pk_list_begin(p); /* one list a device, up to the trace's */
    for (int i = 0; i < device; i++) {
        pk_op(p, PK_EMPTY_LIST);
        pk_item(p);
    }
    size_t outer = p->in_batch;
    pk_list_begin(p);
    err[0] = 0;
    int rc = walk(d, snap_event, &s, err, cap);
    if (rc != 0 && !err[0]) /* snap_event's -1 without a reason */
        snprintf(err, cap, "no host memory for the snapshot of the trace's %zu records", d->n);
    pk_list_end(p);
    p->in_batch = outer;
    pk_item(p);
    pk_list_end(p);
    if (rc == 0) {
        pk_key(p, K_SEGMENTS);
        if (pk_segments(&s, device) != 0) {
            snprintf(err, cap, "no host memory for the snapshot's segments");
            rc = -1;
        }
    }
    pk_op(p, PK_SETITEMS);
    pk_op(p, PK_STOP);
    snap_free(&s);
    return finish(f, rc, err, cap);
}

/* ------------------------------------------------------------ SVG */

#define SVG_W 960
#define SVG_H 480
#define SVG_L 90  /* left margin: the bytes' labels */
#define SVG_R 20
#define SVG_T 40
#define SVG_B 50
#define SVG_COLS (SVG_W - SVG_L - SVG_R)

/* One series drawn as its value's first, lowest, highest and last in each pixel column, so that a trace of
 * millions of records stays a few thousand points and no peak is lost. */
typedef struct col {
    uint64_t first, lo, hi, last;
    int seen;
} col;

typedef struct svg_ctx {
    col use[SVG_COLS], map[SVG_COLS];
    uint64_t t0, span, peak;
} svg_ctx;

static void col_put(col *c, uint64_t v)
{
    if (!c->seen) {
        c->first = c->lo = c->hi = v;
        c->seen = 1;
    }
    c->lo = v < c->lo ? v : c->lo;
    c->hi = v > c->hi ? v : c->hi;
    c->last = v;
}

static int svg_point(void *p, const viz_ev *e)
{
    svg_ctx *c = p;
    uint64_t t = e->r->t_ns - c->t0; /* walk() passes only time stamps in order: t0 <= t_ns <= t0 + span */
    size_t x = c->span ? (size_t)((double)t / (double)c->span * (SVG_COLS - 1)) : 0;
    if (x >= SVG_COLS)
        x = SVG_COLS - 1;
    col_put(&c->use[x], e->in_use);
    col_put(&c->map[x], e->mapped);
    if (e->in_use > c->peak)
        c->peak = e->in_use;
    if (e->mapped > c->peak)
        c->peak = e->mapped;
    return 0;
}

static void svg_text(FILE *f, const char *s)
{
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        if (*q == '<')
            fputs("&lt;", f);
        else if (*q == '>')
            fputs("&gt;", f);
        else if (*q == '&')
            fputs("&amp;", f);
        else if (*q == '"')
            fputs("&quot;", f);
        else if (*q < 0x20 || *q >= 0x80)
            fputc('?', f); /* XML takes neither control bytes nor bytes that may not be UTF-8 */
        else
            fputc(*q, f);
    }
}

static void svg_series(FILE *f, const col *c, double ys, const char *color, const char *name)
{
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    double last = -1;
    for (int x = 0; x < SVG_COLS; x++) {
        if (!c[x].seen) {
            if (last >= 0) /* a step: the value holds until the next event */
                fprintf(f, "%d,%.1f ", SVG_L + x, last);
            continue;
        }
        const uint64_t v[4] = {c[x].first, c[x].lo, c[x].hi, c[x].last};
        if (last >= 0)
            fprintf(f, "%d,%.1f ", SVG_L + x, last);
        for (int k = 0; k < 4; k++)
            fprintf(f, "%d,%.1f ", SVG_L + x, SVG_H - SVG_B - (double)v[k] * ys);
        last = SVG_H - SVG_B - (double)c[x].last * ys;
    }
    fprintf(f, "\"><title>%s</title></polyline>\n", name);
}

static const char *unit_of(uint64_t peak, double *div)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    *div = 1;
    while (i < 4 && (double)peak / *div >= 1024 * 4) {
        *div *= 1024;
        i++;
    }
    return u[i];
}

int trace_write_svg(const trace_data *d, const char *title, FILE *f, char *err, size_t cap)
{
    svg_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, cap, "no host memory for the plot");
        return -1;
    }
    c->t0 = d->n ? d->recs[0].t_ns : 0;
    c->span = d->n ? d->recs[d->n - 1].t_ns - c->t0 : 0;
    int rc = walk(d, svg_point, c, err, cap);
    if (rc != 0) {
        free(c);
        return rc;
    }
    int maps = has_maps(d);
    uint64_t top = c->peak ? c->peak + c->peak / 20 : 1;
    double ys = (double)(SVG_H - SVG_T - SVG_B) / (double)top, div;
    const char *unit = unit_of(top, &div);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text x=\"%d\" y=\"20\" font-size=\"14\">",
            SVG_W, SVG_H, SVG_W, SVG_H, SVG_L);
    svg_text(f, title);
    fprintf(f, "</text>\n");
    /* the axes, five lines across with the bytes, five times */
    for (int k = 0; k <= 4; k++) {
        double v = (double)top * k / 4;
        double y = SVG_H - SVG_B - v * ys;
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", SVG_L, SVG_W - SVG_R, y, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1f %s</text>\n", SVG_L - 6, y + 4, v / div, unit);
        double t = (double)c->span * k / 4 / 1e9;
        int x = SVG_L + (SVG_COLS - 1) * k / 4;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.3g s</text>\n", x, SVG_H - SVG_B + 18, t);
    }
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", SVG_L, SVG_W - SVG_R,
            SVG_H - SVG_B, SVG_H - SVG_B);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", SVG_L, SVG_L, SVG_T,
            SVG_H - SVG_B);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">time since the trace began</text>\n",
            SVG_L + SVG_COLS / 2, SVG_H - 12);
    if (maps)
        svg_series(f, c->map, ys, "#f28e2c", "mapped (held from the driver)");
    svg_series(f, c->use, ys, "#4e79a7", "in use");
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"4\" fill=\"#4e79a7\"/><text x=\"%d\" y=\"%d\">in use "
               "(%s)</text>\n",
            SVG_W - 330, SVG_T - 14, SVG_W - 314, SVG_T - 9, d->has_app ? "the application's blocks" : "blocks");
    if (maps)
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"4\" fill=\"#f28e2c\"/><text x=\"%d\" y=\"%d\">"
                   "mapped</text>\n",
                SVG_W - 110, SVG_T - 14, SVG_W - 94, SVG_T - 9);
    else
        fprintf(f, "<text x=\"%d\" y=\"%d\">(no map records: mapped unknown)</text>\n", SVG_W - 330, SVG_T + 6);
    fprintf(f, "</svg>\n");
    free(c);
    return finish(f, 0, err, cap);
}
