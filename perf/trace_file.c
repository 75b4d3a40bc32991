/* trace_file.c - reading and summarising fabpool traces (trace_file.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef FABPOOL_HAVE_ZLIB
#include <zlib.h>
#endif

#include "fabpool.h"
#include "trace_file.h"

/* ------------------------------------------------------------ u64map */

static size_t slot_of(uint64_t k, size_t cap) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1); }

int u64map_put(u64map *m, uint64_t key, uint64_t val)
{
    if (!key)
        return 0; /* 0 marks an empty slot: never a key (no record names memory at address 0) */
    if ((m->n + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 1024;
        uint64_t *nk = calloc(nc, sizeof *nk), *nv = calloc(nc, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                size_t s = slot_of(m->keys[i], nc);
                while (nk[s])
                    s = (s + 1) & (nc - 1);
                nk[s] = m->keys[i];
                nv[s] = m->vals[i];
            }
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->cap = nc;
    }
    size_t s = slot_of(key, m->cap);
    while (m->keys[s] && m->keys[s] != key)
        s = (s + 1) & (m->cap - 1);
    if (!m->keys[s])
        m->n++;
    m->keys[s] = key;
    m->vals[s] = val;
    return 0;
}

static size_t find(const u64map *m, uint64_t key)
{
    if (!m->cap || !key)
        return SIZE_MAX;
    size_t s = slot_of(key, m->cap);
    while (m->keys[s]) {
        if (m->keys[s] == key)
            return s;
        s = (s + 1) & (m->cap - 1);
    }
    return SIZE_MAX;
}

int u64map_get(const u64map *m, uint64_t key, uint64_t *val)
{
    size_t s = find(m, key);
    if (s == SIZE_MAX)
        return 0;
    if (val)
        *val = m->vals[s];
    return 1;
}

int u64map_del(u64map *m, uint64_t key, uint64_t *val)
{
    size_t s = find(m, key);
    if (s == SIZE_MAX)
        return 0;
    if (val)
        *val = m->vals[s];
    m->keys[s] = 0;
    m->n--;
    for (size_t j = (s + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        uint64_t k = m->keys[j], v = m->vals[j];
        m->keys[j] = 0;
        size_t t = slot_of(k, m->cap);
        while (m->keys[t])
            t = (t + 1) & (m->cap - 1);
        m->keys[t] = k;
        m->vals[t] = v;
    }
    return 1;
}

void u64map_free(u64map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------ reading */

#define GZ_RATIO_MAX 64               /* decompressed bytes a compressed byte may give */
#define GZ_FLOOR (64ull << 20)        /* and at least this much, for small files */

/* The whole file (decompressed) into *buf. */
static int slurp(const char *path, unsigned char **buf, size_t *len, char *err, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, cap, "cannot open trace '%s': %s", path, strerror(errno));
        return -1;
    }
    unsigned char magic[2] = {0, 0};
    size_t got = fread(magic, 1, 2, f);
    int gz = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    size_t n = 0, c = 1 << 20;
    unsigned char *b = malloc(c);
    if (!b) {
        fclose(f);
        snprintf(err, cap, "no host memory to read trace '%s'", path);
        return -1;
    }
    if (!gz) {
        memcpy(b, magic, got);
        n = got;
        for (;;) {
            if (n == c) {
                unsigned char *nb = realloc(b, c *= 2);
                if (!nb)
                    goto nomem;
                b = nb;
            }
            size_t r = fread(b + n, 1, c - n, f);
            if (r == 0)
                break;
            n += r;
        }
        if (ferror(f)) {
            snprintf(err, cap, "reading trace '%s' failed: %s", path, strerror(errno));
            goto fail;
        }
        fclose(f);
        *buf = b;
        *len = n;
        return 0;
    }
    /* a gzip file decompresses to at most this much: a stream of zeros (a "zip bomb") reaches a thousand times
     * its size, a trace's records a few times theirs */
    struct stat stz;
    uint64_t limit = fstat(fileno(f), &stz) == 0 && stz.st_size > 0 ? (uint64_t)stz.st_size * GZ_RATIO_MAX : 0;
    limit = limit > GZ_FLOOR ? limit : GZ_FLOOR;
    fclose(f);
    f = NULL;
#ifdef FABPOOL_HAVE_ZLIB
    gzFile z = gzopen(path, "rb");
    if (!z) {
        snprintf(err, cap, "cannot open gzip trace '%s'", path);
        free(b);
        return -1;
    }
    for (;;) {
        if (n == c) {
            unsigned char *nb = realloc(b, c *= 2);
            if (!nb) {
                gzclose(z);
                goto nomem;
            }
            b = nb;
        }
        int r = gzread(z, b + n, (unsigned)(c - n > (1u << 30) ? (1u << 30) : c - n));
        if (r < 0) {
            int zerr = 0;
            snprintf(err, cap, "trace '%s' is a corrupt gzip file: %s", path, gzerror(z, &zerr));
            gzclose(z);
            free(b);
            return -1;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > limit) {
            gzclose(z);
            goto too_large;
        }
    }
    /* a gzip stream cut short reads as a short file without an error from
     * gzread on some zlib versions: gzclose says so */
    int zc = gzclose(z);
    if (zc != Z_OK) {
        snprintf(err, cap, "trace '%s' is a truncated or corrupt gzip file (zlib error %d)", path, zc);
        free(b);
        return -1;
    }
#else
    {
        char cmd[4200];
        /* the path in single quotes, its own quotes escaped */
        size_t k = 0;
        k += (size_t)snprintf(cmd, sizeof cmd, "gzip -dc -- '");
        for (const char *s = path; *s && k + 8 < sizeof cmd; s++) {
            if (*s == '\'') {
                memcpy(cmd + k, "'\\''", 4);
                k += 4;
            } else {
                cmd[k++] = *s;
            }
        }
        snprintf(cmd + k, sizeof cmd - k, "'");
        FILE *pz = popen(cmd, "r");
        if (!pz) {
            snprintf(err, cap, "cannot run gzip -dc on '%s': %s", path, strerror(errno));
            free(b);
            return -1;
        }
        for (;;) {
            if (n == c) {
                unsigned char *nb = realloc(b, c *= 2);
                if (!nb) {
                    pclose(pz);
                    goto nomem;
                }
                b = nb;
            }
            size_t r = fread(b + n, 1, c - n, pz);
            if (r == 0)
                break;
            n += r;
            if (n > limit) {
                pclose(pz);
                goto too_large;
            }
        }
        if (pclose(pz) != 0) {
            snprintf(err, cap, "trace '%s' is a truncated or corrupt gzip file (gzip -dc failed)", path);
            free(b);
            return -1;
        }
    }
#endif
    *buf = b;
    *len = n;
    return 0;
too_large:
    snprintf(err, cap, "trace '%s' decompresses to more than %llu bytes, %d times its compressed size: not a trace "
             "(one compresses a few times); if it really is one, decompress it (gzip -d) and give that file",
             path, (unsigned long long)limit, GZ_RATIO_MAX);
    free(b);
    return -1;
nomem:
    snprintf(err, cap, "no host memory to read trace '%s'", path);
fail:
    if (f)
        fclose(f);
    free(b);
    return -1;
}

int trace_load(const char *path, trace_data *d, char *err, size_t cap)
{
    memset(d, 0, sizeof *d);
    unsigned char *b = NULL;
    size_t len = 0;
    if (slurp(path, &b, &len, err, cap) != 0)
        return -1;
    int rc = trace_parse(b, len, path, d, err, cap);
    free(b);
    return rc;
}

int trace_parse(const unsigned char *b, size_t len, const char *path, trace_data *d, char *err, size_t cap)
{
    memset(d, 0, sizeof *d);
    int rc = -1;
    if (len < FABPOOL_TRACE_HEADER_BYTES) {
        snprintf(err, cap, "trace '%s' is truncated: %zu bytes, shorter than the %u-byte header", path, len,
                 FABPOOL_TRACE_HEADER_BYTES);
        goto out;
    }
    if (memcmp(b, FABPOOL_TRACE_MAGIC, 8) != 0) {
        snprintf(err, cap, "'%s' is not a fabpool trace (it does not start with \"FPTRACE\")", path);
        goto out;
    }
    d->h.version = fabpool_le_get32(b + 8);
    if (d->h.version != FABPOOL_TRACE_VERSION) {
        snprintf(err, cap, "trace '%s' is of version %u; this reader knows version %u", path, d->h.version,
                 FABPOOL_TRACE_VERSION);
        goto out;
    }
    if (fabpool_le_get32(b + 12) != FABPOOL_TRACE_HEADER_BYTES || fabpool_le_get32(b + 16) != FABPOOL_TRACE_RECORD_BYTES) {
        snprintf(err, cap, "trace '%s' is corrupt: its header says %u-byte header and %u-byte records, version 1 has "
                 "%u and %u", path, fabpool_le_get32(b + 12), fabpool_le_get32(b + 16), FABPOOL_TRACE_HEADER_BYTES,
                 FABPOOL_TRACE_RECORD_BYTES);
        goto out;
    }
    d->h.device = (int32_t)fabpool_le_get32(b + 20);
    if (d->h.device < 0 || d->h.device > TRACE_MAX_DEVICE) {
        snprintf(err, cap, "trace '%s' is corrupt: its header names device %d; a device ordinal is 0 to %d", path,
                 d->h.device, TRACE_MAX_DEVICE);
        goto out;
    }
    d->h.granularity = fabpool_le_get64(b + 24);
    d->h.slab_max = fabpool_le_get64(b + 32);
    d->h.n_records = fabpool_le_get64(b + 40);
    d->h.checksum = fabpool_le_get64(b + 48);
    d->h.pid = fabpool_le_get32(b + 56);
    d->h.flags = fabpool_le_get32(b + 60);
    size_t body = len - FABPOOL_TRACE_HEADER_BYTES;
    size_t whole = body / FABPOOL_TRACE_RECORD_BYTES;
    d->closed = d->h.n_records != FABPOOL_TRACE_OPEN;
    if (d->closed) {
        if (d->h.n_records > whole) {
            snprintf(err, cap, "trace '%s' is truncated: its header counts %llu records, the file holds %zu (and %zu "
                     "bytes of a partial one)", path, (unsigned long long)d->h.n_records, whole,
                     body % FABPOOL_TRACE_RECORD_BYTES);
            goto out;
        }
        if (body != d->h.n_records * FABPOOL_TRACE_RECORD_BYTES) {
            snprintf(err, cap, "trace '%s' is corrupt: its header counts %llu records, the file holds %zu bytes of "
                     "records after the header (%llu expected)", path, (unsigned long long)d->h.n_records, body,
                     (unsigned long long)(d->h.n_records * FABPOOL_TRACE_RECORD_BYTES));
            goto out;
        }
        uint64_t sum = fabpool_fnv1a(FABPOOL_FNV_OFFSET, b + FABPOOL_TRACE_HEADER_BYTES, body);
        if (sum != d->h.checksum) {
            snprintf(err, cap, "trace '%s' is corrupt: the checksum of its %zu records is %016llx, its header says "
                     "%016llx", path, whole, (unsigned long long)sum, (unsigned long long)d->h.checksum);
            goto out;
        }
    } else {
        snprintf(d->note, sizeof d->note, "the writer never completed this trace (the process ended before its pool "
                 "was destroyed or exit ran): %zu whole records read%s, no checksum to check", whole,
                 body % FABPOOL_TRACE_RECORD_BYTES ? ", a partial last one dropped" : "");
    }
    d->n = whole;
    d->recs = malloc((whole ? whole : 1) * sizeof *d->recs);
    if (!d->recs) {
        snprintf(err, cap, "no host memory for the %zu records of trace '%s'", whole, path);
        goto out;
    }
    uint64_t last_t = 0;
    for (size_t i = 0; i < whole; i++) {
        fabpool_trace_rec *r = &d->recs[i];
        fabpool_trace_decode_rec(b + FABPOOL_TRACE_HEADER_BYTES + i * FABPOOL_TRACE_RECORD_BYTES, r);
        const char *bad = trace_rec_bad(r);
        if (!bad && r->t_ns < last_t)
            bad = "a time stamp earlier than the record before it";
        if (bad) {
            snprintf(err, cap, "trace '%s' is corrupt: record %zu (of %zu, at byte %zu) has %s (op %u, status %u, "
                     "t %llu ns, ptr 0x%llx, size %llu)", path, i, whole,
                     FABPOOL_TRACE_HEADER_BYTES + i * FABPOOL_TRACE_RECORD_BYTES, bad, r->op, r->status,
                     (unsigned long long)r->t_ns, (unsigned long long)r->ptr, (unsigned long long)r->size);
            free(d->recs);
            d->recs = NULL;
            goto out;
        }
        last_t = r->t_ns;
        if (r->op >= FABPOOL_TR_APP_ALLOC)
            d->has_app = 1;
    }
    if (d->h.flags & FABPOOL_TRACE_F_APP_MARKED)
        d->has_app = 1;
    rc = 0;
out:
    return rc;
}

const char *trace_rec_bad(const fabpool_trace_rec *r)
{
    if (r->op == 0 || r->op >= FABPOOL_TR_NOPS)
        return "an unknown op";
    if (r->status != FABPOOL_TRACE_STATUS_UNKNOWN && r->status > FABPOOL_STATUS_LAST)
        return "an unknown status";
    if (r->thread == 0)
        return "thread 0";
    int ok = r->status == FABPOOL_TRACE_STATUS_UNKNOWN || r->status == FABPOOL_OK;
    int ranged = r->op == FABPOOL_TR_ALLOC || r->op == FABPOOL_TR_APP_ALLOC || r->op == FABPOOL_TR_BUF_CREATE ||
                 r->op == FABPOOL_TR_BUF_RESIZE || r->op == FABPOOL_TR_MAP || r->op == FABPOOL_TR_UNMAP;
    if (!ranged || !ok)
        return NULL;
    if (r->ptr == 0)
        return "memory at address 0";
    if (r->size > UINT64_MAX - r->ptr)
        return "a range that runs past the end of the address space";
    if ((r->op == FABPOOL_TR_MAP || r->op == FABPOOL_TR_UNMAP) && r->size == 0)
        return "a map or unmap of 0 bytes";
    return NULL;
}

void trace_free(trace_data *d)
{
    free(d->recs);
    memset(d, 0, sizeof *d);
}

/* ------------------------------------------------------------ summary */

static unsigned log2_floor(uint64_t x)
{
    unsigned k = 0;
    while (x >>= 1)
        k++;
    return k;
}

/* The summary's byte counts: a hostile trace may claim more than 2^64 bytes live; they stop at the top. */
static uint64_t sat_add(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }
static uint64_t sat_sub(uint64_t a, uint64_t b) { return b > a ? 0 : a - b; }

static void stream_seen(trace_summary *s, uint64_t st)
{
    if (!st) {
        s->null_stream = 1;
        return;
    }
    for (unsigned i = 0; i < s->n_streams && i < 64; i++)
        if (s->streams[i] == st)
            return;
    if (s->n_streams < 64)
        s->streams[s->n_streams] = st;
    s->n_streams++;
}

void trace_summarize(const trace_data *d, trace_summary *s)
{
    memset(s, 0, sizeof *s);
    s->level_app = d->has_app;
    u64map live = {0}, pool_live = {0};
    uint64_t bytes = 0, pool_bytes = 0;
    uint32_t threads = 0;
    for (size_t i = 0; i < d->n; i++) {
        const fabpool_trace_rec *r = &d->recs[i];
        s->ops[r->op]++;
        if (r->status != FABPOOL_TRACE_STATUS_UNKNOWN && r->status != FABPOOL_OK)
            s->failed[r->op]++;
        if (r->thread > threads)
            threads = r->thread;
        /* the level's allocations and frees: the application's calls of either pair (the plain one and the
         * stream-ordered one), or every alloc and free that reached the pool */
        int alloc_or_free = r->op == FABPOOL_TR_ALLOC || r->op == FABPOOL_TR_FREE || r->op == FABPOOL_TR_APP_ALLOC ||
                            r->op == FABPOOL_TR_APP_FREE;
        int counted_level = alloc_or_free && (d->has_app ? trace_rec_app(d, r) : r->op <= FABPOOL_TR_FREE);
        uint64_t v = 0;
        switch (r->op) {
        case FABPOOL_TR_ALLOC:
        case FABPOOL_TR_APP_ALLOC:
            if (r->op == FABPOOL_TR_APP_ALLOC)
                stream_seen(s, r->arg);
            if (r->status != FABPOOL_TRACE_STATUS_UNKNOWN && r->status != FABPOOL_OK)
                break;
            if (r->op == FABPOOL_TR_ALLOC) {
                u64map_put(&pool_live, r->ptr, r->size);
                pool_bytes = sat_add(pool_bytes, r->size);
            }
            if (counted_level) {
                s->hist[r->size ? log2_floor(r->size) : 0]++;
                u64map_put(&live, r->ptr, r->size);
                bytes = sat_add(bytes, r->size);
            }
            break;
        case FABPOOL_TR_FREE:
        case FABPOOL_TR_APP_FREE:
            if (r->op == FABPOOL_TR_APP_FREE)
                stream_seen(s, r->arg);
            if (r->op == FABPOOL_TR_FREE && u64map_del(&pool_live, r->ptr, &v))
                pool_bytes = sat_sub(pool_bytes, v);
            if (counted_level) {
                if (u64map_del(&live, r->ptr, &v))
                    bytes = sat_sub(bytes, v);
                else
                    s->unknown_frees++;
            }
            break;
        case FABPOOL_TR_BUF_CREATE:
            s->buf_hist[r->size ? log2_floor(r->size) : 0]++;
            u64map_put(&live, r->ptr, r->size);
            u64map_put(&pool_live, r->ptr, r->size);
            bytes = sat_add(bytes, r->size);
            pool_bytes = sat_add(pool_bytes, r->size);
            break;
        case FABPOOL_TR_BUF_RESIZE:
            stream_seen(s, r->arg);
            s->buf_hist[r->size ? log2_floor(r->size) : 0]++;
            if (u64map_get(&live, r->ptr, &v)) {
                bytes = sat_add(sat_sub(bytes, v), r->size);
                pool_bytes = sat_add(sat_sub(pool_bytes, v), r->size);
                u64map_put(&live, r->ptr, r->size);
                u64map_put(&pool_live, r->ptr, r->size);
            } else {
                s->unknown_frees++;
            }
            break;
        case FABPOOL_TR_BUF_DESTROY:
            stream_seen(s, r->arg);
            if (u64map_del(&live, r->ptr, &v)) {
                bytes = sat_sub(bytes, v);
                u64map_del(&pool_live, r->ptr, NULL);
                pool_bytes = sat_sub(pool_bytes, v);
            } else {
                s->unknown_frees++;
            }
            break;
        default:
            break;
        }
        if (bytes > s->live_peak)
            s->live_peak = bytes;
        if (pool_bytes > s->pool_live_peak)
            s->pool_live_peak = pool_bytes;
    }
    s->live_end = bytes;
    s->objects_end = live.n;
    s->threads = threads;
    s->duration_ns = d->n ? d->recs[d->n - 1].t_ns - d->recs[0].t_ns : 0;
    u64map_free(&live);
    u64map_free(&pool_live);
}
