/* view.c - a peer's buffer in this process (view.h). */
#include "view.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "array.h"
#include "clock.h"
#include "counter.h"
#include "desc.h"
#include "distinct_files.h"
#include "error.h"
#include "handles.h"
#include "list.h"
#include "retire.h"

_Static_assert(sizeof(CUmemFabricHandle) == FP_DESC_FABRIC_BYTES, "a record holds one fabric handle");
_Static_assert(sizeof(struct fabpool_view) <= FP_HANDLE_BYTES, "a view fits its handle's slot (handles.h)");

/* ------------------------------------------------------------ views */

void fp_view_close_fds(const int *fds, size_t n)
{
    for (size_t i = 0; fds && i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Imports the handle of record i (not mapped yet); counted in handles_outstanding. */
static fabpool_status import_one(fp_views *vs, const fp_desc *ds, uint32_t i, const int *fds,
                                 CUmemGenericAllocationHandle *h)
{
    fp_desc_rec r;
    fp_desc_record(ds, i, &r);
    CUmemFabricHandle fh;
    memcpy(&fh, r.fabric, sizeof fh);
    CUresult cr = fp_chunk_import(vs->sp->ch, (fabpool_handle_type)ds->handle_type,
                                  ds->handle_type == FABPOOL_HANDLE_POSIX_FD ? fds[i] : -1, &fh, h);
    if (cr != CUDA_SUCCESS)
        return fp_drv_error(cr, "cuMemImportFromShareableHandle", "importing a chunk of %llu bytes at offset %llu of "
                            "process %d's buffer%s", (unsigned long long)r.size, (unsigned long long)r.off, ds->pid,
                            ds->handle_type == FABPOOL_HANDLE_FABRIC ? " (a fabric handle fails once its exporter "
                            "has unmapped it, and needs an IMEX channel)" : "");
    return FABPOOL_OK;
}

/* Maps imported handle h of record k at its offset in the view and releases
 * it: the mapping keeps the memory.  A handle whose allocation is not the
 * record's size (the driver maps whole handles only) is refused with
 * FABPOOL_ERR_DESCRIPTOR: an fd of another chunk. */
static fabpool_status map_one(fp_views *vs, fabpool_view_t *v, const fp_desc *ds, uint32_t k,
                              CUmemGenericAllocationHandle h)
{
    fp_desc_rec r;
    fp_desc_record(ds, k, &r);
    uint64_t off = r.off, size = r.size;
    fabpool_status st = fp_chunk_map_handle(vs->sp->ch, v->base + off, size, h, FP_MAP_VIEW, NULL, "an imported chunk");
    if (st == FABPOOL_OK)
        atomic_fetch_add(&vs->bytes, size);
    if (st != FABPOOL_OK && ds->handle_type == FABPOOL_HANDLE_POSIX_FD && strstr(fabpool_last_error(), "NOT_SUPPORTED"))
        return fp_desc_refuse("fd %llu is not a chunk of the record's size (%llu bytes): the fds were swapped, or belong to "
                        "another buffer", k, size);
    return st;
}

/* The view's chunks and a descriptor's records are each sorted by offset and do not overlap (the decoder refuses
 * records that do; view_merge keeps the chunks so), so the first of either that ends past an offset is found by
 * bisection: what an apply costs grows as its records and the view's chunks times their logarithm, however many
 * records a peer sends against however many chunks the view maps. */

/* The first chunk of the view that ends past off (v->n: none). */
static uint32_t chunk_past(const fabpool_view_t *v, uint64_t off)
{
    uint32_t lo = 0, hi = v->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (v->chunks[mid].off + v->chunks[mid].size > off)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The first record of ds that ends past off (ds->n: none). */
static uint32_t record_past(const fp_desc *ds, uint64_t off)
{
    uint32_t lo = 0, hi = ds->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        fp_desc_rec r;
        fp_desc_record(ds, mid, &r);
        if (r.off + r.size > off)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Whether record k's range is free in the view now (no chunk there). */
static int range_free(const fabpool_view_t *v, const fp_desc *ds, uint32_t k)
{
    fp_desc_rec r;
    fp_desc_record(ds, k, &r);
    uint32_t i = chunk_past(v, r.off);
    return i == v->n || v->chunks[i].off >= r.off + r.size;
}

static fabpool_status view_unmap_at(fp_views *vs, fabpool_view_t *v, uint64_t off, uint64_t size)
{
    fabpool_status st = fp_chunk_unmap(vs->sp->ch, v->base + off, size);
    if (st == FABPOOL_OK)
        atomic_fetch_sub(&vs->bytes, size);
    return st;
}

static fabpool_status view_unmap(fp_views *vs, fabpool_view_t *v, uint32_t i)
{
    return view_unmap_at(vs, v, v->chunks[i].off, v->chunks[i].size);
}

/* The wait that every unmap of the pool makes first (chunk.h: the owner stream's fence), made before a view
 * changes, so that its refusal leaves the view as it was; the unmaps after it then find it done. */
static fabpool_status view_fence(fp_views *vs, const fabpool_view_t *v)
{
    fp_chunks *ch = vs->sp->ch;
    if (!v->n || !ch->fence)
        return FABPOOL_OK;
    fabpool_status st = fp_retire_fence(ch->fence);
    if (st != FABPOOL_OK)
        fp_error_append(" (before unmapping a view's chunks; the view is as it was)");
    return st;
}

/* A record that names a chunk the view maps already: the same offset, size
 * and generation are the same memory of the same buffer (a chunk that is new
 * memory gets a new generation). */
static int same_chunk(const fp_vchunk *c, const fp_desc_rec *r)
{
    return r->off == c->off && r->size == c->size && r->gen == c->gen;
}

/* The chunks the view keeps: those below `live` that no record replaces (a
 * record of the same chunk keeps it). */
static int kept(const fabpool_view_t *v, uint32_t i, const fp_desc *ds)
{
    const fp_vchunk *c = &v->chunks[i];
    if (c->off + c->size > ds->live)
        return 0;
    uint32_t k = record_past(ds, c->off); /* the first record that can overlap the chunk */
    if (k == ds->n)
        return 1;
    fp_desc_rec r;
    fp_desc_record(ds, k, &r);
    return r.off < c->off + c->size ? same_chunk(c, &r) : 1;
}

/* Whether record k names a chunk the view maps already (nothing to import). */
static int mapped_already(const fabpool_view_t *v, const fp_desc *ds, uint32_t k)
{
    fp_desc_rec r;
    fp_desc_record(ds, k, &r);
    uint32_t i = chunk_past(v, r.off); /* the only chunk that can start at r.off */
    return i < v->n && same_chunk(&v->chunks[i], &r) && r.off + r.size <= ds->live;
}

/* Grows the view's chunk list to hold `need`. */
static fabpool_status view_reserve(fp_views *vs, fabpool_view_t *v, uint32_t need)
{
    if (FP_ARRAY_RESERVE(vs->sp->meta, v->chunks, v->n, v->cap, need, 8) != 0)
        return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory for a view's chunk list");
    return FABPOOL_OK;
}

/* What became of each record of a descriptor being applied (REC_SAME: the
 * view maps its chunk already). */
enum { REC_HELD = 0, REC_MAPPED = 1, REC_GONE = 2, REC_SAME = 3 };

/* The view's chunks after a commit: the first v->n (those kept, sorted) and the records mapped (state
 * REC_MAPPED), merged by offset from the back, in the room view_reserve made for both. */
static void view_merge(fabpool_view_t *v, const fp_desc *ds, const uint8_t *state)
{
    uint32_t m = 0;
    for (uint32_t k = 0; k < ds->n; k++)
        m += state[k] == REC_MAPPED;
    uint32_t i = v->n, at = v->n + m;
    for (uint32_t k = ds->n; k-- > 0;) {
        if (state[k] != REC_MAPPED)
            continue;
        fp_desc_rec r;
        fp_desc_record(ds, k, &r);
        while (i > 0 && v->chunks[i - 1].off > r.off)
            v->chunks[--at] = v->chunks[--i];
        v->chunks[--at] = (fp_vchunk){r.off, r.size, r.gen};
    }
    v->n += m;
}

/* Whether descriptor ds applies to view v: the same buffer, a delta from
 * the view's generation or earlier, not older, and the chunks after it
 * cover [0, live) exactly. */
static fabpool_status apply_admit(const fabpool_view_t *v, const fp_desc *ds)
{
    if (ds->uid != v->uid || ds->window != v->window || ds->handle_type != v->handle_type)
        return fp_desc_refuse("it describes another buffer (uid %llx, the view's is %llx)", ds->uid, v->uid);
    if (ds->gran % v->owner->sp->gran) /* as an open refuses it: before anything is unmapped, not at a map */
        return fp_desc_refuse("its granularity %llu does not fit this pool's %llu", ds->gran, v->owner->sp->gran);
    if (ds->since > v->generation)
        return fp_desc_refuse("it is a delta since generation %llu, but the view is at %llu: ask the exporter for a "
                        "delta since the view's generation", ds->since, v->generation);
    if (ds->generation < v->generation)
        return fp_desc_refuse("it is older (generation %llu) than the view (%llu)", ds->generation, v->generation);
    uint64_t covered = 0;
    for (uint32_t i = 0; i < v->n; i++)
        if (kept(v, i, ds))
            covered += v->chunks[i].size;
    for (uint32_t k = 0; k < ds->n; k++) {
        fp_desc_rec r;
        fp_desc_record(ds, k, &r);
        covered += mapped_already(v, ds, k) ? 0 : r.size;
    }
    if (covered != ds->live)
        return fp_desc_refuse("after it the view would map %llu of the buffer's %llu live bytes: a delta is missing; "
                        "apply a full descriptor (since 0)", covered, ds->live);
    return FABPOOL_OK;
}

/* The steps that can fail on the peer's side, before the view changes:
 * every import, then the mapping of each new chunk whose range is free. */
static fabpool_status apply_prepare(fp_views *vs, fabpool_view_t *v, const fp_desc *ds, const int *fds,
                                    CUmemGenericAllocationHandle *h, uint8_t *state)
{
    memset(state, REC_GONE, ds->n);
    fabpool_status st = view_fence(vs, v);
    if (st != FABPOOL_OK)
        return st;
    /* h, not filled yet, is the sort's room (a handle is at least an int) */
    _Static_assert(sizeof *h >= sizeof(int), "a handle's room holds an fd");
    if (ds->handle_type == FABPOOL_HANDLE_POSIX_FD && (st = fp_distinct_files(fds, ds->n, (int *)h)) != FABPOOL_OK)
        return st;
    for (uint32_t k = 0; k < ds->n; k++) {
        if (mapped_already(v, ds, k)) {
            state[k] = REC_SAME;
            continue;
        }
        if ((st = import_one(vs, ds, k, fds, &h[k])) != FABPOOL_OK)
            return st;
        state[k] = REC_HELD;
    }
    for (uint32_t k = 0; k < ds->n; k++) {
        if (state[k] == REC_SAME || !range_free(v, ds, k))
            continue;
        st = map_one(vs, v, ds, k, h[k]);
        state[k] = st == FABPOOL_OK ? REC_MAPPED : REC_GONE;
        if (st != FABPOOL_OK)
            return st;
    }
    return FABPOOL_OK;
}

/* Takes back what a failed apply did to the records: handles not mapped released, chunks mapped unmapped.  One
 * the driver would not unmap is given up as stuck (chunk.h): no view lists it, the device layer unmaps it later
 * and space.c keeps its range until then.  Returns how many were given up so. */
static int apply_undo(fp_views *vs, fabpool_view_t *v, const fp_desc *ds, const CUmemGenericAllocationHandle *h,
                      const uint8_t *state)
{
    int stuck = 0;
    for (uint32_t k = 0; k < ds->n; k++) {
        fp_desc_rec r;
        fp_desc_record(ds, k, &r);
        if (state[k] == REC_HELD) {
            fp_chunk_release(vs->sp->ch, h[k]);
        } else if (state[k] == REC_MAPPED && view_unmap_at(vs, v, r.off, r.size) != FABPOOL_OK) {
            fp_chunk_stick(vs->sp->ch, v->base + r.off, r.size);
            atomic_fetch_sub(&vs->bytes, r.size);
            stuck++;
        }
    }
    return stuck;
}

/* Before the commit: a handle of each chunk the descriptor drops (old[i] for chunk i; 0 for those kept), so
 * that a failed commit maps it back. */
static fabpool_status apply_retain(fp_views *vs, fabpool_view_t *v, const fp_desc *ds,
                                   CUmemGenericAllocationHandle *old)
{
    fabpool_status st = FABPOOL_OK;
    for (uint32_t i = 0; i < v->n; i++)
        old[i] = 0;
    for (uint32_t i = 0; i < v->n && st == FABPOOL_OK; i++)
        if (!kept(v, i, ds))
            st = fp_chunk_retain(vs->sp->ch, v->base + v->chunks[i].off, &old[i], "keeping a view's chunk while "
                                 "a descriptor replaces it; nothing was changed");
    for (uint32_t i = 0; i < v->n && st != FABPOOL_OK; i++)
        if (old[i])
            fp_chunk_release(vs->sp->ch, old[i]);
    return st;
}

/* A failed commit taken back: the records' mappings undone, then the dropped chunks (gone[i]) mapped back from
 * their handles, which go.  What the driver refuses to map back is lost: the view lists what it maps and ends
 * where its first hole begins, and the answer is FABPOOL_ERR_PARTIAL; else the view is as it was. */
static fabpool_status commit_undo(fp_views *vs, fabpool_view_t *v, const fp_desc *ds, const CUmemGenericAllocationHandle *h,
                                  const uint8_t *state, const CUmemGenericAllocationHandle *old, const uint8_t *gone,
                                  fabpool_status st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fabpool_last_error());
    int stuck = apply_undo(vs, v, ds, h, state);
    uint64_t lost = 0;
    uint32_t w = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        fp_vchunk c = v->chunks[i];
        fabpool_status s2 = gone[i] ? fp_chunk_map_access(vs->sp->ch, v->base + c.off, c.size, old[i], FP_MAP_VIEW,
                                                          NULL, "a view's chunk, back") : FABPOOL_OK;
        if (old[i])
            fp_chunk_release(vs->sp->ch, old[i]); /* mapped back, the mapping keeps the memory */
        if (gone[i] && s2 == FABPOOL_OK) {
            fp_chunk_count_mapped(vs->sp->ch, v->base + c.off, c.size, "a view's chunk, back");
            atomic_fetch_add(&vs->bytes, c.size);
        }
        if (s2 != FABPOOL_OK)
            lost += c.size;
        else
            v->chunks[w++] = c;
    }
    v->n = w;
    const char *left = stuck ? "; the driver would not unmap a chunk this call had mapped either: it stays mapped, "
                               "unused, until fabpool_collect, fabpool_trim or fabpool_destroy unmaps it" : "";
    if (!lost)
        return fp_error(st, "%s (the view is as it was%s)", msg, left);
    uint64_t live = 0;
    for (uint32_t i = 0; i < v->n && v->chunks[i].off == live; i++)
        live += v->chunks[i].size;
    v->live = live < v->live ? live : v->live;
    return fp_error(FABPOOL_ERR_PARTIAL, "%s (and the driver refused to map back %llu bytes of the chunks this "
                    "descriptor replaces: the view lost them and maps its first %llu bytes now, as its info says; "
                    "apply this descriptor again, or a full one%s)", msg, (unsigned long long)lost,
                    (unsigned long long)v->live, left);
}

/* From here on the view changes: drop what goes (old: their handles), then map what replaces it; a failure
 * takes it all back (commit_undo). */
static fabpool_status apply_commit(fp_views *vs, fabpool_view_t *v, const fp_desc *ds,
                                   const CUmemGenericAllocationHandle *h, uint8_t *state,
                                   const CUmemGenericAllocationHandle *old, uint8_t *gone)
{
    fabpool_status st = FABPOOL_OK;
    for (uint32_t i = 0; i < v->n; i++)
        gone[i] = old[i] && st == FABPOOL_OK && (st = view_unmap(vs, v, i)) == FABPOOL_OK;
    for (uint32_t k = 0; k < ds->n && st == FABPOOL_OK; k++)
        if (state[k] == REC_HELD) {
            st = map_one(vs, v, ds, k, h[k]);
            state[k] = st == FABPOOL_OK ? REC_MAPPED : REC_GONE;
        }
    if (st != FABPOOL_OK)
        return commit_undo(vs, v, ds, h, state, old, gone, st);
    uint32_t w = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        if (old[i])
            fp_chunk_release(vs->sp->ch, old[i]);
        if (!gone[i])
            v->chunks[w++] = v->chunks[i];
    }
    v->n = w;
    view_merge(v, ds, state);
    v->live = ds->live;
    v->generation = ds->generation;
    return FABPOOL_OK;
}

/* Applies a parsed descriptor.  Every step that can fail on the peer's side
 * comes first: every import, then the mapping of each new chunk whose range
 * is free, then a handle of each chunk it drops; only then are the dropped
 * chunks unmapped and the chunks that replace them mapped, and a failure
 * there maps the dropped ones back.  So a failure leaves the view exactly as
 * it was, unless the driver refuses the map back too (FABPOOL_ERR_PARTIAL:
 * the view ends where the first chunk it lost began). */
fabpool_status fp_view_apply_locked(fabpool_view_t *v, const fp_desc *ds, const int *fds)
{
    fp_lock_assert_held(&v->owner->sp->lock);
    fp_views *vs = v->owner;
    fabpool_status st = apply_admit(v, ds);
    if (st != FABPOOL_OK || (st = view_reserve(vs, v, v->n + ds->n)) != FABPOOL_OK)
        return st;
    /* per record: its handle and what became of it; per chunk of the view: its handle if dropped, and whether
     * it was unmapped */
    enum { STACK = 64 };
    size_t nh = (size_t)ds->n + v->n;
    CUmemGenericAllocationHandle hs[STACK], *h = hs;
    uint8_t states[STACK], *state = states;
    if (nh > STACK) {
        h = fp_meta_alloc(vs->sp->meta, nh * (sizeof *h + 1));
        if (!h)
            return fp_error(FABPOOL_ERR_HOST_MEMORY, "no host memory to import %u chunks", ds->n);
        state = (uint8_t *)(h + nh);
    }
    CUmemGenericAllocationHandle *old = h + ds->n;
    st = apply_prepare(vs, v, ds, fds, h, state);
    if (st == FABPOOL_OK && (st = apply_retain(vs, v, ds, old)) != FABPOOL_OK)
        fp_error_append(" (the view is as it was)");
    if (st != FABPOOL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", fabpool_last_error());
        if (apply_undo(vs, v, ds, h, state))
            fp_error(st, "%s (the driver would not unmap a chunk this call had mapped either: it stays mapped, "
                     "unused, until fabpool_collect, fabpool_trim or fabpool_destroy unmaps it)", msg);
        else
            fp_error(st, "%s", msg);
    } else {
        st = apply_commit(vs, v, ds, h, state, old, state + ds->n);
    }
    if (h != hs)
        fp_meta_free(vs->sp->meta, h, nh * (sizeof *h + 1));
    return st;
}

void fp_views_init(fp_views *vs, fp_space *sp, uint32_t keep_ms)
{
    vs->sp = sp;
    vs->keep_ms = keep_ms;
}

void fp_views_read_counters(const fp_views *src, fp_view_counters *c)
{
    FP_VIEWS_COUNTERS(FP_COUNTER_COPY)
}

void fp_view_keep(fp_views *vs, fabpool_view_t *v, int on)
{
    if (on)
        fp_handle_kill(v); /* an open of its buffer takes it back under a new handle */
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < v->n; i++)
        bytes += v->chunks[i].size;
    if (on && !v->kept)
        atomic_fetch_add(&vs->kept_bytes, bytes);
    else if (!on && v->kept)
        atomic_fetch_sub(&vs->kept_bytes, bytes);
    v->kept = on;
}

void fp_views_drop_kept(fp_views *vs, int all)
{
    fp_lock_assert_held(&vs->sp->lock);
    if (!atomic_load(&vs->kept_bytes))
        return;
    uint64_t now = fp_coarse_ns(), keep = (uint64_t)vs->keep_ms * 1000000u;
    for (fabpool_view_t *v = vs->list, *next; v; v = next) {
        next = v->next;
        if (v->kept && (all || now - v->kept_ns >= keep))
            (void)fp_view_free(vs, v, 0); /* a refusal: it stays kept, the next drop closes it */
    }
}

fabpool_status fp_view_named(fabpool_status st, const char *fn)
{
    size_t n = strlen(fn);
    const char *m = fabpool_last_error();
    if (st != FABPOOL_OK && !(strncmp(m, fn, n) == 0 && (m[n] == ':' || m[n] == '(')))
        fp_error_append(" (%s)", fn);
    return st;
}

fabpool_status fabpool_view_apply(fabpool_view_t *v, const void *desc, size_t len, const int *fds, size_t nfds)
{
    fabpool_status st = fp_handle_check(v, FP_HANDLE_VIEW, "fabpool_view_apply", "the view");
    if (st != FABPOOL_OK) {
        fp_view_close_fds(fds, nfds);
        return st;
    }
    fp_desc ds;
    st = fp_device_forked(v->owner->sp->ch) ? fp_device_forked_error(v->owner->sp->ch,
                            "fabpool_view_apply") : fp_desc_parse(desc, len, nfds, &ds);
    if (st == FABPOOL_OK) {
        fp_lock(&v->owner->sp->lock);
        st = fp_chunks_asleep(v->owner->sp->ch) ? fp_chunk_asleep_error("fabpool_view_apply")
                                                : fp_view_apply_locked(v, &ds, fds);
        fp_unlock(&v->owner->sp->lock);
    }
    fp_view_close_fds(fds, nfds);
    return fp_view_named(st, "fabpool_view_apply");
}

fabpool_status fp_view_free(fp_views *vs, fabpool_view_t *v, int force)
{
    fp_lock_assert_held(&vs->sp->lock);
    fabpool_status st = view_fence(vs, v);
    while (v->n && st == FABPOOL_OK) {
        uint64_t size = v->chunks[v->n - 1].size;
        if ((st = view_unmap(vs, v, v->n - 1)) != FABPOOL_OK)
            break;
        v->n--;
        if (v->kept)
            atomic_fetch_sub(&vs->kept_bytes, size);
        v->live = v->live > size ? v->live - size : 0;
    }
    if (st != FABPOOL_OK && !force)
        return st;
    fp_view_keep(vs, v, 0); /* what a forced free leaves mapped is forgotten with it */
    FP_LIST_REMOVE(&vs->list, v, next, prev);
    fp_space_free_range(vs->sp, v->base, v->window);
    FP_ARRAY_FREE(vs->sp->meta, v->chunks, v->cap);
    fp_handle_free(v, vs->sp->meta);
    return st;
}

fabpool_status fabpool_view_close(fabpool_view_t *v)
{
    fabpool_status st = fp_handle_check(v, FP_HANDLE_VIEW, "fabpool_view_close", "the view");
    if (st != FABPOOL_OK)
        return st;
    fp_views *vs = v->owner;
    if (fp_device_forked(vs->sp->ch))
        return fp_device_forked_error(vs->sp->ch, "fabpool_view_close");
    fp_lock(&vs->sp->lock);
    st = fp_view_free(vs, v, 0);
    if (st != FABPOOL_OK)
        fp_error_append(" (fabpool_view_close: the view is still open, with the chunks it still maps; close it "
                        "again)");
    fp_unlock(&vs->sp->lock);
    return st;
}

fabpool_status fabpool_view_release(fabpool_view_t *v)
{
    fabpool_status st = fp_handle_check(v, FP_HANDLE_VIEW, "fabpool_view_release", "the view");
    if (st != FABPOOL_OK)
        return st;
    fp_views *vs = v->owner;
    if (fp_device_forked(vs->sp->ch))
        return fp_device_forked_error(vs->sp->ch, "fabpool_view_release");
    if (vs->keep_ms == 0 || !v->vouched_pid) /* no open could take it back (reopen_kept) */
        return fabpool_view_close(v);
    fp_lock(&vs->sp->lock);
    fp_views_drop_kept(vs, 0);
    fp_view_keep(vs, v, 1);
    v->kept_ns = fp_coarse_ns();
    fp_unlock(&vs->sp->lock);
    return FABPOOL_OK;
}

void fp_views_destroy(fp_views *vs)
{
    fp_lock_assert_held(&vs->sp->lock);
    while (vs->list)
        (void)fp_view_free(vs, vs->list, 1);
}
