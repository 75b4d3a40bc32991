/* fabpool_bench: allocation latency, buffer growth and mixed live sets,
 * fabpool side by side with what users would pick instead, every allocator
 * in the same run, in turns, with warm-up (docs/performance.md).
 *
 *   fabpool_bench [--quick] [--long] [--seed N] [--json FILE] [--workload W,W,...]
 *                 [--allocators A,A,...] [--no-torch] [--check]   (--help says what each does)
 *
 * --check also holds fabpool's peak held / peak live on each shape to its
 * bound on the simulated driver outside --quick (and, with --long, within
 * SHAPE_CREEP of its ratio over the first tenth of the run).  Times mean
 * something only on a real GPU. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

static FILE *js;
static int js_first = 1;
static int check_failed;
static int quick;

static const char *wname(int w)
{
    return w == W_LATENCY ? "latency" : w == W_GROWTH ? "growth" : w == W_TRACE ? "trace" : w == W_MIXED ? "mixed"
         : w == W_ACTIVATIONS ? "activations" : w == W_LOGUNIFORM ? "loguniform" : "families";
}

static void run_any(balloc *a, const bcase *c, bresult *r)
{
    if (a->remote)
        bench_remote_case(a, c, r);
    else
        bench_run_case(a, c, r);
    /* give back what this allocator caches, so the next one finds the device as it was */
    for (int k = 0; k < A_MAX; k++)
        if (!allocs[k].remote && !allocs[k].unavailable && allocs[k].release)
            allocs[k].release(&allocs[k]);
}

/* a string as JSON: quotes, backslashes and control characters escaped */
static void js_str(const char *v)
{
    fputc('"', js);
    for (const char *p = v ? v : ""; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(js, "\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            fprintf(js, "\\u%04x", (unsigned char)*p);
        else
            fputc(*p, js);
    }
    fputc('"', js);
}

static void js_num(const char *k, double v)
{
    if (v != v || v < 0)
        fprintf(js, ",\"%s\":null", k);
    else
        fprintf(js, ",\"%s\":%.4f", k, v);
}

static void js_case_head(const balloc *a, const bcase *c, const bresult *r, const char *label)
{
    fprintf(js, "%s{\"workload\":\"%s\",\"allocator\":\"%s\",\"label\":\"%s\",\"ok\":%d", js_first ? "" : ",\n",
            wname(c->workload), a->key, label, r->ok);
    js_first = 0;
    if (r->ok != 1) {
        fprintf(js, ",\"error\":");
        js_str(a->unavailable && r->ok != 0 ? a->unavailable : r->error);
    }
}

static void size_name(uint64_t s, char *b, size_t cap)
{
    if (s >= (1ull << 30) && s % (1ull << 30) == 0)
        snprintf(b, cap, "%" PRIu64 " GiB", s >> 30);
    else if (s >= (1u << 20) && s % (1u << 20) == 0)
        snprintf(b, cap, "%" PRIu64 " MiB", s >> 20);
    else if (s >= 1024 && s % 1024 == 0)
        snprintf(b, cap, "%" PRIu64 " KiB", s >> 10);
    else
        snprintf(b, cap, "%" PRIu64 " B", s);
}

/* ---------------------------------------------------------------- latency */

/* results kept for the goals table: fabpool warm 256 B, one thread, and the others */
static double hot[A_MAX];

static void latency_row(bcase *c, const char *title)
{
    char sz[32];
    size_name(c->size, sz, sizeof sz);
    double ref = 0;
    for (int k = 0; k < A_MAX; k++) {
        balloc *a = &allocs[k];
        static bresult r;
        memset(&r, 0, sizeof r);
        if (a->unavailable) {
            r.ok = -1;
        } else
            run_any(a, c, &r);
        if (k == A_FABPOOL && r.ok == 1)
            ref = r.median;
        if (r.ok == 1 && c->size == 256 && !c->cold && c->threads == 1)
            hot[k] = r.median;
        if (r.ok == 1)
            printf("  %-8s %-28s %3d %12.1f %12.1f %12.1f %9.2fx\n", sz, a->name, c->threads, r.median, r.p99,
                   r.p999, ref > 0 ? r.median / ref : 0);
        else if (r.ok == 0) {
            printf("  %-8s %-28s %3d   failed: %s\n", sz, a->name, c->threads, r.error);
            if (!a->remote)
                check_failed = 1;
        }
        if (js) {
            js_case_head(a, c, &r, title);
            fprintf(js, ",\"size\":%" PRIu64 ",\"threads\":%d,\"cold\":%d", c->size, c->threads, c->cold);
            if (r.ok == 1) {
                fprintf(js, ",\"samples\":%d", r.n);
                js_num("median_ns", r.median);
                js_num("p99_ns", r.p99);
                js_num("p999_ns", r.p999);
                js_num("mean_ns", r.mean);
                js_num("thread_median_min_ns", r.thread_median_min);
                js_num("thread_median_max_ns", r.thread_median_max);
                js_num("ratio_to_fabpool", ref > 0 ? r.median / ref : -1);
                fprintf(js, ",\"quantiles_ns\":[");
                for (int q = 0; q < BQ; q++)
                    fprintf(js, "%s%.2f", q ? "," : "", r.q[q]);
                fprintf(js, "]");
            }
            fprintf(js, "}");
        }
    }
}

static void latency(void)
{
    static const uint64_t warm_q[] = {256, 4096, 65536, 2u << 20, 64u << 20};
    static const uint64_t warm_f[] = {256, 1024, 4096, 16384, 65536, 262144, 1u << 20, 4u << 20, 16u << 20,
                                      64u << 20, 256u << 20, 1u << 30};
    static const uint64_t thr_sizes[] = {256, 65536, 4u << 20};
    static const int thr_f[] = {1, 2, 4, 8, 16}, thr_q[] = {1, 2, 4};
    static const uint64_t cold_f[] = {256, 65536, 2u << 20, 64u << 20, 1u << 30};
    static const uint64_t cold_q[] = {256, 2u << 20};
    bcase c;
    memset(&c, 0, sizeof c);
    c.workload = W_LATENCY;
    c.samples = quick ? 30 : 2000;
    c.batch = 64;
    c.budget_s = quick ? 0.02 : 0.25;
    const char *hdr = "  %-8s %-28s %3s %12s %12s %12s %10s\n";
    printf("\nlatency, warm: alloc + free of a cached size, ns a pair (batches of 64 where a pair is under 20 us)\n");
    printf(hdr, "size", "allocator", "thr", "median", "p99", "p99.9", "vs fabpool");
    const uint64_t *ws = quick ? warm_q : warm_f;
    int nws = quick ? 5 : 12;
    c.threads = 1;
    for (int i = 0; i < nws; i++) {
        c.size = ws[i];
        latency_row(&c, "warm");
    }
    printf("\nlatency, warm, threads: every thread its own alloc + free pairs; median and p99 over all threads' samples\n");
    printf(hdr, "size", "allocator", "thr", "median", "p99", "p99.9", "vs fabpool");
    const int *th = quick ? thr_q : thr_f;
    int nth = quick ? 3 : 5;
    for (int s = 0; s < 3; s++)
        for (int t = 1; t < nth; t++) {
            c.size = thr_sizes[s];
            c.threads = th[t];
            latency_row(&c, "threads");
        }
    printf("\nlatency, cold: the allocator's cache emptied before each alloc (untimed), ns a pair\n");
    for (int k = 0; k < A_MAX; k++)
        printf("    %-28s %s\n", allocs[k].name, allocs[k].cold_means);
    printf(hdr, "size", "allocator", "thr", "median", "p99", "p99.9", "vs fabpool");
    c.threads = 1;
    c.cold = 1;
    c.samples = quick ? 10 : 300;
    const uint64_t *cs = quick ? cold_q : cold_f;
    for (int i = 0; i < (quick ? 2 : 5); i++) {
        c.size = cs[i];
        latency_row(&c, "cold");
    }
}

/* ---------------------------------------------------------------- growth */

static bresult gres[2][2][A_MAX]; /* [linear|trace][plain|share] */

static void growth_case(bcase *c, int which, int share)
{
    const char *label = share ? "share" : "plain";
    for (int k = 0; k < A_MAX; k++) {
        balloc *a = &allocs[k];
        bresult *r = &gres[which][share][k];
        if (a->unavailable) {
            r->ok = -1;
            continue;
        }
        c->share = share;
        run_any(a, c, r);
        if (r->ok == 0 && !a->remote)
            check_failed = 1;
    }
    double ref = gres[which][share][A_FABPOOL].ok == 1 ? gres[which][share][A_FABPOOL].us_per_step : 0;
    for (int k = 0; k < A_MAX; k++) {
        balloc *a = &allocs[k];
        bresult *r = &gres[which][share][k];
        if (r->ok == 1) {
            char calls[16];
            if (r->calls_per_step < 0)
                snprintf(calls, sizeof calls, "?");
            else
                snprintf(calls, sizeof calls, "%.2f", r->calls_per_step);
            printf("  %-28s %10.1f %9.1f %9.1f %8s %8.3f %6d", a->name, r->us_per_step, r->step_median_us,
                   r->step_p99_us, calls, r->peak_ratio, r->base_changes);
            if (share)
                printf(" %10.1f %10.1f %6.2f", r->exported_bytes_per_step / 1048576.0,
                       r->imported_bytes_per_step / 1048576.0, r->fds_per_step);
            printf(" %8.1fx\n", ref > 0 ? r->us_per_step / ref : 0);
        } else if (r->ok == 0)
            printf("  %-28s failed: %s\n", a->name, r->error);
        if (!js || (r->ok == -1 && share && a->unavailable == NULL))
            continue;
        js_case_head(a, c, r, label);
        fprintf(js, ",\"share\":%d", share);
        if (r->ok == 1) {
            fprintf(js, ",\"steps\":%d,\"realloc_steps\":%d", r->steps, r->realloc_steps);
            js_num("us_per_step", r->us_per_step);
            js_num("us_per_realloc", r->us_per_realloc);
            js_num("step_median_us", r->step_median_us);
            js_num("step_p99_us", r->step_p99_us);
            js_num("calls_per_step", r->calls_per_step);
            fprintf(js, ",\"peak_held_bytes\":%" PRIu64 ",\"peak_live_bytes\":%" PRIu64, r->peak_held, r->peak_live);
            js_num("peak_held_over_live", r->peak_ratio);
            fprintf(js, ",\"base_changes\":%d", r->base_changes);
            js_num("exported_bytes_per_step", r->exported_bytes_per_step);
            js_num("imported_bytes_per_step", r->imported_bytes_per_step);
            js_num("descriptor_bytes_per_step", r->desc_bytes_per_step);
            js_num("fds_per_step", r->fds_per_step);
            js_num("ratio_to_fabpool", ref > 0 ? r->us_per_step / ref : -1);
            fprintf(js, ",\"series\":{\"live_mib\":[");
            for (int i = 0; i < r->n_series; i++)
                fprintf(js, "%s%.1f", i ? "," : "", r->series_live_mib[i]);
            fprintf(js, "],\"held_mib\":[");
            for (int i = 0; i < r->n_series; i++)
                fprintf(js, "%s%.1f", i ? "," : "", r->series_held_mib[i]);
            fprintf(js, "],\"step_us\":[");
            for (int i = 0; i < r->n_series; i++)
                fprintf(js, "%s%.2f", i ? "," : "", r->series_us[i]);
            fprintf(js, "]}");
        }
        fprintf(js, "}");
    }
}

static void growth(int trace)
{
    bcase c;
    memset(&c, 0, sizeof c);
    const char *hdr = "  %-28s %10s %9s %9s %8s %8s %6s";
    if (!trace) {
        c.workload = W_GROWTH;
        c.from = 256u << 20;
        c.to = quick ? 1ull << 30 : 4ull << 30;
        c.step = 16u << 20;
        printf("\ngrowth: one dispatch buffer from %" PRIu64 " MiB to %" PRIu64 " MiB in %" PRIu64
               " MiB steps (each step: grow in place, or free + allocate anew)\n",
               c.from >> 20, c.to >> 20, c.step >> 20);
    } else {
        c.workload = W_TRACE;
        c.steps = quick ? 24 : 200;
        c.seed = 42;
        printf("\ntrace: HybridEP's 5-buffer set (hidden 7168, 32 experts/rank, 8 ranks, bf16) over %d steps of seeded "
               "random tokens per rank (ramp 1024 -> 8192, 25 %% spread); a new high reallocates the set\n",
               c.steps);
    }
    for (int share = 0; share < 2; share++) {
        if (share)
            printf("  with sharing: every change exported to a peer (POSIX fds) and imported there\n");
        printf(hdr, "allocator", "us/step", "median", "p99", "calls", "peak/live", "moved");
        if (share)
            printf(" %10s %10s %6s", "MiB exp.", "MiB imp.", "fds");
        printf(" %9s\n", "vs fabpool");
        growth_case(&c, trace, share);
    }
}

/* ------------------------------------------------------------------ shapes */

/* The bounds fabpool's peak held / peak live keeps on the simulated driver
 * (--check), and how far a run ten times as long (--long) may move it from
 * its value over the first tenth. */
#define SHAPE_CREEP 0.02

typedef struct shape_case {
    const char *label;
    shape sh;
    double bound;      /* 0: none (a shape there to compare allocators, not to hold fabpool to) */
} shape_case;

static int long_run;     /* --long: ten times the operations */
static uint64_t seed_opt; /* --seed: every shape's sequence from this seed (0: each its own) */
static unsigned only;    /* --allocators: a bit per allocator run (0: all) */

static void shape_row(int w, shape_case *sc)
{
    bcase c;
    memset(&c, 0, sizeof c);
    c.workload = w;
    c.sh = sc->sh;
    if (seed_opt)
        c.sh.seed = seed_opt;
    c.seed = c.sh.seed;
    c.budget_s = quick ? 2 : long_run ? 60 : 8;
    double ref = 0;
    for (int k = 0; k < A_MAX; k++) {
        balloc *a = &allocs[k];
        static bresult r;
        memset(&r, 0, sizeof r);
        if (only && !(only & (1u << k)))
            continue;
        if (a->unavailable)
            r.ok = -1;
        else
            run_any(a, &c, &r);
        if (k == A_FABPOOL && r.ok == 1)
            ref = r.median;
        if (r.ok == 1) {
            char maps[48] = "-";
            if (r.map_batches >= 0)
                snprintf(maps, sizeof maps, "%5.1f %% %5.0f %7" PRIu64, 100 * r.map_batches, r.maps_p99, r.maps);
            printf("  %-24s %-28s %10.1f %10.1f %10.1f %9.3f %9.3f %22s %9.2fx%s\n", sc->label, a->name, r.median,
                   r.p99, r.p999, r.peak_ratio, r.ratio_tenth, maps, ref > 0 ? r.median / ref : 0,
                   r.ops_done < (uint64_t)shape_ops(&c.sh) ? " (time budget hit)" : "");
        } else if (r.ok == 0) {
            printf("  %-24s %-28s failed: %s\n", sc->label, a->name, r.error);
            if (!a->remote)
                check_failed = 1;
        }
        /* the layout's bounds, on the simulated driver, for a whole run */
        if (k == A_FABPOOL && r.ok == 1 && cu.sim && !quick && r.ops_done == (uint64_t)shape_ops(&c.sh)) {
            if (!long_run && sc->bound > 0 && r.peak_ratio > sc->bound) {
                printf("  %-24s fabpool holds %.3fx its live peak: above the bound %.2f\n", sc->label, r.peak_ratio,
                       sc->bound);
                check_failed = 1;
            }
            if (long_run && sc->bound > 0 && (r.peak_ratio > r.ratio_tenth + SHAPE_CREEP || r.peak_ratio < r.ratio_tenth - SHAPE_CREEP)) {
                printf("  %-24s fabpool's ratio moved from %.3f over the first tenth to %.3f: more than %.2f\n",
                       sc->label, r.ratio_tenth, r.peak_ratio, SHAPE_CREEP);
                check_failed = 1;
            }
        }
        if (js) {
            js_case_head(a, &c, &r, sc->label);
            const shape *h = &c.sh;
            fprintf(js, ",\"shape\":%d,\"n_live\":%d,\"n_ops\":%ld,\"min_size\":%" PRIu64 ",\"max_size\":%" PRIu64
                        ",\"steps\":%d,\"layers\":%d,\"unit\":%" PRIu64 ",\"len\":[%d,%d],\"bound\":%.2f",
                    h->kind, h->n_live, shape_ops(h), h->min_size, h->max_size, h->steps, h->layers, h->unit, h->len_lo,
                    h->len_hi, sc->bound);
            if (r.ok == 1) {
                fprintf(js, ",\"ops_done\":%" PRIu64, r.ops_done);
                js_num("median_ns", r.median);
                js_num("p99_ns", r.p99);
                js_num("p999_ns", r.p999);
                js_num("mean_ns", r.mean);
                fprintf(js, ",\"peak_held_bytes\":%" PRIu64 ",\"peak_live_bytes\":%" PRIu64, r.peak_held,
                        r.peak_live);
                js_num("peak_held_over_live", r.peak_ratio);
                js_num("peak_held_over_live_first_tenth", r.ratio_tenth);
                js_num("batches_with_maps", r.map_batches);
                js_num("maps_per_batch_p99", r.map_batches >= 0 ? r.maps_p99 : -1);
                js_num("ratio_to_fabpool", ref > 0 ? r.median / ref : -1);
            }
            fprintf(js, "}");
        }
    }
}

static void shapes_head(const char *title)
{
    printf("\n%s\n", title);
    printf("  %-24s %-28s %10s %10s %10s %9s %9s %22s %10s\n", "case", "allocator", "median", "p99", "p99.9",
           "peak/live", "1st 10th", "maps: batches p99 all", "vs fabpool");
}

/* RMM-style random allocations: uniform small blocks, normal medium ones. */
static void mixed(void)
{
    int x = long_run ? 10 : 1;
    shape_case cs[] = {
        {"uniform 1 B..64 KiB", {.kind = SHAPE_UNIFORM, .seed = 7, .n_live = quick ? 500 : 10000,
                                 .n_ops = (quick ? 2000 : 40000) * x, .max_size = 65536}, 1.04},
        {"normal up to 4 MiB", {.kind = SHAPE_NORMAL, .seed = 8, .n_live = quick ? 100 : 2000,
                                .n_ops = (quick ? 400 : 8000) * x, .max_size = 4u << 20}, 1.05},
    };
    shapes_head("mixed: RMM-style random allocations: up to N live, random frees interleaved, ns an operation "
                "(batches of 32)");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        shape_row(W_MIXED, &cs[i]);
}

/* A training loop's activations: 24 layers, four activations each of 1, 4,
 * 2 and 1 x the sequence length x 8 KiB (hidden 4096 in bf16), a length of
 * 256..4096 drawn per step (2 to 128 MiB a block, up to 6 GiB a step), all
 * freed in reverse at the end of the step. */
static void activations(void)
{
    shape_case c = {"activation steps", {.kind = SHAPE_STEPS, .seed = 11, .steps = (quick ? 6 : 60) * (long_run ? 10 : 1),
                                         .layers = 24, .n_factors = 4, .factors = {1, 4, 2, 1}, .unit = 8192,
                                         .len_lo = quick ? 64 : 256, .len_hi = quick ? 512 : 4096}, 1.02};
    shapes_head("activations: steps of 24 layers' activations (2..128 MiB) freed in reverse, each step at another "
                "length, ns an operation (batches of 32)");
    shape_row(W_ACTIVATIONS, &c);
}

/* Log-uniform sizes 4 KiB..16 MiB, up to 1,500 live, random frees. */
static void loguniform(void)
{
    shape_case c = {"log-uniform 4 KiB..16 MiB", {.kind = SHAPE_LOGU, .seed = 9, .n_live = quick ? 150 : 1500,
                                                  .n_ops = (quick ? 4000 : 60000) * (long_run ? 10 : 1),
                                                  .min_size = 4096, .max_size = 16u << 20}, 1.10};
    shapes_head("loguniform: sizes log-uniform in 4 KiB..16 MiB, up to 1,500 live, random frees, ns an operation "
                "(batches of 32)");
    shape_row(W_LOGUNIFORM, &c);
}

/* Shapes fabpool's layout was not tuned to (shapes.h): peak held / peak live against the other allocators, no
 * bound of fabpool's own. */
static void families(void)
{
    int x = long_run ? 10 : 1;
    shape_case cs[] = {
        {"FIFO 64 KiB..8 MiB", {.kind = SHAPE_FIFO, .seed = 21, .n_live = quick ? 150 : 1500,
                                .n_ops = (quick ? 4000 : 60000) * x, .min_size = 64u << 10, .max_size = 8u << 20}, 0},
        {"realloc x1.25 to 512 MiB", {.kind = SHAPE_REALLOC, .seed = 22, .n_live = 200, .layers = 8,
                                      .n_ops = (quick ? 2000 : 20000) * x, .min_size = 1u << 20,
                                      .max_size = (quick ? 64u : 512u) << 20}, 0},
        {"Pareto 4 KiB.. (a 0.8)", {.kind = SHAPE_PARETO, .seed = 23, .n_live = quick ? 400 : 4000,
                                    .n_ops = (quick ? 4000 : 60000) * x, .min_size = 4096,
                                    .max_size = (quick ? 64ull : 1024ull) << 20}, 0},
        {"drift 1 -> 16 MiB", {.kind = SHAPE_DRIFT, .seed = 24, .n_live = quick ? 100 : 1000,
                               .n_ops = (quick ? 4000 : 60000) * x, .min_size = 1u << 20, .max_size = 16u << 20}, 0},
    };
    shapes_head("families: shapes the layout was not tuned to (FIFO, growth by copying, heavy-tailed sizes, sizes "
                "that drift), ns an operation (batches of 32)");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        shape_row(W_FAMILIES, &cs[i]);
}

/* ------------------------------------------------------------------ goals */

static void goal(const char *what, double v, double limit, int at_most, const char *unit)
{
    const char *res = v < 0 ? "n/a" : (at_most ? v <= limit : v >= limit) ? "met" : "NOT met";
    if (v < 0)
        printf("  %-52s %12s   goal %s %g %s: %s\n", what, "-", at_most ? "<=" : ">=", limit, unit, res);
    else
        printf("  %-52s %12.3f   goal %s %g %s: %s\n", what, v, at_most ? "<=" : ">=", limit, unit, res);
    if (js) {
        fprintf(js, "%s{\"goal\":\"%s\",\"limit\":%g,\"at_most\":%d,\"unit\":\"%s\"", js_first ? "" : ",\n", what,
                limit, at_most, unit);
        js_first = 0;
        js_num("value", v);
        fprintf(js, ",\"met\":%s}", v < 0 ? "null" : strcmp(res, "met") ? "false" : "true");
    }
}

static void goals(int did_lat, int did_growth)
{
    printf("\ngoals\n");
    if (js)
        fprintf(js, "\n],\"goals\":[\n");
    js_first = 1;
    double f = did_lat && hot[A_FABPOOL] > 0 ? hot[A_FABPOOL] : -1;
    goal("hot path alloc+free, 256 B, 1 thread (ns)", f, 40, 1, "ns");
    goal("speed-up over PyTorch's caching allocator", f > 0 && hot[A_TORCH] > 0 ? hot[A_TORCH] / f : -1, 10, 0, "x");
    goal("speed-up over cudaMallocAsync", f > 0 && hot[A_ASYNC] > 0 ? hot[A_ASYNC] / f : -1, 25, 0, "x");
    bresult *g = &gres[0][0][A_FABPOOL];
    int ok = did_growth && g->ok == 1;
    goal("growth 256 MiB -> 4 GiB, amortized (us a step)", ok ? g->us_per_step : -1, 10, 1, "us");
    goal("growth: peak physical / peak live", ok ? g->peak_ratio : -1, 1.25, 1, "x");
    goal("growth: base-address changes", ok ? g->base_changes : -1, 0, 1, "");
    if (ok && (g->base_changes != 0 || g->peak_ratio > 1.25))
        check_failed = 1;
    for (int w = 0; w < 2 && did_growth; w++) {
        bresult *fs = &gres[w][1][A_FABPOOL], *hs = &gres[w][1][A_HYBRIDEP];
        if (gres[w][0][A_FABPOOL].ok == 1 && gres[w][0][A_FABPOOL].base_changes)
            check_failed = 1;
        if (fs->ok == 1 && hs->ok == 1 && !(fs->exported_bytes_per_step < hs->exported_bytes_per_step))
            check_failed = 1;
    }
}

static void print_meta(void)
{
    printf("allocators:\n");
    for (int k = 0; k < A_MAX; k++)
        printf("  %-28s %s\n", allocs[k].name, allocs[k].unavailable ? allocs[k].unavailable : "ready");
    if (!js)
        return;
    fprintf(js, "{\"bench\":\"fabpool_bench\",\"driver\":\"%s\",\"simulated\":%d,\"quick\":%d,\"allocators\":[",
            cu.path, cu.sim, quick);
    for (int k = 0; k < A_MAX; k++) {
        fprintf(js, "%s{\"key\":\"%s\",\"name\":\"%s\",\"available\":%d,\"note\":", k ? "," : "",
                allocs[k].key, allocs[k].name, !allocs[k].unavailable);
        js_str(allocs[k].unavailable);
        fprintf(js, ",\"cold_means\":");
        js_str(allocs[k].cold_means);
        fprintf(js, "}");
    }
    fprintf(js, "],\n\"trace_parameters\":{\"hidden\":7168,\"experts_per_rank\":32,\"ranks_per_node\":8,\"nodes\":1,"
                "\"dtype\":\"bf16\",\"buffers\":5,\"tokens_ramp\":[1024,8192],\"spread\":0.25,\"align\":128,"
                "\"seed\":42},\n\"results\":[\n");
}

static int sim_clean(void)
{
    typedef struct {
        uint64_t handles, allocations, mappings, reservations, exported_fds, bytes_held, bytes_mapped, dev[16],
            legacy, rest[256]; /* room for the fields the sim adds later: it fills its whole struct */
    } ledger;
    int (*get)(ledger *) = (int (*)(ledger *))dlsym(RTLD_DEFAULT, "fabsim_get_ledger");
    if (!get)
        return 1;
    ledger l;
    memset(&l, 0, sizeof l);
    get(&l);
    if (l.handles || l.mappings || l.reservations || l.bytes_held || l.exported_fds || l.legacy) {
        fprintf(stderr, "fabpool_bench: the simulated driver still holds: %" PRIu64 " handles, %" PRIu64
                        " mappings, %" PRIu64 " reservations, %" PRIu64 " bytes, %" PRIu64 " fds, %" PRIu64
                        " legacy blocks\n",
                l.handles, l.mappings, l.reservations, l.bytes_held, l.exported_fds, l.legacy);
        return 0;
    }
    return 1;
}

static const char usage_line[] =
    "usage: fabpool_bench [--quick] [--long] [--seed N] [--json FILE] [--workload W,W,...] [--allocators A,A,...] "
    "[--no-torch] [--check]\n";

static void help(void)
{
    printf("%s\n"
           "Measures fabpool beside cudaMalloc, cudaMallocAsync, PyTorch's caching allocator (default and\n"
           "expandable_segments, where a PyTorch was found at configure time) and HybridEP's VMM pattern, every\n"
           "allocator in the same run, in turns (docs/performance.md).  Times mean something only on a GPU.\n\n"
           "  --quick          fewer samples and steps (a smoke run)\n"
           "  --long           the shapes (mixed, activations, loguniform, families) ten times as long, to show\n"
           "                   nothing creeps\n"
           "  --seed N         the shapes' random sequences from seed N (1 or more) instead of their own (7, 8,\n"
           "                   11, 9; 21 to 24): the same shape over other draws, for the spread of its peak held /\n"
           "                   live\n"
           "  --json FILE      every figure as one JSON object into FILE\n"
           "  --workload W,... latency (alloc + free, warm and cold, 256 B to 1 GiB, 1 to 16 threads), growth (a\n"
           "                   dispatch buffer from 256 MiB to 4 GiB), trace (a HybridEP-like variable-length\n"
           "                   trace, with and without sharing), mixed (RMM-style live sets), activations (a\n"
           "                   transformer-like step: activations sized by a sequence length, freed in reverse),\n"
           "                   loguniform (log-uniform sizes, random frees), families (shapes the layout was\n"
           "                   not tuned to: FIFO, growth by copying, heavy-tailed sizes, drifting sizes), or\n"
           "                   all (default); a comma list\n"
           "  --allocators A,...  only these allocators, by their JSON keys (fabpool, fabpool_notc, cuMemAllocAsync,\n"
           "                   cuMemAlloc, hybridep, torch, torch_expandable)\n"
           "  --no-torch       leave out PyTorch's columns\n"
           "  --check          exit 1 unless every case of every allocator ran, fabpool's buffers never moved, its\n"
           "                   growth held at most 1.25x what was live, its deltas exported less than re-exporting,\n"
           "                   and (simulated driver) nothing is held at the end and each shape's peak held / peak\n"
           "                   live stayed within its bound (with --long: within 0.02 of its first tenth's)\n"
           "  --help           this text\n\n"
           "Exit status: 0; 1 if the driver or an allocator could not be set up, or a --check failed; 2 for a\n"
           "wrong command line.\n",
           usage_line);
}

/* Whether the comma-separated list has the word w. */
static int listed(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, w, n))
            return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *json_path = NULL, *workload = "all", *allocators = NULL;
    int with_torch = 1, check = 0;
    /* the PyTorch columns' child processes (bench_remote_case): internal, not for users */
    if (argc == 5 && !strcmp(argv[1], "--child"))
        return bench_child_main(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    enum { O_QUICK = 256, O_LONG, O_JSON, O_WORKLOAD, O_ALLOCATORS, O_NO_TORCH, O_CHECK, O_SEED };
    static const struct option opts[] = {
        {"quick", no_argument, NULL, O_QUICK},   {"json", required_argument, NULL, O_JSON},
        {"workload", required_argument, NULL, O_WORKLOAD}, {"no-torch", no_argument, NULL, O_NO_TORCH},
        {"check", no_argument, NULL, O_CHECK},   {"long", no_argument, NULL, O_LONG},
        {"seed", required_argument, NULL, O_SEED},
        {"allocators", required_argument, NULL, O_ALLOCATORS},   {"help", no_argument, NULL, 'h'}, {0}};
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        switch (c) {
        case O_QUICK: quick = 1; break;
        case O_LONG: long_run = 1; break;
        case O_SEED:
            if (cli_u64("fabpool_bench", "--seed", optarg, 1, UINT64_MAX, &seed_opt) != CLI_OK)
                return cli_usage_error(usage_line);
            break;
        case O_ALLOCATORS: allocators = optarg; break;
        case O_JSON: json_path = optarg; break;
        case O_WORKLOAD: workload = optarg; break;
        case O_NO_TORCH: with_torch = 0; break;
        case O_CHECK: check = 1; break;
        case 'h': help(); return CLI_OK;
        default: return cli_usage_error(usage_line);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fabpool_bench: '%s': no operand is taken\n", argv[optind]);
        return cli_usage_error(usage_line);
    }
    int all = !strcmp(workload, "all");
    int w_lat = all || listed(workload, "latency"), w_gro = all || listed(workload, "growth");
    int w_tra = all || listed(workload, "trace"), w_mix = all || listed(workload, "mixed");
    int w_act = all || listed(workload, "activations"), w_log = all || listed(workload, "loguniform");
    int w_fam = all || listed(workload, "families");
    if (!w_lat && !w_gro && !w_tra && !w_mix && !w_act && !w_log && !w_fam) {
        fprintf(stderr, "fabpool_bench: unknown workload '%s' (latency, growth, trace, mixed, activations, loguniform, "
                        "families or all)\n", workload);
        return cli_usage_error(usage_line);
    }
    if (bench_load_driver()) {
        fprintf(stderr, "fabpool_bench: cannot load and initialize the driver %s%s\n", cu.path, cli_sim_hint());
        return 1;
    }
    if (json_path && !(js = fopen(json_path, "w"))) {
        perror(json_path);
        return 1;
    }
    if (bench_setup_allocators(argv[0], with_torch)) {
        fprintf(stderr, "fabpool_bench: %s\n", fabpool_last_error());
        return 1;
    }
    for (int k = 0; allocators && k < A_MAX; k++)
        if (listed(allocators, allocs[k].key))
            only |= 1u << k;
    if (allocators && !only) {
        fprintf(stderr, "fabpool_bench: --allocators %s names none of the allocators (see their keys in the JSON)\n",
                allocators);
        return cli_usage_error(usage_line);
    }
    printf("fabpool_bench: driver %s (%s)%s\n", cu.path, cu.sim ? "simulated: times are not GPU times" : "real",
           quick ? ", quick run" : "");
    print_meta();
    if (w_lat)
        latency();
    if (w_gro)
        growth(0);
    if (w_tra)
        growth(1);
    if (w_mix)
        mixed();
    if (w_act)
        activations();
    if (w_log)
        loguniform();
    if (w_fam)
        families();
    goals(w_lat, w_gro);
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    bench_teardown_allocators();
    if (check && cu.sim && !sim_clean())
        check_failed = 1;
    if (check && check_failed) {
        fprintf(stderr, "fabpool_bench --check: FAILED (see above)\n");
        return 1;
    }
    return 0;
}
