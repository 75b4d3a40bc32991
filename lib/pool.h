/* pool.h - the pool's internal structures, shared by the files of lib/.
 *
 * Locking: which lock guards what, and the one lock order, are in lib/lock.h
 * (registry < pool < class, ascending index < retire < trace list < trace).
 * A function that needs a lock says so with fp_lock_assert_held() on its
 * first line, checked in a FP_DEBUG_LOCKS build.  The hot path (a thread
 * cache hit) takes no lock and makes no driver call. */
#ifndef FP_POOL_H
#define FP_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "driver.h"
#include "fabpool.h"
#include "lock.h"
#include "meta.h"
#include "retire.h"
#include "sizeclass.h"
#include "vaspace.h"

#define FP_CACHELINE 64

enum { FP_SPAN_SLAB = 1, FP_SPAN_LARGE = 2 };
/* in_use of a large piece: a free range, a block given out, a free range held by an allocation in progress,
 * a block freed on a stream whose work may still use it (retire.h: live for the rest of the pool) */
enum { FP_LARGE_FREE = 0, FP_LARGE_LIVE = 1, FP_LARGE_HELD = 2, FP_LARGE_PENDING = 3 };
/* a slab block's freeflag: given out, free, freed on a stream and still pending there (retire.h) */
enum { FP_FREEFLAG_USED = 0, FP_FREEFLAG_FREE = 1, FP_FREEFLAG_PENDING = 2 };

/* One physical chunk mapped for large blocks (cuMemUnmap takes whole chunks). */
typedef struct fp_lchunk {
    uint64_t va, size;
} fp_lchunk;
enum { FP_LIST_NONE = 0, FP_LIST_PARTIAL = 1, FP_LIST_EMPTY = 2, FP_LIST_FULL = 3 };

/* A slab: a run of address space mapped with one physical chunk, holding
 * blocks of one class.  Or a large piece: a run of address space mapped by
 * one or more chunks (fp_lchunk) that is one large block given out, or a
 * free range of them (lib/slab.c). */
typedef struct fp_span {
    uint64_t base, size;
    uint8_t kind, list;
    uint16_t cls;
    _Atomic uint32_t in_use;           /* large: FP_LARGE_FREE / LIVE / HELD */
    struct fp_span *next, *prev;       /* class list, or the large live / free list */
    struct fp_span *all_next, *all_prev; /* every slab of the pool (pool lock) */
    /* slabs */
    uint32_t obj_q;                    /* block size / 64 (FP_QUANTUM_SHIFT) */
    uint64_t magic;                    /* ceil(2^32 / obj_q): index = (off/64 * magic) >> 32 */
    uint32_t nobj, nfree;              /* nfree: blocks on free_stack (held centrally) */
    uint32_t *free_stack;
    _Atomic uint8_t *freeflag;         /* per block, FP_FREEFLAG_*: 1 = free (central or in a thread cache), 2 =
                                          pending on a stream (given out for the rest of the pool): a byte
                                          each, so setting one is a plain store, not a locked RMW */
} fp_span;

/* One slab class, central part. */
typedef struct fp_class {
    fp_lock_t lock;                    /* level FP_LOCK_CLASS, sub-level the class index (lock.h) */
    fp_span *partial, *empty;          /* slabs with some / all blocks free */
    uint64_t obj_size, slab_size;
    uint32_t nobj, nslabs, nempty;
    _Atomic uint64_t allocs, frees;    /* blocks given out / taken back without a thread cache */
    _Atomic uint64_t tc_allocs, tc_frees; /* folded in from thread caches that were freed */
} __attribute__((aligned(FP_CACHELINE))) fp_class;

typedef struct fp_item {
    uint64_t ptr;
    fp_span *span;
} fp_item;

typedef struct fp_bin {
    uint32_t n, cap;
    fp_item *items;
} fp_bin;

/* A thread's cache for one pool.  Only its thread writes it (counters are
 * atomics so that stats can read them). */
typedef struct fp_tcache {
    struct fabpool *pool;
    struct fp_tcache *next, *prev;     /* the pool's list */
    uint64_t epoch;
    size_t bytes;                      /* its own allocation size */
    _Atomic uint64_t allocs[FP_NCLASS], frees[FP_NCLASS];
    fp_bin bins[];                     /* one per slab class */
} fp_tcache;

/* A chunk of a growable buffer. */
typedef struct fp_bchunk {
    uint64_t off, size;
    uint64_t gen;                      /* the buffer's generation when it joined the live chunks */
    uint64_t named;                    /* the generation of the last descriptor that named it (0: none) */
    uint64_t drop_gen;                 /* retiring: the generation that dropped it */
    fp_rticket ticket;                 /* while retiring: unmap once its work is done (retire.h) */
    uint8_t retiring;
    uint8_t has_fabric;                /* fabric handle exported and cached */
    int fd;                            /* exported POSIX fd cached, or -1 */
    CUmemFabricHandle fabric;
} fp_bchunk;

/* The physical memory of a chunk that left an exported buffer's address
 * window while peers may still import it: a retained handle keeps it alive
 * until no generation the peers have not acknowledged can name it. */
typedef struct fp_ghost {
    CUmemGenericAllocationHandle h;
    uint64_t size, named;
} fp_ghost;

struct fabpool_buffer {
    struct fabpool *pool;
    struct fabpool_buffer *next, *prev;
    uint64_t base, window;
    uint64_t size;                     /* asked */
    uint64_t mapped;                   /* all chunks, retiring included */
    uint64_t live;                     /* chunks not retiring */
    uint64_t generation;
    uint32_t n, cap;
    fp_bchunk *chunks;
    int destroyed;                     /* waiting for its retirements, then freed */
    int shared;                        /* exported at least once: dropped chunks wait for the peers */
    uint64_t acked;                    /* every peer has applied this generation */
    uint64_t exported_gen;             /* the generation of the last descriptor written */
    fp_ghost *ghosts;
    uint32_t n_ghosts, cap_ghosts;
    uint64_t uid;                      /* names the buffer in descriptors */
};

/* A peer's buffer, mapped from its descriptors. */
typedef struct fp_vchunk {
    uint64_t off, size, gen;
} fp_vchunk;

struct fabpool_view {
    struct fabpool *pool;
    struct fabpool_view *next, *prev;
    uint64_t base, window, live, generation, uid;
    uint32_t handle_type, n, cap;
    int peer_pid, peer_device;
    fp_vchunk *chunks;
};

struct fabpool {
    uint64_t id;
    struct fp_trace *trace;            /* NULL: no trace (trace.h) */
    fabpool_options opt;
    fabpool_handle_type handle_type;
    CUmemAllocationHandleType cu_handle_types;
    unsigned char rdma;                /* chunks made with allocFlags.gpuDirectRDMACapable */
    int dmabuf_supported;              /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
    CUdevice dev;
    CUcontext ctx;
    uint64_t gran;
    unsigned gran_shift;
    unsigned n_slab_classes;           /* classes [0, n_slab_classes) come from slabs */
    uint32_t tc_cap[FP_NCLASS];        /* thread-cache bin capacity per class */
    size_t tcache_bytes;

    fp_meta meta;
    fp_drv_counters calls;

    uint64_t va_base, va_size;
    fp_vaspace va;

    /* page map: granule index -> span, two levels, read without a lock */
    _Atomic(fp_span *) *_Atomic *map_l1;
    uint64_t map_l1_n;

    fp_lock_t lock;                    /* level FP_LOCK_POOL (lock.h) */
    fp_span *spans;                    /* all slabs, for destroy */
    /* large blocks (slab.c), under the pool lock: pieces of address space,
     * each a live block or a free range (free neighbours are merged), and
     * the chunks that map them, sorted by address */
    fp_span *large_live, *large_free;
    fp_lchunk *lchunks;
    size_t n_lchunks, cap_lchunks;
    uint64_t large_free_bytes;
    /* decay (slab.c): the least idle_bytes seen since the period began */
    _Atomic uint64_t idle_low, decay_epoch_ns;
    struct fabpool_buffer *buffers;
    struct fabpool_view *views;
    fp_tcache *tcaches;
    _Atomic uint64_t flush_epoch;      /* FP_EPOCH_ASLEEP set while asleep (sleep.h) */
    fp_retire retire;                  /* blocks freed on streams, events of retired chunks (retire.h) */
    struct fp_sleep *sleep;            /* sleep.c: the chunks put to sleep, non-NULL while asleep (pool lock) */
    _Atomic uint64_t sleep_offloaded, sleep_discarded, sleep_host_bytes, sleep_host_copies, sleeps, wakes;
    _Atomic int sleep_mode;

    fp_class classes[FP_NCLASS];

    /* stats (atomics: updated under different locks) */
    _Atomic uint64_t mapped_bytes, mapped_peak, chunks_mapped, chunks_mapped_total, chunks_unmapped_total;
    _Atomic uint64_t idle_bytes;       /* empty slabs + free large ranges */
    _Atomic uint64_t large_in_use_bytes, large_blocks, large_allocs[FP_NCLASS];
    _Atomic uint64_t buffer_bytes, buffer_mapped, buffer_count, retiring_bytes;
    _Atomic uint64_t in_use_peak, oom_retries, handles_outstanding, exported_fds;
    _Atomic uint64_t view_bytes, ghost_bytes;
};

#define FP_MAP_LEAF_SHIFT 12
#define FP_MAP_LEAF (1u << FP_MAP_LEAF_SHIFT)

/* page map (pool.c) */
static inline fp_span *fp_map_get(const struct fabpool *p, uint64_t addr)
{
    uint64_t off = addr - p->va_base;
    if (addr < p->va_base || off >= p->va_size)
        return NULL;
    uint64_t g = off >> p->gran_shift;
    _Atomic(fp_span *) *leaf = atomic_load_explicit(&p->map_l1[g >> FP_MAP_LEAF_SHIFT], memory_order_acquire);
    return leaf ? atomic_load_explicit(&leaf[g & (FP_MAP_LEAF - 1)], memory_order_acquire) : NULL;
}
int fp_map_set(struct fabpool *p, uint64_t addr, uint64_t size, fp_span *s);

/* chunk.c: physical chunks (each function asserts the pool lock: lock.h). */
/* What every chunk of the pool is made as: pinned device memory of the
 * pool's device, with the pool's shareable handle types, GPUDirect RDMA
 * capable if the pool's rdma setting chose it (dmabuf.c). */
static inline CUmemAllocationProp fp_alloc_prop(const struct fabpool *p)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = p->dev;
    prop.requestedHandleTypes = p->cu_handle_types;
    prop.allocFlags.gpuDirectRDMACapable = p->rdma;
    return prop;
}
fabpool_status fp_chunk_map(struct fabpool *p, uint64_t va, uint64_t size);
/* cuMemCreate of a chunk, with one trim and retry on OOM; the handle is
 * counted in handles_outstanding. */
fabpool_status fp_chunk_create(struct fabpool *p, uint64_t size, CUmemGenericAllocationHandle *out);
fabpool_status fp_chunk_map_access(struct fabpool *p, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   const char *what);
void fp_chunk_count_mapped(struct fabpool *p, uint64_t size);
CUresult fp_chunk_release(struct fabpool *p, CUmemGenericAllocationHandle h);
fabpool_status fp_chunk_map_handle(struct fabpool *p, uint64_t va, uint64_t size, CUmemGenericAllocationHandle h,
                                   const char *what);
fabpool_status fp_chunk_unmap(struct fabpool *p, uint64_t va, uint64_t size);
fabpool_status fp_ctx_push(struct fabpool *p, CUcontext *saved);
void fp_ctx_pop(struct fabpool *p, CUcontext saved);

/* slab.c: slabs and large spans */
void fp_classes_init(struct fabpool *p);
void fp_classes_destroy(struct fabpool *p);   /* unmaps every span */
/* Takes up to n free blocks of class cls into out[]; returns how many (0 with an error set). */
unsigned fp_class_take(struct fabpool *p, unsigned cls, fp_item *out, unsigned n, fabpool_status *st);
/* Gives blocks back to their slabs (their free bits are already set). */
void fp_class_give(struct fabpool *p, unsigned cls, const fp_item *items, unsigned n);
fabpool_status fp_large_alloc(struct fabpool *p, uint64_t size, void **out);
fabpool_status fp_large_free(struct fabpool *p, fp_span *s, uint64_t addr);
/* A live large block freed on a stream: FP_LARGE_PENDING (live for the rest
 * of the pool), *usable its size.  The errors of fp_large_free otherwise. */
fabpool_status fp_large_pend(struct fabpool *p, uint64_t addr, uint64_t *usable);
/* Unmaps idle slabs and free large chunks until at most keep bytes are idle
 * (a chunk that also holds part of a live block stays). */
void fp_trim_locked(struct fabpool *p, uint64_t keep);
/* Trims to the cache limit if idle memory is above it, and returns what
 * stayed idle for a whole decay period.  No lock held. */
void fp_trim_policy(struct fabpool *p);
/* idle_bytes went down by n: the decay's low-water mark follows. */
void fp_idle_sub(struct fabpool *p, uint64_t n);

/* alloc.c: the retirement queue's blocks whose work is done go back to the
 * pool (with wait: all of them, after waiting).  No lock held. */
void fp_retire_drain(struct fabpool *p, int wait, int forget);

/* tcache.c */
fp_tcache *fp_tcache_get(struct fabpool *p);   /* NULL: no cache (disabled or no memory) */
void fp_tcache_flush(struct fabpool *p, fp_tcache *tc);
void fp_tcaches_destroy(struct fabpool *p);    /* pool destroy: folds and frees every cache */
int fp_registry_add(struct fabpool *p);
void fp_registry_remove(struct fabpool *p);

/* pool.c */
const char *fp_handle_type_name(fabpool_handle_type t);

/* dmabuf.c: decides p->rdma from opt.rdma and the device's attributes
 * (rdma:on on a device without GPUDirect RDMA with VMM fails), and reads
 * whether the device exports dma-bufs. */
fabpool_status fp_rdma_choose(struct fabpool *p);

/* buffer.c */
void fp_buffers_destroy(struct fabpool *p);
void fp_views_destroy(struct fabpool *p);        /* share.c */
void fp_chunk_forget_export(struct fabpool *p, fp_bchunk *c);
fabpool_status fp_collect_locked(struct fabpool *p, int wait);

/* block index in a slab, and whether addr is a block start */
static inline int fp_slab_index(const fp_span *s, uint64_t addr, uint32_t *idx)
{
    uint64_t off = addr - s->base;
    if (off & (FP_MIN_ALIGN - 1))
        return 0;
    uint32_t q = (uint32_t)(off >> FP_QUANTUM_SHIFT);
    uint32_t i = (uint32_t)(((uint64_t)q * s->magic) >> 32);
    *idx = i;
    return i < s->nobj && i * s->obj_q == q;
}

#endif
