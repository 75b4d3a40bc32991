/* desc.c - the sharing descriptor's codec (desc.h has the layout). */
#include "desc.h"

#include <stdio.h>
#include <string.h>

#include "error.h"

#define DESC_MAGIC 0x53445046u

/* header fields */
enum {
    H_MAGIC = 0, H_VERSION = 4, H_HEADER_BYTES = 6, H_RECORD_BYTES = 8, H_RECORDS = 12, H_HANDLE_TYPE = 16,
    H_FLAGS = 20, H_GENERATION = 24, H_SINCE = 32, H_WINDOW = 40, H_LIVE = 48, H_UID = 56, H_PID = 64,
    H_DEVICE = 68, H_GRAN = 72, H_CHECKSUM = 80, H_RESERVED = 88
};
/* record fields */
enum { R_OFFSET = 0, R_SIZE = 8, R_GENERATION = 16, R_FD_INDEX = 24, R_RESERVED = 28, R_FABRIC = 32 };

_Static_assert(H_RESERVED + 8 == FABPOOL_DESC_HEADER_BYTES, "the header's fields fill it");
_Static_assert(R_FABRIC + FP_DESC_FABRIC_BYTES == FABPOOL_DESC_RECORD_BYTES, "the record's fields fill it");

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* FNV-1a over the descriptor, its checksum field read as zeros. */
static uint64_t checksum(const uint8_t *d, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (i >= H_CHECKSUM && i < H_CHECKSUM + 8) ? 0 : d[i];
        h = (h ^ c) * 1099511628211ull;
    }
    return h;
}

/* A count whose bytes size_t cannot hold answers SIZE_MAX (no buffer is that large), not a wrapped small size that
 * a caller would allocate and overrun. */
size_t fabpool_desc_size(size_t n)
{
    if (n > (SIZE_MAX - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES)
        return SIZE_MAX;
    return FABPOOL_DESC_HEADER_BYTES + n * FABPOOL_DESC_RECORD_BYTES;
}

static uint8_t *record_at(uint8_t *d, uint32_t k) { return d + FABPOOL_DESC_HEADER_BYTES + (size_t)k * FABPOOL_DESC_RECORD_BYTES; }

void fp_desc_put_record(uint8_t *d, uint32_t k, const fp_desc_rec *r)
{
    uint8_t *p = record_at(d, k);
    put64(p + R_OFFSET, r->off);
    put64(p + R_SIZE, r->size);
    put64(p + R_GENERATION, r->gen);
    put32(p + R_FD_INDEX, r->fd_index);
    memcpy(p + R_FABRIC, r->fabric, FP_DESC_FABRIC_BYTES);
}

void fp_desc_put_header(uint8_t *d, const fp_desc *h)
{
    put32(d + H_MAGIC, DESC_MAGIC);
    put16(d + H_VERSION, FABPOOL_DESC_VERSION);
    put16(d + H_HEADER_BYTES, FABPOOL_DESC_HEADER_BYTES);
    put32(d + H_RECORD_BYTES, FABPOOL_DESC_RECORD_BYTES);
    put32(d + H_RECORDS, h->n);
    put32(d + H_HANDLE_TYPE, h->handle_type);
    put32(d + H_FLAGS, 0);
    put64(d + H_GENERATION, h->generation);
    put64(d + H_SINCE, h->since);
    put64(d + H_WINDOW, h->window);
    put64(d + H_LIVE, h->live);
    put64(d + H_UID, h->uid);
    put32(d + H_PID, (uint32_t)h->pid);
    put32(d + H_DEVICE, (uint32_t)h->device);
    put64(d + H_GRAN, h->gran);
    put64(d + H_CHECKSUM, checksum(d, fabpool_desc_size(h->n)));
}

void fp_desc_record(const fp_desc *ds, uint32_t k, fp_desc_rec *r)
{
    const uint8_t *p = ds->records + (size_t)k * FABPOOL_DESC_RECORD_BYTES;
    r->off = get64(p + R_OFFSET);
    r->size = get64(p + R_SIZE);
    r->gen = get64(p + R_GENERATION);
    r->fd_index = get32(p + R_FD_INDEX);
    memcpy(r->fabric, p + R_FABRIC, FP_DESC_FABRIC_BYTES);
}

fabpool_status fp_desc_refuse(const char *fmt, unsigned long long a, unsigned long long b)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a, b);
    return fp_error(FABPOOL_ERR_DESCRIPTOR, "descriptor refused, nothing mapped: %s", msg);
}

fabpool_status fp_desc_parse(const void *desc, size_t len, size_t nfds, fp_desc *out)
{
    const uint8_t *d = desc;
    if (!d)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "the descriptor is NULL");
    if (len < FABPOOL_DESC_HEADER_BYTES)
        return fp_desc_refuse("truncated: %llu bytes, a header alone takes %llu", len, FABPOOL_DESC_HEADER_BYTES);
    if (get32(d + H_MAGIC) != DESC_MAGIC)
        return fp_desc_refuse("not a fabpool descriptor (magic 0x%llx, expected 0x%llx)", get32(d + H_MAGIC),
                              DESC_MAGIC);
    uint16_t v = get16(d + H_VERSION), hb = get16(d + H_HEADER_BYTES);
    if (v != FABPOOL_DESC_VERSION)
        return fp_desc_refuse("version %llu, this fabpool reads version %llu: exporter and importer must run the "
                              "same fabpool version", v, FABPOOL_DESC_VERSION);
    if (hb != FABPOOL_DESC_HEADER_BYTES || get32(d + H_RECORD_BYTES) != FABPOOL_DESC_RECORD_BYTES)
        return fp_desc_refuse("header of %llu bytes or records of another size (%llu)", hb,
                              get32(d + H_RECORD_BYTES));
    out->n = get32(d + H_RECORDS);
    if (out->n > (len - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES || len != fabpool_desc_size(out->n))
        return fp_desc_refuse("truncated or padded: %llu bytes for %llu records", len, out->n);
    if (get64(d + H_CHECKSUM) != checksum(d, len))
        return fp_desc_refuse("the checksum does not match: corrupted in transit (%llu bytes, %llu records)", len,
                              out->n);
    out->handle_type = get32(d + H_HANDLE_TYPE);
    out->generation = get64(d + H_GENERATION);
    out->since = get64(d + H_SINCE);
    out->window = get64(d + H_WINDOW);
    out->live = get64(d + H_LIVE);
    out->uid = get64(d + H_UID);
    out->pid = (int)get32(d + H_PID);
    out->device = (int)get32(d + H_DEVICE);
    out->gran = get64(d + H_GRAN);
    out->records = d + FABPOOL_DESC_HEADER_BYTES;
    if (out->handle_type != FABPOOL_HANDLE_POSIX_FD && out->handle_type != FABPOOL_HANDLE_FABRIC)
        return fp_desc_refuse("handle type %llu is neither posix_fd (%llu) nor fabric (3)", out->handle_type,
                              FABPOOL_HANDLE_POSIX_FD);
    if (!out->gran || (out->gran & (out->gran - 1)) || out->window == 0 || out->window % out->gran ||
        out->live > out->window || out->live % out->gran)
        return fp_desc_refuse("window %llu / live %llu bytes do not fit the granularity", out->window, out->live);
    if (out->since > out->generation)
        return fp_desc_refuse("since %llu is past its generation %llu", out->since, out->generation);
    if (out->handle_type == FABPOOL_HANDLE_POSIX_FD && nfds != FP_DESC_ANY_FDS && nfds != out->n)
        return fp_desc_refuse("%llu fds came with %llu records", nfds, out->n);
    uint64_t end = 0;
    for (uint32_t i = 0; i < out->n; i++) {
        fp_desc_rec r;
        fp_desc_record(out, i, &r);
        if (r.size == 0 || r.off % out->gran || r.size % out->gran || r.off > out->window ||
            r.size > out->window - r.off || r.off + r.size > out->live)
            return fp_desc_refuse("record %llu names a range outside the window (offset %llu)", i, r.off);
        if (i && r.off < end)
            return fp_desc_refuse("record %llu overlaps or repeats the one before it (offset %llu)", i, r.off);
        if (r.gen <= out->since || r.gen > out->generation)
            return fp_desc_refuse("record %llu has generation %llu outside (since, generation]", i, r.gen);
        if (out->handle_type == FABPOOL_HANDLE_POSIX_FD && r.fd_index != i)
            return fp_desc_refuse("record %llu names fd %llu: each record names its own fd, in order", i,
                                  r.fd_index);
        end = r.off + r.size;
    }
    return FABPOOL_OK;
}
