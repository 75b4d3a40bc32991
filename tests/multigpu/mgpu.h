/* mgpu.h - what the two-GPU tests share: a context on each of devices 0 and
 * 1 (or exit 77, ctest's "skipped"), and the bytes each device holds. */
#ifndef FP_MGPU_H
#define FP_MGPU_H

#include "../testutil.h"

static CUcontext mg_ctx[2];
static uint64_t (*mg_machine_held)(int); /* set: count the whole simulated machine */

/* After t_driver_init: device 0's context is t_ctx; retains device 1's.
 * Exits 77 with fewer than two devices, or two that cannot reach each other. */
static inline void mg_two_devices(const char *name)
{
    int n = 0, can01 = 0, can10 = 0;
    CUdevice d1 = 1;
    CHECK_CU(cuDeviceGetCount(&n));
    if (n < 2) {
        printf("%s: %d device%s: needs two (FABSIM_DEVICES=2 on the sim): skipped\n", name, n, n == 1 ? "" : "s");
        exit(77);
    }
    CHECK_CU(cuDeviceGet(&d1, 1));
    CHECK_CU(cuDeviceCanAccessPeer(&can10, d1, 0));
    CHECK_CU(cuDeviceCanAccessPeer(&can01, 0, d1));
    if (!can01 || !can10) {
        printf("%s: devices 0 and 1 cannot access each other's memory (%d, %d): skipped\n", name, can01, can10);
        exit(77);
    }
    mg_ctx[0] = t_ctx;
    CHECK_CU(cuDevicePrimaryCtxRetain(&mg_ctx[1], d1));
}

/* Bytes device d holds: sim, this process's ledger (or with mg_machine_held,
 * every process of the simulated machine); real driver, what this process
 * and its children use on d (held.h: NVML; total - free where it cannot
 * say), read in d's context. */
static inline int64_t mg_used(int d)
{
    if (mg_machine_held)
        return (int64_t)mg_machine_held(d);
    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        return (int64_t)l.bytes_held_dev[d];
    }
    CUcontext saved = NULL;
    CUdevice dev = 0;
    int whole;
    cuCtxGetCurrent(&saved);
    cuCtxSetCurrent(mg_ctx[d]);
    CHECK_CU(cuDeviceGet(&dev, d));
    int64_t used = t_used_bytes(dev, &whole);
    cuCtxSetCurrent(saved);
    return used;
}

#endif
