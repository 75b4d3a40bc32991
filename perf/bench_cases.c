/* bench_cases.c - the workloads of fabpool_bench, run against one allocator.
 * docs/performance.md says what each one does. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double at(const double *v, int n, double q)
{
    int i = (int)(q * (double)n);
    return v[i < n ? i : n - 1];
}

static void summarize(double *v, int n, bresult *r)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    r->n = n;
    r->median = v[n / 2];
    r->p99 = at(v, n, 0.99);
    r->p999 = at(v, n, 0.999);
    r->mean = sum / n;
    for (int k = 0; k < BQ; k++)
        r->q[k] = at(v, n, (double)k / (BQ - 1));
}

/* ---------------------------------------------------------------- latency */

typedef struct lat_thread {
    balloc *a;
    const bcase *c;
    pthread_barrier_t *bar;
    double *v;
    int n, cap, batch;
    int failed;
} lat_thread;

static void *lat_worker(void *arg)
{
    lat_thread *t = arg;
    balloc *a = t->a;
    const bcase *c = t->c;
    cu.ctx_set(cu.ctx);
    size_t size = (size_t)c->size;
    void *p;
    /* warm-up (the first pairs may map a slab: tens of microseconds), then
     * the batch: one pair if a warm pair is slow, else c->batch.  Timing a
     * fast pair alone would time the clock instead. */
    for (int i = 0; i < 2 && !t->failed; i++)
        if (a->alloc(a, size, &p) || a->free(a, p))
            t->failed = 1;
    double t0 = bench_now_ns();
    for (int i = 0; i < 4 && !t->failed; i++)
        if (a->alloc(a, size, &p) || a->free(a, p))
            t->failed = 1;
    double one = (bench_now_ns() - t0) / 4;
    t->batch = c->cold || one > 20000 ? 1 : c->batch;
    for (int i = 0; !c->cold && one <= 20000 && i < 256 && !t->failed; i++)
        if (a->alloc(a, size, &p) || a->free(a, p))
            t->failed = 1;
    if (t->bar)
        pthread_barrier_wait(t->bar);
    double deadline = bench_now_ns() + c->budget_s * 1e9;
    while (!t->failed && t->n < t->cap && (t->n < 5 || bench_now_ns() < deadline)) {
        if (c->cold && a->cold)
            a->cold(a); /* untimed */
        double s = bench_now_ns();
        for (int i = 0; i < t->batch; i++)
            if (a->alloc(a, size, &p) || a->free(a, p)) {
                t->failed = 1;
                break;
            }
        t->v[t->n++] = (bench_now_ns() - s) / t->batch;
    }
    if (a->pool)
        fabpool_thread_flush(a->pool);
    return NULL;
}

static void run_latency(balloc *a, const bcase *c, bresult *r)
{
    int nt = c->threads < 1 ? 1 : c->threads;
    lat_thread *ts = calloc((size_t)nt, sizeof *ts);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nt);
    for (int i = 0; i < nt; i++) {
        ts[i].a = a;
        ts[i].c = c;
        ts[i].cap = c->samples;
        ts[i].v = malloc(sizeof(double) * (size_t)c->samples);
        ts[i].bar = nt > 1 ? &bar : NULL;
    }
    if (nt == 1)
        lat_worker(&ts[0]);
    else {
        for (int i = 0; i < nt; i++)
            pthread_create(&th[i], NULL, lat_worker, &ts[i]);
        for (int i = 0; i < nt; i++)
            pthread_join(th[i], NULL);
    }
    int total = 0, failed = 0;
    r->thread_median_min = 1e300;
    r->thread_median_max = 0;
    for (int i = 0; i < nt; i++) {
        total += ts[i].n;
        failed |= ts[i].failed;
        if (ts[i].n) {
            qsort(ts[i].v, (size_t)ts[i].n, sizeof(double), cmp_d);
            double m = ts[i].v[ts[i].n / 2];
            if (m < r->thread_median_min)
                r->thread_median_min = m;
            if (m > r->thread_median_max)
                r->thread_median_max = m;
        }
    }
    double *all = malloc(sizeof(double) * (size_t)(total ? total : 1));
    int k = 0;
    for (int i = 0; i < nt; i++) {
        memcpy(all + k, ts[i].v, sizeof(double) * (size_t)ts[i].n);
        k += ts[i].n;
        free(ts[i].v);
    }
    if (failed || !total) {
        r->ok = 0;
        snprintf(r->error, sizeof r->error, "an alloc or free of %llu bytes failed",
                 (unsigned long long)c->size);
    } else {
        r->ok = 1;
        summarize(all, total, r);
    }
    free(all);
    free(ts);
    free(th);
    pthread_barrier_destroy(&bar);
}

/* ----------------------------------------------------------------- growth */

/* HybridEP's buffer set for one MoE layer (csrc/hybrid_ep/buffer/intranode.cu,
 * allocate_dispatch_buffers / allocate_combine_buffers, use_shared_buffer off):
 * with T = max_num_of_tokens_per_rank * num_of_ranks_per_node * num_of_nodes,
 *   dispatch expert_output_token          T * hidden * sizeof(bf16)
 *   dispatch expert_output_prob           T * (experts_per_rank * ranks_per_node) * 4
 *   dispatch expert_output_scaling_factor T * (hidden / 128) * 4
 *   combine  expert_input_token           T * hidden * 2
 *   combine  expert_input_prob            T * (experts_per_rank * ranks_per_node) * 4
 * Layer: DeepSeek-V3's (hidden 7168, 256 routed experts) on one node of 8
 * ranks: 32 experts per rank. */
#define TR_HIDDEN 7168
#define TR_EXPERTS_PER_RANK 32
#define TR_RANKS 8
#define TR_NODES 1
#define TR_ALIGN 128      /* token counts are rounded up to this */
#define TR_MIN_TOKENS 512
#define TR_MAX_TOKENS 16384
#define NBUF 5

static void trace_sizes(uint64_t tokens_per_rank, uint64_t s[NBUF])
{
    uint64_t t = tokens_per_rank * TR_RANKS * TR_NODES;
    uint64_t e = TR_EXPERTS_PER_RANK * TR_RANKS;
    s[0] = t * TR_HIDDEN * 2;
    s[1] = t * e * 4;
    s[2] = t * (TR_HIDDEN / 128) * 4;
    s[3] = t * TR_HIDDEN * 2;
    s[4] = t * e * 4;
}

/* Tokens per rank at step i of n: a sequence-length ramp from 1024 to 8192
 * tokens per rank over the trace (as in long-context training), drawn from a
 * normal distribution with a 25 % spread around it, clipped and aligned. */
static uint64_t trace_tokens(uint64_t *rng, int i, int n)
{
    double mean = 1024.0 + (8192.0 - 1024.0) * (double)i / (double)(n > 1 ? n - 1 : 1);
    double x = mean * (1.0 + 0.25 * shape_normal(rng));
    if (x < TR_MIN_TOKENS)
        x = TR_MIN_TOKENS;
    if (x > TR_MAX_TOKENS)
        x = TR_MAX_TOKENS;
    uint64_t t = (uint64_t)x;
    return (t + TR_ALIGN - 1) / TR_ALIGN * TR_ALIGN;
}

/* the target sizes of every step: growth has one buffer, a trace NBUF */
static int plan(const bcase *c, int *nbuf, uint64_t (**tg)[NBUF])
{
    int n;
    if (c->workload == W_GROWTH) {
        n = (int)((c->to - c->from) / c->step) + 1;
        *nbuf = 1;
    } else {
        n = c->steps + 1;
        *nbuf = NBUF;
    }
    uint64_t(*t)[NBUF] = calloc((size_t)n, sizeof *t);
    uint64_t rng = c->seed;
    for (int i = 0; i < n; i++) {
        if (c->workload == W_GROWTH)
            t[i][0] = c->from + (uint64_t)i * c->step;
        else
            trace_sizes(trace_tokens(&rng, i, n), t[i]);
    }
    *tg = t;
    return n;
}

typedef struct gstate {
    balloc *a;
    int nbuf, share;
    fabpool_t *pool;
    fabpool_buffer_t *buf[NBUF];
    fabpool_view_t *view[NBUF];
    uint64_t gen[NBUF], mapped[NBUF];
    void *ptr[NBUF];
    uint64_t size[NBUF];
    uintptr_t peer_va[NBUF];
    size_t peer_size[NBUF];
    double exported, imported, desc, fds;
    char err[200];
} gstate;

static int fab_share_step(gstate *g, int i)
{
    static uint8_t d[1 << 16];
    int fds[256], mine[256];
    size_t len = 0, nfds = 0;
    if (fabpool_buffer_export(g->buf[i], g->gen[i], d, sizeof d, &len, fds, 256, &nfds) != FABPOOL_OK)
        goto fail;
    for (size_t k = 0; k < nfds; k++)
        mine[k] = dup(fds[k]); /* what a Unix socket would hand the peer */
    fabpool_status st = g->view[i] ? fabpool_view_apply(g->view[i], d, len, mine, nfds)
                                   : fabpool_view_open(bench_share_peer, d, len, mine, nfds, &g->view[i]);
    fabpool_buffer_export_done(g->buf[i]);
    if (st != FABPOOL_OK)
        goto fail;
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    fabpool_buffer_get_info(g->buf[i], &bi);
    g->exported += (double)(bi.mapped - g->mapped[i]);
    g->imported += (double)(bi.mapped - g->mapped[i]);
    g->desc += (double)len;
    g->fds += (double)nfds;
    g->mapped[i] = bi.mapped;
    g->gen[i] = bi.generation;
    return 0;
fail:
    snprintf(g->err, sizeof g->err, "sharing buffer %d: %s", i, fabpool_last_error());
    return -1;
}

/* Sets the buffers to sizes s (a grow of each, HybridEP's grow_to).  fabpool
 * resizes in place; every other allocator frees the whole set and allocates
 * it anew, as HybridEP's update_buffer does. */
static int gset(gstate *g, const uint64_t *s, int first)
{
    balloc *a = g->a;
    if (a->grows_in_place) {
        if (first) {
            for (int i = 0; i < g->nbuf; i++) {
                if (fabpool_buffer_create(g->pool, (size_t)g->size[i], (size_t)s[i], &g->buf[i]) != FABPOOL_OK) {
                    snprintf(g->err, sizeof g->err, "fabpool_buffer_create: %s", fabpool_last_error());
                    return -1;
                }
                g->ptr[i] = fabpool_buffer_ptr(g->buf[i]);
            }
        } else {
            size_t sz[NBUF];
            for (int i = 0; i < g->nbuf; i++)
                sz[i] = (size_t)s[i];
            if (fabpool_buffer_resize_set(g->buf, sz, (size_t)g->nbuf, NULL) != FABPOOL_OK) {
                snprintf(g->err, sizeof g->err, "fabpool_buffer_resize_set: %s", fabpool_last_error());
                return -1;
            }
            for (int i = 0; i < g->nbuf; i++)
                g->ptr[i] = fabpool_buffer_ptr(g->buf[i]);
        }
        if (g->share)
            for (int i = 0; i < g->nbuf; i++)
                if (fab_share_step(g, i))
                    return -1;
        return 0;
    }
    for (int i = 0; i < g->nbuf; i++) {
        if (g->peer_va[i])
            bench_hyb_unshare(a, g->peer_va[i], g->peer_size[i]);
        g->peer_va[i] = 0;
        if (g->ptr[i] && a->free(a, g->ptr[i])) {
            snprintf(g->err, sizeof g->err, "free of buffer %d failed", i);
            return -1;
        }
        g->ptr[i] = NULL;
    }
    for (int i = 0; i < g->nbuf; i++) {
        if (a->alloc(a, (size_t)s[i], &g->ptr[i])) {
            g->ptr[i] = NULL;
            snprintf(g->err, sizeof g->err, "alloc of %llu bytes failed", (unsigned long long)s[i]);
            return -1;
        }
        if (g->share) {
            if (bench_hyb_share(a, g->ptr[i], (size_t)s[i], &g->peer_va[i], &g->peer_size[i])) {
                snprintf(g->err, sizeof g->err, "export/import of buffer %d failed", i);
                return -1;
            }
            g->exported += (double)g->peer_size[i];
            g->imported += (double)g->peer_size[i];
            g->fds += 1;
        }
    }
    return 0;
}

static void gclear(gstate *g)
{
    balloc *a = g->a;
    for (int i = 0; i < g->nbuf; i++) {
        if (g->view[i])
            fabpool_view_close(g->view[i]);
        if (g->buf[i]) {
            fabpool_buffer_peers_ack(g->buf[i], UINT64_MAX);
            fabpool_buffer_destroy(g->buf[i], NULL);
        } else {
            if (g->peer_va[i])
                bench_hyb_unshare(a, g->peer_va[i], g->peer_size[i]);
            if (g->ptr[i])
                a->free(a, g->ptr[i]);
        }
    }
    /* the sharing pool's export anchor (an fd kept open) goes with its last chunk, so that another allocator's
     * fd exports pay their own price */
    if (g->share && a->grows_in_place)
        fabpool_trim(g->pool, 0);
}

static uint64_t pool_calls(fabpool_t *p)
{
    static fabpool_stats s = {.struct_size = sizeof s};
    uint64_t n = 0;
    if (p && fabpool_get_stats(p, &s) == FABPOOL_OK)
        for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS; i++)
            n += s.driver_calls[i];
    return n;
}

/* driver calls so far: for fabpool, those of the pools this case uses */
static uint64_t gcalls(gstate *g)
{
    if (g->a->grows_in_place)
        return pool_calls(g->pool) + (g->share ? pool_calls(bench_share_peer) : 0);
    return g->a->calls(g->a);
}

static void run_growth(balloc *a, const bcase *c, bresult *r)
{
    gstate g;
    memset(&g, 0, sizeof g);
    g.a = a;
    g.share = c->share;
    g.pool = c->share ? bench_share_pool : a->pool;
    if (c->share && (!(a == &allocs[A_FABPOOL] || a == &allocs[A_HYBRIDEP]) || !bench_share_pool)) {
        r->ok = -1;
        snprintf(r->error, sizeof r->error, "%s", bench_share_pool ? "this allocator does not share" :
                                                  "the driver allows no POSIX fd handles");
        return;
    }
    uint64_t(*tg)[NBUF];
    int n = plan(c, &g.nbuf, &tg);
    uint64_t cur[NBUF] = {0};
    for (int i = 0; i < g.nbuf; i++) {
        cur[i] = tg[0][i];
        for (int k = 0; k < n; k++)
            if (tg[k][i] > g.size[i])
                g.size[i] = tg[k][i]; /* fabpool's windows: the largest size */
    }
    uint64_t base_used = bench_device_used();
    double *steps_us = malloc(sizeof(double) * (size_t)n);
    if (gset(&g, cur, 1)) {
        r->ok = 0;
        snprintf(r->error, sizeof r->error, "%s", g.err);
        gclear(&g);
        free(tg);
        free(steps_us);
        return;
    }
    g.exported = g.imported = g.desc = g.fds = 0; /* the first full export is setup */
    uint64_t calls0 = gcalls(&g);
    uint64_t peak_live = 0, peak_held = 0;
    int moved = 0, reallocs = 0, nsteps = n - 1, failed = 0;
    double total = 0;
    r->n_series = 0;
    for (int k = 1; k < n; k++) {
        int change = 0;
        uint64_t live = 0;
        for (int i = 0; i < g.nbuf; i++) {
            if (tg[k][i] > cur[i]) {
                cur[i] = tg[k][i];
                change = 1;
            }
            live += cur[i];
        }
        void *before[NBUF];
        memcpy(before, g.ptr, sizeof before);
        double t0 = bench_now_ns();
        if (change && gset(&g, cur, 0)) {
            failed = 1;
            nsteps = k - 1;
            break;
        }
        double us = (bench_now_ns() - t0) / 1000.0;
        total += us;
        steps_us[k - 1] = us;
        reallocs += change;
        for (int i = 0; i < g.nbuf; i++)
            if (g.ptr[i] != before[i]) {
                moved++;
                break;
            }
        uint64_t used = bench_device_used();
        uint64_t held = used > base_used ? used - base_used : 0;
        if (held > peak_held)
            peak_held = held;
        if (live > peak_live)
            peak_live = live;
        if (r->n_series < BSERIES) {
            r->series_live_mib[r->n_series] = (float)((double)live / 1048576.0);
            r->series_held_mib[r->n_series] = (float)((double)held / 1048576.0);
            r->series_us[r->n_series] = (float)us;
            r->n_series++;
        }
    }
    uint64_t calls1 = gcalls(&g);
    uint64_t used = bench_device_used();
    r->final_held = used > base_used ? used - base_used : 0;
    gclear(&g);
    if (failed) {
        r->ok = 0;
        snprintf(r->error, sizeof r->error, "step %d: %.180s", nsteps + 1, g.err);
    } else
        r->ok = 1;
    if (nsteps > 0) {
        r->steps = nsteps;
        r->realloc_steps = reallocs;
        r->us_total = total;
        r->us_per_step = total / nsteps;
        r->us_per_realloc = reallocs ? total / reallocs : 0;
        qsort(steps_us, (size_t)nsteps, sizeof(double), cmp_d);
        r->step_median_us = steps_us[nsteps / 2];
        r->step_p99_us = at(steps_us, nsteps, 0.99);
        r->calls_per_step = calls0 == UINT64_MAX || calls1 == UINT64_MAX ? -1.0
                                                                          : (double)(calls1 - calls0) / nsteps;
        r->peak_held = peak_held;
        r->peak_live = peak_live;
        r->peak_ratio = peak_live ? (double)peak_held / (double)peak_live : 0;
        r->base_changes = moved;
        r->exported_bytes_per_step = g.exported / nsteps;
        r->imported_bytes_per_step = g.imported / nsteps;
        r->desc_bytes_per_step = a->grows_in_place ? g.desc / nsteps : -1;
        r->fds_per_step = g.fds / nsteps;
    }
    free(tg);
    free(steps_us);
}

/* ------------------------------------------------------------------ shapes */

/* A shape (shapes.h) replayed: every allocator sees the same seeded
 * sequence.  Timed in batches of 32 operations; the live bytes' peak is
 * followed at every allocation, and between batches, untimed, the device's
 * used memory is sampled for its peak (memory is mapped at allocations, so
 * the peak at a batch's end is the batch's unless the allocator unmapped
 * in it), their ratio noted after the first tenth of the operations (so
 * that a run ten times as long shows whether it creeps), and the chunks the
 * allocator mapped or unmapped in the batch are counted where it says. */
static void run_shape(balloc *a, const bcase *c, bresult *r)
{
    int cap = shape_max_live(&c->sh);
    void **live = calloc((size_t)cap, sizeof *live);
    uint64_t *lsz = calloc((size_t)cap, sizeof *lsz);
    long nops = shape_ops(&c->sh), nb = nops / 32 + 1, tenth = nops / 10;
    int nv = 0, nlive = 0, nm = 0, failed = 0;
    double *v = malloc(sizeof(double) * (size_t)nb), *mv = malloc(sizeof(double) * (size_t)nb);
    uint64_t live_bytes = 0, peak_live = 0, peak_held = 0, maps0 = a->maps ? a->maps(a) : UINT64_MAX;
    uint64_t base_used = bench_device_used(), maps_at = maps0;
    double deadline = bench_now_ns() + c->budget_s * 1e9;
    long done = 0;
    shape_run sr;
    if (!live || !lsz || !v || !mv || shape_start(&sr, &c->sh) != 0) {
        snprintf(r->error, sizeof r->error, "no host memory for the shape's %d live blocks", cap);
        free(v);
        free(mv);
        free(live);
        free(lsz);
        return;
    }
    r->ratio_tenth = -1;
    while (done < nops && !failed) {
        double t0 = bench_now_ns();
        int k;
        uint64_t size;
        int j;
        for (k = 0; k < 32 && shape_next(&sr, &size, &j); k++, done++) {
            if (size) {
                if (a->alloc(a, (size_t)size, &live[nlive])) {
                    failed = 1;
                    break;
                }
                lsz[nlive++] = size;
                live_bytes += size;
                if (live_bytes > peak_live)
                    peak_live = live_bytes;
            } else {
                if (a->free(a, live[j])) {
                    failed = 1;
                    break;
                }
                live_bytes -= lsz[j];
                live[j] = live[--nlive];
                lsz[j] = lsz[nlive];
            }
        }
        if (k)
            v[nv++] = (bench_now_ns() - t0) / k;
        uint64_t u = bench_device_used(); /* between batches, untimed */
        if (u > base_used && u - base_used > peak_held)
            peak_held = u - base_used;
        if (maps0 != UINT64_MAX && k) {
            uint64_t m = a->maps(a);
            mv[nm++] = (double)(m - maps_at);
            maps_at = m;
        }
        if (r->ratio_tenth < 0 && done >= tenth && peak_live)
            r->ratio_tenth = (double)peak_held / (double)peak_live;
        if (bench_now_ns() > deadline)
            break;
    }
    shape_end(&sr);
    for (int i = 0; i < nlive; i++)
        a->free(a, live[i]);
    r->ops_done = (uint64_t)done;
    r->peak_live = peak_live;
    r->peak_held = peak_held;
    r->peak_ratio = peak_live ? (double)peak_held / (double)peak_live : 0;
    r->map_batches = -1;
    if (nm) {
        int with = 0;
        for (int i = 0; i < nm; i++)
            with += mv[i] > 0;
        r->map_batches = (double)with / nm;
        r->maps = maps_at - maps0;
        bresult mr;
        summarize(mv, nm, &mr);
        r->maps_p99 = mr.p99;
    }
    if (failed) {
        r->ok = 0;
        snprintf(r->error, sizeof r->error, "operation %ld failed with %d blocks live", done, nlive);
    } else
        r->ok = 1;
    if (nv)
        summarize(v, nv, r);
    free(v);
    free(mv);
    free(live);
    free(lsz);
}

void bench_run_case(balloc *a, const bcase *c, bresult *r)
{
    memset(r, 0, sizeof *r);
    if (c->workload == W_LATENCY)
        run_latency(a, c, r);
    else if (c->workload == W_GROWTH || c->workload == W_TRACE)
        run_growth(a, c, r);
    else if (c->workload == W_MIXED || c->workload == W_ACTIVATIONS || c->workload == W_LOGUNIFORM ||
             c->workload == W_FAMILIES)
        run_shape(a, c, r);
    else
        snprintf(r->error, sizeof r->error, "unknown workload %d", c->workload);
}
