/* mapreg.h - every mapping the device layer made for a pool: its address,
 * size, owner kind, owner and whether a sleep with offload copies its
 * bytes.  chunk.c and vmm.c add a mapping where they map and remove it
 * where they unmap, and nowhere else: the registry changes with the
 * driver's mappings, never on the alloc/free path.
 *
 * What reads it: fabpool_sleep puts to sleep the mappings of the kinds that
 * sleep (FP_MAP_SLEEPS) and copies those marked copy (pool/sleep.c); the
 * stats read mapped bytes from its sums (pool/stats.c); fabpool_check
 * compares each layer's own walk of what it maps with its sum for that
 * kind (pool/check.c).
 *
 * An array sorted by address (the mappings never overlap), in the pool's
 * metadata memory: sleep walks it in address order, and a map or unmap,
 * a chunk of at least a granule, moves at most the entries after it.  The
 * sums per kind are atomics, so that a log line reads them without a lock.
 * No lock of its own: the pool lock guards it, as every map and unmap
 * (chunk.h). */
#ifndef FP_MAPREG_H
#define FP_MAPREG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"
#include "meta.h"

/* Who owns a mapping.  The first three are what the pool counts as mapped (fabpool_stats' mapped_bytes). */
typedef enum fp_map_kind {
    FP_MAP_ARENA = 0,  /* a chunk of an arena: slabs and large blocks (heap/) */
    FP_MAP_BUFFER,     /* a chunk of a growable buffer (buffers/); owner: the buffer */
    FP_MAP_VIEW,       /* a peer's chunk imported into a view (api/view.c) */
    FP_MAP_STAGING,    /* a shrinking buffer's smaller chunk while its bytes are copied in (buffers/) */
    FP_MAP_HOST,       /* a host copy of sleep with offload (pool/host_copy.c) */
    FP_MAP_STUCK,      /* a mapping its user gave up but the driver would not unmap (the undo of a failed map or
                          apply): no owner; chunk.c unmaps it before anything is mapped over it, vmm.c before the
                          reservation of a sleep's host copies it lies in is freed, and the collects and sleep
                          (fp_space_unstick) try again */
    FP_MAP_KINDS
} fp_map_kind;

/* The kinds the pool counts as mapped (a stuck mapping holds memory of the driver's for the pool too), and
 * those a sleep unmaps (the views stay: the memory is a peer's). */
#define FP_MAP_COUNTED(kind) ((kind) <= FP_MAP_VIEW || (kind) == FP_MAP_STUCK)
#define FP_MAP_SLEEPS(kind) ((kind) == FP_MAP_ARENA || (kind) == FP_MAP_BUFFER)

typedef struct fp_mapping {
    uint64_t va, size;
    uint64_t ident;    /* the memory's identity: new for every mapping (fp_mapreg_add), never reused by the
                          process, nor by a later one of the same pid (its first one is the wall clock's
                          nanoseconds): memory mapped again at an address, or woken, is never taken for the old */
    void *owner;       /* FP_MAP_BUFFER: the buffer (opaque here); else NULL */
    uint8_t kind;      /* fp_map_kind */
    uint8_t copy;      /* a sleep with offload copies its bytes (a kind that sleeps: 1 until its owner says not) */
    uint8_t held;      /* FP_MAP_STUCK: its address range was given back by its user and is held for it (space.c
                          frees it once the mapping is gone); else 0 */
} fp_mapping;

typedef struct fp_mapreg {
    fp_meta *meta;
    fp_mapping *m;                     /* sorted by va, apart */
    size_t n, cap;
    _Atomic uint64_t count[FP_MAP_KINDS], bytes[FP_MAP_KINDS];
    _Atomic uint64_t peak;             /* the counted kinds' bytes, highest since the last reset */
} fp_mapreg;

void fp_mapreg_init(fp_mapreg *r, fp_meta *meta);
/* Forgets every mapping and frees the list (the pool's teardown). */
void fp_mapreg_free(fp_mapreg *r);
/* Room for one more mapping, so that the next fp_mapreg_add cannot fail:
 * 0, or -1 without host memory (nothing changed).  Called before the
 * driver maps anything. */
int fp_mapreg_reserve(fp_mapreg *r);
/* Adds a mapping (room reserved; [va, va + size) overlaps none held), with a new identity. */
void fp_mapreg_add(fp_mapreg *r, uint64_t va, uint64_t size, fp_map_kind kind, void *owner);
/* Removes the mapping at va of size bytes and gives it in *out (out may be
 * NULL): 0, or -1 when none is held there (nothing changed). */
int fp_mapreg_remove(fp_mapreg *r, uint64_t va, uint64_t size, fp_mapping *out);
/* The mapping that starts at va, or NULL. */
fp_mapping *fp_mapreg_find(fp_mapreg *r, uint64_t va);
/* The mapping whose range holds va, or NULL. */
const fp_mapping *fp_mapreg_over(const fp_mapreg *r, uint64_t va);
/* Sets whether a sleep with offload copies the mapping at va: 0, or -1 when none starts there. */
int fp_mapreg_set_copy(fp_mapreg *r, uint64_t va, int copy);

/* Bytes and mappings of the counted kinds (no lock needed). */
uint64_t fp_mapreg_mapped(const fp_mapreg *r, uint64_t *count);
/* The highest fp_mapreg_mapped since the last reset; the reset starts it again from now. */
uint64_t fp_mapreg_peak(const fp_mapreg *r);
void fp_mapreg_reset_peak(fp_mapreg *r);

/* fabpool_check: the list is sorted, apart, each mapping of a known kind
 * and not empty, and it adds up to the sums per kind: FABPOOL_ERR_CORRUPT
 * with "[registry.list]" or "[registry.sums]" (walk.h) where not. */
fabpool_status fp_mapreg_check(const fp_mapreg *r);
/* The name of a kind, for the messages ("arena chunks", ...). */
const char *fp_map_kind_name(fp_map_kind kind);

#endif
