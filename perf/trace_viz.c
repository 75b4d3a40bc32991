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

/* A set of addresses as sorted, disjoint, non-adjacent ranges. */
typedef struct iset {
    range *r;
    size_t n, cap;
} iset;

/* s with [a, a + n) added (add) or taken out (!add): 0, or -1 (no memory; s unchanged). */
static int iset_apply(iset *s, uint64_t a, uint64_t n, int add)
{
    if (n > UINT64_MAX - a) /* walk() passes none */
        return -1;
    uint64_t e = a + n;
    /* each range gives at most two (the parts of it left either side of [a, e)), and [a, e) one more */
    if (s->n > (SIZE_MAX / sizeof(range) - 1) / 2)
        return -1;
    range *out = malloc((2 * s->n + 1) * sizeof *out);
    if (!out)
        return -1;
    size_t k = 0, i = 0;
    for (; i < s->n && s->r[i].a + s->r[i].n < a; i++)
        out[k++] = s->r[i];
    uint64_t lo = a, hi = e;
    for (; i < s->n && s->r[i].a <= e; i++) {
        uint64_t ra = s->r[i].a, re = ra + s->r[i].n;
        if (add) {
            lo = ra < lo ? ra : lo;
            hi = re > hi ? re : hi;
        } else {
            if (ra < a)
                out[k++] = (range){ra, a - ra};
            if (re > e)
                out[k++] = (range){e, re - e};
        }
    }
    if (add)
        out[k++] = (range){lo, hi - lo};
    for (; i < s->n; i++)
        out[k++] = s->r[i];
    free(s->r);
    s->r = out;
    s->n = k;
    s->cap = 2 * s->n + 1;
    return 0;
}

typedef struct snap_ctx {
    pk p;
    u64map live;    /* the blocks of the level live now */
    iset mapped;    /* what the chunk records say is mapped now */
    iset shown;     /* what the snapshot's segment events have mapped so far */
    int behind;     /* shown holds memory that is no longer mapped, under a live block */
} snap_ctx;

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

static int live_within(const u64map *m, uint64_t a, uint64_t n)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] && m->keys[i] < a + n && m->keys[i] + m->vals[i] > a)
            return 1;
    return 0;
}

/* The viewer draws every live block inside a segment, so memory is shown unmapped only once no live block is
 * in it: a buffer that shrinks is remapped under its live range before its resize record, and a pool asleep
 * keeps its blocks over no memory.  Unmaps what is shown but no longer mapped and holds no live block. */
static int snap_sync(snap_ctx *s, uint64_t t_ns)
{
    s->behind = 0;
    for (size_t i = 0; i < s->shown.n; i++) {
        range sh = s->shown.r[i];
        /* the parts of sh that are not mapped */
        iset gone = {0};
        if (iset_apply(&gone, sh.a, sh.n, 1))
            return -1;
        for (size_t j = 0; j < s->mapped.n; j++)
            if (s->mapped.r[j].a < sh.a + sh.n && s->mapped.r[j].a + s->mapped.r[j].n > sh.a &&
                iset_apply(&gone, s->mapped.r[j].a, s->mapped.r[j].n, 0)) {
                free(gone.r);
                return -1;
            }
        int changed = 0;
        for (size_t j = 0; j < gone.n; j++) {
            if (live_within(&s->live, gone.r[j].a, gone.r[j].n)) {
                s->behind = 1;
                continue;
            }
            pk_entry(&s->p, K_SEGMENT_UNMAP, gone.r[j].a, gone.r[j].n, 0, t_ns);
            if (iset_apply(&s->shown, gone.r[j].a, gone.r[j].n, 0)) {
                free(gone.r);
                return -1;
            }
            changed = 1;
        }
        free(gone.r);
        if (changed)
            i = (size_t)-1; /* shown changed under the loop: again from the start */
    }
    return 0;
}

static int snap_event(void *c, const viz_ev *e)
{
    snap_ctx *s = c;
    uint64_t t = e->r->t_ns;
    switch (e->kind) {
    case EV_ALLOC:
        pk_entry(&s->p, K_ALLOC, e->addr, e->size, e->stream, t);
        return u64map_put(&s->live, e->addr, e->size) ? -1 : 0;
    case EV_FREE: /* fabpool's free is done when it returns: requested and completed at once */
        pk_entry(&s->p, K_FREE_REQUESTED, e->addr, e->size, e->stream, t);
        pk_entry(&s->p, K_FREE_COMPLETED, e->addr, e->size, e->stream, t);
        u64map_del(&s->live, e->addr, NULL);
        return s->behind ? snap_sync(s, t) : 0;
    case EV_MAP: { /* the parts not shown yet */
        iset add = {0};
        if (iset_apply(&s->mapped, e->addr, e->size, 1) || iset_apply(&add, e->addr, e->size, 1))
            return -1;
        for (size_t j = 0; j < s->shown.n; j++)
            if (iset_apply(&add, s->shown.r[j].a, s->shown.r[j].n, 0)) {
                free(add.r);
                return -1;
            }
        for (size_t j = 0; j < add.n; j++)
            pk_entry(&s->p, K_SEGMENT_MAP, add.r[j].a, add.r[j].n, 0, t);
        int rc = 0;
        for (size_t j = 0; j < add.n && !rc; j++)
            rc = iset_apply(&s->shown, add.r[j].a, add.r[j].n, 1);
        free(add.r);
        return rc;
    }
    case EV_UNMAP:
        return iset_apply(&s->mapped, e->addr, e->size, 0) || snap_sync(s, t) ? -1 : 0;
    default:
        return 0;
    }
}

static int by_addr(const void *x, const void *y)
{
    uint64_t a = ((const range *)x)->a, b = ((const range *)y)->a;
    return a < b ? -1 : a > b;
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
    range *blk = NULL;
    size_t nblk = 0;
    if (ranges_of(&s->live, &blk, &nblk))
        return -1;
    const range *ch = s->shown.r;
    size_t nch = s->shown.n;
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
    return 0;
}

int trace_write_snapshot(const trace_data *d, FILE *f, char *err, size_t cap)
{
    snap_ctx s;
    memset(&s, 0, sizeof s);
    s.p.f = f;
    if (d->h.device < 0 || d->h.device > TRACE_MAX_DEVICE) { /* one empty list a device before it */
        snprintf(err, cap, "the trace names device %d; a device ordinal is 0 to %d", d->h.device, TRACE_MAX_DEVICE);
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
    if (rc != 0 && !err[0]) /* snap_event's -1 */
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
    u64map_free(&s.live);
    free(s.mapped.r);
    free(s.shown.r);
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
