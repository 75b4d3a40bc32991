/* list.h - intrusive doubly-linked lists, NULL-terminated, reached by a head
 * pointer.  An element carries its own links: the two field names are
 * arguments, so one element can sit on several lists (a slab is on its
 * class's list through next/prev and on the pool's list of every slab
 * through all_next/all_prev).  Macros, so that they work for any element
 * type and cost what the open-coded lines cost.  No locking: the caller
 * holds whatever lock guards the list. */
#ifndef FP_LIST_H
#define FP_LIST_H

#include <stddef.h>

/* Puts e at the head of the list *headp. */
#define FP_LIST_PUSH(headp, e, nextf, prevf)       \
    do {                                            \
        (e)->prevf = NULL;                          \
        (e)->nextf = *(headp);                      \
        if (*(headp))                               \
            (*(headp))->prevf = (e);                \
        *(headp) = (e);                             \
    } while (0)

/* Takes e off the list *headp (it must be on it); its links are cleared. */
#define FP_LIST_REMOVE(headp, e, nextf, prevf)     \
    do {                                            \
        if ((e)->prevf)                             \
            (e)->prevf->nextf = (e)->nextf;         \
        else                                        \
            *(headp) = (e)->nextf;                  \
        if ((e)->nextf)                             \
            (e)->nextf->prevf = (e)->prevf;         \
        (e)->nextf = (e)->prevf = NULL;             \
    } while (0)

/* Points the list *headp at e where it held the element e was copied from
 * (an element moved to new memory, its links copied with it). */
#define FP_LIST_MOVED(headp, e, nextf, prevf)      \
    do {                                            \
        if ((e)->prevf)                             \
            (e)->prevf->nextf = (e);                \
        else                                        \
            *(headp) = (e);                         \
        if ((e)->nextf)                             \
            (e)->nextf->prevf = (e);                \
    } while (0)

#endif
