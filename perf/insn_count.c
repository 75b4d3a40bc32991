/* insn_count - the allocation pairs whose instructions perf/insn_count.sh
 * counts under valgrind's cachegrind: fabpool through libfabpool.so (this
 * program links the shared library, so every call goes through its PLT and
 * its thread-local storage as any program's does), or the process's malloc
 * (glibc's, or jemalloc's / tcmalloc's / mimalloc's under LD_PRELOAD).
 *
 *   insn_count fabpool|malloc small|rep16k|uniform N
 *
 * small:   256 bytes allocated and freed, N times (after a warm-up pair, a
 *          thread-cache hit every time);
 * rep16k:  16 KiB allocated and freed, N times;
 * uniform: 4,096 live blocks of sizes uniform in 1 B..64 KiB; N times a
 *          random one is freed and replaced by a block of a random size.
 *
 * The script runs each case at two N and divides the difference of the
 * counts by the difference of N, so that the set-up (the pool, the driver,
 * the first 4,096 blocks) cancels.  The pool is fabpool_create's defaults on
 * device 0 but for a 16 GiB reservation.  Nothing is timed here: the counts are deterministic. */
#include <fabpool.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIVE 4096

static fabpool_t *pool;
static int use_pool;

static void fail(const char *call, const void *arg)
{
    fprintf(stderr, "insn_count: %s(%p): %s\n", call, arg, fabpool_last_error());
    exit(1);
}

/* The calls a case makes, through the library the program loaded: inline, so that both allocators' loops
 * carry the same few harness instructions (a fabpool status is checked, malloc's NULL is not: the check of
 * a status is the caller's cost of the API). */
static inline __attribute__((always_inline)) void *take(int pooled, size_t n)
{
    void *p = NULL;
    if (!pooled)
        return malloc(n);
    if (__builtin_expect(fabpool_alloc(pool, n, &p) != FABPOOL_OK, 0))
        fail("fabpool_alloc", (void *)(uintptr_t)n);
    return p;
}

static inline __attribute__((always_inline)) void give(int pooled, void *p)
{
    if (!pooled)
        free(p);
    else if (__builtin_expect(fabpool_free(pool, p) != FABPOOL_OK, 0))
        fail("fabpool_free", p);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The loops are kept out of line, one per allocator, and opaque to the optimiser (a volatile sink). */
static void *volatile sink;

#define FIXED_LOOP(name, pooled)                                                                                  \
    static __attribute__((noinline)) void name(size_t size, long n)                                            \
    {                                                                                                          \
        for (long i = 0; i < n; i++) {                                                                         \
            void *p = take(pooled, size);                                                                      \
            sink = p;                                                                                          \
            give(pooled, p);                                                                                   \
        }                                                                                                      \
    }
FIXED_LOOP(fixed_pool, 1)
FIXED_LOOP(fixed_malloc, 0)

#define UNIFORM_LOOP(name, pooled)                                                                                \
    static __attribute__((noinline)) void name(void **live, long n)                                            \
    {                                                                                                          \
        for (long i = 0; i < n; i++) {                                                                         \
            uint64_t r = next();                                                                               \
            unsigned k = (unsigned)(r & (LIVE - 1));                                                           \
            give(pooled, live[k]);                                                                             \
            live[k] = take(pooled, (size_t)((r >> 20) & 0xffff) + 1);                                          \
        }                                                                                                      \
    }
UNIFORM_LOOP(uniform_pool, 1)
UNIFORM_LOOP(uniform_malloc, 0)

static void run_fixed(size_t size, long n) { use_pool ? fixed_pool(size, n) : fixed_malloc(size, n); }
static void run_uniform(void **live, long n) { use_pool ? uniform_pool(live, n) : uniform_malloc(live, n); }

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: insn_count fabpool|malloc small|rep16k|uniform N\n");
        return 2;
    }
    use_pool = strcmp(argv[1], "fabpool") == 0;
    if (!use_pool && strcmp(argv[1], "malloc") != 0) {
        fprintf(stderr, "insn_count: the allocator is fabpool or malloc, not %s\n", argv[1]);
        return 2;
    }
    char *end = NULL;
    long n = strtol(argv[3], &end, 10);
    if (!end || *end || n < 0 || n > 100000000) {
        fprintf(stderr, "insn_count: N is 0..100000000, not %s\n", argv[3]);
        return 2;
    }
    if (use_pool) {
        fabpool_options o;
        fabpool_options_init(&o);
        o.reserve_bytes = 16ull << 30;   /* valgrind refuses the default reservation (8x device memory) */
        if (fabpool_create(&o, &pool) != FABPOOL_OK) {
            fprintf(stderr, "insn_count: fabpool_create: %s\n", fabpool_last_error());
            return 1;
        }
    }
    int rc = 0;
    if (strcmp(argv[2], "small") == 0 || strcmp(argv[2], "rep16k") == 0) {
        size_t size = argv[2][0] == 's' ? 256 : 16384;
        run_fixed(size, 16);   /* the first pairs fill the caches, whatever n */
        run_fixed(size, n);
    } else if (strcmp(argv[2], "uniform") == 0) {
        static void *live[LIVE];
        for (unsigned k = 0; k < LIVE; k++)
            live[k] = take(use_pool, (size_t)((next() >> 20) & 0xffff) + 1);
        run_uniform(live, n);
        for (unsigned k = 0; k < LIVE; k++)
            give(use_pool, live[k]);
    } else {
        fprintf(stderr, "insn_count: the case is small, rep16k or uniform, not %s\n", argv[2]);
        rc = 2;
    }
    if (use_pool && fabpool_destroy(pool) != FABPOOL_OK) {
        fprintf(stderr, "insn_count: fabpool_destroy: %s\n", fabpool_last_error());
        rc = 1;
    }
    return rc;
}
