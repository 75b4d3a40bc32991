/* bchunk.h - the pool's buffers and their chunks (the structures), and
 * what bchunk.c does with mapped chunks: take one out, hold dropped ones for
 * the peers, collect retired ones. */
#ifndef FP_BCHUNK_H
#define FP_BCHUNK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "chunk.h"
#include "counter.h"
#include "device.h"
#include "retire.h"
#include "slab.h"
#include "usage.h"

struct fp_trace;

/* A chunk of a growable buffer. */
typedef struct fp_bchunk {
    uint64_t off, size;
    uint64_t gen;                      /* the buffer's generation when it joined the live chunks */
    uint64_t named;                    /* the generation of the last descriptor that named it (0: none) */
    uint64_t drop_gen;                 /* retiring: the generation that dropped it */
    fp_rwaits uses;                    /* the GPU work that may still use it: a ticket of each stream a shrink
                                          retired it on, kept when a grow takes it back; it is unmapped or
                                          replaced only once all of that is done (retire.h) */
    uint8_t retiring;
    uint8_t has_fabric;                /* fabric handle exported and cached */
    int fd;                            /* exported POSIX fd cached, or -1 */
    CUmemFabricHandle fabric;
} fp_bchunk;

/* The physical memory of a chunk that left an exported buffer's address
 * window while peers may still import it: a retained handle keeps it alive
 * until the peers acknowledge the generation that dropped it (or a later
 * one). */
typedef struct fp_peer_hold {
    CUmemGenericAllocationHandle h;
    uint64_t size, named;
    uint64_t dropped;                  /* the generation that took it out of the live chunks */
} fp_peer_hold;

/* The buffers' counters that fp_buffers_read_counters copies (counter.h): the sizes asked of the live buffers,
 * their number, their retiring chunks' bytes, the bytes held for the peers, and the live bytes of the buffers
 * kept for reuse. */
#define FP_BUFFERS_COUNTERS(X) X(bytes) X(count) X(retiring_bytes) X(held_for_peers_bytes) X(kept_bytes)

/* The pool's buffers. */
/* A shrink's copy of a chunk (staging, mapped at va) whose unmap the driver refused twice: kept, its address
 * range with it, until a collect unmaps it. */
typedef struct fp_stuck_copy {
    uint64_t va, size;
} fp_stuck_copy;

typedef struct fp_buffers {
    fp_heap *heap;                     /* chunks are made through it (OOM: trim and retry) */
    fp_space *sp;                      /* the heap's */
    fp_retire *retire;                 /* the pool's stream queue: retired chunks' tickets */
    struct fp_trace *trace;            /* NULL: none */
    fp_usage *use;                     /* the pool's in-use mark, raised when bytes grows (usage.h) */
    uint64_t max_chunk;
    uint32_t max_waste_percent, shrink_hysteresis_percent;
    uint32_t keep_ms;                  /* how long a released buffer is kept for reuse (release.c) */
    struct fabpool_buffer *list;
    FP_BUFFERS_COUNTERS(FP_COUNTER_ATOMIC)
    _Atomic uint64_t mapped;           /* by the buffers' chunks, retiring included */
    fp_stuck_copy *stuck;              /* shrinks' copies the driver would not unmap: unmapped at collect */
    uint32_t n_stuck;
    size_t cap_stuck;
} fp_buffers;

struct fabpool_buffer {
    fp_buffers *owner;
    struct fabpool_buffer *next, *prev;
    uint64_t base, window;
    uint64_t size;                     /* asked */
    uint64_t mapped;                   /* all chunks, retiring included */
    uint64_t live;                     /* chunks not retiring */
    uint64_t generation;
    uint32_t n;
    size_t cap;
    fp_bchunk *chunks;
    int destroyed;                     /* waiting for its retirements, then freed */
    int kept;                          /* released, kept for reuse since kept_ns (release.c): size 0, not counted
                                          in the buffers */
    uint64_t kept_ns;
    int shared;                        /* exported at least once: dropped chunks wait for the peers */
    uint64_t acked;                    /* every peer has applied this generation */
    uint64_t exported_gen;             /* the generation of the last descriptor written */
    fp_peer_hold *peer_holds;
    uint32_t n_peer_holds;
    size_t cap_peer_holds;
    uint64_t uid;                      /* names the buffer in descriptors */
};

/* Sets up the pool's buffers; use is the pool's in-use mark, which is pointed at their bytes (usage.h). */
void fp_buffers_init(fp_buffers *bs, fp_heap *heap, fp_retire *retire, fp_usage *use, const fabpool_options *o);
/* The trace the buffers' calls are recorded in (NULL: none). */
void fp_buffers_set_trace(fp_buffers *bs, struct fp_trace *trace);
/* What the buffers count (fabpool_stats): atomics, read without a lock,
 * exact under the pool lock. */
typedef struct fp_buffer_counters {
    FP_BUFFERS_COUNTERS(FP_COUNTER_PLAIN)
} fp_buffer_counters;
void fp_buffers_read_counters(const fp_buffers *bs, fp_buffer_counters *c);

/* fabpool_collect of the pool whose buffers bs are (bs NULL: the pool was NULL). */
fabpool_status fp_buffers_collect(fp_buffers *bs, int wait);
/* Room for one more stuck copy, so that a refit's failure path cannot fail to record one: 0, or -1 without host
 * memory.  Pool lock held. */
int fp_buffers_reserve_stuck(fp_buffers *bs);

/* Closes the pool's copy of chunk c's exported fd, if it holds one (an open
 * fd keeps the memory alive), and forgets its fabric handle: the chunk is
 * unmapped, replaced, or put to sleep (sleep.c).  Pool lock held. */
void fp_bchunk_forget_export(fp_buffers *bs, fp_bchunk *c);

/* Unmaps retired chunks whose event has completed (all of them, waiting,
 * with wait != 0) and that no peer may still import; frees destroyed
 * buffers that hold nothing any more.  Pool lock held. */
fabpool_status fp_collect_locked(fp_buffers *bs, int wait);

/* Room for n chunks in b's list: 0, or -1 without host memory.  Pool lock held. */
int fp_buffer_reserve_chunks(fp_buffers *bs, struct fabpool_buffer *b, uint32_t n);
/* Takes b off the pool's list and frees its window, lists and itself (its handle's slot: handles.h). */
void fp_buffer_free(fp_buffers *bs, struct fabpool_buffer *b);
/* b, a kept buffer (its handle refused), moved to a new handle, live, in b's place on the list and in the
 * registry of mappings; b's handle stays refused.  NULL without host memory (b as it was).  Pool lock held. */
struct fabpool_buffer *fp_buffer_rehandle(fp_buffers *bs, struct fabpool_buffer *b);
/* Whether a peer may still import a chunk named by the descriptor of
 * generation `named` and dropped at `dropped` (bchunk.c says why). */
int fp_buffer_peers_may_hold(const struct fabpool_buffer *b, uint64_t named, uint64_t dropped);
/* Unmaps b's last chunk.  Pool lock held. */
fabpool_status fp_buffer_pop_chunk(fp_buffers *bs, struct fabpool_buffer *b);
/* Keeps g, a dropped chunk's retained handle, until the peers let it go. */
fabpool_status fp_buffer_peer_hold_add(fp_buffers *bs, struct fabpool_buffer *b, fp_peer_hold g);
/* Releases the peer holds no peer can still import (all of them with all != 0). */
void fp_buffer_peer_holds_release(fp_buffers *bs, struct fabpool_buffer *b, int all);

#endif
