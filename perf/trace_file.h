/* trace_file.h - reading a fabpool trace (include/fabpool_trace_format.h) for the tools
 * of perf/: fabpool_trace (the summary), fabpool_replay, and the tests. */
#ifndef FABPOOL_TRACE_FILE_H
#define FABPOOL_TRACE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool_trace_format.h"

typedef struct trace_data {
    fabpool_trace_header h;
    fabpool_trace_rec *recs;
    size_t n;
    int closed;          /* the header holds the record count and checksum (checked) */
    int has_app;         /* the application's level differs from the pool's: the records say which calls the
                            application made (FABPOOL_TRACE_F_APP_MARKED), or some are app_* records */
    char note[256];      /* what the reader accepted with a warning ("" if nothing) */
} trace_data;

/* The highest device ordinal a trace may name (the tools' --device takes 0 to this). */
#define TRACE_MAX_DEVICE 1023

/* Reads a whole trace (gzip-compressed if it starts with gzip's magic: through
 * zlib where built with it, else `gzip -dc`).  Refuses a file that is not a
 * trace, of another version, truncated, or corrupt (checksum, a device
 * outside 0..TRACE_MAX_DEVICE, a record trace_rec_bad refuses, time going
 * back): -1 with the reason in err.  A trace whose writer never completed it
 * (the process died) is read up to its last whole record, with a note. */
int trace_load(const char *path, trace_data *d, char *err, size_t cap);
/* The same, of the len bytes at b (already decompressed); path only names the trace in messages. */
int trace_parse(const unsigned char *b, size_t len, const char *path, trace_data *d, char *err, size_t cap);
void trace_free(trace_data *d);

/* Why r cannot be a record the pool wrote, or NULL: an unknown op or status, thread 0, or memory given out,
 * resized, mapped or unmapped (a successful alloc, app_alloc, buffer record, map, unmap) at address 0 or over a
 * range that runs past the end of the 64-bit address space, or a map or unmap of 0 bytes.  Every reader takes
 * only records that pass, so that each range [ptr, ptr + size) it computes is a true one. */
const char *trace_rec_bad(const fabpool_trace_rec *r);

/* 1 if r is one of the application's calls (its level): in a trace whose header has
 * FABPOOL_TRACE_F_APP_MARKED, a record marked FABPOOL_TRACE_R_APP; in one without, an app_* record or a
 * buffer's. */
static inline int trace_rec_app(const trace_data *d, const fabpool_trace_rec *r)
{
    if (d->h.flags & FABPOOL_TRACE_F_APP_MARKED)
        return (r->flags & FABPOOL_TRACE_R_APP) != 0;
    return r->op >= FABPOOL_TR_APP_ALLOC || r->op == FABPOOL_TR_BUF_CREATE || r->op == FABPOOL_TR_BUF_RESIZE ||
           r->op == FABPOOL_TR_BUF_DESTROY;
}

/* The summary of fabpool_trace, computed from d. */
#define TRACE_HIST 64
typedef struct trace_summary {
    uint64_t ops[FABPOOL_TR_NOPS];       /* records by op */
    uint64_t failed[FABPOOL_TR_NOPS];    /* records with a known status other than OK */
    uint64_t hist[TRACE_HIST];      /* allocations (the level in `level`) by size: [k] = sizes in [2^k, 2^(k+1)) */
    uint64_t buf_hist[TRACE_HIST];  /* buffer sizes asked (create, resize) */
    uint64_t live_peak, live_end;   /* bytes: blocks of the level + buffer sizes */
    uint64_t pool_live_peak;        /* fabpool's own blocks + buffers, whatever the level */
    uint64_t objects_end;           /* blocks and buffers still live at the end */
    uint64_t unknown_frees;         /* frees (or buffer ops) of pointers the trace never gave out */
    uint64_t duration_ns;
    uint64_t streams[64];           /* distinct non-NULL streams seen (the first 64) */
    unsigned n_streams, threads;
    int null_stream;                /* the NULL (legacy default) stream was named */
    int level_app;                  /* 1: the level is the application's (trace_rec_app), 0: the pool's */
} trace_summary;

void trace_summarize(const trace_data *d, trace_summary *s);

/* A map of nonzero 64-bit keys to values (open addressing), for pointers. */
typedef struct u64map {
    uint64_t *keys, *vals;
    size_t cap, n;
} u64map;
int u64map_put(u64map *m, uint64_t key, uint64_t val);      /* -1: no memory */
int u64map_get(const u64map *m, uint64_t key, uint64_t *val); /* 1 found, 0 not */
int u64map_del(u64map *m, uint64_t key, uint64_t *val);       /* 1 found (and removed), 0 not */
void u64map_free(u64map *m);

#endif
