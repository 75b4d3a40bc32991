/* test_badinput: what callers get wrong.  Every call gets its exact status and
 * a message with the words that say what was wrong; live allocations stay
 * intact (read back); nothing crashes.  Runs on the sim and on the real driver.
 * Not detectable, so not tested: a call on a pool after fabpool_destroy (the
 * pool's memory is gone: a use after free, as with free()), and a buffer or
 * view pointer after its destroy/close. */
#include <unistd.h>

#include "../testutil.h"

#define MB (1ull << 20)

static void put(void *at, uint64_t v) { CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)at, &v, sizeof v)); }
static uint64_t get(void *at)
{
    uint64_t v = 0;
    CHECK_CU(cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)at, sizeof v));
    return v;
}

#define EXPECT(expr, want, word)                                                                             \
    do {                                                                                                     \
        fabpool_status s_ = (expr);                                                                          \
        t_checks++;                                                                                          \
        if (s_ != (want) || !strstr(fabpool_last_error(), (word))) {                                        \
            t_failures++;                                                                                    \
            fprintf(stderr, "%s:%d: %s -> %s (%s), expected %s with '%s'\n", __FILE__, __LINE__, #expr,      \
                    fabpool_status_name(s_), fabpool_last_error(), #want, word);                             \
        }                                                                                                    \
    } while (0)

int main(void)
{
    t_driver_init();
    fabpool_t *p = NULL;
    void *x = NULL;
    fabpool_buffer_t *b = NULL;

    /* NULLs before any pool */
    EXPECT(fabpool_create(NULL, NULL), FABPOOL_ERR_INVALID_ARG, "NULL");
    CHECK_OK(fabpool_destroy(NULL)); /* as free(NULL) */
    fabpool_options o;
    fabpool_options_init(&o);
    o.struct_size = 12;
    EXPECT(fabpool_create(&o, &p), FABPOOL_ERR_INVALID_ARG, "struct_size");
    CHECK(p == NULL);

    CHECK_OK(fabpool_create(NULL, &p));
    if (!p)
        return t_done("test_badinput");
    /* live data that every bad call below must leave alone */
    void *live_small = NULL, *live_large = NULL;
    CHECK_OK(fabpool_alloc(p, 4096, &live_small));
    CHECK_OK(fabpool_alloc(p, 24 * MB, &live_large));
    CHECK_OK(fabpool_buffer_create(p, 256 * MB, 32 * MB, &b));
    put(live_small, 1111);
    put((char *)live_large + 24 * MB - 8, 2222);
    put((char *)fabpool_buffer_ptr(b) + 32 * MB - 8, 3333);
    int64_t held0 = t_held();

    /* allocations */
    EXPECT(fabpool_alloc(NULL, 64, &x), FABPOOL_ERR_INVALID_ARG, "NULL");
    EXPECT(fabpool_alloc(p, 64, NULL), FABPOOL_ERR_INVALID_ARG, "NULL");
    x = (void *)1;
    CHECK_OK(fabpool_alloc(p, 0, &x)); /* as cudaMalloc: NULL */
    CHECK(x == NULL);
    x = (void *)1;
    fabpool_status st = fabpool_alloc(p, SIZE_MAX, &x);
    CHECK(st == FABPOOL_ERR_INVALID_ARG || st == FABPOOL_ERR_LIMIT || st == FABPOOL_ERR_OUT_OF_MEMORY);
    CHECK(fabpool_last_error()[0] != 0);
    CHECK(x == NULL);
    st = fabpool_alloc(p, SIZE_MAX - 100, &x); /* overflows when rounded to a class or a granule */
    CHECK(st != FABPOOL_OK && fabpool_last_error()[0] != 0);
    st = fabpool_alloc(p, (SIZE_MAX >> 1) + 1, &x);
    CHECK(st != FABPOOL_OK && fabpool_last_error()[0] != 0);
    CHECK(t_near(t_held(), held0));
    /* the size of a descriptor of more chunks than size_t can count saturates: a wrapped small size would have
     * the caller allocate a buffer that the records overrun */
    CHECK(fabpool_desc_size(SIZE_MAX) == SIZE_MAX && fabpool_desc_size(SIZE_MAX / 96) == SIZE_MAX);
    CHECK(fabpool_desc_size((SIZE_MAX - 96) / 96) == 96 + (SIZE_MAX - 96) / 96 * 96);
    CHECK(fabpool_desc_size(0) == 96 && fabpool_desc_size(2) == 288);

    /* frees */
    EXPECT(fabpool_free(NULL, live_small), FABPOOL_ERR_INVALID_ARG, "NULL");
    CHECK_OK(fabpool_free(p, NULL)); /* free(NULL) is a no-op */
    int on_stack;
    EXPECT(fabpool_free(p, &on_stack), FABPOOL_ERR_NOT_FOUND, "not");
    EXPECT(fabpool_free(p, (char *)live_small + 256), FABPOOL_ERR_NOT_FOUND, "interior");
    EXPECT(fabpool_free(p, (char *)live_large + 4096), FABPOOL_ERR_NOT_FOUND, "interior");
    EXPECT(fabpool_free(p, fabpool_buffer_ptr(b)), FABPOOL_ERR_NOT_FOUND, "");
    void *once = NULL;
    CHECK_OK(fabpool_alloc(p, 1000, &once));
    CHECK_OK(fabpool_free(p, once));
    EXPECT(fabpool_free(p, once), FABPOOL_ERR_DOUBLE_FREE, "double free");
    void *big_once = NULL;
    CHECK_OK(fabpool_alloc(p, 12 * MB, &big_once));
    CHECK_OK(fabpool_free(p, big_once));
    st = fabpool_free(p, big_once);
    CHECK(st == FABPOOL_ERR_DOUBLE_FREE || st == FABPOOL_ERR_NOT_FOUND);
    size_t us = 0;
    EXPECT(fabpool_usable_size(p, &on_stack, &us), FABPOOL_ERR_NOT_FOUND, "");
    EXPECT(fabpool_usable_size(p, live_small, NULL), FABPOOL_ERR_INVALID_ARG, "NULL");

    /* a pointer of another pool */
    fabpool_t *p2 = NULL;
    CHECK_OK(fabpool_create(NULL, &p2));
    if (p2) {
        EXPECT(fabpool_free(p2, live_small), FABPOOL_ERR_NOT_FOUND, "");
        CHECK_OK(fabpool_destroy(p2));
    }

    /* buffers */
    fabpool_buffer_t *nb = NULL;
    EXPECT(fabpool_buffer_create(NULL, 64 * MB, 2 * MB, &nb), FABPOOL_ERR_INVALID_ARG, "NULL");
    EXPECT(fabpool_buffer_create(p, 64 * MB, 2 * MB, NULL), FABPOOL_ERR_INVALID_ARG, "NULL");
    st = fabpool_buffer_create(p, 0, 0, &nb);
    CHECK(st == FABPOOL_ERR_INVALID_ARG && nb == NULL);
    st = fabpool_buffer_create(p, 64 * MB, 128 * MB, &nb); /* size past max */
    CHECK(st == FABPOOL_ERR_LIMIT || st == FABPOOL_ERR_INVALID_ARG);
    CHECK(nb == NULL && fabpool_last_error()[0] != 0);
    st = fabpool_buffer_create(p, SIZE_MAX, 2 * MB, &nb);
    CHECK(st == FABPOOL_ERR_LIMIT || st == FABPOOL_ERR_INVALID_ARG);
    CHECK(nb == NULL && fabpool_last_error()[0] != 0);
    EXPECT(fabpool_buffer_resize(NULL, 2 * MB, NULL), FABPOOL_ERR_INVALID_ARG, "NULL");
    EXPECT(fabpool_buffer_resize(b, 0, NULL), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_buffer_resize(b, 257 * MB, NULL), FABPOOL_ERR_LIMIT, "");
    EXPECT(fabpool_buffer_resize(b, SIZE_MAX, NULL), FABPOOL_ERR_LIMIT, "");
    fabpool_buffer_info bi = {.struct_size = sizeof bi};
    CHECK_OK(fabpool_buffer_get_info(b, &bi));
    CHECK(bi.size == 32 * MB);
    EXPECT(fabpool_buffer_get_info(b, NULL), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_buffer_get_info(NULL, &bi), FABPOOL_ERR_INVALID_ARG, "");
    CHECK(fabpool_buffer_ptr(NULL) == NULL);

    /* resize_set: NULL arrays, n 0, a NULL member, one size past max (all or nothing) */
    fabpool_buffer_t *b2 = NULL;
    CHECK_OK(fabpool_buffer_create(p, 64 * MB, 8 * MB, &b2));
    fabpool_buffer_t *set[2] = {b, b2};
    size_t sizes[2] = {40 * MB, 65 * MB};
    EXPECT(fabpool_buffer_resize_set(NULL, sizes, 2, NULL), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_buffer_resize_set(set, NULL, 2, NULL), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_buffer_resize_set(set, sizes, 0, NULL), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_buffer_resize_set(set, sizes, 2, NULL), FABPOOL_ERR_LIMIT, "");
    CHECK_OK(fabpool_buffer_get_info(b, &bi));
    CHECK(bi.size == 32 * MB);
    fabpool_buffer_t *holes[2] = {b, NULL};
    sizes[1] = 16 * MB;
    EXPECT(fabpool_buffer_resize_set(holes, sizes, 2, NULL), FABPOOL_ERR_INVALID_ARG, "NULL");
    fabpool_t *p3 = NULL;
    CHECK_OK(fabpool_create(NULL, &p3));
    fabpool_buffer_t *b3 = NULL;
    if (p3) {
        CHECK_OK(fabpool_buffer_create(p3, 64 * MB, 8 * MB, &b3));
        fabpool_buffer_t *mixed[2] = {b, b3};
        EXPECT(fabpool_buffer_resize_set(mixed, sizes, 2, NULL), FABPOOL_ERR_INVALID_ARG, "another pool");
        fabpool_buffer_destroy(b3, NULL);
        CHECK_OK(fabpool_destroy(p3));
    }
    CHECK_OK(fabpool_buffer_destroy(b2, NULL));
    EXPECT(fabpool_buffer_destroy(NULL, NULL), FABPOOL_ERR_INVALID_ARG, "");

    /* sharing with NULLs and garbage */
    uint8_t junk[512];
    memset(junk, 0xa5, sizeof junk);
    fabpool_view_t *v = NULL;
    EXPECT(fabpool_view_open(NULL, junk, sizeof junk, NULL, 0, &v), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_view_open(p, junk, sizeof junk, NULL, 0, NULL), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_view_open(p, junk, sizeof junk, NULL, 0, &v), FABPOOL_ERR_DESCRIPTOR, "");
    CHECK(v == NULL);
    EXPECT(fabpool_view_apply(NULL, junk, sizeof junk, NULL, 0), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_view_close(NULL), FABPOOL_ERR_INVALID_ARG, "");
    size_t len = 0, nfds = 0;
    EXPECT(fabpool_buffer_export(NULL, 0, junk, sizeof junk, &len, NULL, 0, &nfds), FABPOOL_ERR_INVALID_ARG, "");
    if (fabpool_handle_type_of(p) != FABPOOL_HANDLE_NONE) {
        int fds[4];
        EXPECT(fabpool_buffer_export(b, 0, junk, 8, &len, fds, 4, &nfds), FABPOOL_ERR_LIMIT, "");
        CHECK(len == fabpool_desc_size(bi.n_chunks));
    }
    EXPECT(fabpool_buffer_peers_ack(NULL, 1), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_fd_send(-1, NULL, 0, "x", 1), FABPOOL_ERR_IO, "");
    EXPECT(fabpool_fd_connect("fabpool-nobody-listens-here", &on_stack, 50), FABPOOL_ERR_IO, "");

    /* stats and trims with NULLs */
    EXPECT(fabpool_get_stats(NULL, NULL), FABPOOL_ERR_INVALID_ARG, "");
    EXPECT(fabpool_trim(NULL, 0), FABPOOL_ERR_INVALID_ARG, "NULL");
    EXPECT(fabpool_collect(NULL, 0), FABPOOL_ERR_INVALID_ARG, "");
    char tiny[4];
    size_t need = 0;
    EXPECT(fabpool_stats_json(p, tiny, sizeof tiny, &need), FABPOOL_ERR_LIMIT, "");
    CHECK(need > sizeof tiny);

    /* FABPOOL_CONF full of nonsense: pool creation refuses each, naming the variable */
    static const char *const bad_confs[] = {
        "expandable_segments:True", "device:-1", "device:99999", "reserve:1KiB", "reserve:2EiB",
        "max_chunk:3MiB", "max_waste:101", "slab_max:0", "thread_cache:maybe", "handle_type:ipc",
        "peers:1;1", "metadata:tcmalloc", ",,,", "max_chunk:18446744073709551616",
        "reserve:99999999999999999999TiB", "cache_limit:-5", "stats_print:3", "shrink_hysteresis:1e3",
        "device:1,device", ":", "\xff\xfe", "max_waste:25%%", "max_chunk: 2MiB",
    };
    int n_bad = 0;
    for (size_t i = 0; i < sizeof bad_confs / sizeof bad_confs[0]; i++) {
        setenv("FABPOOL_CONF", bad_confs[i], 1);
        fabpool_t *q = NULL;
        st = fabpool_create(NULL, &q);
        t_checks++;
        if (st != FABPOOL_ERR_CONFIG || q || !strstr(fabpool_last_error(), "FABPOOL_CONF")) {
            t_failures++;
            fprintf(stderr, "FABPOOL_CONF='%s' -> %s: %s\n", bad_confs[i], fabpool_status_name(st),
                    fabpool_last_error());
            if (q)
                fabpool_destroy(q);
        }
        n_bad++;
    }
    /* a long variable with its mistake at the end: the message still says what is wrong, the variable shown in
     * part (whole, it filled the message and the reason was cut off) */
    char long_conf[2048] = "";
    for (int i = 0; i < 100; i++)
        strcat(long_conf, "thread_cache:true,");
    strcat(long_conf, "max_chunk:3MiB");
    setenv("FABPOOL_CONF", long_conf, 1);
    fabpool_t *ql = NULL;
    EXPECT(fabpool_create(NULL, &ql), FABPOOL_ERR_CONFIG, "key 'thread_cache' is given twice");
    CHECK(ql == NULL && strstr(fabpool_last_error(), "FABPOOL_CONF='thread_cache:true,") &&
          strstr(fabpool_last_error(), "...': "));
    /* well-formed, but the pool's own device as its peer: refused at creation, not by the parser */
    setenv("FABPOOL_CONF", "peers:0", 1);
    fabpool_t *q0 = NULL;
    EXPECT(fabpool_create(NULL, &q0), FABPOOL_ERR_INVALID_ARG, "peer device 0");
    CHECK(q0 == NULL);
    unsetenv("FABPOOL_CONF");
    EXPECT(fabpool_options_parse(NULL, "device:0"), FABPOOL_ERR_INVALID_ARG, "");

    /* live data survived all of it */
    CHECK(get(live_small) == 1111);
    CHECK(get((char *)live_large + 24 * MB - 8) == 2222);
    CHECK(get((char *)fabpool_buffer_ptr(b) + 32 * MB - 8) == 3333);
    CHECK_OK(fabpool_free(p, live_small));
    CHECK_OK(fabpool_free(p, live_large));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(p));
    CHECK(t_near(t_held(), 0));
    fabsim_ledger l = t_ledger();
    CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0);
    printf("test_badinput: %d bad FABPOOL_CONF strings refused\n", n_bad);
    return t_done("test_badinput");
}
