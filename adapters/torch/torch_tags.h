/* torch_tags.h - what fabpool_torch.c asks of torch_tags.c inside
 * libfabpool_torch.so (not exported: the version script keeps it local). */
#ifndef FP_TORCH_TAGS_H
#define FP_TORCH_TAGS_H

#include <stddef.h>

#include "fabpool.h"

/* fabpool_torch_shutdown's part for the tags: destroys the pool of every tag
 * with nothing live (after waiting for its streams) and unbinds its slot.
 * A tag with live blocks keeps its pool and slot: FABPOOL_ERR_BUSY, and msg
 * (cap bytes) names it.  No other thread may use the tags meanwhile. */
fabpool_status ft_tags_shutdown(char *msg, size_t cap);

/* A pool's report to stderr where its option stats_print asks for one, as
 * fabpool_destroy prints it (fabpool_torch.c); and every tag's. */
void ft_report(fabpool_t *p);
void ft_tags_report(void);

/* In a forked child (fabpool_torch.c's fork hook): the tags' lock starts
 * again unlocked, since the thread of the parent that may have held it at
 * the fork is not in the child.  The tags' pools refuse there themselves. */
void ft_tags_fork_child(void);

#endif
