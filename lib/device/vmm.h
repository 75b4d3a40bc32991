/* vmm.h - the driver's address-space and mapping calls that are not a pool
 * chunk: reservations, the fabric handle probe, host memory mapped for
 * sleep's copies, the stuck mappings in such a reservation, and unmaps of
 * mappings the pool does not count.  With chunk.c, the only place in lib/
 * that reserves, creates, maps, sets access, unmaps or releases.  Each
 * returns the driver's CUresult, so that the caller's message says what the
 * memory was for. */
#ifndef FP_VMM_H
#define FP_VMM_H

#include "chunk.h"

/* Reserves size bytes of address space aligned to align (0: the driver's choice) at *va. */
CUresult fp_vmm_reserve(fp_chunks *ch, uint64_t size, uint64_t align, uint64_t *va);
/* Frees a reservation (tried twice). */
CUresult fp_vmm_unreserve(fp_chunks *ch, uint64_t va, uint64_t size);
/* A real create, export and import of a fabric handle of one granule: the
 * device attribute alone says nothing about the IMEX channel
 * (driver-facts.md).  *step names the call that answered. */
CUresult fp_vmm_probe_fabric(fp_chunks *ch, const char **step);
/* Pinned host memory on the NUMA node next to ch's device (node 0 where
 * the driver does not say), as VMM memory (*prop, filled whatever the
 * outcome), and its minimum granularity (*gran): the answer of
 * cuMemGetAllocationGranularity. */
CUresult fp_vmm_host_prop(fp_chunks *ch, CUmemAllocationProp *prop, size_t *gran);
/* Creates size bytes of memory as prop, maps them at va with read-write
 * access for the pool's device alone, and releases the handle (the mapping
 * keeps the memory); the registry lists it as kind's.  On failure *call
 * names the call that failed, and nothing stays mapped or created but what
 * the driver would not undo: a mapping whose unmap it refused (twice) stays,
 * listed as stuck (FP_MAP_STUCK, *stuck set), for fp_chunk_unstick_range before its
 * reservation is freed (and the collects: fp_space_unstick).  Pool lock
 * held. */
CUresult fp_vmm_map_new(fp_chunks *ch, uint64_t va, uint64_t size, const CUmemAllocationProp *prop,
                        fp_map_kind kind, const char **call, int *stuck);
/* Unmaps a mapping that the pool does not count as mapped (a host copy, a
 * buffer's copy while it shrinks), tried twice, and removes it from the
 * registry.  Pool lock held. */
CUresult fp_vmm_unmap(fp_chunks *ch, uint64_t va, uint64_t size);

#endif
