/* lifecycle.c - a pool per device: creation (options, the driver, the device
 * opened, the one address reservation, every layer's part set up), trim and
 * destroy, and the public entry points that take a pool and belong to a
 * layer below (buffers, views, acknowledgements by export id). */
#define _GNU_SOURCE /* secure_getenv */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#include "conf_options.h"
#include "device.h"
#include "error.h"
#include "export.h"
#include "log.h"
#include "sleep.h"
#include "trace.h"

_Static_assert(offsetof(struct fabpool, alloc) == 0, "alloc.c reaches its state by a cast of the pool (alloc.h)");

/* ------------------------------------------------------------ create */

static fabpool_status apply_conf(fabpool_options *o)
{
    if (o->conf) {
        fabpool_status st = fabpool_options_parse(o, o->conf);
        if (st != FABPOOL_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", fabpool_last_error());
            return fp_error(st, "options.conf: %s", msg);
        }
    }
    const char *env = secure_getenv("FABPOOL_CONF");
    if (env) {
        fabpool_status st = fabpool_options_parse(o, env);
        if (st != FABPOOL_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", fabpool_last_error());
            /* the variable shown in part: whole, a long one would push the reason out of the message */
            size_t n = strlen(env);
            return fp_error(st, "FABPOOL_CONF='%.*s%s': %s", n > 160 ? 160 : (int)n, env, n > 160 ? "..." : "", msg);
        }
    }
    int lvl;
    fabpool_status st = fp_log_env(&lvl); /* FABPOOL_DEBUG wins over the debug key */
    if (st != FABPOOL_OK)
        return st;
    if (lvl >= 0)
        o->debug = lvl;
    return fp_trace_env(o);
}

/* The pool's reservation: the size asked for (0: eight times the device's memory), in whole granules. */
static fabpool_status reserve(struct fabpool *p, uint64_t gran)
{
    uint64_t size = p->opt.reserve_bytes;
    if (!size)
        size = 8ull * fp_chunks_get_info(&p->ch).dev_total;
    return fp_space_reserve(&p->sp, gran, fp_round_up(size, gran));
}

/* The log's line for a new pool: version, device, handle type and why, reservation, the options asked for
 * that differ from the defaults (o: before the pool rounded any). */
static void log_created(struct fabpool *p, const fabpool_options *o, const char *why)
{
    char *opts = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&opts, &len);
    if (f) {
        fp_options_print(f, o, 1, 0);
        fclose(f);
    }
    fp_chunks_info d = fp_chunks_get_info(&p->ch);
    FP_LOG_POOL(FP_LOG_INFO, d.log_pool, p->opt.device,
                "fabpool %s: pool created on device %d (%.1f GiB, granularity %llu KiB), handle type %s (%s), rdma "
                "%s, reservation %.1f GiB at 0x%llx, options %s%s", fabpool_version(), p->opt.device,
                (double)d.dev_total / (double)(1ull << 30), (unsigned long long)(fp_space_gran(&p->sp) >> 10),
                fp_handle_type_name(d.handle_type), why, d.rdma ? "on" : "off",
                (double)fp_space_size(&p->sp) / (double)(1ull << 30), (unsigned long long)fp_space_base(&p->sp),
                opts && len ? "other than the defaults: " : "", opts && len ? opts : "the defaults");
    free(opts);
}

static fabpool_status teardown(struct fabpool *p);

_Static_assert(offsetof(fabpool_options, large_chunks) == FABPOOL_OPTIONS_SIZE_0_3,
               "0.3's options end where large_chunks begins");

/* The options a pool is made with: opts (or the defaults), then the
 * configuration string over them, checked.  Options of an older fabpool.h
 * (FABPOOL_OPTIONS_SIZE_0_3) are read up to their size, the later fields
 * keeping their defaults. */
static fabpool_status resolve_options(const fabpool_options *opts, fabpool_options *o)
{
    fabpool_options_init(o);
    if (opts) {
        if (opts->struct_size != sizeof(fabpool_options) && opts->struct_size != FABPOOL_OPTIONS_SIZE_0_3)
            return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_create: options.struct_size is %u, this library "
                            "expects %zu (or %u, the options of fabpool 0.3): call fabpool_options_init() first, "
                            "and build against this fabpool.h", opts->struct_size, sizeof(fabpool_options),
                            FABPOOL_OPTIONS_SIZE_0_3);
        memcpy(o, opts, opts->struct_size);
        o->struct_size = (uint32_t)sizeof *o;
    }
    fabpool_status st = apply_conf(o);
    if (st == FABPOOL_OK)
        st = fp_options_check(o);
    return st;
}

/* The pool's struct, in its own metadata arena, with its options and the
 * device fields that the layers below read; nothing of the driver yet. */
static fabpool_status pool_new(const fabpool_options *o, struct fabpool **out)
{
    fp_meta meta;
    fabpool_status st = fp_meta_init(&meta, o->metadata);
    if (st != FABPOOL_OK)
        return st;
    struct fabpool *p = fp_meta_alloc(&meta, sizeof *p);
    if (!p) {
        fp_meta_destroy(&meta);
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a pool (%zu bytes)", sizeof(struct fabpool));
    }
    p->meta = meta;
    p->opt = *o;
    p->opt.conf = NULL;   /* not ours to keep */
    fp_space_init(&p->sp, &p->ch, &p->meta);
    fp_chunks_init(&p->ch, o, &p->meta, fp_space_pool_lock(&p->sp));
    *out = p;
    return FABPOOL_OK;
}

/* The layers above the space, each given what it shares with the others. */
static void layers_init(struct fabpool *p)
{
    fp_heap_init(&p->heap, &p->sp, &p->use, &p->opt);
    p->opt.slab_max_bytes = fp_heap_slab_max(&p->heap);
    fp_alloc_init(&p->alloc, &p->heap, &p->retire, &p->use, p->opt.thread_cache);
    fp_alloc_set_trace(&p->alloc, p->trace);
    fp_alloc_set_buffers(&p->alloc, &p->bufs);
    fp_buffers_init(&p->bufs, &p->heap, &p->retire, &p->use, &p->opt);
    fp_buffers_set_trace(&p->bufs, p->trace);
    fp_views_init(&p->views, &p->sp, p->opt.keep_ms);
}

static fabpool_status create(const fabpool_options *opts, fabpool_t **out)
{
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_create: the output pointer is NULL");
    *out = NULL;
    fabpool_options o;
    fabpool_status st = resolve_options(opts, &o);
    if (st != FABPOOL_OK)
        return st;
    /* before the driver loads: its calls are logged at trace */
    if ((st = fp_log_raise(o.debug)) != FABPOOL_OK)
        return st;
    struct fabpool *p = NULL;
    if ((st = fp_drv_load("fabpool_create")) != FABPOOL_OK || (st = pool_new(&o, &p)) != FABPOOL_OK)
        return st;

    char why[256];
    uint64_t gran = 0;
    if ((st = fp_device_open(&p->ch, &p->retire, &p->opt, why, sizeof why, &gran)) != FABPOOL_OK ||
        (st = reserve(p, gran)) != FABPOOL_OK || (st = fp_trace_open(&p->opt, gran, &p->trace)) != FABPOOL_OK)
        goto fail;
    /* before anything is mapped, so that every unmap in the trace follows its map */
    fp_chunks_attach(&p->ch, p->trace, &p->retire);
    if ((st = fp_space_map_init(&p->sp)) != FABPOOL_OK)
        goto fail;
    layers_init(p);
    if (fp_registry_add(&p->alloc) != 0) {
        st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for the pool registry");
        goto fail;
    }
    if (FP_LOG_ON(FP_LOG_INFO))
        log_created(p, &o, why);
    *out = p;
    return FABPOOL_OK;

fail: {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    (void)teardown(p);
    return fp_error(st, "%s", msg);
}
}

fabpool_status fabpool_create(const fabpool_options *opts, fabpool_t **out)
{
    fp_msg_hold h; /* a failure that creation recovers from on the way is not the call's */
    fp_error_hold(&h);
    return fp_error_unhold(&h, create(opts, out));
}

/* Frees whatever creation got to; also the end of destroy. */
static fabpool_status teardown(struct fabpool *p)
{
    fp_trace_close(p->trace);
    p->trace = NULL;
    fp_alloc_set_trace(&p->alloc, NULL);
    fp_buffers_set_trace(&p->bufs, NULL);
    fp_chunks_attach(&p->ch, NULL, NULL);
    fp_retire_destroy(&p->retire);
    fp_space_lock(&p->sp); /* the unmaps assert it (lock.h); no other thread uses the pool any more */
    fp_heap_destroy(&p->heap);
    fp_sleep_free(p);
    fp_chunks_destroy(&p->ch);
    fp_space_unlock(&p->sp);
    fp_tcaches_destroy(&p->alloc);
    fabpool_status st = fp_space_destroy(&p->sp), cst = fp_device_close(&p->ch);
    if (st == FABPOOL_OK)
        st = cst;
    fp_meta meta = p->meta;
    fp_meta_free(&meta, p, sizeof *p);
    fp_meta_destroy(&meta);
    return st;
}

fabpool_status fabpool_destroy(fabpool_t *p)
{
    if (!p)   /* as free(NULL): a cleanup path may destroy a pool it never made */
        return FABPOOL_OK;
    /* a child's copy of a pool made before the fork (device.h): its memory is the parent's, its locks may be
     * held for ever, so nothing is unmapped, locked or freed; its host memory goes with the process (shared
     * with the parent's until written) */
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_destroy");
    fp_registry_remove(&p->alloc);
    if (p->opt.stats_at_destroy) {
        /* a report stderr would not take is no failure of the destroy's: the message stays as it was */
        fp_msg_hold h;
        fp_error_hold(&h);
        fabpool_print_stats(p, stderr, p->opt.stats_at_destroy == 2);
        fp_error_unhold(&h, FABPOOL_OK);
    }
    /* blocks freed on streams: waited for and given back to the pool, so
     * that they count neither as live nor as leaked */
    fp_alloc_drain(&p->alloc, 1, 1);
    fp_space_lock(&p->sp);
    fp_chunk_anchor_close(&p->ch); /* before the chunks go one by one */
    fabpool_status st = fp_collect_locked(&p->bufs, 1);
    fp_buffer_counters bc;
    fp_buffers_read_counters(&p->bufs, &bc);
    uint64_t live_buffers = bc.count;
    fp_views_destroy(&p->views);
    fp_buffers_destroy(&p->bufs);
    fp_space_unlock(&p->sp);
    fabpool_stats s = {.struct_size = sizeof s};
    fabpool_get_stats(p, &s);
    uint64_t live_blocks = s.blocks;
    unsigned log_pool = fp_chunks_get_info(&p->ch).log_pool; /* for the log, once p is gone */
    int device = p->opt.device;
    fabpool_status tst = teardown(p);
    if (st == FABPOOL_OK)
        st = tst;
    if (st == FABPOOL_OK && (live_buffers || live_blocks))
        st = fp_error(FABPOOL_ERR_BUSY, "fabpool_destroy: %llu buffer%s and %llu block%s were still live; their "
                      "memory was unmapped and the pool destroyed",
                      (unsigned long long)live_buffers, live_buffers == 1 ? "" : "s",
                      (unsigned long long)live_blocks, live_blocks == 1 ? "" : "s");
    if (st != FABPOOL_OK)
        FP_LOG_POOL(FP_LOG_WARN, log_pool, device, "%s", fabpool_last_error());
    else
        FP_LOG_POOL(FP_LOG_INFO, log_pool, device, "destroyed");
    return st;
}

/* ------------------------------------------------------------ misc */

fabpool_status fabpool_trim(fabpool_t *p, size_t keep)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_trim: the pool is NULL");
    if (fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_trim");
    FP_TRACE(p->trace, FABPOOL_TR_TRIM, 0, keep, 0);
    fp_chunk_tally t = fp_chunk_tally_begin();
    /* what was freed on streams and whose work is done can go too (an event
     * is recorded on every stream with uncovered frees); what the GPU may
     * still use stays: it is live for the pool until then */
    fp_alloc_drain(&p->alloc, 0, 1);
    fp_alloc_flush_all(&p->alloc);
    fp_space_lock(&p->sp);
    fp_buffers_drop_kept(&p->bufs, 1); /* released buffers and views kept for reuse go too */
    fp_views_drop_kept(&p->views, 1);
    fabpool_status st = fp_collect_locked(&p->bufs, 0);
    fp_heap_trim_locked(&p->heap, keep);
    fabpool_status hst = fp_sleep_host_trim(p); /* and sleep's kept host copies (sleep_keep_host) */
    fp_space_unlock(&p->sp);
    t = fp_chunk_tally_end(t);
    FP_LOG_CH(FP_LOG_INFO, &p->ch, "trim (keep %zu bytes cached): %llu bytes in %llu chunks back to the driver; the "
              "pool maps %llu", keep, (unsigned long long)t.bytes, (unsigned long long)t.chunks,
              (unsigned long long)fp_chunks_mapped(&p->ch, NULL));
    return st != FABPOOL_OK ? st : hst;
}

fabpool_status fabpool_device_count(int *out)
{
    if (!out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_device_count: the output is NULL");
    *out = 0;
    fabpool_status st = fp_drv_load("fabpool_device_count");
    if (st != FABPOOL_OK)
        return st;
    CUresult r = FP_CU(NULL, cuDeviceGetCount, out);
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuDeviceGetCount", "counting devices");
    return FABPOOL_OK;
}

fabpool_status fabpool_device_memory(fabpool_t *p, size_t *free_bytes, size_t *total_bytes)
{
    if (!p || !free_bytes || !total_bytes)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_device_memory(%p, %p, %p): the pool and both outputs must "
                        "not be NULL", (void *)p, (void *)free_bytes, (void *)total_bytes);
    if (fp_device_forked(&p->ch)) {
        *free_bytes = *total_bytes = 0;
        return fp_device_forked_error(&p->ch, "fabpool_device_memory");
    }
    return fp_chunks_device_memory(&p->ch, free_bytes, total_bytes);
}

fabpool_handle_type fabpool_handle_type_of(const fabpool_t *p)
{
    return p ? fp_chunks_get_info(&p->ch).handle_type : FABPOOL_HANDLE_NONE;
}

/* ------------------------------------------------------------ entry points of the layers below */

fabpool_status fabpool_buffer_create(fabpool_t *p, size_t max_size, size_t size, fabpool_buffer_t **out)
{
    return fp_buffer_create(p ? &p->bufs : NULL, max_size, size, out);
}

fabpool_status fabpool_buffer_reuse(fabpool_t *p, size_t size, void *stream, fabpool_buffer_t **out)
{
    return fp_buffer_reuse(p ? &p->bufs : NULL, size, stream, out);
}

fabpool_status fabpool_collect(fabpool_t *p, int wait)
{
    if (p && fp_device_forked(&p->ch))
        return fp_device_forked_error(&p->ch, "fabpool_collect");
    if (p) {
        fp_alloc_drain(&p->alloc, wait, wait); /* blocks freed on streams whose work is done go back to the pool */
        fp_space_lock(&p->sp);
        fp_buffers_drop_kept(&p->bufs, 0); /* and what was released and kept for keep_ms */
        fp_views_drop_kept(&p->views, 0);
        fp_space_unlock(&p->sp);
    }
    return fp_buffers_collect(p ? &p->bufs : NULL, wait);
}

fabpool_status fabpool_peers_ack(fabpool_t *p, uint64_t export_id, uint64_t generation)
{
    return fp_buffers_peers_ack(p ? &p->bufs : NULL, export_id, generation);
}

fabpool_status fabpool_block_export(fabpool_t *p, const void *ptr, void *desc, size_t cap, size_t *len, int *fds,
                                    size_t fd_cap, size_t *nfds, size_t *offset)
{
    return fp_block_export(p ? &p->alloc : NULL, ptr, desc, cap, len, fds, fd_cap, nfds, offset);
}

fabpool_status fabpool_view_open(fabpool_t *p, const void *desc, size_t len, const int *fds, size_t nfds,
                                 fabpool_view_t **out)
{
    return fp_view_open(p ? &p->views : NULL, 0, desc, len, fds, nfds, out);
}

fabpool_status fabpool_view_open_peer(fabpool_t *p, int peer_pid, const void *desc, size_t len, const int *fds,
                                      size_t nfds, fabpool_view_t **out)
{
    return fp_view_open(p ? &p->views : NULL, peer_pid > 0 ? peer_pid : -1, desc, len, fds, nfds, out);
}
