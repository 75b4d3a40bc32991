/* driver_calls.h - the driver entry points the library calls (lib/device/driver_entries.h), by name, and how
 * often a piece of work calls each on the simulated driver: the fault tests make every one of those calls
 * fail in turn.  Include after testutil.h. */
#ifndef FP_DRIVER_CALLS_H
#define FP_DRIVER_CALLS_H

#include "driver_entries.h"

static const char *const entries[] = {
#define ENTRY_NAME(name, ver, sym) #name,
    FP_DRIVER_ENTRIES(ENTRY_NAME)
#undef ENTRY_NAME
};
#define N_ENTRIES (sizeof entries / sizeof entries[0])

/* made[e]: the calls of entries[e] so far */
static inline void t_calls_mark(const t_sim_hooks *h, uint64_t made[N_ENTRIES])
{
    for (size_t e = 0; e < N_ENTRIES; e++)
        made[e] = h->calls(entries[e]);
}

/* made[e]: the calls of entries[e] since t_calls_mark */
static inline void t_calls_since(const t_sim_hooks *h, uint64_t made[N_ENTRIES])
{
    for (size_t e = 0; e < N_ENTRIES; e++)
        made[e] = h->calls(entries[e]) - made[e];
}

#endif
