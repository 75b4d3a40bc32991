/* test_stats.c - the stats as a user reads them: the in-use high-water
 * mark kept as allocations happen (exact without thread caches, within the
 * bound fabpool.h gives with them, never below the true mark), both marks
 * reset by fabpool_reset_peak (also while the pool sleeps: the wake's maps
 * count), and the options in force in the printed
 * report, text and JSON (a trace path with '"' and '\' escaped; test_tools
 * parses such a report with python3 -m json.tool), and the reports saying
 * whether the in-use mark is exact or an upper bound; a report that could
 * not be written (a full device, a FILE not open for writing) is an error
 * naming the call, not FABPOOL_OK, and a NULL pool is refused in the name of
 * the call made. */
#include "testutil.h"

#include <sys/stat.h>
#include <unistd.h>

#define MB (1ull << 20)

static void peak_exact_without_caches(void)
{
    fabpool_t *p = t_pool("thread_cache:0,handle_type:none");
    if (!p)
        return;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(fabpool_alloc(p, MB, &a)); /* a 1 MiB class: 1 MiB in use */
    CHECK_OK(fabpool_free(p, a));
    fabpool_stats s = t_stats(p);
    CHECK(s.in_use_bytes == 0 && s.in_use_bytes_peak == MB);
    if (s.in_use_bytes_peak != MB)
        fprintf(stderr, "after a 1 MiB alloc and free: in use %llu, peak %llu\n",
                (unsigned long long)s.in_use_bytes, (unsigned long long)s.in_use_bytes_peak);

    CHECK_OK(fabpool_alloc(p, MB, &a));
    CHECK_OK(fabpool_alloc(p, 64 * MB, &b)); /* a large block */
    CHECK_OK(fabpool_free(p, b));
    CHECK_OK(fabpool_free(p, a));
    s = t_stats(p);
    CHECK(s.in_use_bytes == 0 && s.in_use_bytes_peak == 65 * MB);

    /* a buffer grows, shrinks and grows again: each size is counted alone */
    fabpool_buffer_t *buf = NULL;
    CHECK_OK(fabpool_buffer_create(p, 512 * MB, 100 * MB, &buf));
    CHECK_OK(fabpool_buffer_resize(buf, 200 * MB, NULL));
    CHECK_OK(fabpool_buffer_resize(buf, 50 * MB, NULL));
    CHECK_OK(fabpool_buffer_resize(buf, 150 * MB, NULL));
    s = t_stats(p);
    CHECK(s.in_use_bytes == 150 * MB && s.in_use_bytes_peak == 200 * MB);

    /* reset: both marks start from now */
    CHECK_OK(fabpool_alloc(p, 3 * MB, &c)); /* a 3 MiB class */
    CHECK_OK(fabpool_reset_peak(p));
    s = t_stats(p);
    CHECK(s.in_use_bytes == 153 * MB && s.in_use_bytes_peak == 153 * MB);
    CHECK(s.mapped_bytes_peak == s.mapped_bytes);
    CHECK_OK(fabpool_free(p, c));
    CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    s = t_stats(p);
    CHECK(s.in_use_bytes == 0 && s.in_use_bytes_peak == 153 * MB);
    CHECK_STATUS(fabpool_reset_peak(NULL), FABPOOL_ERR_INVALID_ARG);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
}

/* With thread caches: a random run whose true high-water mark the test keeps (usable sizes of the live
 * blocks): the pool's mark is never below it, and above it by no more than the bound of fabpool.h. */
static void peak_bound_with_caches(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    enum { N = 64, STEPS = 3000 };
    void *live[N] = {0};
    size_t usable[N] = {0};
    uint64_t now = 0, truth = 0, rng = 12345;
    for (int i = 0; i < STEPS; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((rng >> 33) % N);
        if (live[k]) {
            CHECK_OK(fabpool_free(p, live[k]));
            now -= usable[k];
            live[k] = NULL;
            continue;
        }
        size_t size = 1 + (size_t)((rng >> 17) % (rng & 1 ? 4 * MB : 64 * 1024));
        if ((rng >> 40) % 50 == 0)
            size = 16 * MB + (size_t)((rng >> 20) % (8 * MB)); /* now and then a large block */
        CHECK_OK(fabpool_alloc(p, size, &live[k]));
        CHECK_OK(fabpool_usable_size(p, live[k], &usable[k]));
        now += usable[k];
        truth = now > truth ? now : truth;
    }
    fabpool_stats s = t_stats(p);
    fabpool_options o;
    fabpool_options_init(&o);
    CHECK_OK(fabpool_get_options(p, &o));
    /* the bound: one thread's bins, each of min(64, max(2, 8 MiB / size)) blocks of its class */
    uint64_t bound = 0;
    for (int c = 0; c < FABPOOL_NUM_CLASSES && s.classes[c].size; c++)
        if (s.classes[c].size <= o.slab_max_bytes) {
            uint64_t cap = (8 * MB) / s.classes[c].size;
            cap = cap > 64 ? 64 : cap < 2 ? 2 : cap;
            bound += cap * s.classes[c].size;
        }
    CHECK(s.in_use_bytes == now);
    CHECK(s.in_use_bytes_peak >= truth && s.in_use_bytes_peak <= truth + bound);
    printf("test_stats: with thread caches, true mark %llu, the pool's %llu (bound +%llu)\n",
           (unsigned long long)truth, (unsigned long long)s.in_use_bytes_peak, (unsigned long long)bound);
    for (int k = 0; k < N; k++)
        if (live[k])
            CHECK_OK(fabpool_free(p, live[k]));
    /* the caller's cached blocks go back at a reset: nothing in use, nothing counted */
    CHECK_OK(fabpool_reset_peak(p));
    s = t_stats(p);
    CHECK(s.in_use_bytes == 0 && s.in_use_bytes_peak == 0);
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
}

static char *report(fabpool_t *p, int json)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    CHECK_OK(fabpool_print_stats(p, f, json));
    fclose(f);
    return text;
}

/* The options in force, in both reports, the trace path escaped in the JSON. */
/* Both marks reset while the pool sleeps (it maps nothing then) and the wake maps its chunks again: the mapped
 * mark follows the wake's maps (exact: each chunk is counted as it is mapped), the counters' mark too, and the
 * in-use mark keeps the blocks that stayed allocated across the sleep. */
static void peak_reset_asleep_counts_the_wake(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc(p, 24 * MB, &a));
    CHECK_OK(fabpool_alloc(p, 3000, &b));
    uint64_t mapped = t_mapped(p);
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_OK(fabpool_reset_peak(p));
    fabpool_stats s = t_stats(p);
    CHECK(s.mapped_bytes == 0 && s.mapped_bytes_peak == 0 && s.in_use_bytes_peak >= 24 * MB + 3000);
    CHECK_OK(fabpool_wake(p, NULL));
    s = t_stats(p);
    fabpool_counters c = t_counters(p);
    CHECK(s.mapped_bytes == mapped && s.mapped_bytes_peak == mapped && c.mapped_bytes_peak == mapped);
    CHECK(s.in_use_bytes_peak >= s.in_use_bytes && s.in_use_bytes >= 24 * MB + 3000);
    if (t_ledger_p)
        CHECK(t_ledger().bytes_held == (uint64_t)mapped);
    CHECK_OK(fabpool_free(p, a));
    CHECK_OK(fabpool_free(p, b));
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_destroy(p));
}

static void options_in_report(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/fabpool-test-stats-%ld", (long)getpid());
    char path[300];
    snprintf(path, sizeof path, "%s/a\"b\\c.trace", dir);
    CHECK(mkdir(dir, 0700) == 0);
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = "decay_ms:250,cache_limit:1GiB,handle_type:none,peers:none";
    snprintf(o.trace_path, sizeof o.trace_path, "%s", path);
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(&o, &p));
    if (!p)
        return;
    char *text = report(p, 0);
    CHECK(text && strstr(text, "\n  options: device:0,reserve:") && strstr(text, ",handle_type:none,") &&
          strstr(text, ",cache_limit:1GiB,decay_ms:250,") && strstr(text, ",stats_print:none,") &&
          strstr(text, ",trace:/tmp/fabpool-test-stats-") && strstr(text, ",debug:none"));
    char *json = report(p, 1);
    CHECK(json && strstr(json, ",\"options\":{\"device\":0,\"reserve\":") &&
          strstr(json, "\"handle_type\":\"none\",") && strstr(json, "\"cache_limit\":1073741824,\"decay_ms\":250,") &&
          strstr(json, "\"thread_cache\":true,") && strstr(json, "\"peers\":[],") &&
          strstr(json, "/a\\\"b\\\\c.trace\","));
    free(text);
    free(json);
    CHECK_OK(fabpool_destroy(p));
    CHECK(unlink(path) == 0 && rmdir(dir) == 0);
}

/* The line of the text report that begins with `row`, or NULL. */
static const char *report_line(const char *text, const char *row, char *line, size_t n)
{
    const char *at = text ? strstr(text, row) : NULL;
    if (!at)
        return NULL;
    size_t k = strcspn(at, "\n");
    snprintf(line, n, "%.*s", (int)(k < n ? k : n - 1), at);
    return line;
}

/* The reports say which in_use_bytes_peak is: an upper bound with thread caches (the text's row, the JSON's
 * in_use_bytes_peak_exact false), exact without (true, and the mark is the true one: 32 blocks of a class live
 * at a time, one class after the other, the run that makes the bound several times the true mark). */
static void peak_labelled(void)
{
    static const char *const confs[] = {"handle_type:none", "handle_type:none,thread_cache:false"};
    static const size_t sizes[] = {64, 256, 1024, 2048, 4096};
    for (int exact = 0; exact < 2; exact++) {
        fabpool_t *p = t_pool(confs[exact]);
        if (!p)
            return;
        uint64_t truth = 0;
        for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
            void *v[32];
            for (int i = 0; i < 32; i++)
                CHECK_OK(fabpool_alloc(p, sizes[c], &v[i]));
            truth = 32 * sizes[c] > truth ? 32 * sizes[c] : truth;
            for (int i = 0; i < 32; i++)
                CHECK_OK(fabpool_free(p, v[i]));
        }
        fabpool_stats s = t_stats(p);
        CHECK(exact ? s.in_use_bytes_peak == truth : s.in_use_bytes_peak > truth);
        char *text = report(p, 0), *json = report(p, 1), line[256];
        const char *row = report_line(text, "  in use, peak ", line, sizeof line);
        int bound = row && strstr(row, "an upper bound with thread caches (exact with thread_cache:false)");
        CHECK(row && bound != exact);
        CHECK(json && strstr(json, exact ? ",\"in_use_bytes_peak_exact\":true" : ",\"in_use_bytes_peak_exact\":false"));
        printf("test_stats: %s: true mark %llu, the pool's %llu; the report: %s\n", confs[exact],
               (unsigned long long)truth, (unsigned long long)s.in_use_bytes_peak, row ? row : "(no row)");
        free(text);
        free(json);
        CHECK_OK(fabpool_destroy(p));
    }
}

static void report_write_failure_is_an_error(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    FILE *full = fopen("/dev/full", "w"); /* every write fails with ENOSPC once it reaches the file */
    if (full) {
        CHECK_STATUS(fabpool_print_stats(p, full, 1), FABPOOL_ERR_IO);
        CHECK(strstr(fabpool_last_error(), "fabpool_print_stats") && strstr(fabpool_last_error(), "space"));
        CHECK_STATUS(fabpool_print_stats(p, full, 0), FABPOOL_ERR_IO);
        fclose(full);
    }
    FILE *ro = fopen("/dev/null", "r");
    if (ro) {
        CHECK_STATUS(fabpool_print_stats(p, ro, 0), FABPOOL_ERR_IO);
        CHECK(strstr(fabpool_last_error(), "fabpool_print_stats") != NULL);
        fclose(ro);
    }
    FILE *ok = fopen("/dev/null", "w");
    if (ok) {
        CHECK_OK(fabpool_print_stats(p, ok, 0));
        fclose(ok);
    }
    char buf[16];
    size_t need = 0;
    CHECK_STATUS(fabpool_stats_json(NULL, buf, sizeof buf, &need), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), "fabpool_stats_json") && !strstr(fabpool_last_error(), "print_stats"));
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_driver_init();
    peak_exact_without_caches();
    peak_bound_with_caches();
    peak_reset_asleep_counts_the_wake();
    options_in_report();
    peak_labelled();
    report_write_failure_is_an_error();
    return t_done("test_stats");
}
