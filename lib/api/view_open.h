/* view_open.h - a peer's buffer opened in this process from its full
 * descriptor (view_open.c): a view mapped afresh, or a kept one taken back. */
#ifndef FP_VIEW_OPEN_H
#define FP_VIEW_OPEN_H

#include "view.h"

/* fabpool_view_open (vouched 0) or fabpool_view_open_peer (vouched: the peer's pid) on the pool whose views vs
 * are (vs NULL: the pool was NULL). */
fabpool_status fp_view_open(fp_views *vs, int vouched, const void *desc, size_t len, const int *fds, size_t nfds,
                            fabpool_view_t **out);

#endif
