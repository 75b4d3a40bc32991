/* trace_write.h - a trace file made of records a test chose (include/fabpool_trace_format.h), closed as the
 * pool closes one: the header holds the record count and their checksum, so that the tools' reader takes it
 * whole.  For the tests of what the tools make of a trace no pool run is needed for (hostile ones, or too
 * many records for a pool to write quickly). */
#ifndef FP_TRACE_WRITE_H
#define FP_TRACE_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fabpool_trace_format.h"

/* A closed trace of the n records on device dev, with the header's flags (FABPOOL_TRACE_F_*), into path:
 * 0 or -1. */
static inline int write_trace(const char *path, int32_t dev, uint32_t flags, const fabpool_trace_rec *r, size_t n)
{
    fabpool_trace_header h = {dev, FABPOOL_TRACE_VERSION, flags, 1, 2u << 20, 1u << 20, n, FABPOOL_FNV_OFFSET};
    unsigned char b[FABPOOL_TRACE_RECORD_BYTES], hb[FABPOOL_TRACE_HEADER_BYTES];
    for (size_t i = 0; i < n; i++) {
        fabpool_trace_encode_rec(b, &r[i]);
        h.checksum = fabpool_fnv1a(h.checksum, b, sizeof b);
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    fabpool_trace_encode_header(hb, &h);
    int ok = fwrite(hb, 1, sizeof hb, f) == sizeof hb;
    for (size_t i = 0; i < n && ok; i++) {
        fabpool_trace_encode_rec(b, &r[i]);
        ok = fwrite(b, 1, sizeof b, f) == sizeof b;
    }
    return fclose(f) == 0 && ok ? 0 : -1;
}

#endif
