/* oom.c - the message of a chunk the device had no memory for, after the heap's trim and one more try
 * (oom.h): what the pool maps, the device's memory, and what to give back by what the pool holds. */
#include "oom.h"

#include <ctype.h>
#include <stdio.h>

#include "error.h"

/* A byte count for a message: MiB, or GiB from 1 GiB. */
static void human(char *buf, size_t n, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
    else
        snprintf(buf, n, "%.2f MiB", (double)b / (double)(1ull << 20));
}

/* The device's memory as the driver sees it now (cuMemGetInfo), for an out-of-memory message: "; the device
 * has F free of T", or "" where the driver cannot say. */
static void device_memory(fp_chunks *ch, char *buf, size_t n)
{
    size_t free_b = 0, total = 0;
    buf[0] = '\0';
    if (fp_chunks_device_memory(ch, &free_b, &total) != FABPOOL_OK || !total)
        return;
    char f[32], t[32];
    human(f, sizeof f, free_b);
    human(t, sizeof t, total);
    snprintf(buf, n, "; the device has %s free of %s", f, t);
}

/* The advice of an out-of-memory message by what the pool maps (bytes: per kind, mapreg.h): what the program
 * can give back through this pool, then the device's other users. */
static void oom_advice(const uint64_t *bytes, char *buf, size_t n)
{
    const char *what[3] = {bytes[FP_MAP_ARENA] ? "free blocks (fabpool_free)" : NULL,
                           bytes[FP_MAP_BUFFER] ? "shrink or destroy buffers" : NULL,
                           bytes[FP_MAP_VIEW] ? "close views of other processes' buffers" : NULL};
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < 3; i++)
        if (what[i] && k < n)
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", what[i]);
    if (k < n)
        snprintf(buf + k, n - k, k ? ", or lower other users of the device" : "this pool holds none of the "
                 "device's memory: lower other users of the device");
    buf[0] = (char)toupper((unsigned char)buf[0]);
}

fabpool_status fp_oom_error(fp_chunks *ch, uint64_t size, uint64_t idle)
{
    uint64_t count[FP_MAP_KINDS], bytes[FP_MAP_KINDS];
    fp_chunk_map_sums(ch, count, bytes);
    char a[32], m[32], blk[32], buf[32], c[32], cache[96], dev[96], advice[160];
    human(a, sizeof a, size);
    human(m, sizeof m, fp_chunks_mapped(ch, NULL));
    human(blk, sizeof blk, bytes[FP_MAP_ARENA]);
    human(buf, sizeof buf, bytes[FP_MAP_BUFFER]);
    human(c, sizeof c, idle);
    snprintf(cache, sizeof cache, idle ? "%s of its cache went back to the driver" : "it had nothing cached to "
             "give back", c);
    device_memory(ch, dev, sizeof dev);
    oom_advice(bytes, advice, sizeof advice);
    return fp_error(FABPOOL_ERR_OUT_OF_MEMORY,
                    "device %d is out of memory: cuMemCreate of a %s chunk failed with CUDA_ERROR_OUT_OF_MEMORY; "
                    "this pool maps %s (%s for blocks, %s for buffers), and %s before one more try%s. %s",
                    (int)ch->dev, a, m, blk, buf, cache, dev, advice);
}
