/* test_threads: 16 threads on one pool at once.  Each thread allocates and
 * frees blocks across the size classes (writing and reading back a tag in
 * each), hands half of its blocks to the next thread through a mailbox (so
 * blocks are freed by a thread that did not allocate them), grows and shrinks
 * a buffer of its own with data checks, and every fourth thread also exports
 * its buffer and opens, applies and closes a view of it in a second pool.
 * Runs in the normal suite, under TSan and under ASan+UBSan (.ci/reliability),
 * and on the real driver.  argv[1]: rounds per thread (default 300). */
#include <pthread.h>
#include <unistd.h>

#include "../testutil.h"

#define MB (1ull << 20)
#define NT 16
#define MAILBOX 64

static fabpool_t *pool, *peer_pool;
static int rounds = 300;
static _Atomic int bad, ops;

static struct mailbox {
    pthread_mutex_t lock;
    void *blk[MAILBOX];
    uint64_t tag[MAILBOX];
    int n;
} box[NT];

static void put(uint64_t at, uint64_t v) { cuMemcpyHtoD((CUdeviceptr)at, &v, sizeof v); }
static uint64_t get(uint64_t at)
{
    uint64_t v = ~0ull;
    cuMemcpyDtoH(&v, (CUdeviceptr)at, sizeof v);
    return v;
}
static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}
static void fail(const char *what, int id)
{
    fprintf(stderr, "thread %d: %s: %s\n", id, what, fabpool_last_error());
    bad++;
}

static void share_round(int id, fabpool_buffer_t *b, size_t size)
{
    static __thread uint8_t desc[1 << 14];
    int fds[64];
    size_t len, nfds;
    if (fabpool_buffer_export(b, 0, desc, sizeof desc, &len, fds, 64, &nfds) != FABPOOL_OK) {
        fail("export", id);
        return;
    }
    int mine[64];
    for (size_t i = 0; i < nfds; i++)
        mine[i] = dup(fds[i]);
    fabpool_buffer_export_done(b);
    fabpool_view_t *v = NULL;
    if (fabpool_view_open(peer_pool, desc, len, mine, nfds, &v) != FABPOOL_OK) {
        fail("view open", id);
        return;
    }
    uint64_t vb = (uint64_t)(uintptr_t)fabpool_view_ptr(v);
    if (get(vb) != (uint64_t)id || get(vb + size - 8) != (uint64_t)id + 100)
        fail("view data", id);
    put(vb + 8, 4242 + (uint64_t)id); /* the view writes, the buffer reads */
    if (get((uint64_t)(uintptr_t)fabpool_buffer_ptr(b) + 8) != 4242 + (uint64_t)id)
        fail("view write", id);
    if (fabpool_view_close(v) != FABPOOL_OK)
        fail("view close", id);
    fabpool_buffer_peers_ack(b, UINT64_MAX);
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    cuCtxSetCurrent(t_ctx);
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
    void *held[32];
    uint64_t tags[32];
    int nh = 0;
    fabpool_buffer_t *b = NULL;
    size_t bsz = 4 * MB;
    if (fabpool_buffer_create(pool, 256 * MB, bsz, &b) != FABPOOL_OK) {
        fail("buffer create", id);
        return NULL;
    }
    uint64_t base = (uint64_t)(uintptr_t)fabpool_buffer_ptr(b);
    put(base, (uint64_t)id);
    for (int r = 0; r < rounds; r++) {
        /* allocate: sizes across classes, mostly small, some large */
        int k = (int)(rnd(&seed) % 16);
        size_t sz = k < 12 ? (size_t)(256u << (rnd(&seed) % 12)) + rnd(&seed) % 256 : (size_t)(5 + rnd(&seed) % 20) * MB;
        void *x = NULL;
        if (fabpool_alloc(pool, sz, &x) != FABPOOL_OK) {
            fail("alloc", id);
            continue;
        }
        uint64_t tag = ((uint64_t)id << 32) | (uint64_t)r;
        put((uint64_t)(uintptr_t)x, tag);
        put((uint64_t)(uintptr_t)x + (sz & ~(size_t)7) - 8, ~tag);
        if (nh == 32) {
            int j = (int)(rnd(&seed) % 32);
            if (fabpool_free(pool, held[j]) != FABPOOL_OK)
                fail("free", id);
            held[j] = held[--nh];
            tags[j] = tags[nh];
        }
        held[nh] = x;
        tags[nh++] = tag;
        if (get((uint64_t)(uintptr_t)x) != tag)
            fail("block data", id);
        /* hand one block to the next thread; free what others handed us */
        if (r % 2 == 0 && nh > 0) {
            struct mailbox *m = &box[(id + 1) % NT];
            pthread_mutex_lock(&m->lock);
            if (m->n < MAILBOX) {
                m->blk[m->n] = held[nh - 1];
                m->tag[m->n++] = tags[nh - 1];
                nh--;
            }
            pthread_mutex_unlock(&m->lock);
        }
        struct mailbox *mine = &box[id];
        pthread_mutex_lock(&mine->lock);
        while (mine->n > 0) {
            mine->n--;
            if (get((uint64_t)(uintptr_t)mine->blk[mine->n]) != mine->tag[mine->n])
                fail("handed block data", id);
            if (fabpool_free(pool, mine->blk[mine->n]) != FABPOOL_OK)
                fail("free of a handed block", id);
        }
        pthread_mutex_unlock(&mine->lock);
        /* grow or shrink the buffer; its first word and its last survive */
        if (r % 5 == 0) {
            size_t nsz = (size_t)(2 + rnd(&seed) % 120) * MB;
            if (fabpool_buffer_resize(b, nsz, NULL) != FABPOOL_OK) {
                fail("resize", id);
            } else {
                if (get(base) != (uint64_t)id)
                    fail("buffer data after resize", id);
                if (nsz > bsz && get(base + bsz - 8) != (uint64_t)id + 100 && r > 0)
                    fail("buffer tail after grow", id);
                bsz = nsz;
                put(base + bsz - 8, (uint64_t)id + 100);
            }
        }
        if (id % 4 == 0 && r % 25 == 0 && peer_pool)
            share_round(id, b, bsz);
        if (r % 50 == 0)
            fabpool_trim(pool, 64 * MB);
        ops++;
    }
    for (int i = 0; i < nh; i++) {
        if (get((uint64_t)(uintptr_t)held[i]) != tags[i])
            fail("block data at the end", id);
        if (fabpool_free(pool, held[i]) != FABPOOL_OK)
            fail("final free", id);
    }
    fabpool_buffer_peers_ack(b, UINT64_MAX);
    if (fabpool_buffer_destroy(b, NULL) != FABPOOL_OK)
        fail("buffer destroy", id);
    fabpool_thread_flush(pool);
    return NULL;
}

int main(int argc, char **argv)
{
    t_driver_init();
    if (argc > 1)
        rounds = atoi(argv[1]);
    CHECK_OK(fabpool_create(NULL, &pool));
    if (!pool)
        return t_done("test_threads");
    if (fabpool_handle_type_of(pool) != FABPOOL_HANDLE_NONE)
        CHECK_OK(fabpool_create(NULL, &peer_pool));
    for (int i = 0; i < NT; i++)
        pthread_mutex_init(&box[i].lock, NULL);
    pthread_t th[NT];
    for (int i = 0; i < NT; i++)
        pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < NT; i++)
        pthread_join(th[i], NULL);
    /* blocks still in mailboxes (handed after their receiver finished) */
    for (int i = 0; i < NT; i++)
        for (int j = 0; j < box[i].n; j++) {
            CHECK(get((uint64_t)(uintptr_t)box[i].blk[j]) == box[i].tag[j]);
            CHECK_OK(fabpool_free(pool, box[i].blk[j]));
        }
    CHECK(bad == 0);
    fabpool_stats s = {.struct_size = sizeof s};
    CHECK_OK(fabpool_get_stats(pool, &s));
    CHECK(s.blocks == 0 && s.buffers == 0);
    CHECK_OK(fabpool_destroy(pool));
    if (peer_pool)
        CHECK_OK(fabpool_destroy(peer_pool));
    CHECK(t_near(t_held(), 0));
    fabsim_ledger l = t_ledger();
    CHECK(l.handles == 0 && l.mappings == 0 && l.reservations == 0 && l.exported_fds == 0 && l.bytes_held == 0);
    printf("test_threads: %d threads, %d rounds each, %d rounds done, %d errors; peak mapped %llu MiB\n", NT, rounds,
           (int)ops, (int)bad, (unsigned long long)(s.mapped_bytes_peak >> 20));
    return t_done("test_threads");
}
