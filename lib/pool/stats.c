/* stats.c - what the pool holds, what it gave out, what it asked of the
 * driver, and the options in force (fabpool_get_options); as a struct, as
 * text and as JSON.
 * It reads what every layer counts and resets the peaks. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#include "conf.h"
#include "error.h"

static uint64_t ld(_Atomic uint64_t *a) { return atomic_load_explicit(a, memory_order_relaxed); }

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

fabpool_status fabpool_get_stats(fabpool_t *p, fabpool_stats *s)
{
    if (!p || !s)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_get_stats: the pool or the output is NULL");
    fabpool_status st = fp_struct_size_check("fabpool_get_stats", "fabpool_stats", s->struct_size, sizeof *s);
    if (st != FABPOOL_OK)
        return st;
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    uint64_t small_in_use = 0, blocks = 0;
    unsigned row = 0;
    fp_lock(&p->sp.lock);
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
            small_in_use += in_use * k->obj_size;
            blocks += in_use;
        } else {
            /* large blocks: no class, their free memory is in cached_bytes */
            uint64_t allocs = ld(&p->heap.large_allocs[c]);
            if (!allocs && !large_live[c])
                continue;
            fabpool_class_stats *cs = &s->classes[row++];
            cs->size = fp_class_size(c);
            cs->in_use = large_live[c];
            cs->allocs = allocs;
            blocks += large_live[c];
        }
    }
    s->reserved_bytes = p->sp.va.size;
    s->mapped_bytes = ld(&p->ch.mapped_bytes);
    s->mapped_bytes_peak = ld(&p->ch.mapped_peak);
    s->in_use_bytes = small_in_use + ld(&p->heap.large_in_use_bytes) + ld(&p->bufs.bytes);
    uint64_t peak = ld(&p->use.peak); /* never below in use now (usage.h: counted as blocks leave their classes) */
    s->in_use_bytes_peak = peak > s->in_use_bytes ? peak : s->in_use_bytes;
    s->retiring_bytes = ld(&p->bufs.retiring_bytes);
    s->stream_pending_bytes = ld(&p->retire.pending_bytes);
    s->stream_pending_blocks = ld(&p->retire.pending_blocks);
    s->view_bytes = ld(&p->views.bytes);
    s->held_for_peers_bytes = ld(&p->bufs.held_for_peers_bytes);
    uint64_t held = s->in_use_bytes + s->retiring_bytes + s->view_bytes;
    s->cached_bytes = s->mapped_bytes > held ? s->mapped_bytes - held : 0;
    s->buffers = ld(&p->bufs.count);
    s->blocks = blocks;
    s->chunks_mapped = ld(&p->ch.chunks_mapped);
    s->chunks_mapped_total = ld(&p->ch.chunks_mapped_total);
    s->chunks_unmapped_total = ld(&p->ch.chunks_unmapped_total);
    s->handles_outstanding = ld(&p->ch.handles_outstanding);
    s->exported_fds_open = ld(&p->ch.exported_fds);
    s->oom_retries = ld(&p->heap.oom_retries);
    s->metadata_bytes = ld(&p->meta.bytes);
    s->metadata_jemalloc = p->meta.jemalloc;
    s->metadata_arena = p->meta.arena;
    fp_unlock(&p->sp.lock);
    for (int i = 0; i < FP_DRV_COUNT && i < FABPOOL_NUM_DRIVER_CALLS; i++) {
        s->driver_calls[i] = ld(&p->ch.calls.n[i]);
        s->driver_call_names[i] = fp_drv_name(i);
    }
    return FABPOOL_OK;
}

static void mib(FILE *f, const char *label, uint64_t b)
{
    fprintf(f, "  %-22s %14" PRIu64 " bytes  (%.1f MiB)\n", label, b, (double)b / 1048576.0);
}

fabpool_status fabpool_print_stats(fabpool_t *p, FILE *f, int json)
{
    if (!f)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_print_stats: the FILE is NULL");
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_status st = fabpool_get_stats(p, &s);
    if (st != FABPOOL_OK)
        return st;
    if (json) {
        fprintf(f, "{\"device\":%d,\"handle_type\":\"%s\",\"reserved_bytes\":%" PRIu64 ",\"mapped_bytes\":%" PRIu64
                   ",\"mapped_bytes_peak\":%" PRIu64 ",\"in_use_bytes\":%" PRIu64 ",\"in_use_bytes_peak\":%" PRIu64
                   ",\"cached_bytes\":%" PRIu64 ",\"retiring_bytes\":%" PRIu64 ",\"stream_pending_bytes\":%" PRIu64
                   ",\"stream_pending_blocks\":%" PRIu64 ",\"view_bytes\":%" PRIu64
                   ",\"held_for_peers_bytes\":%" PRIu64 ",\"buffers\":%" PRIu64
                   ",\"blocks\":%" PRIu64 ",\"chunks_mapped\":%" PRIu64 ",\"chunks_mapped_total\":%" PRIu64
                   ",\"chunks_unmapped_total\":%" PRIu64 ",\"handles_outstanding\":%" PRIu64
                   ",\"exported_fds_open\":%" PRIu64 ",\"oom_retries\":%" PRIu64 ",\"metadata_bytes\":%" PRIu64
                   ",\"metadata_allocator\":\"%s\",\"driver_calls\":{",
                p->opt.device, fp_handle_type_name(p->ch.handle_type), s.reserved_bytes, s.mapped_bytes,
                s.mapped_bytes_peak, s.in_use_bytes, s.in_use_bytes_peak, s.cached_bytes, s.retiring_bytes,
                s.stream_pending_bytes, s.stream_pending_blocks, s.view_bytes, s.held_for_peers_bytes, s.buffers, s.blocks, s.chunks_mapped, s.chunks_mapped_total, s.chunks_unmapped_total,
                s.handles_outstanding, s.exported_fds_open, s.oom_retries, s.metadata_bytes,
                s.metadata_jemalloc ? "jemalloc" : "libc");
        int first = 1;
        for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && s.driver_call_names[i]; i++) {
            if (!s.driver_calls[i])
                continue;
            fprintf(f, "%s\"%s\":%" PRIu64, first ? "" : ",", s.driver_call_names[i], s.driver_calls[i]);
            first = 0;
        }
        fprintf(f, "},\"classes\":[");
        for (int i = 0; i < FABPOOL_NUM_CLASSES && s.classes[i].size; i++)
            fprintf(f, "%s{\"size\":%" PRIu64 ",\"in_use\":%" PRIu64 ",\"cached\":%" PRIu64 ",\"slabs\":%" PRIu64
                       ",\"allocs\":%" PRIu64 "}",
                    i ? "," : "", s.classes[i].size, s.classes[i].in_use, s.classes[i].cached, s.classes[i].slabs,
                    s.classes[i].allocs);
        fprintf(f, "],\"options\":");
        fabpool_options o = options_in_force(p);
        fp_options_print(f, &o, 0, 1);
        fprintf(f, "}\n");
        return FABPOOL_OK;
    }
    fprintf(f, "fabpool: device %d, handle type %s, metadata in %s (%" PRIu64 " bytes)\n", p->opt.device,
            fp_handle_type_name(p->ch.handle_type), s.metadata_jemalloc ? "a private jemalloc arena" : "libc",
            s.metadata_bytes);
    mib(f, "reserved", s.reserved_bytes);
    mib(f, "mapped", s.mapped_bytes);
    mib(f, "mapped, peak", s.mapped_bytes_peak);
    mib(f, "in use", s.in_use_bytes);
    mib(f, "in use, peak", s.in_use_bytes_peak);
    mib(f, "cached", s.cached_bytes);
    mib(f, "retiring", s.retiring_bytes);
    mib(f, "pending on streams", s.stream_pending_bytes);
    mib(f, "views of peers", s.view_bytes);
    mib(f, "held for peers", s.held_for_peers_bytes);
    fprintf(f, "  buffers %" PRIu64 ", blocks %" PRIu64 ", chunks mapped %" PRIu64 " (%" PRIu64 " mapped, %" PRIu64
               " unmapped all time), handles held %" PRIu64 ", exported fds open %" PRIu64 ", OOM retries %" PRIu64 "\n",
            s.buffers, s.blocks, s.chunks_mapped, s.chunks_mapped_total, s.chunks_unmapped_total,
            s.handles_outstanding, s.exported_fds_open, s.oom_retries);
    fprintf(f, "  driver calls:");
    for (int i = 0; i < FABPOOL_NUM_DRIVER_CALLS && s.driver_call_names[i]; i++)
        if (s.driver_calls[i])
            fprintf(f, " %s %" PRIu64, s.driver_call_names[i], s.driver_calls[i]);
    fprintf(f, "\n  options: ");
    fabpool_options o = options_in_force(p);
    fp_options_print(f, &o, 0, 0);
    fprintf(f, "\n  %12s %10s %10s %8s %12s\n", "class", "in use", "cached", "slabs", "allocs");
    for (int i = 0; i < FABPOOL_NUM_CLASSES && s.classes[i].size; i++)
        fprintf(f, "  %12" PRIu64 " %10" PRIu64 " %10" PRIu64 " %8" PRIu64 " %12" PRIu64 "\n", s.classes[i].size,
                s.classes[i].in_use, s.classes[i].cached, s.classes[i].slabs, s.classes[i].allocs);
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
    if (!p || !c)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_get_counters: the pool or the output is NULL");
    fabpool_status st = fp_struct_size_check("fabpool_get_counters", "fabpool_counters", c->struct_size, sizeof *c);
    if (st != FABPOOL_OK)
        return st;
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->mapped_bytes = ld(&p->ch.mapped_bytes);
    c->mapped_bytes_peak = ld(&p->ch.mapped_peak);
    c->chunks_mapped = ld(&p->ch.chunks_mapped);
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
