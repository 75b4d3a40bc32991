/* clock.h - the clock of the pool's time limits (decay_ms, keep_ms): the
 * coarse monotonic clock (a few ms of resolution, read from the vDSO without
 * a syscall) is plenty for periods of tens of ms and up, and costs a few ns
 * on the slow paths that read it. */
#ifndef FP_CLOCK_H
#define FP_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t fp_coarse_ns(void)
{
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
