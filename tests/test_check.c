/* test_check: fabpool_check passes on healthy pools of every kind
 * (slabs with thread caches, large blocks, buffers with retiring chunks, an
 * exported buffer and its view, an exported block) and catches each invariant broken on
 * purpose, with FABPOOL_ERR_CORRUPT and a message that names it.
 *
 * White-box: it includes lib/pool.h to reach the structures it corrupts (the
 * same build's headers, so the layout is the library's, FP_DEBUG_LOCKS or
 * not).  Every corruption is undone right after its check, and the pools
 * must check clean again, so the test also shows the check has no memory of
 * an earlier failure; at the end everything is destroyed and the driver
 * holds nothing.
 *
 * Then fabpool_check beside threads that allocate and free (through their
 * thread caches, on a pool without them, and on two streams): every check
 * answers OK (no invariant seems broken by work in flight), without a data
 * race (the TSan build runs it), and a thread that holds a cache and sleeps
 * does not hide a broken free stack. */
#include <pthread.h>

#include <unistd.h>

#include "testutil.h"

#include "pool.h"

#define MB (1ull << 20)

static fabpool_t *A, *B;
static uint64_t gran;
static int n_broken;

/* fabpool_check of pool p answers CORRUPT with tag in its message. */
static void expect_broken(fabpool_t *p, const char *tag, const char *what)
{
    n_broken++;
    fabpool_status st = fabpool_check(p);
    const char *msg = fabpool_last_error();
    CHECK(st == FABPOOL_ERR_CORRUPT && strstr(msg, tag) != NULL);
    if (st != FABPOOL_ERR_CORRUPT || !strstr(msg, tag))
        fprintf(stderr, "  %s: expected %s, got %s: %s\n", what, tag, fabpool_status_name(st), msg);
    else
        printf("  %-28s -> %s\n", what, msg);
}

static void expect_clean(const char *when)
{
    fabpool_status sa = fabpool_check(A);
    char ma[1024];
    snprintf(ma, sizeof ma, "%s", fabpool_last_error());
    fabpool_status sb = fabpool_check(B);
    CHECK(sa == FABPOOL_OK && sb == FABPOOL_OK);
    if (sa != FABPOOL_OK || sb != FABPOOL_OK)
        fprintf(stderr, "  %s: fabpool_check: %s%s\n", when, sa != FABPOOL_OK ? ma : "", sb != FABPOOL_OK ? fabpool_last_error() : "");
}

static fp_span *slab_of(fabpool_t *p, void *ptr)
{
    fp_span *s = (fp_span *)fp_map_get(&p->sp.map, (uint64_t)(uintptr_t)ptr);
    CHECK(s && s->kind == FP_SPAN_SLAB);
    return s;
}

/* fabpool_free's hit finds a block's index without comparing it with the slab's count: the address one block
 * past the last, in the slab's tail, must still be refused (its flag there is not a block's) and change
 * nothing.  A size whose slab has such a tail is looked for among the slab classes. */
static void tail_free_refused(fabpool_t *p)
{
    int tried = 0;
    for (size_t size = 320; size <= 4096 && !tried; size += 64) {
        void *blk = NULL;
        CHECK_OK(fabpool_alloc(p, size, &blk));
        fp_span *s = blk ? slab_of(p, blk) : NULL;
        uint64_t tail = s ? s->base + (uint64_t)s->nobj * s->obj_bytes : 0;
        if (s && tail < s->base + s->size) {
            tried = 1;
            CHECK_STATUS(fabpool_free(p, (void *)(uintptr_t)tail), FABPOOL_ERR_NOT_FOUND);
            CHECK(strstr(fabpool_last_error(), "interior") != NULL);
            CHECK(atomic_load(&s->freeflag[s->nobj]) == FP_FREEFLAG_FREE);
            void *again = NULL;
            for (int i = 0; i < 3 * (int)s->nobj; i++) {   /* nothing of the slab hands out the tail */
                CHECK_OK(fabpool_alloc(p, size, &again));
                CHECK((uint64_t)(uintptr_t)again != tail);
                CHECK_OK(fabpool_free(p, again));
            }
            printf("test_check: a free of %zu-byte blocks' slab tail (block %u of %u) refused\n", size, s->nobj, s->nobj);
        }
        CHECK_OK(fabpool_free(p, blk));
    }
    CHECK(tried);
    expect_clean("after a free of a slab's tail");
}

static void break_slabs(fabpool_t *p, void **live, fp_span *s)
{
    fp_class *c = &p->heap.classes[s->cls];
    uint32_t idx = 0;
    CHECK(fp_slab_index(s, (uint64_t)(uintptr_t)live[0], &idx));
    CHECK(s->nfree >= 2 && s->list == FP_LIST_PARTIAL);

    atomic_store(&s->freeflag[idx], 1); /* a live block marked free */
    expect_broken(p, "[slab.flags]", "live block flagged free");
    atomic_store(&s->freeflag[idx], 0);

    atomic_store(&s->freeflag[idx], 4);
    expect_broken(p, "[slab.flags]", "flag not 0, 1, 2 or 3");
    atomic_store(&s->freeflag[idx], 2); /* pending on a stream, but the stream queue does not hold it */
    expect_broken(p, "[retire.pending]", "block pending without its queue record");
    atomic_store(&s->freeflag[idx], 3); /* used on recorded streams, but the stream queue has no record */
    expect_broken(p, "[retire.uses]", "block recorded without its streams");
    atomic_store(&s->freeflag[idx], 0);

    uint32_t keep = s->free_stack[0];
    s->free_stack[0] = s->free_stack[1]; /* one free block twice on the stack, another lost */
    expect_broken(p, "[slab.stack]", "block twice on free stack");
    s->free_stack[0] = s->nobj + 5;
    expect_broken(p, "[slab.stack]", "free-stack entry past end");
    s->free_stack[0] = idx; /* a live block on the free stack (its flag is clear) */
    expect_broken(p, "[slab.flags]", "live block on free stack");
    s->free_stack[0] = keep;

    s->nfree--; /* the count says one block fewer than the flags */
    expect_broken(p, "[slab.flags]", "free count below flags");
    s->nfree++;

    s->list = FP_LIST_EMPTY;
    expect_broken(p, "[slab.list]", "slab marked on wrong list");
    s->list = FP_LIST_PARTIAL;

    c->nslabs++;
    expect_broken(p, "[class.count]", "class slab count");
    c->nslabs--;

    fp_span *head = c->partial;
    c->partial = NULL;
    expect_broken(p, "[class.list]", "partial list lost a slab");
    c->partial = head;

    s->cls ^= 1;
    expect_broken(p, "[slab.shape]", "slab of another class");
    s->cls ^= 1;

    atomic_fetch_add(&p->use.slab_out, c->obj_size); /* the in-use mark counts a block still in its class */
    expect_broken(p, "[usage.slab_out]", "in-use mark's slab bytes");
    atomic_fetch_sub(&p->use.slab_out, c->obj_size);
    fp_arena *ma = &p->heap.arenas[FP_ARENA_MEDIUM];
    /* the slab's run no longer a block of its arena */
    fp_rid run = fp_arena_block_id(ma, s->base);
    fp_arena_block_unlist(ma, s->base);
    expect_broken(p, "[slab.arena]", "slab not a block of the medium arena");
    fp_arena_block_list(ma, s->base, run);

    /* the thread cache: a block twice in a bin, a block of another class */
    fp_tcache *tc = p->alloc.tcaches;
    CHECK(tc != NULL);
    if (tc) {
        fp_titem *items = tc->lo[s->cls];
        uint32_t n = fp_bin_n(tc, s->cls);
        CHECK(n >= 2);
        if (n >= 2) {
            fp_titem keep0 = items[0];
            items[0] = items[1];
            expect_broken(p, "[tcache.block]", "block twice in a thread cache");
            items[0] = keep0;
            uint64_t ptr = items[n - 1].ptr;
            items[n - 1].ptr = ptr + 8; /* not a block start */
            expect_broken(p, "[tcache.block]", "interior pointer in a bin");
            items[n - 1].ptr = ptr;
        }
    }
    expect_clean("after the slab corruptions");

    /* the thread cache's medium blocks: one whose state byte no longer says it is cached (the cache takes
     * them again first: the setup's sizes never repeated, so it had stopped) */
    void *m = NULL;
    if (tc)
        tc->moff = 0;
    CHECK_OK(fabpool_alloc(p, 20000, &m));
    CHECK_OK(fabpool_free(p, m));
    int found = 0;
    for (unsigned k = 1; tc && k <= FP_MSTATE_MAX && !found; k++)
        if (tc->mn[k]) {
            found = 1;
            _Atomic uint8_t *f = tc->mitems[k][0].flag;
            atomic_store(f, (uint8_t)k);
            expect_broken(p, "[tcache.medium]", "cached medium block given out");
            atomic_store(f, FP_MSTATE_CACHED);
            atomic_fetch_add(&tc->mbytes, 256);
            expect_broken(p, "[tcache.medium]", "medium bytes miscounted");
            atomic_fetch_sub(&tc->mbytes, 256);
        }
    CHECK(found);
    expect_clean("after the medium cache's corruptions");
}

static void break_map(fabpool_t *p, fp_span *s)
{
    uint64_t page = 1ull << p->sp.page_shift;
    fp_lock(&p->sp.lock); /* fp_map_set asserts it in a FP_DEBUG_LOCKS build */
    fp_map_set(&p->sp.map, s->base, page, NULL);
    fp_unlock(&p->sp.lock);
    expect_broken(p, "[map.span]", "slab page unmapped in map");
    fp_lock(&p->sp.lock);
    fp_map_set(&p->sp.map, s->base, page, s);
    uint64_t free_va = p->sp.va.free[0].start;
    int set = fp_map_set(&p->sp.map, free_va, page, s);
    fp_unlock(&p->sp.lock);
    CHECK(set == 0);
    expect_broken(p, "[map.stray]", "free address in page map");
    fp_lock(&p->sp.lock);
    fp_map_set(&p->sp.map, free_va, page, NULL);
    fp_unlock(&p->sp.lock);
    expect_clean("after the page-map corruptions");
}

static void break_va(fabpool_t *p, fp_span *s)
{
    uint64_t fb = p->sp.va.free_bytes;
    p->sp.va.free_bytes -= gran;
    expect_broken(p, "[va.free_bytes]", "free bytes miscounted");
    p->sp.va.free_bytes = fb;

    CHECK(fp_va_free(&p->sp.va, s->base, s->size) == 0); /* a slab's range handed back while in use */
    expect_broken(p, "[va.free_used]", "used range also free");
    CHECK(fp_va_take(&p->sp.va, s->base, s->size) == 0);

    uint64_t lost = p->sp.va.free[0].start;
    CHECK(fp_va_take(&p->sp.va, lost, gran) == 0); /* address space taken by nothing */
    expect_broken(p, "[va.sum]", "address space leaked");
    CHECK(fp_va_free(&p->sp.va, lost, gran) == 0);

    /* two free ranges made to touch: a granule taken out of the first one splits it */
    uint64_t mid = p->sp.va.free[0].start + gran;
    CHECK(p->sp.va.free[0].size >= 3 * gran && fp_va_take(&p->sp.va, mid, gran) == 0);
    CHECK(p->sp.va.n >= 2 && p->sp.va.free[1].start == mid + gran);
    uint64_t sz = p->sp.va.free[0].size;
    p->sp.va.free[0].size = p->sp.va.free[1].start - p->sp.va.free[0].start;
    expect_broken(p, "[va.sorted]", "free ranges touch");
    p->sp.va.free[0].size = sz;
    CHECK(fp_va_free(&p->sp.va, mid, gran) == 0);
    expect_clean("after the address-space corruptions");
}

/* The first free range of arena a in address order, of at least min bytes. */
static fp_piece *free_range(fp_arena *a, uint64_t min)
{
    for (size_t i = 0; i < a->n_runs; i++)
        for (fp_piece *q = a->runs[i].head; q; q = q->anext)
            if (q->state == FP_LARGE_FREE && fp_piece_size(q) >= min)
                return q;
    return NULL;
}

static void break_arenas(fabpool_t *p)
{
    fp_arena *a = &p->heap.arenas[FP_ARENA_LARGE];
    fp_piece *f = free_range(a, 2 * gran);
    CHECK(f && f->aprev && a->n_chunks >= 2);
    if (!f || !f->aprev || a->n_chunks < 2)
        return;
    atomic_fetch_add(&p->heap.large_in_use_bytes, gran);
    expect_broken(p, "[large.in_use]", "large in-use counter");
    atomic_fetch_sub(&p->heap.large_in_use_bytes, gran);

    a->free_bytes += gran;
    expect_broken(p, "[arena.sums]", "arena free counter");
    a->free_bytes -= gran;

    /* a live block grown over the free range after it */
    fp_piece *l = f->aprev;
    CHECK(l->state == FP_LARGE_LIVE);
    l->size_q++;
    expect_broken(p, "[arena.run]", "pieces overlap");
    l->size_q--;

    f->state = FP_LARGE_LIVE;
    expect_broken(p, "[arena.blocks]", "a block not in the table");
    f->state = FP_LARGE_FREE;

    fp_arena_block_unlist(a, l->base);
    expect_broken(p, "[arena.blocks]", "a block lost from the table");
    fp_arena_block_list(a, l->base, fp_piece_rid(l));

    unsigned bin = f->bin;
    f->bin = bin ^ 1;
    expect_broken(p, "[arena.bin]", "free range in another bin");
    f->bin = bin;

    a->summary ^= 1ull << (bin / 64);
    expect_broken(p, "[arena.bin]", "bitmap summary bit");
    a->summary ^= 1ull << (bin / 64);

    /* a free range split in two touching pieces (a spare record for its high part) */
    CHECK(fp_arena_spare_reserve(a, 1) == 0);
    fp_piece *after = f->anext;
    fp_piece *half = fp_arena_piece_new(a, f->base + gran, fp_piece_size(f) - gran, FP_LARGE_FREE);
    half->aprev = f;
    half->anext = after;
    f->anext = half;
    fp_piece_resize(f, gran);
    if (after)
        after->aprev = half;
    expect_broken(p, "[arena.merge]", "touching free ranges");
    f->anext = after;
    if (after)
        after->aprev = f;
    f->size_q += half->size_q;
    fp_arena_piece_drop(a, half);

    /* a page of records that counts a spare record more than its list holds, and a piece that links to no
     * record: into its own page between two slots, and to memory outside the pages (never followed) */
    fp_piece_page *pg = a->recs.pages[fp_piece_rid(f) >> FP_PIECE_PAGE_SHIFT];
    pg->n_spare++;
    expect_broken(p, "[arena.records]", "spare records miscounted");
    pg->n_spare--;
    fp_piece *next = f->anext, outside = *f;
    f->anext = (fp_piece *)(void *)((char *)f + 8);
    expect_broken(p, "[arena.records]", "a link between two records");
    f->anext = &outside;
    expect_broken(p, "[arena.records]", "a link to no record");
    f->anext = next;
    /* a spare record of the cache (the half's, given back above) that is no record, and one counted twice */
    CHECK(a->recs.n_cache > 0);
    fp_piece *cached = a->recs.cache[0];
    a->recs.cache[0] = &outside;
    expect_broken(p, "[arena.records]", "a cached spare record that is no record");
    a->recs.cache[0] = cached;
    a->recs.n_spare++;
    expect_broken(p, "[arena.records]", "spare records in all miscounted");
    a->recs.n_spare--;

    fp_lchunk c0 = a->chunks[0];
    a->chunks[0] = a->chunks[1];
    a->chunks[1] = c0;
    expect_broken(p, "[arena.chunk]", "chunks out of order");
    a->chunks[1] = a->chunks[0];
    a->chunks[0] = c0;

    size_t k = 0;
    while (k + 1 < a->n_chunks && a->chunks[k].size < 2 * gran)
        k++;
    CHECK(a->chunks[k].size >= 2 * gran);
    a->chunks[k].size -= gran; /* the count follows: only the cover is wrong */
    a->mapped_bytes -= gran;
    expect_broken(p, "[arena.cover]", "run not covered by chunks");
    a->chunks[k].size += gran;
    a->mapped_bytes += gran;
    expect_clean("after the arena corruptions");
}

/* The device layer's registry of mappings against the layers' own walks: a buffer chunk it forgets, a view
 * chunk no view holds, sums that disagree with its list, a list out of order. */
static void break_registry(fabpool_t *p, fabpool_buffer_t *b)
{
    fp_mapreg *r = &p->ch.reg;
    uint64_t va = b->base + b->chunks[0].off, size = b->chunks[0].size;
    fp_mapping m;
    CHECK(fp_mapreg_remove(r, va, size, &m) == 0 && m.kind == FP_MAP_BUFFER && m.owner == b);
    expect_broken(p, "[pool.mapped]", "a buffer chunk unlisted");
    CHECK(fp_mapreg_reserve(r) == 0);
    fp_mapreg_add(r, va, size, FP_MAP_BUFFER, b);
    expect_clean("the buffer chunk listed again");

    uint64_t ghost = p->sp.va.base + p->sp.va.size; /* past the reservation: no mapping of the pool is there */
    CHECK(fp_mapreg_reserve(r) == 0);
    fp_mapreg_add(r, ghost, gran, FP_MAP_VIEW, NULL);
    expect_broken(p, "[pool.mapped]", "a view chunk no view holds");
    CHECK(fp_mapreg_remove(r, ghost, gran, NULL) == 0);

    atomic_fetch_add(&r->bytes[FP_MAP_ARENA], gran);
    expect_broken(p, "[registry.sums]", "mapped bytes");
    atomic_fetch_sub(&r->bytes[FP_MAP_ARENA], gran);
    atomic_fetch_add(&r->count[FP_MAP_BUFFER], 1);
    expect_broken(p, "[registry.sums]", "mapping count");
    atomic_fetch_sub(&r->count[FP_MAP_BUFFER], 1);

    CHECK(r->n >= 2);
    fp_mapping first = r->m[0];
    r->m[0].va = r->m[1].va;
    expect_broken(p, "[registry.list]", "mappings overlap");
    r->m[0] = first;
    expect_clean("after the registry corruptions");
}

static void break_buffer(fabpool_t *p, fabpool_buffer_t *b)
{
    CHECK(b->n >= 3 && !b->chunks[0].retiring && b->chunks[b->n - 1].retiring);
    if (b->n < 3)
        return;
    b->chunks[1].off += gran;
    expect_broken(p, "[buffer.contiguous]", "gap between chunks");
    b->chunks[1].off -= gran;

    b->chunks[0].size += gran;
    expect_broken(p, "[buffer.chunks]", "chunks overlap");
    b->chunks[0].size -= gran;

    b->live += gran;
    expect_broken(p, "[buffer.sums]", "buffer live bytes");
    b->live -= gran;

    uint64_t sz = b->size;
    b->size = b->live + 1;
    expect_broken(p, "[buffer.size]", "size beyond live");
    b->size = sz;

    b->kept = 1; /* released, but its handle live */
    expect_broken(p, "[buffer.handle]", "a released buffer's handle live");
    b->kept = 0;

    b->chunks[0].uses.n++;
    expect_broken(p, "[buffer.uses]", "a chunk with more tickets than room");
    b->chunks[0].uses.n--;

    b->chunks[0].retiring = 1;
    expect_broken(p, "[buffer.retire]", "retiring chunk before live one");
    b->chunks[0].retiring = 0;

    _Atomic uint64_t *stats[] = {&p->bufs.bytes, &p->bufs.mapped, &p->bufs.retiring_bytes, &p->bufs.count,
                                 &p->bufs.held_for_peers_bytes, &p->ch.exported_fds};
    for (size_t i = 0; i < sizeof stats / sizeof *stats; i++) {
        atomic_fetch_add(stats[i], 1);
        expect_broken(p, "[buffer.stats]", "a buffer counter");
        atomic_fetch_sub(stats[i], 1);
    }

    atomic_fetch_add(&p->heap.idle_slabs, gran);
    expect_broken(p, "[pool.idle]", "idle bytes");
    atomic_fetch_sub(&p->heap.idle_slabs, gran);

    expect_clean("after the buffer corruptions");
    break_registry(p, b);
}

static void break_view(fabpool_t *p, fabpool_view_t *v)
{
    CHECK(v->n >= 1);
    if (!v->n)
        return;
    atomic_fetch_add(&p->views.bytes, gran);
    expect_broken(p, "[view.stats]", "view bytes");
    atomic_fetch_sub(&p->views.bytes, gran);
    v->kept = 1; /* released, but its handle live */
    expect_broken(p, "[view.handle]", "a released view's handle live");
    v->kept = 0;
    uint64_t sz = v->chunks[0].size;
    v->chunks[0].size = v->window + gran;
    expect_broken(p, "[view.chunks]", "view chunk past window");
    v->chunks[0].size = sz;
    expect_clean("after the view corruptions");
}

/* The export anchor (one exported fd kept open) names a chunk the pool does not map, or its fd is closed. */
static void break_anchor(fabpool_t *p)
{
    if (fabpool_handle_type_of(p) != FABPOOL_HANDLE_POSIX_FD)
        return;
    CHECK(p->ch.anchor_size != 0);
    if (!p->ch.anchor_size)
        return;
    uint64_t va = p->ch.anchor_va;
    p->ch.anchor_va = va + gran;
    expect_broken(p, "[chunk.anchor]", "anchor off its chunk");
    p->ch.anchor_va = va;
    int fd = p->ch.anchor_fd, spare = dup(fd);
    close(fd);
    expect_broken(p, "[chunk.anchor]", "anchor's fd closed");
    CHECK(dup2(spare, fd) == fd);
    close(spare);
    expect_clean("after the anchor's corruptions");
}

static void break_kept(fabpool_t *p)
{
    CHECK(p->ch.n_kept >= 1);
    if (!p->ch.n_kept)
        return;
    fp_xchunk *x = &p->ch.kept[0];
    uint64_t va = x->va;
    x->va = p->sp.va.base + p->sp.va.size; /* past the reservation */
    expect_broken(p, "[chunk.kept]", "exported chunk off the heap");
    x->va = va;
    int fd = x->fd;
    x->fd = fd >= 0 ? -1 : 1;
    expect_broken(p, "[chunk.kept]", "exported chunk's fd");
    x->fd = fd;
    expect_clean("after the exported-chunk corruptions");
}

/* ---------------------------------------------------------------- beside other threads */

enum { NWORK = 4 };
static fabpool_t *busy_cached, *busy_uncached;
static CUstream busy_streams[2];
static _Atomic int busy_stop, busy_bad;
static _Atomic long busy_rounds[NWORK];

/* Allocates and frees blocks of every kind until told to stop: small and mid
 * sizes through the thread cache of busy_cached, the same on busy_uncached
 * (no thread cache: every call under the class lock), a large block now and
 * then, and a block freed on one stream and allocated on the other. */
static void *busy_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    static const size_t sizes[] = {64, 256, 1000, 4096, 40000, 300000};
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
    void *blk[32];
    while (!atomic_load(&busy_stop)) {
        for (int k = 0; k < 2; k++) {
            fabpool_t *p = k ? busy_uncached : busy_cached;
            int n = 0;
            for (; n < 32; n++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                size_t sz = (rng >> 60) == 0 ? 10 * MB : sizes[(rng >> 33) % 6];
                if (fabpool_alloc(p, sz, &blk[n]) != FABPOOL_OK) {
                    atomic_fetch_add(&busy_bad, 1);
                    break;
                }
            }
            for (int i = 0; i < n; i++) { /* in an order of their own */
                int j = (int)((rng >> (i % 32)) % (uint64_t)(n - i)) + i;
                void *t = blk[i];
                blk[i] = blk[j];
                blk[j] = t;
                if (fabpool_free(p, blk[i]) != FABPOOL_OK)
                    atomic_fetch_add(&busy_bad, 1);
            }
        }
        void *q = NULL;
        CUstream s = busy_streams[id & 1];
        if (fabpool_alloc_on_stream(busy_cached, 512, s, &q) != FABPOOL_OK ||
            fabpool_free_on_stream(busy_cached, q, busy_streams[(id + 1) & 1]) != FABPOOL_OK)
            atomic_fetch_add(&busy_bad, 1);
        atomic_fetch_add(&busy_rounds[id], 1);
    }
    fabpool_thread_flush(busy_cached);
    return NULL;
}

static void *parked_worker(void *arg)
{
    pthread_barrier_t *bar = arg;
    void *b[8];
    for (int i = 0; i < 8; i++)
        fabpool_alloc(busy_cached, 256, &b[i]);
    for (int i = 0; i < 8; i++)
        fabpool_free(busy_cached, b[i]); /* into this thread's cache, which the pool lists */
    pthread_barrier_wait(bar);
    pthread_barrier_wait(bar); /* asleep, its cache held, while the main thread checks */
    return NULL;
}

static void check_beside_threads(void)
{
    busy_cached = t_pool("stream_owner:false");
    busy_uncached = t_pool("thread_cache:false");
    if (!busy_cached || !busy_uncached)
        return;
    CHECK_CU(cuStreamCreate(&busy_streams[0], 0));
    CHECK_CU(cuStreamCreate(&busy_streams[1], 0));
    pthread_t th[NWORK];
    for (int i = 0; i < NWORK; i++)
        pthread_create(&th[i], NULL, busy_worker, (void *)(intptr_t)i);
    int checks = 0, corrupt = 0;
    for (;;) {
        long least = busy_rounds[0];
        for (int i = 1; i < NWORK; i++)
            if (busy_rounds[i] < least)
                least = busy_rounds[i];
        if (checks >= 400 && least >= 50)
            break;
        for (int k = 0; k < 2; k++) {
            fabpool_status st = fabpool_check(k ? busy_uncached : busy_cached);
            checks++;
            if (st != FABPOOL_OK && corrupt++ < 3)
                fprintf(stderr, "  beside %d threads, check %d: %s: %s\n", NWORK, checks, fabpool_status_name(st),
                        fabpool_last_error());
        }
    }
    atomic_store(&busy_stop, 1);
    for (int i = 0; i < NWORK; i++)
        pthread_join(th[i], NULL);
    CHECK(corrupt == 0 && busy_bad == 0);
    printf("test_check: %d checks beside %d threads that allocated and freed (%ld rounds of the slowest): %d "
           "failed\n", checks, NWORK, (long)busy_rounds[0], corrupt);
    CHECK_OK(fabpool_collect(busy_cached, 1));
    CHECK_OK(fabpool_check(busy_cached));
    CHECK_OK(fabpool_check(busy_uncached));

    /* a thread that holds a cache and sleeps: its blocks cannot be read, the free stacks still can */
    void *b[8];
    for (int i = 0; i < 8; i++)
        CHECK_OK(fabpool_alloc(busy_cached, 256, &b[i]));
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t parked;
    pthread_create(&parked, NULL, parked_worker, &bar);
    pthread_barrier_wait(&bar);
    CHECK_OK(fabpool_check(busy_cached));
    fp_span *s = slab_of(busy_cached, b[0]);
    if (s && s->nfree) {
        uint32_t keep = s->free_stack[0];
        s->free_stack[0] = s->nobj + 5;
        expect_broken(busy_cached, "[slab.stack]", "free-stack entry past end, a thread's cache asleep");
        s->free_stack[0] = keep;
    }
    CHECK_OK(fabpool_check(busy_cached));
    pthread_barrier_wait(&bar);
    pthread_join(parked, NULL); /* its cache went back to the pool as it exited */
    pthread_barrier_destroy(&bar);
    if (s) {
        uint32_t idx = 0;
        CHECK(fp_slab_index(s, (uint64_t)(uintptr_t)b[0], &idx));
        atomic_store(&s->freeflag[idx], 1); /* with no other thread's cache the count is exact again */
        expect_broken(busy_cached, "[slab.flags]", "live block flagged free, the other thread gone");
        atomic_store(&s->freeflag[idx], 0);
    }
    for (int i = 0; i < 8; i++)
        CHECK_OK(fabpool_free(busy_cached, b[i]));
    CHECK_OK(fabpool_check(busy_cached));
    CHECK_OK(fabpool_destroy(busy_cached));
    CHECK_OK(fabpool_destroy(busy_uncached));
    CHECK_CU(cuStreamDestroy(busy_streams[0]));
    CHECK_CU(cuStreamDestroy(busy_streams[1]));
}

/* Streams recorded on blocks and the blocks freed, by two threads with no thread cache (the PyTorch shim's
 * setting), while the main thread checks: a record is made before its block's flag and dropped after it, each
 * outside the check's locks, so a check may find the two apart; every check answers OK all the same (work in
 * flight is not reported), and a check after the threads are gone too. */
static fabpool_t *rec_pool;
static CUstream rec_streams[3];
static _Atomic int rec_stop, rec_bad;

static void *record_worker(void *arg)
{
    uint64_t rng = 0x2545f4914f6cdd1dull * (uint64_t)((intptr_t)arg + 1);
    CHECK_CU(cuCtxSetCurrent(t_ctx));
    while (!atomic_load(&rec_stop)) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int s = (int)((rng >> 33) % 3);
        size_t sz = (rng >> 40) % 4 ? 64 + (rng >> 20) % 4000 : 5000 + (rng >> 20) % 100000;
        void *b = NULL;
        if (fabpool_alloc_on_stream(rec_pool, sz, rec_streams[s], &b) != FABPOOL_OK) {
            atomic_fetch_add(&rec_bad, 1);
            continue;
        }
        if ((rng >> 50) & 1 && fabpool_record_stream(rec_pool, b, rec_streams[(s + 1) % 3]) != FABPOOL_OK)
            atomic_fetch_add(&rec_bad, 1);
        if (((rng >> 51) % 3 ? fabpool_free_on_stream(rec_pool, b, rec_streams[s]) : fabpool_free(rec_pool, b)) !=
            FABPOOL_OK)
            atomic_fetch_add(&rec_bad, 1);
    }
    return NULL;
}

static void check_beside_records(void)
{
    rec_pool = t_pool("thread_cache:false");
    if (!rec_pool)
        return;
    for (int i = 0; i < 3; i++)
        CHECK_CU(cuStreamCreate(&rec_streams[i], 0));
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, record_worker, (void *)(intptr_t)i);
    int checks = 0, corrupt = 0;
    for (; checks < 3000; checks++) {
        fabpool_status st = fabpool_check(rec_pool);
        if (st != FABPOOL_OK && corrupt++ < 3)
            fprintf(stderr, "  beside record_stream, check %d: %s: %s\n", checks, fabpool_status_name(st),
                    fabpool_last_error());
    }
    atomic_store(&rec_stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK(corrupt == 0 && rec_bad == 0);
    printf("test_check: %d checks beside two threads recording streams on their blocks: %d failed\n", checks,
           corrupt);
    for (int i = 0; i < 3; i++)
        CHECK_CU(cuStreamSynchronize(rec_streams[i]));
    CHECK_OK(fabpool_collect(rec_pool, 1));
    CHECK_OK(fabpool_check(rec_pool));
    CHECK_OK(fabpool_destroy(rec_pool));
    for (int i = 0; i < 3; i++)
        CHECK_CU(cuStreamDestroy(rec_streams[i]));
}

int main(void)
{
    int sim = t_driver_init();
    CHECK_STATUS(fabpool_check(NULL), FABPOOL_ERR_INVALID_ARG);
    fabpool_options o;
    fabpool_options_init(&o);
    o.decay_ms = 1000000; /* nothing goes back to the driver behind the test's back */
    o.cache_limit_bytes = 1ull << 40;
    CHECK_OK(fabpool_create(&o, &A));
    CHECK_OK(fabpool_create(&o, &B));
    if (!A || !B)
        return t_done("test_check");
    gran = A->sp.gran;
    CHECK_OK(fabpool_check(A));

    /* slabs: two classes, some blocks freed (into the thread cache, and past it onto the free stack) */
    enum { N = 600 };
    static void *small[N], *mid[64];
    for (int i = 0; i < N; i++)
        CHECK_OK(fabpool_alloc(A, 256, &small[i]));
    for (int i = 0; i < 64; i++)
        CHECK_OK(fabpool_alloc(A, 40000, &mid[i]));
    for (int i = 1; i < N; i += 2)
        CHECK_OK(fabpool_free(A, small[i]));
    for (int i = 0; i < 64; i += 3)
        CHECK_OK(fabpool_free(A, mid[i]));
    /* large: three blocks, the middle one freed (a free range between live ones) */
    void *large[3];
    for (int i = 0; i < 3; i++)
        CHECK_OK(fabpool_alloc(A, 40 * MB, &large[i]));
    CHECK_OK(fabpool_free(A, large[1]));
    /* buffers: one grown in steps then shrunk on a held stream (chunks retiring), one exported and viewed */
    fabpool_buffer_t *b = NULL, *e = NULL;
    CUstream stream;
    CHECK_CU(cuStreamCreate(&stream, 0));
    typedef int (*hold_fn)(void *);
    hold_fn hold = (hold_fn)dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    hold_fn release = (hold_fn)dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    CHECK_OK(fabpool_buffer_create(A, 1024 * MB, 8 * MB, &b));
    for (size_t sz = 16 * MB; sz <= 256 * MB; sz *= 2)
        CHECK_OK(fabpool_buffer_resize(b, sz, NULL));
    if (hold)
        hold(stream);
    CHECK_OK(fabpool_buffer_resize(b, 20 * MB, stream));
    CHECK_OK(fabpool_buffer_create(A, 512 * MB, 96 * MB, &e));
    static uint8_t d[1 << 16];
    int fds[64];
    size_t len = 0, nfds = 0;
    fabpool_view_t *v = NULL;
    CHECK_OK(fabpool_buffer_export(e, 0, d, sizeof d, &len, fds, 64, &nfds));
    for (size_t i = 0; i < nfds; i++)
        fds[i] = dup(fds[i]); /* the exported fds stay the pool's: the view takes copies, as a socket would give */
    CHECK_OK(fabpool_view_open(B, d, len, fds, nfds, &v));
    /* a block exported: its chunks' handles kept by the chunk layer */
    size_t off = 0;
    CHECK_OK(fabpool_block_export(A, large[0], d, sizeof d, &len, fds, 64, &nfds, &off));
    if (!b || !e || !v)
        return t_done("test_check");
    expect_clean("healthy pools");
    uint64_t n_mapped = 0;
    fp_chunks_mapped(&A->ch, &n_mapped);
    printf("test_check: healthy: %u slab classes, %llu chunks, %zu large chunks, buffer of %u chunks, view of %u\n",
           A->heap.n_slab_classes, (unsigned long long)n_mapped,
           A->heap.arenas[FP_ARENA_LARGE].n_chunks, b->n, v->n);

    tail_free_refused(A);
    fp_span *s = slab_of(A, small[0]);
    if (s) {
        break_slabs(A, small, s);
        break_map(A, s);
        break_va(A, s);
    }
    break_arenas(A);
    if (hold)
        break_buffer(A, b);
    else
        printf("test_check: no stream hold in this driver: the retiring-buffer corruptions are skipped\n");
    break_view(B, v);
    break_kept(A);

    /* everything goes; the pools check clean at each stage */
    if (release)
        release(stream);
    CHECK_OK(fabpool_view_close(v));
    CHECK_OK(fabpool_buffer_export_done(e));
    break_anchor(A);
    CHECK_OK(fabpool_buffer_destroy(e, NULL));
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_collect(A, 1));
    expect_clean("after the buffers went");
    for (int i = 0; i < N; i += 2)
        CHECK_OK(fabpool_free(A, small[i]));
    for (int i = 0; i < 64; i++)
        if (i % 3)
            CHECK_OK(fabpool_free(A, mid[i]));
    CHECK_OK(fabpool_free(A, large[0]));
    CHECK_OK(fabpool_free(A, large[2]));
    expect_clean("after every block was freed");
    CHECK_OK(fabpool_trim(A, 0));
    expect_clean("after a trim");
    CHECK_OK(fabpool_destroy(B));
    CHECK_OK(fabpool_destroy(A));
    CHECK_CU(cuStreamDestroy(stream));
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == 0 && l.mappings == 0 && l.handles == 0);
    }
    printf("test_check: %d corruptions, each caught with its invariant's name\n", n_broken);
    check_beside_threads();
    check_beside_records();
    if (sim) {
        fabsim_ledger l = t_ledger();
        CHECK(l.bytes_held == 0 && l.mappings == 0 && l.handles == 0);
    }
    return t_done("test_check");
}
