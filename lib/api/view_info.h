/* view_info.h - fabpool_check's walk of the views (view_info.c, which also
 * answers fabpool_view_get_info and fabpool_view_ptr of fabpool.h). */
#ifndef FP_VIEW_INFO_H
#define FP_VIEW_INFO_H

#include "view.h"
#include "walk.h"

/* fabpool_check's walk of the views (walk.h), pool lock held: each adds its
 * window to w's address space in use and its chunks to w's mappings. */
fabpool_status fp_views_check(const fp_views *vs, fp_walk *w);

#endif
