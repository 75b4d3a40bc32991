/* test_view_apply_scales: what a view's apply costs grows with the descriptor's records and the view's chunks,
 * not with their product, so that a peer cannot hold a process (and its pool's lock) for minutes with one
 * descriptor; and the apply that finds its chunks by bisection still maps what it must.
 *
 * - many_records: a view of 2048 chunks of 2 MiB gets a delta of 500,000 records of 2 MiB past them (a peer's
 *   word: up to its window over the granularity, here 2 TiB): it is refused (they do not cover the live bytes it
 *   states) within 2 s, where a scan of every chunk for every record took 8 s, and the view is as it
 *   was (its info and data).
 * - middle_chunk: a delta that replaces a chunk in the middle of the view (another buffer's chunk, its fd): the
 *   view maps it there and keeps the chunks around it in order, as its info and data say; a delta after a grow
 *   of the buffer then adds its chunks after them. */
#include <sys/resource.h>
#include <time.h>

#include "testutil.h"
#include "desc.h"

#define MB (1ull << 20)
#define CHUNK (2 * MB)
#define NCHUNKS 2048u
#define WINDOW (2ull << 40)
#define NRECORDS 500000u
#define BOUND_MS 2000

static fabpool_t *pool(void) { return t_pool("metadata:libc,reserve:4TiB,max_chunk:2MiB,handle_type:posix_fd"); }

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static fabpool_buffer_info vinfo(fabpool_view_t *v)
{
    fabpool_buffer_info i = {.struct_size = sizeof i};
    CHECK_OK(fabpool_view_get_info(v, &i));
    return i;
}

/* b's descriptor since `since` (malloc'd, *len bytes) and copies of its fds (malloc'd, *nfds). */
static uint8_t *export_since(fabpool_buffer_t *b, uint64_t since, size_t *len, int **fds, size_t *nfds)
{
    size_t cap = fabpool_desc_size(NCHUNKS + 16);
    uint8_t *d = malloc(cap);
    int *f = malloc((NCHUNKS + 16) * sizeof *f);
    CHECK(d && f);
    CHECK_OK(fabpool_buffer_export(b, since, d, cap, len, f, NCHUNKS + 16, nfds));
    for (size_t i = 0; i < *nfds; i++)
        f[i] = dup(f[i]);
    CHECK_OK(fabpool_buffer_export_done(b));
    *fds = f;
    return d;
}

/* A tag at the start of each chunk k of b, k + seed. */
static void tag_chunks(fabpool_buffer_t *b, unsigned n, uint64_t seed)
{
    char *base = fabpool_buffer_ptr(b);
    for (unsigned k = 0; k < n; k++)
        t_put_word(base + (uint64_t)k * CHUNK, k + seed);
}

/* A buffer of n chunks, tagged, and a view of it in q. */
static fabpool_view_t *viewed(fabpool_t *p, fabpool_t *q, unsigned n, fabpool_buffer_t **b)
{
    CHECK_OK(fabpool_buffer_create(p, WINDOW, (size_t)n * CHUNK, b));
    tag_chunks(*b, n, 0);
    size_t len = 0, nfds = 0;
    int *fds = NULL;
    uint8_t *d = export_since(*b, 0, &len, &fds, &nfds);
    CHECK(nfds == n);
    fabpool_view_t *v = NULL;
    CHECK_OK(fabpool_view_open(q, d, len, fds, nfds, &v));
    free(d);
    free(fds);
    return v;
}

static void many_records(void)
{
    fabpool_t *p = pool(), *q = pool();
    fabpool_buffer_t *b = NULL;
    fabpool_view_t *v = viewed(p, q, NCHUNKS, &b);
    fabpool_buffer_info before = vinfo(v);
    size_t len = 0, nfds = 0;
    int *fds = NULL;
    uint8_t *full = export_since(b, 0, &len, &fds, &nfds);
    for (size_t i = 0; i < nfds; i++)
        close(fds[i]);
    free(fds);
    fp_desc h;
    CHECK_OK(fp_desc_parse(full, len, nfds, &h));
    /* the hostile delta: records of a chunk each, past the view's, and a live size no record covers */
    h.since = h.generation;
    h.generation++;
    h.n = NRECORDS;
    h.live = WINDOW;
    size_t dlen = fabpool_desc_size(NRECORDS);
    uint8_t *d = calloc(1, dlen);
    int *none = malloc(NRECORDS * sizeof *none);
    CHECK(d && none);
    for (uint32_t k = 0; k < NRECORDS; k++) {
        fp_desc_rec r = {.off = (uint64_t)(NCHUNKS + k) * CHUNK, .size = CHUNK, .gen = h.generation, .fd_index = k};
        fp_desc_put_record(d, k, &r);
        none[k] = -1; /* never looked at: the delta is refused before any import */
    }
    fp_desc_put_header(d, &h);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    alarm(600);
    fabpool_status st = fabpool_view_apply(v, d, dlen, none, NRECORDS);
    alarm(0);
    long ms = ms_since(&t0);
    printf("many_records: a delta of %u records to a view of %u chunks -> %s after %ld ms: %.200s\n", NRECORDS,
           NCHUNKS, fabpool_status_name(st), ms, fabpool_last_error());
    CHECK_STATUS(st, FABPOOL_ERR_DESCRIPTOR);
    CHECK(strstr(fabpool_last_error(), "live bytes") != NULL);
    CHECK(ms < BOUND_MS);
    fabpool_buffer_info after = vinfo(v);
    CHECK(after.n_chunks == before.n_chunks && after.size == before.size && after.generation == before.generation);
    char *base = fabpool_view_ptr(v);
    for (unsigned k = 0; k < NCHUNKS; k += 97)
        CHECK(t_get_word(base + (uint64_t)k * CHUNK) == k);
    free(d);
    free(none);
    free(full);
    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(p));
}

static void middle_chunk(void)
{
    enum { N = 8, MID = 3 };
    fabpool_t *p = pool(), *q = pool();
    fabpool_buffer_t *b = NULL, *other = NULL;
    fabpool_view_t *v = viewed(p, q, N, &b);
    uint64_t g0 = vinfo(v).generation;
    CHECK_OK(fabpool_buffer_create(p, WINDOW, CHUNK, &other));
    tag_chunks(other, 1, 1000);
    size_t len = 0, nfds = 0, olen = 0, onfds = 0;
    int *fds = NULL, *ofds = NULL;
    uint8_t *full = export_since(b, 0, &len, &fds, &nfds), *od = export_since(other, 0, &olen, &ofds, &onfds);
    for (size_t i = 0; i < nfds; i++)
        close(fds[i]);
    fp_desc h;
    CHECK_OK(fp_desc_parse(full, len, nfds, &h));
    /* the delta: chunk MID replaced by the other buffer's chunk */
    h.since = h.generation;
    h.generation++;
    h.n = 1;
    uint8_t d[4096] = {0};
    CHECK(fabpool_desc_size(1) <= sizeof d);
    fp_desc_rec r = {.off = MID * CHUNK, .size = CHUNK, .gen = h.generation, .fd_index = 0};
    fp_desc_put_record(d, 0, &r);
    fp_desc_put_header(d, &h);
    CHECK_OK(fabpool_view_apply(v, d, fabpool_desc_size(1), ofds, 1));
    fabpool_buffer_info vi = vinfo(v);
    CHECK(vi.n_chunks == N && vi.size == N * CHUNK && vi.generation == h.generation);
    char *base = fabpool_view_ptr(v);
    for (unsigned k = 0; k < N; k++)
        CHECK(t_get_word(base + (uint64_t)k * CHUNK) == (k == MID ? 1000 : k));
    /* the exporter grows by two chunks: its delta since the generation the view had before adds them after the
     * others */
    CHECK_OK(fabpool_buffer_resize(b, (N + 2) * CHUNK, NULL));
    tag_chunks(b, N + 2, 0);
    free(fds);
    free(full);
    full = export_since(b, g0, &len, &fds, &nfds);
    CHECK(nfds == 2);
    CHECK_OK(fabpool_view_apply(v, full, len, fds, nfds));
    vi = vinfo(v);
    CHECK(vi.n_chunks == N + 2 && vi.size == (N + 2) * CHUNK);
    for (unsigned k = 0; k < N + 2; k++)
        CHECK(t_get_word(base + (uint64_t)k * CHUNK) == (k == MID ? 1000 : k));
    free(fds);
    free(full);
    free(od);
    free(ofds);
    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_destroy(other, NULL));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    /* the sim holds an fd for every chunk of a buffer and of a view: three for each of the view's chunks */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4 * NCHUNKS) {
        rl.rlim_cur = rl.rlim_max < 4 * NCHUNKS ? rl.rlim_max : 4 * NCHUNKS;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < 4 * NCHUNKS) {
        printf("test_view_apply_scales: skipped: RLIMIT_NOFILE is below %u and cannot be raised\n", 4 * NCHUNKS);
        return 77;
    }
    t_driver_init();
    /* two pools of 4 TiB of address space each (the window of 2 TiB and the view of it): more than ThreadSanitizer's
     * and valgrind's processes may reserve */
    fabpool_options o;
    fabpool_options_init(&o);
    o.conf = "metadata:libc,reserve:4TiB,max_chunk:2MiB,handle_type:posix_fd";
    fabpool_t *a = NULL, *b = NULL;
    fabpool_status sa = fabpool_create(&o, &a), sb = sa == FABPOOL_OK ? fabpool_create(&o, &b) : sa;
    if (b)
        CHECK_OK(fabpool_destroy(b));
    if (a)
        CHECK_OK(fabpool_destroy(a));
    if (sa == FABPOOL_ERR_OUT_OF_MEMORY || sb == FABPOOL_ERR_OUT_OF_MEMORY) {
        printf("test_view_apply_scales: skipped: two pools of 4 TiB of address space cannot be reserved here (%s)\n",
               fabpool_last_error());
        return 77;
    }
    middle_chunk();
    many_records();
    return t_done("test_view_apply_scales");
}
