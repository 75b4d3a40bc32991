/* sim_init.c - the simulated driver's start: cuInit reads the settings from
 * the environment (FABSIM_*, fabsim.h) and sets up the frame and the memory
 * records; a forked child drops what its parent had. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

/* A size: whole decimal bytes, optionally followed by a unit of powers of 1024 in any case (K, KB, KiB ... P, PB,
 * PiB); 0 where it is none (no digits, another unit, anything after it, 0 bytes, or past 64 bits). */
static uint64_t parse_size(const char *s)
{
    static const char *const units[] = {"", "k", "kb", "kib", "m", "mb", "mib", "g", "gb", "gib", "t", "tb", "tib",
                                        "p", "pb", "pib"};
    uint64_t v = 0;
    const char *c = s;
    for (; *c >= '0' && *c <= '9'; c++) {
        if (v > (UINT64_MAX - (uint64_t)(*c - '0')) / 10)
            return 0;
        v = v * 10 + (uint64_t)(*c - '0');
    }
    if (c == s)
        return 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        unsigned shift = (unsigned)((i + 2) / 3) * 10;
        if (!strcasecmp(c, units[i]))
            return v > (UINT64_MAX >> shift) ? 0 : v << shift;
    }
    return 0;
}

/* The settings of the environment (fabsim.h); a value that is not one is refused on stderr, as the sim is a test
 * tool whose wrong setting must not pass for another. */
static int read_settings(void)
{
    const char *v;
    if ((v = getenv("FABSIM_DEVICES")) && *v) {
        char *end = NULL;
        long n = v[0] >= '0' && v[0] <= '9' ? strtol(v, &end, 10) : -1;
        if (n < 0 || n > FABSIM_MAX_DEVICES || *end) {
            fprintf(stderr, "fabsim: FABSIM_DEVICES='%s' is not a number of devices from 0 to %d; cuInit fails\n", v,
                    FABSIM_MAX_DEVICES);
            return -1;
        }
        sim_ndev = (int)n;
    }
    const char *const sizes[] = {"FABSIM_MEMORY", "FABSIM_HOST_MEMORY"};
    uint64_t *const to[] = {&sim_capacity, &sim_host_capacity};
    for (int i = 0; i < 2; i++) {
        if (!(v = getenv(sizes[i])) || !*v)
            continue;
        if (!(*to[i] = parse_size(v))) {
            fprintf(stderr, "fabsim: %s='%s' is not a size: write whole bytes above 0, optionally with a unit of "
                    "powers of 1024 (K, M, G, T, P; KB or KiB ...), e.g. 16GiB; cuInit fails\n", sizes[i], v);
            return -1;
        }
    }
    return 0;
}

/* sim_lock is held across a fork, so that the child's handler reads whole records (another thread of the parent
 * may have been changing them) and TSan sees their writes ordered before its reads. */
static void before_fork(void) { pthread_mutex_lock(&sim_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&sim_lock); }

static void after_fork_child(void)
{
    /* The real driver does not survive fork either: a child must call
     * cuInit anew (or exec).  Drop what the parent had. */
    sim_vmm_after_fork();
    __atomic_store_n(&sim_inited, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_lock); /* taken by before_fork: the child's only thread holds it */
}

SIM_API CUresult cuInit(unsigned flags)
{
    CUresult r = sim_enter(E_cuInit, 0);
    if (r != CUDA_SUCCESS)
        return r;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    if (!sim_inited) {
        const char *v;
        if (read_settings() != 0) {
            pthread_mutex_unlock(&sim_lock);
            return CUDA_ERROR_INVALID_VALUE;
        }
        sim_fabric = (v = getenv("FABSIM_FABRIC")) && atoi(v) != 0;
        sim_rdma = !((v = getenv("FABSIM_RDMA")) && *v && atoi(v) == 0);
        sim_trace = (v = getenv("FABSIM_TRACE")) && atoi(v) != 0;
        if ((v = getenv("FABSIM_MACHINE")) && *v) {
            if (strlen(v) < sizeof sim_machine) {
                snprintf(sim_machine, sizeof sim_machine, "%s", v);
            } else { /* too long to keep whole: its start and a hash of all of it, so names stay distinct */
                uint32_t h = 2166136261u;
                for (const char *c = v; *c; c++)
                    h = (h ^ (uint8_t)*c) * 16777619u;
                snprintf(sim_machine, sizeof sim_machine, "%.14s-%08x", v, h);
            }
        }
        static int atfork;
        if (!atfork) {
            pthread_atfork(before_fork, after_fork_parent, after_fork_child);
            atfork = 1;
        }
        sim_vmm_init();
        if ((v = getenv("FABSIM_FAULT")) && *v)
            sim_parse_faults(v);
        __atomic_store_n(&sim_inited, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&sim_lock);
    return sim_ndev > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}
