/* stats.c - what the pool holds, what it gave out, what it asked of the
 * driver, and the options in force (fabpool_get_options); as a struct, as
 * text and as JSON, all three from one table of its fields (STATS_FIELDS).
 * It reads what every layer counts and resets the peaks. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#include "conf_options.h"
#include "error.h"

static uint64_t ld(_Atomic uint64_t *a) { return atomic_load_explicit(a, memory_order_relaxed); }

/* Chunks the pool maps, from the device layer's registry. */
static uint64_t mapped_chunks(const struct fabpool *p)
{
    uint64_t n = 0;
    fp_chunks_mapped(&p->ch, &n);
    return n;
}

/* The options in force: the pool's, with the handle type and rdma chosen and the reservation made. */
static fabpool_options options_in_force(const struct fabpool *p)
{
    fabpool_options o = p->opt;
    o.handle_type = p->ch.handle_type;
    o.rdma = p->ch.rdma ? FABPOOL_RDMA_ON : FABPOOL_RDMA_OFF;
    o.reserve_bytes = p->sp.va.size;
    return o;
}

fabpool_status fabpool_get_options(const fabpool_t *p, fabpool_options *out)
{
    if (!p || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_get_options: the pool or the output is NULL");
    fabpool_status st = fp_struct_size_check("fabpool_get_options", "fabpool_options", out->struct_size, sizeof *out);
    if (st != FABPOOL_OK)
        return st;
    *out = options_in_force(p);
    return FABPOOL_OK;
}

/* What the walk of the classes adds up. */
typedef struct class_sums {
    uint64_t small_in_use; /* bytes of slab blocks given out */
    uint64_t blocks;       /* blocks given out, slab and larger */
} class_sums;

/* One row of s->classes per slab class, then per class of larger blocks, that has been used.  Pool lock held. */
static class_sums class_rows(fabpool_t *p, fabpool_stats *s)
{
    class_sums w = {0, 0};
    unsigned row = 0;
    /* live large blocks by the class of the grid their size falls in */
    uint64_t large_live[FP_NCLASS];
    memset(large_live, 0, sizeof large_live);
    fp_heap_count_large(&p->heap, large_live);
    for (unsigned c = 0; c < FP_NCLASS && row < FABPOOL_NUM_CLASSES; c++) {
        fp_class *k = &p->heap.classes[c];
        if (c < p->heap.n_slab_classes) {
            fp_class_counts *n = &p->alloc.counts[c];
            uint64_t allocs = ld(&n->allocs) + ld(&n->tc_allocs), frees = ld(&n->frees) + ld(&n->tc_frees);
            for (fp_tcache *tc = p->alloc.tcaches; tc; tc = tc->next) {
                allocs += ld(&tc->allocs[c]);
                frees += ld(&tc->frees[c]);
            }
            fp_lock(&k->lock);
            uint64_t slabs = k->nslabs;
            fp_unlock(&k->lock);
            if (!allocs && !slabs)
                continue;
            uint64_t in_use = allocs - frees;
            fabpool_class_stats *cs = &s->classes[row++];
            cs->size = k->obj_size;
            cs->in_use = in_use;
            cs->cached = slabs * k->nobj - in_use;
            cs->slabs = slabs;
            cs->allocs = allocs;
            w.small_in_use += in_use * k->obj_size;
            w.blocks += in_use;
        } else {
            /* large blocks: no class, their free memory is in cached_bytes */
            uint64_t allocs = ld(&p->heap.large_allocs[c]);
            if (!allocs && !large_live[c])
                continue;
            fabpool_class_stats *cs = &s->classes[row++];
            cs->size = fp_class_size(c);
            cs->in_use = large_live[c];
            cs->allocs = allocs;
            w.blocks += large_live[c];
        }
    }
    return w;
}

static uint64_t at_least(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Mapped but neither in use, retiring nor a view: free memory kept mapped. */
static uint64_t free_mapped(const fabpool_stats *s)
{
    uint64_t held = s->in_use_bytes + s->retiring_bytes + s->view_bytes;
    return s->mapped_bytes > held ? s->mapped_bytes - held : 0;
}

/* How the text and the JSON write a field. */
typedef enum stat_kind { STAT_BYTES, STAT_COUNT } stat_kind;

/* Every uint64_t scalar of fabpool_stats: X(field, kind, label in the text, value).  One row is all a field
 * needs: fabpool_get_stats fills the rows in this order under the pool's lock (a value may use the rows above
 * it, through s, and the walk of the classes, through w), and the text and the JSON report them in it, so the
 * JSON keys, which the Python module reads, are the field names. */
#define STATS_FIELDS(X)                                                                                        \
    X(reserved_bytes, STAT_BYTES, "reserved", p->sp.va.size)                                                   \
    X(mapped_bytes, STAT_BYTES, "mapped", fp_chunks_mapped(&p->ch, NULL))                                      \
    X(mapped_bytes_peak, STAT_BYTES, "mapped, peak", fp_chunks_mapped_peak(&p->ch))                            \
    X(in_use_bytes, STAT_BYTES, "in use", w.small_in_use + ld(&p->heap.large_in_use_bytes) + ld(&p->bufs.bytes)) \
    /* the peak is never below in use now (usage.h: counted as blocks leave their classes) */                 \
    X(in_use_bytes_peak, STAT_BYTES, "in use, peak", at_least(ld(&p->use.peak), s->in_use_bytes))              \
    X(retiring_bytes, STAT_BYTES, "retiring", ld(&p->bufs.retiring_bytes))                                     \
    X(view_bytes, STAT_BYTES, "views of peers", ld(&p->views.bytes))                                           \
    X(cached_bytes, STAT_BYTES, "cached", free_mapped(s))                                                      \
    X(stream_pending_bytes, STAT_BYTES, "pending on streams", ld(&p->retire.pending_bytes))                    \
    X(stream_pending_blocks, STAT_COUNT, "pending blocks", ld(&p->retire.pending_blocks))                      \
    X(held_for_peers_bytes, STAT_BYTES, "held for peers", ld(&p->bufs.held_for_peers_bytes))                            \
    X(buffers, STAT_COUNT, "buffers", ld(&p->bufs.count))                                                      \
    X(blocks, STAT_COUNT, "blocks", w.blocks)                                                                  \
    X(chunks_mapped, STAT_COUNT, "chunks mapped", mapped_chunks(p))                                            \
    X(chunks_mapped_total, STAT_COUNT, "chunks mapped, all", ld(&p->ch.chunks_mapped_total))                   \
    X(chunks_unmapped_total, STAT_COUNT, "chunks unmapped, all", ld(&p->ch.chunks_unmapped_total))             \
    X(handles_outstanding, STAT_COUNT, "handles held", ld(&p->ch.handles_outstanding))                         \
    X(exported_fds_open, STAT_COUNT, "exported fds open", ld(&p->ch.exported_fds))                             \
    X(oom_retries, STAT_COUNT, "OOM retries", ld(&p->heap.oom_retries))                                        \
    X(metadata_bytes, STAT_BYTES, "host metadata", ld(&p->meta.bytes))                                         \
    X(traded_bytes, STAT_BYTES, "traded", ld(&p->heap.traded_bytes))                                          \
    X(kept_bytes, STAT_BYTES, "kept for reuse", ld(&p->bufs.kept_bytes) + ld(&p->views.kept_bytes))

typedef struct stat_row {
    const char *name, *label;
    size_t offset;
    stat_kind kind;
} stat_row;

static const stat_row stat_rows[] = {
#define STAT_ROW(f, kind, label, value) {#f, label, offsetof(fabpool_stats, f), kind},
    STATS_FIELDS(STAT_ROW)
#undef STAT_ROW
};
#define N_STAT_ROWS (sizeof stat_rows / sizeof stat_rows[0])
/* A field added to fabpool_stats without its row would stay 0 and be missing from the reports: the rows, the
 * metadata pair and the arrays make up the whole struct. */
_Static_assert(sizeof(size_t) + N_STAT_ROWS * sizeof(uint64_t) + sizeof(int) + sizeof(unsigned) +
                       sizeof(((fabpool_stats *)0)->driver_calls) + sizeof(((fabpool_stats *)0)->driver_call_names) +
                       sizeof(((fabpool_stats *)0)->classes) ==
                   sizeof(fabpool_stats),
               "every uint64_t field of fabpool_stats has its row in STATS_FIELDS");

static uint64_t stat_value(const fabpool_stats *s, const stat_row *r)
{
    uint64_t v;
    memcpy(&v, (const char *)s + r->offset, sizeof v);
    return v;
}

fabpool_status fabpool_get_stats(fabpool_t *p, fabpool_stats *s)
{
    fabpool_status st = fp_getter_begin("fabpool_get_stats", "fabpool_stats", p, s, sizeof *s);
    if (st != FABPOOL_OK)
        return st;
    fp_lock(&p->sp.lock);
    class_sums w = class_rows(p, s);
#define STAT_FILL(f, kind, label, value)                                                                       \
    _Static_assert(sizeof s->f == sizeof(uint64_t), #f " is a uint64_t");                                     \
    s->f = (value);
    STATS_FIELDS(STAT_FILL)
#undef STAT_FILL
    s->metadata_jemalloc = p->meta.jemalloc;
    s->metadata_arena = p->meta.arena;
    fp_unlock(&p->sp.lock);
    for (int i = 0; i < FP_DRV_COUNT && i < FABPOOL_NUM_DRIVER_CALLS; i++) {
        s->driver_calls[i] = ld(&p->ch.calls.n[i]);
        s->driver_call_names[i] = fp_drv_name(i);
    }
    return FABPOOL_OK;
}

static void stats_json(fabpool_t *p, FILE *f, const fabpool_stats *s)
{
    fprintf(f, "{\"device\":%d,\"handle_type\":\"%s\"", p->opt.device, fp_handle_type_name(p->ch.handle_type));
    for (size_t i = 0; i < N_STAT_ROWS; i++)
        fprintf(f, ",\"%s\":%" PRIu64, stat_rows[i].name, stat_value(s, &stat_rows[i]));
    fprintf(f, ",\"metadata_allocator\":\"%s\",\"driver_calls\":{", s->metadata_jemalloc ? "jemalloc" : "libc");
    int first = 1;
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && s->driver_call_names[i]; i++) {
        if (!s->driver_calls[i])
            continue;
        fprintf(f, "%s\"%s\":%" PRIu64, first ? "" : ",", s->driver_call_names[i], s->driver_calls[i]);
        first = 0;
    }
    fprintf(f, "},\"classes\":[");
    for (int i = 0; i < FABPOOL_NUM_CLASSES && s->classes[i].size; i++)
        fprintf(f, "%s{\"size\":%" PRIu64 ",\"in_use\":%" PRIu64 ",\"cached\":%" PRIu64 ",\"slabs\":%" PRIu64
                   ",\"allocs\":%" PRIu64 "}",
                i ? "," : "", s->classes[i].size, s->classes[i].in_use, s->classes[i].cached, s->classes[i].slabs,
                s->classes[i].allocs);
    fprintf(f, "],\"options\":");
    fabpool_options o = options_in_force(p);
    fp_options_print(f, &o, 0, 1);
    fprintf(f, "}\n");
}

static void stats_text(fabpool_t *p, FILE *f, const fabpool_stats *s)
{
    fprintf(f, "fabpool: device %d, handle type %s, metadata in %s\n", p->opt.device,
            fp_handle_type_name(p->ch.handle_type), s->metadata_jemalloc ? "a private jemalloc arena" : "libc");
    for (size_t i = 0; i < N_STAT_ROWS; i++) {
        const stat_row *r = &stat_rows[i];
        uint64_t v = stat_value(s, r);
        if (r->kind == STAT_BYTES)
            fprintf(f, "  %-22s %14" PRIu64 " bytes  (%.1f MiB)\n", r->label, v, (double)v / 1048576.0);
        else
            fprintf(f, "  %-22s %14" PRIu64 "\n", r->label, v);
    }
    fprintf(f, "  driver calls:");
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && s->driver_call_names[i]; i++)
        if (s->driver_calls[i])
            fprintf(f, " %s %" PRIu64, s->driver_call_names[i], s->driver_calls[i]);
    fprintf(f, "\n  options: ");
    fabpool_options o = options_in_force(p);
    fp_options_print(f, &o, 0, 0);
    fprintf(f, "\n  %12s %10s %10s %8s %12s\n", "class", "in use", "cached", "slabs", "allocs");
    for (int i = 0; i < FABPOOL_NUM_CLASSES && s->classes[i].size; i++)
        fprintf(f, "  %12" PRIu64 " %10" PRIu64 " %10" PRIu64 " %8" PRIu64 " %12" PRIu64 "\n", s->classes[i].size,
                s->classes[i].in_use, s->classes[i].cached, s->classes[i].slabs, s->classes[i].allocs);
}

fabpool_status fabpool_print_stats(fabpool_t *p, FILE *f, int json)
{
    if (!f)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_print_stats: the FILE is NULL");
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_status st = fabpool_get_stats(p, &s);
    if (st != FABPOOL_OK)
        return st;
    if (json)
        stats_json(p, f, &s);
    else
        stats_text(p, f, &s);
    return FABPOOL_OK;
}

fabpool_status fabpool_stats_json(fabpool_t *p, char *buf, size_t cap, size_t *needed)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "fabpool_stats_json: open_memstream failed");
    fabpool_status st = fabpool_print_stats(p, f, 1);
    fclose(f);
    if (st == FABPOOL_OK) {
        if (needed)
            *needed = len + 1;
        if (!buf || cap < len + 1)
            st = fp_error(FABPOOL_ERR_LIMIT, "fabpool_stats_json: the report takes %zu bytes, the buffer has %zu",
                          len + 1, cap);
        else
            memcpy(buf, text, len + 1);
    }
    free(text);
    return st;
}

fabpool_status fabpool_reset_peak(fabpool_t *p)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_reset_peak: the pool is NULL");
    fabpool_thread_flush(p);
    fp_usage_reset(&p->use);
    fp_chunk_reset_peak(&p->ch);
    return FABPOOL_OK;
}

fabpool_status fabpool_get_counters(fabpool_t *p, fabpool_counters *c)
{
    fabpool_status st = fp_getter_begin("fabpool_get_counters", "fabpool_counters", p, c, sizeof *c);
    if (st != FABPOOL_OK)
        return st;
    c->mapped_bytes = fp_chunks_mapped(&p->ch, &c->chunks_mapped);
    c->mapped_bytes_peak = fp_chunks_mapped_peak(&p->ch);
    c->chunks_mapped_total = ld(&p->ch.chunks_mapped_total);
    c->chunks_unmapped_total = ld(&p->ch.chunks_unmapped_total);
    c->oom_retries = ld(&p->heap.oom_retries);
    c->stream_pending_blocks = ld(&p->retire.pending_blocks);
    c->stream_pending_bytes = ld(&p->retire.pending_bytes);
    c->stream_frees = ld(&p->retire.frees) + ld(&p->retire.owner_frees);
    c->stream_reuse_same = ld(&p->retire.reuse_same);
    c->stream_reuse_after_event = ld(&p->retire.reuse_after_event);
    c->stream_releases = ld(&p->retire.releases);
    c->stream_events_recorded = ld(&p->retire.events_recorded);
    c->stream_event_queries = ld(&p->retire.event_queries);
    c->stream_syncs = ld(&p->retire.syncs);
    c->streams = ld(&p->retire.n_streams_now);
    c->stream_owner_frees = ld(&p->retire.owner_frees);
    c->stream_fences = ld(&p->retire.fences);
    c->stream_records = ld(&p->retire.records);
    c->stream_record_waits = ld(&p->retire.used_frees);
    c->stream_recorded_blocks = ld(&p->retire.used_blocks);
    return FABPOOL_OK;
}
