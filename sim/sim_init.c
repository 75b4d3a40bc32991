/* sim_init.c - the simulated driver's start: cuInit reads the settings from
 * the environment (FABSIM_*, fabsim.h) and sets up the frame and the memory
 * records; a forked child drops what its parent had. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

static uint64_t parse_size(const char *s)
{
    char *end;
    uint64_t v = strtoull(s, &end, 10);
    if (!strcasecmp(end, "k") || !strcasecmp(end, "kib") || !strcasecmp(end, "kb"))
        v <<= 10;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib") || !strcasecmp(end, "mb"))
        v <<= 20;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib") || !strcasecmp(end, "gb"))
        v <<= 30;
    else if (!strcasecmp(end, "t") || !strcasecmp(end, "tib") || !strcasecmp(end, "tb"))
        v <<= 40;
    return v;
}

static void after_fork_child(void)
{
    /* The real driver does not survive fork either: a child must call
     * cuInit anew (or exec).  Drop what the parent had. */
    sim_vmm_after_fork();
    __atomic_store_n(&sim_inited, 0, __ATOMIC_RELEASE);
    pthread_mutex_init(&sim_lock, NULL);
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
        if ((v = getenv("FABSIM_DEVICES")) && *v) {
            sim_ndev = atoi(v);
            if (sim_ndev < 0)
                sim_ndev = 0;
            if (sim_ndev > FABSIM_MAX_DEVICES)
                sim_ndev = FABSIM_MAX_DEVICES;
        }
        if ((v = getenv("FABSIM_MEMORY")) && *v)
            sim_capacity = parse_size(v);
        if ((v = getenv("FABSIM_HOST_MEMORY")) && *v)
            sim_host_capacity = parse_size(v);
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
            pthread_atfork(NULL, NULL, after_fork_child);
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
