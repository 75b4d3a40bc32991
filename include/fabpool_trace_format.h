/* fabpool_trace_format.h - the layout of a fabpool trace file (FABPOOL_TRACE, conf
 * key trace): what lib/trace.c writes and what the tools of perf/ read
 * (fabpool_trace, fabpool_replay).  Plain C, no dependency.
 *
 * A file is one header of FABPOOL_TRACE_HEADER_BYTES, then records of
 * FABPOOL_TRACE_RECORD_BYTES each, every field little-endian, in the order the
 * pool made them (time stamps never decrease).
 *
 * header (64 bytes)
 *    0  char[8]  magic "FPTRACE\0"
 *    8  u32      version (1)
 *   12  u32      header bytes (64)
 *   16  u32      record bytes (40)
 *   20  i32      the pool's device ordinal
 *   24  u64      the pool's granularity (bytes)
 *   32  u64      the pool's slab_max (bytes)
 *   40  u64      records in the file; FABPOOL_TRACE_OPEN while the file is written
 *                (a process that ended without a flush leaves it so)
 *   48  u64      FNV-1a 64 of every record's bytes, in order (0 while open)
 *   56  u32      pid of the process that wrote it
 *   60  u32      flags (FABPOOL_TRACE_F_*)
 *
 * record (40 bytes)
 *    0  u64      nanoseconds since the file was opened (CLOCK_MONOTONIC)
 *    8  u64      ptr: the block, or the buffer's base (its name in the trace)
 *   16  u64      size: asked (alloc, buffer create and resize, app alloc);
 *                trim: bytes to keep; map, unmap: the bytes; 0 otherwise
 *   24  u64      arg: the CUstream (buffer resize / destroy, app alloc / free:
 *                the stream given to the call); buffer create: max_size
 *   32  u8       op (FABPOOL_TR_*)
 *   33  u8       status: the fabpool_status of the call where it was known
 *                when recorded, FABPOOL_TRACE_STATUS_UNKNOWN where it was not (a
 *                free is recorded before it happens, so that no later
 *                allocation of the same address can precede it in the file)
 *   34  u16      flags (FABPOOL_TRACE_R_*)
 *   36  u32      thread: 1, 2, ... in the order threads first recorded
 *
 * Ops: fabpool's own calls (alloc, free, the buffers, trim), and the
 * stream-ordered pair (fabpool_alloc_on_stream / fabpool_free_on_stream, what
 * the PyTorch shim calls): "app" records carry what was asked, with its
 * stream.  Under an app record, the pool's alloc and free records show what
 * reached the pool (a block freed on a stream and taken back by that stream
 * reaches it neither time).
 *
 * Two levels: the pool's (every alloc and free record: what reached the
 * pool, with the buffers and trims) and the application's (the calls the
 * program made, whatever their mix).  A writer that sets
 * FABPOOL_TRACE_F_APP_MARKED in the header marks each record of a call the
 * application made with FABPOOL_TRACE_R_APP; the records the pool makes of
 * itself under such a call (the stream pair's alloc and free) carry no mark.
 * In a trace without that header flag, the application's level is its app
 * records and its buffer records.
 *
 * Map and unmap records say what the driver holds for the pool over time:
 * each chunk of device memory mapped (its address and bytes) and each
 * unmapped (every unmap names a range an earlier map gave).  A trace
 * without any (written before they were recorded) says nothing of it. */
#ifndef FABPOOL_TRACE_FORMAT_H
#define FABPOOL_TRACE_FORMAT_H

#include <stdint.h>
#include <string.h>

#define FABPOOL_TRACE_MAGIC "FPTRACE"
#define FABPOOL_TRACE_VERSION 1u
#define FABPOOL_TRACE_HEADER_BYTES 64u
#define FABPOOL_TRACE_RECORD_BYTES 40u
#define FABPOOL_TRACE_OPEN UINT64_MAX
#define FABPOOL_TRACE_STATUS_UNKNOWN 255u

enum fabpool_trace_op {
    FABPOOL_TR_ALLOC = 1,        /* fabpool_alloc: ptr (0 if it failed), size, status */
    FABPOOL_TR_FREE = 2,         /* fabpool_free: ptr */
    FABPOOL_TR_BUF_CREATE = 3,   /* fabpool_buffer_create: base, size, arg = max_size */
    FABPOOL_TR_BUF_RESIZE = 4,   /* fabpool_buffer_resize(_set), one record a buffer: base, size, arg = stream */
    FABPOOL_TR_BUF_DESTROY = 5,  /* fabpool_buffer_destroy: base, arg = stream */
    FABPOOL_TR_TRIM = 6,         /* fabpool_trim: size = bytes to keep */
    FABPOOL_TR_APP_ALLOC = 7,    /* an adapter's allocation: ptr, size, arg = stream */
    FABPOOL_TR_APP_FREE = 8,     /* an adapter's free: ptr, arg = the stream it was allocated on */
    FABPOOL_TR_APP_EMPTY = 9,    /* an adapter's empty-cache (torch.cuda.empty_cache) */
    FABPOOL_TR_MAP = 10,         /* device memory mapped for the pool: ptr = va, size (the pool's own record) */
    FABPOOL_TR_UNMAP = 11,       /* device memory unmapped: ptr = va, size, as an earlier map gave them */
    FABPOOL_TR_NOPS = 12
};

enum {
    FABPOOL_TRACE_F_SYNTHETIC = 1u,   /* made by a generator, not recorded from a program */
    FABPOOL_TRACE_F_APP_MARKED = 2u   /* every record says whether the application made the call (FABPOOL_TRACE_R_APP) */
};

/* A record's flags. */
enum { FABPOOL_TRACE_R_APP = 1u };    /* a call the application made, not one the pool made of itself */

typedef struct fabpool_trace_header {
    int32_t device;
    uint32_t version, flags, pid;
    uint64_t granularity, slab_max, n_records, checksum;
} fabpool_trace_header;

typedef struct fabpool_trace_rec {
    uint64_t t_ns, ptr, size, arg;
    uint8_t op, status;
    uint32_t thread;
    uint16_t flags;
} fabpool_trace_rec;

static inline void fabpool_le_put64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}
static inline void fabpool_le_put32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}
static inline uint64_t fabpool_le_get64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}
static inline uint32_t fabpool_le_get32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline void fabpool_trace_encode_header(unsigned char b[FABPOOL_TRACE_HEADER_BYTES], const fabpool_trace_header *h)
{
    memset(b, 0, FABPOOL_TRACE_HEADER_BYTES);
    memcpy(b, FABPOOL_TRACE_MAGIC, 8);
    fabpool_le_put32(b + 8, h->version);
    fabpool_le_put32(b + 12, FABPOOL_TRACE_HEADER_BYTES);
    fabpool_le_put32(b + 16, FABPOOL_TRACE_RECORD_BYTES);
    fabpool_le_put32(b + 20, (uint32_t)h->device);
    fabpool_le_put64(b + 24, h->granularity);
    fabpool_le_put64(b + 32, h->slab_max);
    fabpool_le_put64(b + 40, h->n_records);
    fabpool_le_put64(b + 48, h->checksum);
    fabpool_le_put32(b + 56, h->pid);
    fabpool_le_put32(b + 60, h->flags);
}

static inline void fabpool_trace_encode_rec(unsigned char b[FABPOOL_TRACE_RECORD_BYTES], const fabpool_trace_rec *r)
{
    fabpool_le_put64(b, r->t_ns);
    fabpool_le_put64(b + 8, r->ptr);
    fabpool_le_put64(b + 16, r->size);
    fabpool_le_put64(b + 24, r->arg);
    b[32] = r->op;
    b[33] = r->status;
    b[34] = (unsigned char)r->flags;
    b[35] = (unsigned char)(r->flags >> 8);
    fabpool_le_put32(b + 36, r->thread);
}

static inline void fabpool_trace_decode_rec(const unsigned char b[FABPOOL_TRACE_RECORD_BYTES], fabpool_trace_rec *r)
{
    r->t_ns = fabpool_le_get64(b);
    r->ptr = fabpool_le_get64(b + 8);
    r->size = fabpool_le_get64(b + 16);
    r->arg = fabpool_le_get64(b + 24);
    r->op = b[32];
    r->status = b[33];
    r->flags = (uint16_t)(b[34] | b[35] << 8);
    r->thread = fabpool_le_get32(b + 36);
}

#define FABPOOL_FNV_OFFSET 0xcbf29ce484222325ull
#define FABPOOL_FNV_PRIME 0x100000001b3ull
static inline uint64_t fabpool_fnv1a(uint64_t h, const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= FABPOOL_FNV_PRIME;
    }
    return h;
}

static inline const char *fabpool_trace_op_name(unsigned op)
{
    static const char *const names[FABPOOL_TR_NOPS] = {"?",          "alloc",    "free",      "buffer_create",
                                                  "buffer_resize", "buffer_destroy", "trim", "app_alloc",
                                                  "app_free",   "app_empty_cache", "map", "unmap"};
    return op < FABPOOL_TR_NOPS ? names[op] : "?";
}

#endif
