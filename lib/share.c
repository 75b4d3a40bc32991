/* share.c - buffers across processes: descriptors out of a buffer, views
 * of a peer's buffer in, and the rules of who may unmap what when. */
#define _GNU_SOURCE /* syscall(SYS_kcmp) */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "error.h"
#include "pool.h"
#include "sleep.h"

/* ------------------------------------------------------------ the descriptor
 *
 * Little-endian, fixed layout (docs/design.md):
 *   header, FABPOOL_DESC_HEADER_BYTES:
 *     0 u32 magic "FPDS"     4 u16 version        6 u16 header bytes
 *     8 u32 record bytes    12 u32 records        16 u32 handle type (2 posix_fd, 3 fabric)
 *    20 u32 flags           24 u64 generation     32 u64 since
 *    40 u64 window          48 u64 live bytes     56 u64 buffer uid
 *    64 u32 pid             68 i32 device         72 u64 granularity
 *    80 u64 checksum (FNV-1a over everything else) 88 u64 reserved
 *   records, FABPOOL_DESC_RECORD_BYTES each, sorted by offset:
 *     0 u64 offset  8 u64 size  16 u64 generation  24 u32 fd index  28 u32 reserved  32 u8[64] fabric handle
 */
#define DESC_MAGIC 0x53445046u

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static uint64_t checksum(const uint8_t *d, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (i >= 80 && i < 88) ? 0 : d[i];
        h = (h ^ c) * 1099511628211ull;
    }
    return h;
}

size_t fabpool_desc_size(size_t n) { return FABPOOL_DESC_HEADER_BYTES + n * FABPOOL_DESC_RECORD_BYTES; }

/* ------------------------------------------------------------ export */

/* Closes the pool's copy of chunk c's exported fd, if it holds one (an open
 * fd keeps the memory alive). */
static void close_export_fd(struct fabpool *p, fp_bchunk *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
        atomic_fetch_sub(&p->exported_fds, 1);
    }
}

void fp_chunk_forget_export(struct fabpool *p, fp_bchunk *c)
{
    fp_lock_assert_held(&p->lock);
    close_export_fd(p, c);
    c->has_fabric = 0;
}

/* Exports chunk c once: retain its handle, export, release at once. */
static fabpool_status export_chunk(struct fabpool *p, struct fabpool_buffer *b, fp_bchunk *c)
{
    int fabric = p->handle_type == FABPOOL_HANDLE_FABRIC;
    if (fabric ? c->has_fabric : c->fd >= 0)
        return FABPOOL_OK;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = FP_CU(&p->calls, cuMemRetainAllocationHandle, &h, (void *)(uintptr_t)(b->base + c->off));
    if (r != CUDA_SUCCESS)
        return fp_drv_error(r, "cuMemRetainAllocationHandle", "taking the handle of a chunk at 0x%llx to export it",
                            (unsigned long long)(b->base + c->off));
    atomic_fetch_add(&p->handles_outstanding, 1);
    if (fabric)
        r = FP_CU(&p->calls, cuMemExportToShareableHandle, &c->fabric, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    else
        r = FP_CU(&p->calls, cuMemExportToShareableHandle, &c->fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    fabpool_status st = FABPOOL_OK;
    if (r != CUDA_SUCCESS) {
        c->fd = -1;
        st = fp_drv_error(r, "cuMemExportToShareableHandle", "exporting a chunk of %llu bytes as a %s handle",
                          (unsigned long long)c->size, fabric ? "fabric" : "POSIX fd");
    } else if (fabric) {
        c->has_fabric = 1;
    } else {
        atomic_fetch_add(&p->exported_fds, 1);
    }
    /* the handle goes at once: the mapping (and the fd) keep the memory */
    if (FP_CU_UNDO(&p->calls, cuMemRelease, h) == CUDA_SUCCESS)
        atomic_fetch_sub(&p->handles_outstanding, 1);
    return st;
}

fabpool_status fabpool_buffer_export(fabpool_buffer_t *b, uint64_t since, void *desc, size_t cap, size_t *len,
                                     int *fds, size_t fd_cap, size_t *nfds)
{
    if (!b || !len || !nfds)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export: the buffer, len or nfds is NULL");
    struct fabpool *p = b->pool;
    if (p->handle_type != FABPOOL_HANDLE_POSIX_FD && p->handle_type != FABPOOL_HANDLE_FABRIC)
        return fp_error(FABPOOL_ERR_NOT_SUPPORTED, "fabpool_buffer_export: the pool's handle type is %s: create it "
                        "with handle_type:posix_fd, fabric or auto to share its buffers",
                        fp_handle_type_name(p->handle_type));
    fp_lock(&p->lock);
    fabpool_status st = FABPOOL_OK;
    if (b->destroyed) {
        st = fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export: the buffer is destroyed");
        goto out;
    }
    if (fp_asleep(p)) {
        st = fp_asleep_error("fabpool_buffer_export");
        goto out;
    }
    if (since > b->generation) {
        st = fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export: since %llu is past the buffer's generation "
                      "%llu", (unsigned long long)since, (unsigned long long)b->generation);
        goto out;
    }
    size_t n = 0;
    for (uint32_t i = 0; i < b->n; i++)
        n += !b->chunks[i].retiring && b->chunks[i].gen > since;
    int posix = p->handle_type == FABPOOL_HANDLE_POSIX_FD;
    *len = fabpool_desc_size(n);
    *nfds = posix ? n : 0;
    if (!desc || cap < *len || (posix && (!fds || fd_cap < n))) {
        st = fp_error(FABPOOL_ERR_LIMIT, "fabpool_buffer_export: the descriptor takes %zu bytes and %zu fds; the "
                      "caller gave room for %zu and %zu", *len, *nfds, cap, fd_cap);
        goto out;
    }
    uint8_t *d = desc;
    memset(d, 0, *len);
    size_t k = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        fp_bchunk *c = &b->chunks[i];
        if (c->retiring || c->gen <= since)
            continue;
        if ((st = export_chunk(p, b, c)) != FABPOOL_OK)
            goto out;
        uint8_t *r = d + FABPOOL_DESC_HEADER_BYTES + k * FABPOOL_DESC_RECORD_BYTES;
        put64(r, c->off);
        put64(r + 8, c->size);
        put64(r + 16, c->gen);
        put32(r + 24, (uint32_t)k);
        c->named = b->generation;
        if (posix)
            fds[k] = c->fd;
        else
            memcpy(r + 32, &c->fabric, sizeof c->fabric);
        k++;
    }
    put32(d, DESC_MAGIC);
    uint16_t v = FABPOOL_DESC_VERSION, hb = FABPOOL_DESC_HEADER_BYTES;
    memcpy(d + 4, &v, 2);
    memcpy(d + 6, &hb, 2);
    put32(d + 8, FABPOOL_DESC_RECORD_BYTES);
    put32(d + 12, (uint32_t)n);
    put32(d + 16, (uint32_t)p->handle_type);
    put64(d + 24, b->generation);
    put64(d + 32, since);
    put64(d + 40, b->window);
    put64(d + 48, b->live);
    put64(d + 56, b->uid);
    put32(d + 64, (uint32_t)getpid());
    put32(d + 68, (uint32_t)p->opt.device);
    put64(d + 72, p->gran);
    put64(d + 80, checksum(d, *len));
    if (b->acked == UINT64_MAX && b->generation > 0)
        b->acked = b->generation - 1; /* a new peer after "no peer is left": it maps what this names */
    b->shared = 1;
    b->exported_gen = b->generation;
out:
    fp_unlock(&p->lock);
    return st;
}

fabpool_status fabpool_buffer_export_done(fabpool_buffer_t *b)
{
    if (!b)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_export_done: the buffer is NULL");
    struct fabpool *p = b->pool;
    fp_lock(&p->lock);
    for (uint32_t i = 0; i < b->n; i++)
        close_export_fd(p, &b->chunks[i]);
    fp_unlock(&p->lock);
    return FABPOOL_OK;
}

/* Records that every peer has applied `generation`, and unmaps what they no
 * longer need. */
static fabpool_status ack_locked(struct fabpool *p, struct fabpool_buffer *b, uint64_t generation, const char *fn)
{
    fp_lock_assert_held(&p->lock);
    if (generation != UINT64_MAX && generation > b->generation)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "%s: generation %llu was never issued (the buffer is at generation "
                        "%llu, its last descriptor has %llu): acknowledge the generation a peer applied, or "
                        "UINT64_MAX when no peer is left", fn, (unsigned long long)generation,
                        (unsigned long long)b->generation, (unsigned long long)b->exported_gen);
    if (generation > b->acked || generation == UINT64_MAX)
        b->acked = generation;
    return fp_collect_locked(p, 0);
}

fabpool_status fabpool_buffer_peers_ack(fabpool_buffer_t *b, uint64_t generation)
{
    if (!b)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_peers_ack: the buffer is NULL");
    struct fabpool *p = b->pool;
    fp_lock(&p->lock);
    fabpool_status st = b->destroyed ? fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_buffer_peers_ack: the buffer is "
                                                "destroyed; acknowledge by its export id (fabpool_peers_ack)")
                                     : ack_locked(p, b, generation, "fabpool_buffer_peers_ack");
    fp_unlock(&p->lock);
    return st;
}

fabpool_status fabpool_peers_ack(fabpool_t *p, uint64_t export_id, uint64_t generation)
{
    if (!p)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_peers_ack: the pool is NULL");
    fp_lock(&p->lock);
    struct fabpool_buffer *b = p->buffers;
    while (b && b->uid != export_id)
        b = b->next;
    fabpool_status st = b ? ack_locked(p, b, generation, "fabpool_peers_ack")
                          : fp_error(FABPOOL_ERR_NOT_FOUND, "fabpool_peers_ack: no buffer of this pool has export id "
                                     "0x%llx (a destroyed buffer whose memory is all gone needs no more acks)",
                                     (unsigned long long)export_id);
    fp_unlock(&p->lock);
    return st;
}

/* ------------------------------------------------------------ parsing */

typedef struct parsed {
    uint32_t n, handle_type;
    uint64_t generation, since, window, live, uid, gran;
    int pid, device;
    const uint8_t *records;
} parsed;

static fabpool_status bad_desc(const char *fmt, unsigned long long a, unsigned long long b)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a, b);
    return fp_error(FABPOOL_ERR_DESCRIPTOR, "descriptor refused, nothing mapped: %s", msg);
}

/* Every check that needs no view: the bytes are a descriptor of version 1,
 * whole, uncorrupted, and its records fit its window. */
static fabpool_status parse(const void *desc, size_t len, size_t nfds, parsed *out)
{
    const uint8_t *d = desc;
    if (!d)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "the descriptor is NULL");
    if (len < FABPOOL_DESC_HEADER_BYTES)
        return bad_desc("truncated: %llu bytes, a header alone takes %llu", len, FABPOOL_DESC_HEADER_BYTES);
    if (get32(d) != DESC_MAGIC)
        return bad_desc("not a fabpool descriptor (magic 0x%llx, expected 0x%llx)", get32(d), DESC_MAGIC);
    uint16_t v, hb;
    memcpy(&v, d + 4, 2);
    memcpy(&hb, d + 6, 2);
    if (v != FABPOOL_DESC_VERSION)
        return bad_desc("version %llu, this fabpool reads version %llu: exporter and importer must run the same "
                        "fabpool version", v, FABPOOL_DESC_VERSION);
    if (hb != FABPOOL_DESC_HEADER_BYTES || get32(d + 8) != FABPOOL_DESC_RECORD_BYTES)
        return bad_desc("header of %llu bytes or records of another size (%llu)", hb, get32(d + 8));
    out->n = get32(d + 12);
    if (out->n > (len - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES || len != fabpool_desc_size(out->n))
        return bad_desc("truncated or padded: %llu bytes for %llu records", len, out->n);
    if (get64(d + 80) != checksum(d, len))
        return bad_desc("the checksum does not match: corrupted in transit (%llu bytes, %llu records)", len, out->n);
    out->handle_type = get32(d + 16);
    out->generation = get64(d + 24);
    out->since = get64(d + 32);
    out->window = get64(d + 40);
    out->live = get64(d + 48);
    out->uid = get64(d + 56);
    out->pid = (int)get32(d + 64);
    out->device = (int)get32(d + 68);
    out->gran = get64(d + 72);
    out->records = d + FABPOOL_DESC_HEADER_BYTES;
    if (out->handle_type != FABPOOL_HANDLE_POSIX_FD && out->handle_type != FABPOOL_HANDLE_FABRIC)
        return bad_desc("handle type %llu is neither posix_fd (%llu) nor fabric (3)", out->handle_type,
                        FABPOOL_HANDLE_POSIX_FD);
    if (!out->gran || (out->gran & (out->gran - 1)) || out->window == 0 || out->window % out->gran ||
        out->live > out->window || out->live % out->gran)
        return bad_desc("window %llu / live %llu bytes do not fit the granularity", out->window, out->live);
    if (out->since > out->generation)
        return bad_desc("since %llu is past its generation %llu", out->since, out->generation);
    if (out->handle_type == FABPOOL_HANDLE_POSIX_FD && nfds != out->n)
        return bad_desc("%llu fds came with %llu records", nfds, out->n);
    uint64_t end = 0;
    for (uint32_t i = 0; i < out->n; i++) {
        const uint8_t *r = out->records + (size_t)i * FABPOOL_DESC_RECORD_BYTES;
        uint64_t off = get64(r), size = get64(r + 8), gen = get64(r + 16);
        if (size == 0 || off % out->gran || size % out->gran || off > out->window || size > out->window - off ||
            off + size > out->live)
            return bad_desc("record %llu names a range outside the window (offset %llu)", i, off);
        if (i && off < end)
            return bad_desc("record %llu overlaps or repeats the one before it (offset %llu)", i, off);
        if (gen <= out->since || gen > out->generation)
            return bad_desc("record %llu has generation %llu outside (since, generation]", i, gen);
        if (out->handle_type == FABPOOL_HANDLE_POSIX_FD && get32(r + 24) != i)
            return bad_desc("record %llu names fd %llu: each record names its own fd, in order", i, get32(r + 24));
        end = off + size;
    }
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ views */

static void close_fds(const int *fds, size_t n)
{
    for (size_t i = 0; fds && i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Two fds that are one open file (the same fd sent twice, or a dup): kcmp
 * says so where the kernel offers it (1 same, 0 not, -1 cannot tell). */
static int same_file(int a, int b)
{
#ifdef SYS_kcmp
    long r = syscall(SYS_kcmp, (long)getpid(), (long)getpid(), 0 /* KCMP_FILE */, (long)a, (long)b);
    return r < 0 ? -1 : r == 0;
#else
    (void)a;
    (void)b;
    return -1;
#endif
}

/* Imports the handle of record i (not mapped yet); counted in handles_outstanding. */
static fabpool_status import_one(struct fabpool *p, const parsed *ds, uint32_t i, const int *fds,
                                 CUmemGenericAllocationHandle *h)
{
    const uint8_t *r = ds->records + (size_t)i * FABPOOL_DESC_RECORD_BYTES;
    uint64_t off = get64(r), size = get64(r + 8);
    CUresult cr;
    if (ds->handle_type == FABPOOL_HANDLE_POSIX_FD) {
        for (uint32_t k = 0; k < i; k++)
            if (fds[k] == fds[i] || same_file(fds[k], fds[i]) == 1)
                return bad_desc("fds %llu and %llu are one file (the same fd given twice): each record needs the fd "
                                "of its own chunk", k, i);
        cr = FP_CU(&p->calls, cuMemImportFromShareableHandle, h, (void *)(intptr_t)fds[i],
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    } else {
        CUmemFabricHandle fh;
        memcpy(&fh, r + 32, sizeof fh);
        cr = FP_CU(&p->calls, cuMemImportFromShareableHandle, h, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
    }
    if (cr != CUDA_SUCCESS)
        return fp_drv_error(cr, "cuMemImportFromShareableHandle", "importing a chunk of %llu bytes at offset %llu of "
                            "process %d's buffer%s", (unsigned long long)size, (unsigned long long)off, ds->pid,
                            ds->handle_type == FABPOOL_HANDLE_FABRIC ? " (a fabric handle fails once its exporter "
                            "has unmapped it, and needs an IMEX channel)" : "");
    atomic_fetch_add(&p->handles_outstanding, 1);
    return FABPOOL_OK;
}

/* Maps imported handle h of record k at its offset in the view and releases
 * it: the mapping keeps the memory.  A handle whose allocation is not the
 * record's size (the driver maps whole handles only) is refused with
 * FABPOOL_ERR_DESCRIPTOR: an fd of another chunk. */
static fabpool_status map_one(struct fabpool *p, fabpool_view_t *v, const parsed *ds, uint32_t k,
                              CUmemGenericAllocationHandle h)
{
    const uint8_t *r = ds->records + (size_t)k * FABPOOL_DESC_RECORD_BYTES;
    uint64_t off = get64(r), size = get64(r + 8);
    fabpool_status st = fp_chunk_map_handle(p, v->base + off, size, h, "an imported chunk");
    if (st == FABPOOL_OK)
        atomic_fetch_add(&p->view_bytes, size);
    if (st != FABPOOL_OK && ds->handle_type == FABPOOL_HANDLE_POSIX_FD && strstr(fabpool_last_error(), "NOT_SUPPORTED"))
        return bad_desc("fd %llu is not a chunk of the record's size (%llu bytes): the fds were swapped, or belong to "
                        "another buffer", k, size);
    return st;
}

/* Whether record k's range is free in the view now (no chunk there). */
static int range_free(const fabpool_view_t *v, const parsed *ds, uint32_t k)
{
    const uint8_t *r = ds->records + (size_t)k * FABPOOL_DESC_RECORD_BYTES;
    uint64_t off = get64(r), size = get64(r + 8);
    for (uint32_t i = 0; i < v->n; i++)
        if (off < v->chunks[i].off + v->chunks[i].size && v->chunks[i].off < off + size)
            return 0;
    return 1;
}

static fabpool_status view_unmap_at(struct fabpool *p, fabpool_view_t *v, uint64_t off, uint64_t size)
{
    fabpool_status st = fp_chunk_unmap(p, v->base + off, size);
    if (st == FABPOOL_OK)
        atomic_fetch_sub(&p->view_bytes, size);
    return st;
}

static fabpool_status view_unmap(struct fabpool *p, fabpool_view_t *v, uint32_t i)
{
    return view_unmap_at(p, v, v->chunks[i].off, v->chunks[i].size);
}

/* The chunks the view keeps: those below `live` that no record replaces. */
static int kept(const fabpool_view_t *v, uint32_t i, const parsed *ds)
{
    const fp_vchunk *c = &v->chunks[i];
    if (c->off + c->size > ds->live)
        return 0;
    for (uint32_t k = 0; k < ds->n; k++) {
        const uint8_t *r = ds->records + (size_t)k * FABPOOL_DESC_RECORD_BYTES;
        uint64_t off = get64(r), size = get64(r + 8);
        if (off < c->off + c->size && c->off < off + size)
            return 0;
    }
    return 1;
}

/* Grows the view's chunk list to hold `need`. */
static fabpool_status view_reserve(struct fabpool *p, fabpool_view_t *v, uint32_t need)
{
    if (need <= v->cap)
        return FABPOOL_OK;
    uint32_t cap = v->cap ? v->cap : 8;
    while (cap < need)
        cap *= 2;
    fp_vchunk *c = fp_meta_alloc(&p->meta, cap * sizeof *c);
    if (!c)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a view's chunk list");
    if (v->n)
        memcpy(c, v->chunks, v->n * sizeof *c);
    fp_meta_free(&p->meta, v->chunks, v->cap * sizeof *c);
    v->chunks = c;
    v->cap = cap;
    return FABPOOL_OK;
}

static void view_add(fabpool_view_t *v, const parsed *ds, uint32_t k)
{
    const uint8_t *r = ds->records + (size_t)k * FABPOOL_DESC_RECORD_BYTES;
    fp_vchunk c = {get64(r), get64(r + 8), get64(r + 16)};
    uint32_t i = v->n++;
    for (; i > 0 && v->chunks[i - 1].off > c.off; i--) /* sorted by offset */
        v->chunks[i] = v->chunks[i - 1];
    v->chunks[i] = c;
}

/* Applies a parsed descriptor.  Every step that can fail on the peer's side
 * comes first: every import, then the mapping of each new chunk whose range
 * is free; only then are the dropped chunks unmapped and the chunks that
 * replace them mapped.  A failed import or first mapping leaves the view
 * exactly as it was. */
static fabpool_status apply_locked(fabpool_view_t *v, const parsed *ds, const int *fds)
{
    fp_lock_assert_held(&v->pool->lock);
    struct fabpool *p = v->pool;
    if (ds->uid != v->uid || ds->window != v->window || ds->handle_type != v->handle_type)
        return bad_desc("it describes another buffer (uid %llx, the view's is %llx)", ds->uid, v->uid);
    if (ds->since > v->generation)
        return bad_desc("it is a delta since generation %llu, but the view is at %llu: ask the exporter for a "
                        "delta since the view's generation", ds->since, v->generation);
    if (ds->generation < v->generation)
        return bad_desc("it is older (generation %llu) than the view (%llu)", ds->generation, v->generation);
    /* the chunks after the apply must cover [0, live) exactly: check first */
    uint64_t covered = 0;
    for (uint32_t i = 0; i < v->n; i++)
        if (kept(v, i, ds))
            covered += v->chunks[i].size;
    for (uint32_t k = 0; k < ds->n; k++)
        covered += get64(ds->records + (size_t)k * FABPOOL_DESC_RECORD_BYTES + 8);
    if (covered != ds->live)
        return bad_desc("after it the view would map %llu of the buffer's %llu live bytes: a delta is missing; "
                        "apply a full descriptor (since 0)", covered, ds->live);
    fabpool_status st = view_reserve(p, v, v->n + ds->n);
    if (st != FABPOOL_OK)
        return st;
    /* per record: its handle, and what became of it */
    enum { HELD = 0, MAPPED = 1, GONE = 2, STACK = 64 };
    CUmemGenericAllocationHandle hs[STACK], *h = hs;
    uint8_t states[STACK], *state = states;
    if (ds->n > STACK) {
        h = fp_meta_alloc(&p->meta, ds->n * (sizeof *h + 1));
        if (!h)
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to import %u chunks", ds->n);
        state = (uint8_t *)(h + ds->n);
    }
    memset(state, GONE, ds->n);
    uint32_t k;
    for (k = 0; k < ds->n; k++) {
        if ((st = import_one(p, ds, k, fds, &h[k])) != FABPOOL_OK)
            goto undo;
        state[k] = HELD;
    }
    for (k = 0; k < ds->n; k++) {
        if (!range_free(v, ds, k))
            continue;
        st = map_one(p, v, ds, k, h[k]);
        state[k] = st == FABPOOL_OK ? MAPPED : GONE;
        if (st != FABPOOL_OK)
            goto undo;
    }
    /* from here on the view changes: drop what goes, then map what replaces it */
    uint32_t w = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        if (kept(v, i, ds) || st != FABPOOL_OK || (st = view_unmap(p, v, i)) != FABPOOL_OK)
            v->chunks[w++] = v->chunks[i];
    }
    v->n = w;
    for (k = 0; k < ds->n; k++) {
        if (state[k] == HELD) {
            fabpool_status s2 = st == FABPOOL_OK ? map_one(p, v, ds, k, h[k]) : FABPOOL_ERR_DRIVER;
            if (st != FABPOOL_OK)
                fp_chunk_release(p, h[k]);
            else if (s2 != FABPOOL_OK)
                st = s2;
            state[k] = s2 == FABPOOL_OK ? MAPPED : GONE;
        }
        if (state[k] == MAPPED)
            view_add(v, ds, k);
    }
    if (st == FABPOOL_OK) {
        v->live = ds->live;
        v->generation = ds->generation;
    } else {
        fp_error_append(" (the view lost the chunks this descriptor replaces: apply a full descriptor)");
    }
    goto out;

undo:
    /* the view is untouched but for this apply's first mappings: take them back */
    for (k = 0; k < ds->n; k++) {
        if (state[k] == HELD)
            fp_chunk_release(p, h[k]);
        else if (state[k] == MAPPED) {
            const uint8_t *r = ds->records + (size_t)k * FABPOOL_DESC_RECORD_BYTES;
            (void)view_unmap_at(p, v, get64(r), get64(r + 8));
        }
    }
out:
    if (h != hs)
        fp_meta_free(&p->meta, h, ds->n * (sizeof *h + 1));
    return st;
}

fabpool_status fabpool_view_open(fabpool_t *p, const void *desc, size_t len, const int *fds, size_t nfds,
                                 fabpool_view_t **out)
{
    if (!p || !out) {
        close_fds(fds, nfds);
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_view_open: the pool or the output pointer is NULL");
    }
    *out = NULL;
    parsed ds;
    fabpool_status st = parse(desc, len, nfds, &ds);
    if (st == FABPOOL_OK && ds.since != 0)
        st = bad_desc("a first view needs a full descriptor (since 0), this is a delta since %llu (of %llu)",
                      ds.since, ds.generation);
    if (st == FABPOOL_OK && ds.gran != p->gran && ds.gran % p->gran)
        st = bad_desc("its granularity %llu does not fit this pool's %llu", ds.gran, p->gran);
    fabpool_view_t *v = NULL;
    if (st == FABPOOL_OK && !(v = fp_meta_alloc(&p->meta, sizeof *v)))
        st = fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a view");
    if (st != FABPOOL_OK) {
        close_fds(fds, nfds);
        return st;
    }
    v->pool = p;
    v->window = ds.window;
    v->uid = ds.uid;
    v->handle_type = ds.handle_type;
    v->peer_pid = ds.pid;
    v->peer_device = ds.device;
    fp_lock(&p->lock);
    v->base = fp_asleep(p) ? 0 : fp_va_alloc(&p->va, v->window, ds.gran > p->gran ? ds.gran : p->gran);
    if (fp_asleep(p))
        st = fp_asleep_error("fabpool_view_open");
    else if (!v->base)
        st = fp_error(FABPOOL_ERR_LIMIT, "fabpool_view_open: no free address range of %llu bytes left in the pool's "
                      "reservation; raise reserve", (unsigned long long)v->window);
    else if ((st = apply_locked(v, &ds, fds)) != FABPOOL_OK)
        fp_va_free(&p->va, v->base, v->window);
    if (st == FABPOOL_OK) {
        v->next = p->views;
        if (p->views)
            p->views->prev = v;
        p->views = v;
    }
    fp_unlock(&p->lock);
    close_fds(fds, nfds);
    if (st != FABPOOL_OK) {
        fp_meta_free(&p->meta, v->chunks, v->cap * sizeof *v->chunks);
        fp_meta_free(&p->meta, v, sizeof *v);
        return st;
    }
    *out = v;
    return FABPOOL_OK;
}

fabpool_status fabpool_view_apply(fabpool_view_t *v, const void *desc, size_t len, const int *fds, size_t nfds)
{
    if (!v) {
        close_fds(fds, nfds);
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_view_apply: the view is NULL");
    }
    parsed ds;
    fabpool_status st = parse(desc, len, nfds, &ds);
    if (st == FABPOOL_OK) {
        fp_lock(&v->pool->lock);
        st = fp_asleep(v->pool) ? fp_asleep_error("fabpool_view_apply") : apply_locked(v, &ds, fds);
        fp_unlock(&v->pool->lock);
    }
    close_fds(fds, nfds);
    return st;
}

static fabpool_status view_free(struct fabpool *p, fabpool_view_t *v)
{
    fp_lock_assert_held(&p->lock);
    fabpool_status st = FABPOOL_OK;
    while (v->n) {
        fabpool_status s = view_unmap(p, v, --v->n); /* a refusal: the range goes with the reservation at destroy */
        if (st == FABPOOL_OK)
            st = s;
    }
    if (v->prev)
        v->prev->next = v->next;
    else
        p->views = v->next;
    if (v->next)
        v->next->prev = v->prev;
    fp_va_free(&p->va, v->base, v->window);
    fp_meta_free(&p->meta, v->chunks, v->cap * sizeof *v->chunks);
    fp_meta_free(&p->meta, v, sizeof *v);
    return st;
}

fabpool_status fabpool_view_close(fabpool_view_t *v)
{
    if (!v)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_view_close: the view is NULL");
    struct fabpool *p = v->pool;
    fp_lock(&p->lock);
    fabpool_status st = view_free(p, v);
    fp_unlock(&p->lock);
    return st;
}

void fp_views_destroy(struct fabpool *p)
{
    fp_lock_assert_held(&p->lock);
    while (p->views)
        (void)view_free(p, p->views);
}

fabpool_status fabpool_view_get_info(const fabpool_view_t *v, fabpool_buffer_info *out)
{
    if (!v || !out)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_view_get_info: the view or the output is NULL");
    fp_lock(&v->pool->lock);
    out->base = (void *)(uintptr_t)v->base;
    out->size = v->live;
    out->mapped = v->live;
    out->max_size = v->window;
    out->n_chunks = v->n;
    out->generation = v->generation;
    out->export_id = v->uid;
    fp_unlock(&v->pool->lock);
    return FABPOOL_OK;
}

void *fabpool_view_ptr(const fabpool_view_t *v) { return v ? (void *)(uintptr_t)v->base : NULL; }
