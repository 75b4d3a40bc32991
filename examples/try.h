/* try.h - the examples' error handling: every fabpool call returns a
 * fabpool_status, and on failure fabpool_last_error() says what went wrong
 * and what to do.  TRY(call) prints both and makes the enclosing function
 * return 1. */
#ifndef EXAMPLES_TRY_H
#define EXAMPLES_TRY_H

#include <fabpool.h>
#include <stdio.h>

#define TRY(call)                                                                                                 \
    do {                                                                                                          \
        fabpool_status s_ = (call);                                                                               \
        if (s_ != FABPOOL_OK) {                                                                                   \
            fprintf(stderr, "%s failed: %s: %s\n", #call, fabpool_status_name(s_), fabpool_last_error());        \
            return 1;                                                                                             \
        }                                                                                                         \
    } while (0)

#define MiB (1ull << 20)

#endif
