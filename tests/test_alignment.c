/* test_alignment: the alignment fabpool.h promises, as cudaMalloc and RMM
 * promise it (CUDA_ALLOCATION_ALIGNMENT): a block of 256 bytes or more on a
 * multiple of 256, a smaller one on its size rounded up to a power of two
 * (at least 64), at every boundary of the class grid (each class's size,
 * size - 1 and size + 1) from 1 byte through the slab classes into the
 * medium and the large arena, with several blocks of a size live at once so
 * that blocks inside a slab count, not only its first; and
 * fabpool_alloc_aligned: every power of two from 1 to the granularity at
 * sizes on both sides of slab_max and of the medium arena, the base a
 * multiple of it, the block's bytes written and read back through the
 * driver, usable_size >= size, the block freed by fabpool_free, on a stream
 * with a recorded stream, and exported to a view; the pool's held memory
 * back to where it was after a trim; alignments that are not a power of two
 * or pass the granularity refused with FABPOOL_ERR_INVALID_ARG and a message
 * that says what is accepted. */
#include "testutil.h"

#define KB (1ull << 10)
#define MB (1ull << 20)

/* What fabpool.h promises for a block of `size` bytes. */
static uint64_t promised_align(uint64_t size)
{
    if (size >= 256)
        return 256;
    uint64_t a = 64;
    while (a < size)
        a *= 2;
    return a;
}

/* The granularity a pool of handle type none maps in (the driver's recommended one). */
static uint64_t granularity(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    return g;
}

/* n blocks of `size` live at once (fabpool_alloc, or fabpool_alloc_aligned with align != 0): each on a
 * multiple of what is promised, usable >= size, its two ends written and read back; then freed.  Returns
 * the failures. */
static int blocks_at(fabpool_t *p, uint64_t size, uint64_t align, int n)
{
    enum { N = 4 };
    void *b[N] = {0};
    size_t u[N] = {0};
    int bad = 0;
    uint64_t want = align > promised_align(size) ? align : promised_align(size);
    for (int i = 0; i < n && i < N; i++) {
        fabpool_status st = align ? fabpool_alloc_aligned(p, size, align, &b[i]) : fabpool_alloc(p, size, &b[i]);
        if (st != FABPOOL_OK || !b[i]) {
            fprintf(stderr, "%llu bytes (alignment %llu): %s\n", (unsigned long long)size, (unsigned long long)align,
                    fabpool_last_error());
            bad++;
            continue;
        }
        if ((uintptr_t)b[i] % want) {
            fprintf(stderr, "%llu bytes (alignment asked %llu): block %d at %p, not a multiple of %llu\n",
                    (unsigned long long)size, (unsigned long long)align, i, b[i], (unsigned long long)want);
            bad++;
        }
        CHECK_OK(fabpool_usable_size(p, b[i], &u[i]));
        if (u[i] < size) {
            fprintf(stderr, "%llu bytes: usable %zu\n", (unsigned long long)size, u[i]);
            bad++;
        }
        if (u[i] >= 16)
            t_put_tag(b[i], u[i], 0xa1e0000000000000ull + size * 8 + (uint64_t)i);
    }
    for (int i = 0; i < n && i < N; i++) {
        if (!b[i])
            continue;
        if (u[i] >= 16 && !t_tag_ok(b[i], u[i], 0xa1e0000000000000ull + size * 8 + (uint64_t)i)) {
            fprintf(stderr, "%llu bytes: block %d at %p did not read back what was written\n",
                    (unsigned long long)size, i, b[i]);
            bad++;
        }
        CHECK_OK(fabpool_free(p, b[i]));
    }
    CHECK(bad == 0);
    return bad;
}

/* The class grid's sizes, independently of the library: 64, 128, then the multiples of 256 up to 1 KiB, then
 * four per doubling: the class after c. */
static uint64_t grid_next(uint64_t c)
{
    if (c < 256)
        return c * 2;
    if (c < 1024)
        return c + 256;
    uint64_t lg = 63 - (uint64_t)__builtin_clzll(c);
    return c + (c == (1ull << lg) ? c / 4 : (1ull << lg) / 4);
}

/* Every size from 1 byte to 2 KiB (whatever grid a library has there), then every boundary of the grid up to
 * top; three blocks of each size live at once. */
static void boundaries(fabpool_t *p, uint64_t top, const char *what)
{
    int bad = 0, n = 0;
    for (uint64_t s = 1; s <= 2 * KB; s++, n++)
        bad += blocks_at(p, s, 0, 3);
    for (uint64_t c = 2 * KB; c <= top; c = grid_next(c))
        for (uint64_t s = c - 1; s <= c + 1; s++, n++)
            bad += blocks_at(p, s, 0, 3);
    printf("%s: %d sizes, every one to 2 KiB, then the class boundaries to %llu B, %d misaligned or lost\n",
           what, n, (unsigned long long)top + 1, bad);
    CHECK_OK(fabpool_check(p));
}

static void class_boundaries(void)
{
    /* default slab_max (4 KiB): slab classes, the medium arena up to 256 KiB, the large one above */
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    boundaries(p, 16 * MB, "slab_max 4 KiB");
    CHECK_OK(fabpool_destroy(p));
    /* slab classes up to 256 KiB (pages of 64 KiB, slabs of sixteen blocks and more) */
    p = t_pool("handle_type:none,slab_max:256KiB");
    if (!p)
        return;
    boundaries(p, 4 * MB, "slab_max 256 KiB");
    CHECK_OK(fabpool_destroy(p));
}

/* Every power of two from 1 to the granularity, at sizes around slab_max, the slab page and the medium
 * arena's limit; blocks live at once; then freed and trimmed: the driver holds what it held before. */
static void aligned_blocks(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    const uint64_t gran = granularity();
    CHECK(gran >= 2 * MB);
    int64_t held0 = t_held();
    const uint64_t sizes[] = {1, 48, 200, 256, 300, 1000, 4095, 4096, 4097, 5000, 64 * KB + 1, 256 * KB,
                              256 * KB + 1, 3 * MB + 5};
    int bad = 0, n = 0;
    for (uint64_t al = 1; al <= gran; al *= 2)
        for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++, n++)
            bad += blocks_at(p, sizes[k], al, 3);
    printf("fabpool_alloc_aligned: %d sizes x alignments 1 B..%llu B, %d misaligned or lost\n", n,
           (unsigned long long)gran, bad);
    /* a 100-byte block aligned to 4 KiB is a slab block of 4 KiB; one aligned to the granularity comes from
     * the medium arena */
    void *x = NULL;
    size_t u = 0;
    CHECK_OK(fabpool_alloc_aligned(p, 100, 4096, &x));
    CHECK_OK(fabpool_usable_size(p, x, &u));
    CHECK(u == 4096 && (uintptr_t)x % 4096 == 0);
    CHECK_OK(fabpool_free(p, x));
    CHECK_OK(fabpool_alloc_aligned(p, 100, gran, &x));
    CHECK_OK(fabpool_usable_size(p, x, &u));
    CHECK(u >= 100 && u < gran && (uintptr_t)x % gran == 0);
    CHECK_OK(fabpool_free(p, x));
    /* an alignment the block has anyway: fabpool_alloc's own block */
    CHECK_OK(fabpool_alloc_aligned(p, 1000, 256, &x));
    CHECK_OK(fabpool_usable_size(p, x, &u));
    CHECK(u == 1024);
    CHECK_OK(fabpool_free(p, x));
    CHECK_OK(fabpool_check(p));
    CHECK(t_stats(p).blocks == 0);
    CHECK_OK(fabpool_trim(p, 0));
    CHECK(t_stats(p).mapped_bytes == 0);
    CHECK(t_held() == held0);
    CHECK_OK(fabpool_destroy(p));
}

/* An aligned block is a block like any other: freed on a stream after another stream was recorded, and
 * exported to a view whose bytes are the block's. */
static void aligned_block_calls(void)
{
    /* no owner stream: the block waits in the queue for both streams */
    fabpool_t *p = t_pool("handle_type:auto,stream_owner:0"), *q = t_pool("handle_type:auto");
    CUstream s = NULL, s2 = NULL;
    CHECK_CU(cuStreamCreate(&s, 0));
    CHECK_CU(cuStreamCreate(&s2, 0));
    if (!p || !q || !s || !s2) {
        fabpool_destroy(q);
        fabpool_destroy(p);
        return;
    }
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc_aligned(p, 5000, 64 * KB, &a));
    CHECK((uintptr_t)a % (64 * KB) == 0);
    CHECK_OK(fabpool_record_stream(p, a, s2));
    CHECK_OK(fabpool_free_on_stream(p, a, s));
    CHECK(t_stats(p).stream_pending_blocks == 1);
    CHECK_STATUS(fabpool_free(p, a), FABPOOL_ERR_DOUBLE_FREE);
    CHECK_OK(fabpool_collect(p, 1));
    CHECK(t_stats(p).stream_pending_blocks == 0 && t_stats(p).blocks == 0);

    CHECK_OK(fabpool_alloc_aligned(p, 3000, 2048, &b));
    CHECK((uintptr_t)b % 2048 == 0);
    t_put_word(b, 0x5eed5eed12345678ull);
    if (fabpool_handle_type_of(p) == FABPOOL_HANDLE_POSIX_FD) {
        unsigned char desc[4096];
        int fds[16], dups[16];
        size_t len = 0, nfds = 0, off = 0;
        CHECK_OK(fabpool_block_export(p, b, desc, sizeof desc, &len, fds, 16, &nfds, &off));
        CHECK(nfds >= 1 && nfds <= 16);
        for (size_t i = 0; i < nfds && i < 16; i++)
            dups[i] = dup(fds[i]); /* the pool keeps its own; the view takes these */
        fabpool_view_t *v = NULL;
        CHECK_OK(fabpool_view_open(q, desc, len, dups, nfds, &v));
        if (v) {
            CHECK(t_get_word((char *)fabpool_view_ptr(v) + off) == 0x5eed5eed12345678ull);
            CHECK_OK(fabpool_view_close(v));
        }
    } else {
        printf("aligned_block_calls: handle type %d, not posix_fd: no export\n", (int)fabpool_handle_type_of(p));
    }
    CHECK_OK(fabpool_free(p, b));
    CHECK_OK(fabpool_check(p));
    cuStreamDestroy(s);
    cuStreamDestroy(s2);
    CHECK_OK(fabpool_destroy(q));
    CHECK_OK(fabpool_destroy(p));
}

/* Alignments that are not a power of two, or pass the granularity: refused, *out NULL, nothing allocated. */
static void bad_alignments(void)
{
    fabpool_t *p = t_pool("handle_type:none");
    if (!p)
        return;
    const uint64_t gran = granularity();
    const size_t bad[] = {0, 3, 48, 96, 257, 1000, (size_t)gran + 256, (size_t)gran * 2, (size_t)1 << 40,
                          SIZE_MAX, (SIZE_MAX >> 1) + 1};
    for (unsigned k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        void *x = (void *)1;
        CHECK_STATUS(fabpool_alloc_aligned(p, 4096, bad[k], &x), FABPOOL_ERR_INVALID_ARG);
        CHECK(x == NULL);
        CHECK(strstr(fabpool_last_error(), "power of two") != NULL);
        CHECK_STATUS(fabpool_alloc_aligned(p, 0, bad[k], &x), FABPOOL_ERR_INVALID_ARG);
    }
    char want[64];
    snprintf(want, sizeof want, "from 1 to %llu bytes", (unsigned long long)gran);
    void *x = (void *)1;
    CHECK_STATUS(fabpool_alloc_aligned(p, 1, gran * 2, &x), FABPOOL_ERR_INVALID_ARG);
    CHECK(strstr(fabpool_last_error(), want) != NULL);
    /* size 0 as fabpool_alloc answers it; NULL pool and output refused */
    CHECK_OK(fabpool_alloc_aligned(p, 0, 4096, &x));
    CHECK(x == NULL);
    CHECK_STATUS(fabpool_alloc_aligned(NULL, 64, 64, &x), FABPOOL_ERR_INVALID_ARG);
    CHECK_STATUS(fabpool_alloc_aligned(p, 64, 64, NULL), FABPOOL_ERR_INVALID_ARG);
    /* a size past the reservation: refused by fabpool_alloc's own check, with the alignment named */
    CHECK(fabpool_alloc_aligned(p, SIZE_MAX - 100, 4096, &x) != FABPOOL_OK && x == NULL);
    CHECK(strstr(fabpool_last_error(), "fabpool_alloc_aligned") != NULL);
    fabpool_stats s = t_stats(p);
    CHECK(s.blocks == 0 && s.mapped_bytes == 0);
    CHECK_OK(fabpool_destroy(p));
}

int main(void)
{
    t_driver_init();
    class_boundaries();
    aligned_blocks();
    aligned_block_calls();
    bad_alignments();
    return t_done("test_alignment");
}
