/* stats.c - what the pool holds, what it gave out, what it asked of the
 * driver, and the options in force (fabpool_get_options); as a struct, as
 * text and as JSON, all three from one table of its fields (STATS_FIELDS).
 * It reads what every layer counts and resets the peaks. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#include "conf_options.h"
#include "error.h"
#include "tcache_medium.h"

/* The options in force: the pool's, with the handle type and rdma chosen and the reservation made. */
static fabpool_options options_in_force(const struct fabpool *p)
{
    fabpool_options o = p->opt;
    fp_chunks_info d = fp_chunks_get_info(&p->ch);
    o.handle_type = d.handle_type;
    o.rdma = d.rdma ? FABPOOL_RDMA_ON : FABPOOL_RDMA_OFF;
    o.reserve_bytes = fp_space_size(&p->sp);
    return o;
}

fabpool_status fabpool_get_options(const fabpool_t *p, fabpool_options *out)
{
    if (!p || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_get_options: the pool or the output is NULL");
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_get_options");
    /* an older fabpool.h's options (0.3's) are filled up to their size, their struct_size kept */
    uint32_t size = out->struct_size;
    if (size != sizeof *out && size != FABPOOL_OPTIONS_SIZE_0_3)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_get_options: the fabpool_options's struct_size is %u, but "
                        "fabpool %s knows fabpool_options of %zu bytes (and %u, fabpool 0.3's) only: set struct_size "
                        "= sizeof(fabpool_options) before the call (fabpool_options_init does), and build against the "
                        "fabpool.h of the library the program loads (fabpool_version() says which)", size,
                        FABPOOL_VERSION_STRING, sizeof *out, FABPOOL_OPTIONS_SIZE_0_3);
    fabpool_options o = options_in_force(p);
    o.struct_size = size;
    memcpy(out, &o, size);
    return FABPOOL_OK;
}

/* What the walk of the classes adds up. */
typedef struct class_sums {
    uint64_t small_in_use; /* bytes of slab blocks given out */
    uint64_t blocks;       /* blocks given out, slab and larger */
} class_sums;

/* One row of s->classes per slab class, then per class of larger blocks, that has been used (hc: the heap's
 * counters).  Pool lock held. */
static class_sums class_rows(fabpool_t *p, const fp_heap_counters *hc, fabpool_stats *s)
{
    class_sums w = {0, 0};
    unsigned row = 0;
    /* live large blocks by the class of the grid their size falls in */
    uint64_t large_live[FP_NCLASS];
    memset(large_live, 0, sizeof large_live);
    fp_heap_count_large(&p->heap, large_live);
    for (unsigned c = 0; c < FP_NCLASS && row < FABPOOL_NUM_CLASSES; c++) {
        if (c < hc->n_slab_classes) {
            uint64_t allocs, frees;
            fp_alloc_class_counts(&p->alloc, c, &allocs, &frees);
            fp_class_counters k;
            fp_heap_read_class(&p->heap, c, &k);
            if (!allocs && !k.slabs)
                continue;
            uint64_t in_use = allocs - frees;
            fabpool_class_stats *cs = &s->classes[row++];
            cs->size = k.size;
            cs->in_use = in_use;
            cs->cached = k.slabs * k.nobj - in_use;
            cs->slabs = k.slabs;
            cs->allocs = allocs;
            w.small_in_use += in_use * k.size;
            w.blocks += in_use;
        } else {
            /* large blocks: no class, their free memory is in cached_bytes */
            uint64_t allocs = hc->large_allocs[c], tc_allocs, tc_frees; /* and the thread caches' medium hits */
            fp_alloc_class_counts(&p->alloc, c, &tc_allocs, &tc_frees);
            allocs += tc_allocs;
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
 * JSON keys, which the Python module reads, are the field names.  The values read what the layers count through
 * their headers' getters, once under the lock: dev (device.h), hc (slab.h), bc (bchunk.h), vc (view.h), rc
 * (retire.h), mc (meta.h) and uc (usage.h). */
#define STATS_FIELDS(X)                                                                                        \
    X(reserved_bytes, STAT_BYTES, "reserved", fp_space_size(&p->sp))                                           \
    X(mapped_bytes, STAT_BYTES, "mapped", dev.mapped_bytes)                                                    \
    X(mapped_bytes_peak, STAT_BYTES, "mapped, peak", dev.mapped_bytes_peak)                                    \
    X(in_use_bytes, STAT_BYTES, "in use", w.small_in_use + hc.large_in_use_bytes + bc.bytes)                   \
    /* the peak is never below in use now (usage.h: counted as blocks leave their classes) */                 \
    X(in_use_bytes_peak, STAT_BYTES, "in use, peak", at_least(uc.peak, s->in_use_bytes))                       \
    X(retiring_bytes, STAT_BYTES, "retiring", bc.retiring_bytes)                                               \
    X(view_bytes, STAT_BYTES, "views of peers", vc.bytes)                                                      \
    X(cached_bytes, STAT_BYTES, "cached", free_mapped(s))                                                      \
    X(stream_pending_bytes, STAT_BYTES, "pending on streams", rc.pending_bytes)                                \
    X(stream_pending_blocks, STAT_COUNT, "pending blocks", rc.pending_blocks)                                  \
    X(held_for_peers_bytes, STAT_BYTES, "held for peers", bc.held_for_peers_bytes)                             \
    X(buffers, STAT_COUNT, "buffers", bc.count)                                                                \
    X(blocks, STAT_COUNT, "blocks", w.blocks)                                                                  \
    X(chunks_mapped, STAT_COUNT, "chunks mapped", dev.chunks_mapped)                                           \
    X(chunks_mapped_total, STAT_COUNT, "chunks mapped, all", dev.chunks_mapped_total)                          \
    X(chunks_unmapped_total, STAT_COUNT, "chunks unmapped, all", dev.chunks_unmapped_total)                    \
    X(handles_outstanding, STAT_COUNT, "handles held", dev.handles_outstanding)                                \
    X(exported_fds_open, STAT_COUNT, "exported fds open", dev.exported_fds)                                    \
    X(oom_retries, STAT_COUNT, "OOM retries", hc.oom_retries)                                                  \
    X(metadata_bytes, STAT_BYTES, "host metadata", mc.bytes)                                                   \
    X(traded_bytes, STAT_BYTES, "traded", hc.traded_bytes)                                                     \
    X(kept_bytes, STAT_BYTES, "kept for reuse", bc.kept_bytes + vc.kept_bytes)                                 \
    X(export_anchor_moves, STAT_COUNT, "export anchor moves", dev.export_anchor_moves)

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
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_get_stats");
    fp_heap_counters hc;
    fp_chunk_counters dev;
    fp_buffer_counters bc;
    fp_view_counters vc;
    fp_retire_counters rc;
    fp_meta_counters mc;
    fp_usage_counters uc;
    fp_space_lock(&p->sp);
    fp_heap_read_counters(&p->heap, &hc);
    hc.large_in_use_bytes -= fp_alloc_medium_cached(&p->alloc); /* free to their callers (tcache.h) */
    class_sums w = class_rows(p, &hc, s);
    fp_chunks_read_counters(&p->ch, &dev);
    fp_buffers_read_counters(&p->bufs, &bc);
    fp_views_read_counters(&p->views, &vc);
    fp_retire_read_counters(&p->retire, &rc);
    fp_meta_read_counters(&p->meta, &mc);
    fp_usage_read(&p->use, &uc);
#define STAT_FILL(f, kind, label, value)                                                                       \
    _Static_assert(sizeof s->f == sizeof(uint64_t), #f " is a uint64_t");                                     \
    s->f = (value);
    STATS_FIELDS(STAT_FILL)
#undef STAT_FILL
    s->metadata_jemalloc = mc.jemalloc;
    s->metadata_arena = mc.arena;
    fp_space_unlock(&p->sp);
    for (int i = 0; i < FP_DRV_COUNT && i < FABPOOL_NUM_DRIVER_CALLS; i++) {
        s->driver_calls[i] = dev.calls[i];
        s->driver_call_names[i] = fp_drv_name(i);
    }
    return FABPOOL_OK;
}

/* in_use_bytes_peak is exact only without thread caches (fabpool.h): with them a refill counts the blocks it
 * takes, so the reports call it an upper bound. */
static int peak_exact(const fabpool_t *p) { return !p->opt.thread_cache; }

static void stats_json(fabpool_t *p, FILE *f, const fabpool_stats *s)
{
    fprintf(f, "{\"device\":%d,\"handle_type\":\"%s\"", p->opt.device, fp_handle_type_name(fp_chunks_get_info(&p->ch).handle_type));
    for (size_t i = 0; i < N_STAT_ROWS; i++)
        fprintf(f, ",\"%s\":%" PRIu64, stat_rows[i].name, stat_value(s, &stat_rows[i]));
    fprintf(f, ",\"in_use_bytes_peak_exact\":%s", peak_exact(p) ? "true" : "false");
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
            fp_handle_type_name(fp_chunks_get_info(&p->ch).handle_type), s->metadata_jemalloc ? "a private jemalloc arena" : "libc");
    for (size_t i = 0; i < N_STAT_ROWS; i++) {
        const stat_row *r = &stat_rows[i];
        uint64_t v = stat_value(s, r);
        const char *note = r->offset == offsetof(fabpool_stats, in_use_bytes_peak) && !peak_exact(p) ?
                           "  an upper bound with thread caches (exact with thread_cache:false)" : "";
        if (r->kind == STAT_BYTES)
            fprintf(f, "  %-22s %14" PRIu64 " bytes  (%.1f MiB)%s\n", r->label, v, (double)v / 1048576.0, note);
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
    if (!p || !f)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_print_stats: the pool or the FILE is NULL");
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_print_stats");
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_status st = fabpool_get_stats(p, &s);
    if (st != FABPOOL_OK)
        return st;
    /* a write that fails (a full disk, a closed pipe, a FILE open for reading) leaves a report cut short or
     * none: the caller learns it here, not from the file; an error the FILE held before is the caller's */
    int failed_before = ferror(f), saved_errno = errno;
    errno = 0;
    if (json)
        stats_json(p, f, &s);
    else
        stats_text(p, f, &s);
    int e = errno;
    if (fflush(f) != 0 || (!failed_before && ferror(f))) {
        e = errno ? errno : e;
        return fp_error(FABPOOL_ERR_IO, "fabpool_print_stats: writing the report failed (%s): it is cut short or "
                        "missing; give a FILE open for writing on a device with room", e ? strerror(e) : "a write "
                        "error");
    }
    errno = saved_errno; /* the caller's, as before the call */
    return FABPOOL_OK;
}

fabpool_status fabpool_stats_json(fabpool_t *p, char *buf, size_t cap, size_t *needed)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_stats_json: the pool is NULL");
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_stats_json");
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
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_reset_peak");
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
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_get_counters");
    fp_chunk_counters dev;
    fp_heap_counters hc;
    fp_retire_counters rc;
    fp_chunks_read_counters(&p->ch, &dev);
    fp_heap_read_counters(&p->heap, &hc);
    fp_retire_read_counters(&p->retire, &rc);
    c->mapped_bytes = dev.mapped_bytes;
    c->chunks_mapped = dev.chunks_mapped;
    c->mapped_bytes_peak = dev.mapped_bytes_peak;
    c->chunks_mapped_total = dev.chunks_mapped_total;
    c->chunks_unmapped_total = dev.chunks_unmapped_total;
    c->oom_retries = hc.oom_retries;
    c->stream_pending_blocks = rc.pending_blocks;
    c->stream_pending_bytes = rc.pending_bytes;
    c->stream_frees = rc.frees + rc.owner_frees;
    c->stream_reuse_same = rc.reuse_same;
    c->stream_reuse_after_event = rc.reuse_after_event;
    c->stream_releases = rc.releases;
    c->stream_events_recorded = rc.events_recorded;
    c->stream_event_queries = rc.event_queries;
    c->stream_syncs = rc.syncs;
    c->streams = rc.n_streams_now;
    c->stream_owner_frees = rc.owner_frees;
    c->stream_fences = rc.fences;
    c->stream_records = rc.records;
    c->stream_record_waits = rc.used_frees;
    c->stream_recorded_blocks = rc.used_blocks;
    return FABPOOL_OK;
}
