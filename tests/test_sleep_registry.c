/* test_sleep_registry: fabpool_sleep and fabpool_wake follow the device
 * layer's registry of mappings (lib/device/mapreg.h).  A sleep unmaps every
 * arena and buffer chunk it lists (the registry then lists none, the stats
 * map nothing), offloads the bytes of those it marks copy and discards the
 * rest; wake lists each again as it was, its mark included, so that the
 * next sleep discards the same chunk; fabpool_check agrees with the
 * registry asleep and awake; the bytes offloaded read back.
 *
 * White-box: it includes lib/pool/pool.h to mark a chunk as its owner would
 * (fp_chunk_set_copy: a buffer's retired chunk, whose bytes no one reads). */
#include "testutil.h"

#include "pool.h"

#define MB (1ull << 20)

/* The arena and buffer chunks the registry lists: their count and bytes. */
static uint64_t sleeping_kinds(fabpool_t *p, uint64_t *bytes)
{
    uint64_t n = 0;
    *bytes = 0;
    fp_lock(&p->sp.lock);
    for (size_t i = 0; i < p->ch.reg.n; i++)
        if (FP_MAP_SLEEPS(p->ch.reg.m[i].kind)) {
            n++;
            *bytes += p->ch.reg.m[i].size;
        }
    fp_unlock(&p->sp.lock);
    return n;
}

/* The copy mark of the registry's mapping at va (-1: none listed there). */
static int copy_mark(fabpool_t *p, uint64_t va)
{
    fp_lock(&p->sp.lock);
    const fp_mapping *m = fp_mapreg_find(&p->ch.reg, va);
    int c = m ? m->copy : -1;
    fp_unlock(&p->sp.lock);
    return c;
}

static void set_copy(fabpool_t *p, uint64_t va, int copy)
{
    fp_lock(&p->sp.lock);
    fp_chunk_set_copy(&p->ch, va, copy);
    fp_unlock(&p->sp.lock);
}

/* Sleeps with offload and wakes: what was offloaded and discarded, and that
 * while asleep the registry listed no arena or buffer chunk and check
 * agreed. */
static fabpool_sleep_info sleep_wake(fabpool_t *p, uint64_t n_before, uint64_t bytes_before)
{
    fabpool_sleep_info si = {.struct_size = sizeof si};
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_OK(fabpool_sleep_state(p, &si));
    uint64_t bytes = 0;
    CHECK(sleeping_kinds(p, &bytes) == 0 && bytes == 0);
    CHECK(t_mapped(p) == 0);
    CHECK(si.offloaded_bytes + si.discarded_bytes == bytes_before);
    CHECK(atomic_load(&p->ch.reg.count[FP_MAP_HOST]) == si.host_copies); /* the host copies are listed too */
    CHECK_OK(fabpool_check(p));
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK(sleeping_kinds(p, &bytes) == n_before && bytes == bytes_before);
    CHECK(atomic_load(&p->ch.reg.count[FP_MAP_HOST]) == 0);
    CHECK_OK(fabpool_check(p));
    return si;
}

int main(void)
{
    int sim = t_driver_init();
    fabsim_ledger l0 = t_ledger();
    fabpool_t *p = t_pool(NULL);
    if (!p)
        return t_done("test_sleep_registry");
    void *blk = NULL;
    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_alloc(p, 20 * MB, &blk));
    CHECK_OK(fabpool_buffer_create(p, 256 * MB, 8 * MB, &b));
    CHECK_OK(fabpool_buffer_resize(b, 24 * MB, NULL)); /* two chunks or more */
    if (!blk || !b)
        return t_done("test_sleep_registry");
    void *base = fabpool_buffer_ptr(b);
    t_put_tag(blk, 20 * MB, 11);
    t_put_tag(base, 8 * MB, 12);
    CHECK_OK(fabpool_trim(p, 0)); /* what sleep would trim first goes now, so that the sums below are sleep's */

    /* the buffer's last chunk marked as its owner marks a retired one */
    uint64_t last = 0;
    fp_lock(&p->sp.lock);
    CHECK(b->n >= 2);
    last = b->base + b->chunks[b->n - 1].off;
    uint64_t last_size = b->chunks[b->n - 1].size;
    fp_unlock(&p->sp.lock);
    uint64_t bytes = 0, n = sleeping_kinds(p, &bytes);
    CHECK(n >= 3 && copy_mark(p, last) == 1);
    set_copy(p, last, 0);

    fabpool_sleep_info si = sleep_wake(p, n, bytes);
    CHECK(si.discarded_bytes == last_size);
    CHECK(copy_mark(p, last) == 0); /* listed again as it was */
    CHECK(t_tag_ok(blk, 20 * MB, 11) && t_tag_ok(base, 8 * MB, 12));
    CHECK(t_mapped(p) == bytes);

    si = sleep_wake(p, n, bytes); /* the mark held through the wake */
    CHECK(si.discarded_bytes == last_size);

    set_copy(p, last, 1);
    t_put_tag(base, 24 * MB, 13);
    si = sleep_wake(p, n, bytes);
    CHECK(si.discarded_bytes == 0 && si.offloaded_bytes == bytes);
    CHECK(t_tag_ok(blk, 20 * MB, 11) && t_tag_ok(base, 24 * MB, 13));

    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_free(p, blk));
    CHECK_OK(fabpool_destroy(p));
    if (sim)
        CHECK(t_ledger().bytes_held == l0.bytes_held);
    return t_done("test_sleep_registry");
}
