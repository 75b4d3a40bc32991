/* desc.h - the sharing descriptor's bytes: writing and parsing them.  Pure
 * bytes: no pool, no driver, no fd (fuzz/fuzz_desc.c fuzzes the parser on
 * its own).  The layout, little-endian (docs/design.md):
 *
 *   header, FABPOOL_DESC_HEADER_BYTES:
 *     0 u32 magic "FPDS"     4 u16 version        6 u16 header bytes
 *     8 u32 record bytes    12 u32 records        16 u32 handle type (2 posix_fd, 3 fabric)
 *    20 u32 flags           24 u64 generation     32 u64 since
 *    40 u64 window          48 u64 live bytes     56 u64 buffer uid
 *    64 u32 pid             68 i32 device         72 u64 granularity
 *    80 u64 checksum (FNV-1a over everything else) 88 u64 reserved
 *   records, FABPOOL_DESC_RECORD_BYTES each, sorted by offset:
 *     0 u64 offset  8 u64 size  16 u64 generation  24 u32 fd index  28 u32 reserved  32 u8[64] fabric handle
 *
 * The offsets are named once, in desc.c. */
#ifndef FP_DESC_H
#define FP_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"

#define FP_DESC_FABRIC_BYTES 64u   /* sizeof(CUmemFabricHandle) */

/* A descriptor's header, parsed or to be written. */
typedef struct fp_desc {
    uint32_t n, handle_type;
    uint64_t generation, since, window, live, uid, gran;
    int pid, device;
    const uint8_t *records;            /* parsed: the first record */
} fp_desc;

typedef struct fp_desc_rec {
    uint64_t off, size, gen;
    uint32_t fd_index;
    uint8_t fabric[FP_DESC_FABRIC_BYTES];
} fp_desc_rec;

/* Writes record k of a descriptor being built in d (zeroed by the caller). */
void fp_desc_put_record(uint8_t *d, uint32_t k, const fp_desc_rec *r);
/* Writes the header of h (h->n records already written), checksum last. */
void fp_desc_put_header(uint8_t *d, const fp_desc *h);

/* Every check that needs no view: the bytes are a descriptor of this
 * version, whole, uncorrupted, its records sorted, inside its live bytes,
 * within (since, generation], and for posix_fd one fd each (nfds of them
 * came; FP_DESC_ANY_FDS: not checked).  FABPOOL_ERR_DESCRIPTOR (or
 * INVALID_ARG for NULL) with a message. */
#define FP_DESC_ANY_FDS ((size_t)-1)
fabpool_status fp_desc_parse(const void *desc, size_t len, size_t nfds, fp_desc *out);
/* Record k of a parsed descriptor. */
void fp_desc_record(const fp_desc *ds, uint32_t k, fp_desc_rec *r);
/* The refusal: FABPOOL_ERR_DESCRIPTOR, "descriptor refused, nothing mapped: <fmt>". */
fabpool_status fp_desc_refuse(const char *fmt, unsigned long long a, unsigned long long b);

#endif
