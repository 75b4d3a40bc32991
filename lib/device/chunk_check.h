/* chunk_check.h - fabpool_check's walks of the device layer's lists
 * (chunk_check.c). */
#ifndef FP_CHUNK_CHECK_H
#define FP_CHUNK_CHECK_H

#include "chunk.h"
#include "walk.h"

/* fabpool_check's walks (walk.h), pool lock held: the chunks exported for
 * blocks (each added to w->kept, its fd to w->fds), then the fds of the
 * buffers and exports against exported_fds; and the registry's own list
 * against its sums (the layers' walks are compared with those sums, chunk.h). */
fabpool_status fp_chunks_kept_check(const fp_chunks *ch, fp_walk *w);
fabpool_status fp_chunks_registry_check(const fp_chunks *ch);
/* fabpool_check: the stuck mappings, each counted in w's mappings, and a held one's range in its address space
 * in use.  Pool lock held. */
fabpool_status fp_chunks_stuck_check(const fp_chunks *ch, fp_walk *w);

#endif
