/* test_combined: seeded random sequences in which any step may be any public
 * operation of fabpool.h, on three pools of different options in one
 * process, so that the features meet each other: the stream pair on the
 * owner stream and on queued streams while their work pends, buffer resizes
 * and exports, late peers, views, dma-bufs, sleep and wake, traces.
 *
 * Each seed takes a configuration (the seed modulo the table `configs`):
 * three pools, each with its handle type (local, POSIX fd, fabric), owner
 * stream on or off, thread cache on or off, a small reservation or not,
 * sleep_keep_host, large_chunks grid or whole, and a trace or not (one pool of each configuration is
 * traced: with plain allocations and the stream pair, or the stream pair
 * only).  Every step draws one operation of the table `ops` (one function
 * each) and a pool it applies to; an operation that is refused by the rules
 * (asleep, a local pool's export, bad pointers, a small reservation full)
 * must answer the documented status and change nothing; so must one that a
 * driver fault refuses (FABPOOL_TEST_FAULTS).  Block exports are viewed,
 * released (kept by the viewing pool) and exported again after the block's
 * memory was renewed at the same address (freed, trimmed and allocated
 * again, or slept and woken): the view reads the new bytes, and a write
 * through it reaches the block.  Three streams can
 * be held (fabsim_stream_hold: their queued work does not complete) and
 * released; a step may also run a short scenario of several calls (a shrink
 * on one stream and a grow on another while the first pends; a refit of an
 * exported buffer with a late peer).  Buffers are released and reused, and
 * views released and reopened, on traced and sleeping pools too; keep_ms
 * passes at random steps (the pools' clock moves on, property.h), and what
 * was kept goes at each pool's next call that gives it back, compared with
 * the sim's ledger to the byte where a collect gives it back.
 *
 * After every step:
 *   - nothing handed out is unmapped: every live block, buffer and view of
 *     an awake pool is mapped in full (fabsim_range_mapped), and every block
 *     an allocation returns at the moment it returns it;
 *   - nothing retired on a stream whose work pends is unmapped or reused:
 *     blocks freed on a held stream and buffer memory retired on one stay
 *     mapped with their data, no other stream gets them, and no new object
 *     overlaps them (the owner stream may reuse its own);
 *   - the sim's ledger equals what the pools count: bytes mapped, mappings,
 *     handles, exported fds, host copies of sleeping pools, dma-buf fds;
 *   - data is intact: each live object carries a pattern written through
 *     cuMemcpyHtoD and read back (a sample each step, all every 64 steps);
 *   - fabpool_check of the pools the step called (of all, every 16th step).
 * One operation runs another thread that allocates and frees on a pool while
 * this one calls fabpool_check and reads its stats (fabpool.h: every
 * function is thread-safe unless its comment says otherwise).
 * At the end of a seed everything is freed, every pool is destroyed (OK) and
 * the ledger is zero; the traced pool's file is read back and compared with
 * what the test did (allocations, live bytes at the end and at the peak,
 * frees of pointers never given out), and fabpool_replay --check runs it
 * (its path in FABPOOL_TEST_REPLAY; skipped if unset).
 *
 * The run prints how often each operation ran, how often each pair of
 * features met (the step's operation and the state of the pool it touched),
 * and the failed checks by kind, each kind with what it means.
 *
 *   test_combined [-v] [first_seed [n_seeds [steps]]]    (default 1 300 2000)
 *   -v prints every step.  FABPOOL_TEST_REPLAY: the fabpool_replay program.
 *   FABPOOL_TEST_KNOWN_FAILURES=kind,kind...: failures of those kinds (or
 *   kinds beginning so) are listed as known and do not fail the run.
 *   FABPOOL_TEST_SKIP_OPS=operation,...: those operations are never drawn.
 *   FABPOOL_TEST_FAULTS=N: N steps in 100 make a driver call of their operation fail (below: "driver faults").
 * Sanitizer builds run a tenth of the seeds.  Sim only: it needs the
 * ledger, stream holds and fabsim_range_mapped. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "trace_file.h"

#define GB (1ull << 30)
#define NPOOL 3
#define NSTREAM 3
#define MAXBLK 32
#define MAXBUF 5
#define MAXVIEW 4
#define MAXSTASH 4
#define MAXDMABUF 4
#define MAXREC 256
#define MAXPEND 128
#define MAXFD 256

#include "property.h"

/* ------------------------------------------------------------ driver faults
 *
 * With FABPOOL_TEST_FAULTS=N (a percentage), N steps in 100 make one driver call of their operation fail: call
 * 1 to 4, from the step's start, of an entry point the pools call and the test does not, with an error drawn
 * from four.  Whatever call of the library the fault hits must either absorb it or be refused and change
 * nothing a caller can see: the operation's checks take such a refusal for the step's result (EXPECT_OK below)
 * and the model keeps what it had; after the operation every buffer and view of every pool has the size,
 * mapped bytes, chunk count and generation it had before the step (for the operations that make one call of
 * the library that changes anything), and the checks after every step (everything handed out is mapped, the
 * data is intact, the ledger equals the pools' counts, fabpool_check) run as always.
 *
 * One faulted step in four has a second fault, so that what mends the first failure (an undo, a map back)
 * meets one: either the same entry point keeps failing from that call on (not cuMemUnmap or cuMemRelease: where
 * every call that gives memory back fails, the driver keeps that memory by definition), or another entry point
 * the operation calls fails too, at one of its first eight calls of the step.  A sleep's faulted cuMemUnmap
 * (two faulted sleeps in five) fails twice in a row instead, its retry refused too, at any unmap of the sleep:
 * one refusal is absorbed by the retry, two make the sleep roll back or go on (fabpool.h).  The rule stays,
 * with the exceptions fabpool.h documents: a buffer resize (single or set) may answer FABPOOL_ERR_PARTIAL, only
 * after two faults; then every buffer of the call has its new size but those that lost a chunk, which end
 * where it began (at most the new size, mapped bytes equal to the size, a new generation, every byte mapped and
 * the data below kept, the last byte written and read back), and the model goes on with that size.  A sleep
 * answers it asleep (a discard that had dropped contents went on, a rollback failed too), and the model takes
 * the pool as asleep; a sleep refused with any other status must leave the pool awake with every sample of its
 * blocks and buffers in place.  Every other call stays all or nothing under two faults. */
static int fault_pct;
static int (*fault_set_fn)(const char *, uint64_t, int, int);
static void (*fault_clear_fn)(void);
static uint64_t (*fault_calls_fn)(const char *);
static const char *const fault_entries[] = {
    "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap" /* [3]: fault_arm */, "cuMemRelease",
    "cuMemRetainAllocationHandle",
    "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemGetAddressRange", "cuEventCreate",
    "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize",
    "cuCtxGetCurrent", "cuMemcpyDtoDAsync", "cuMemGetHandleForAddressRange",
};
static const int fault_errors[] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE,
                                   CUDA_ERROR_NOT_PERMITTED};
static struct {
    int armed, refused;
    const char *entry;
    uint64_t c0, nth;
    int err;
    int every;           /* the second fault: the entry keeps failing from call nth on (1), or fails twice (2) */
    const char *entry2;  /* or the second fault: this entry fails at its call nth2 of the step (NULL: none) */
    uint64_t c02, nth2;
    int err2;
} flt;
static long n_fault_steps, n_fault_fired, n_fault_refused, n_fault_compared, n_fault_double, n_fault_double_fired,
    n_partial, n_partial_bufs;
/* a call that may claim or end a pool's owner stream was refused for a fault: whether it did is known at the
 * pool's next free on a stream; meanwhile the owner rule is not checked against it */
static int own_unknown[NPOOL];
#define NFAULT_ENTRIES (sizeof fault_entries / sizeof fault_entries[0])
#define MAXOPS 64
/* per operation (by its index in ops), the most calls of each entry point one step of it has made: a fault is
 * armed on an entry point the operation calls, at a call it reaches */
static uint32_t fault_seen[MAXOPS][NFAULT_ENTRIES];
static uint64_t fault_calls0[NFAULT_ENTRIES];

static const char *err_name(int e)
{
    return e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : e == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
           : e == CUDA_ERROR_NOT_PERMITTED ? "CUDA_ERROR_NOT_PERMITTED" : "CUDA_ERROR_UNKNOWN";
}

/* How many of the faults armed for this step have fired (an entry that keeps failing: each failed call). */
static int faults_fired(void)
{
    if (!flt.armed)
        return 0;
    uint64_t d = fault_calls_fn(flt.entry) - flt.c0, most = flt.every > 1 ? (uint64_t)flt.every : 8;
    int n = d < flt.nth ? 0 : flt.every ? (int)(d - flt.nth + 1 < most ? d - flt.nth + 1 : most) : 1;
    if (flt.entry2 && fault_calls_fn(flt.entry2) - flt.c02 >= flt.nth2)
        n++;
    return n;
}
/* Whether a fault armed for this step has fired. */
static int fault_fired(void) { return faults_fired() > 0; }

/* The step's faults, for a message. */
static const char *fault_said(void)
{
    static char said[160];
    int n = snprintf(said, sizeof said, "call %llu%s of %s (%s)", (unsigned long long)flt.nth,
                     flt.every > 1 ? " and the next" : flt.every ? " and on" : "", flt.entry, err_name(flt.err));
    if (flt.entry2 && n > 0 && (size_t)n < sizeof said)
        snprintf(said + n, sizeof said - (size_t)n, " and call %llu of %s (%s)", (unsigned long long)flt.nth2,
                 flt.entry2, err_name(flt.err2));
    return said;
}

/* 1 when st is the library's refusal of the step's fault (noted: the model stays as it was). */
static int fault_refusal(fabpool_status st)
{
    if (st == FABPOOL_OK || !fault_fired())
        return 0;
    if (st == FABPOOL_ERR_PARTIAL) /* a resize's or a sleep's answer: resize_one, op_buffer_resize_set and
                                    * sleep_failed take it */
        return 0;
    flt.refused = 1;
    return 1;
}

/* The step's fault fired and was answered: cleared, so that the operation goes on with the driver well. */
static void fault_spend(void)
{
    if (!flt.armed)
        return;
    fault_clear_fn();
    n_fault_fired += fault_fired();
    n_fault_double_fired += faults_fired() > 1;
    n_fault_refused += flt.refused;
    flt.armed = flt.refused = 0;
}

#undef EXPECT_OK
#define EXPECT_OK(st, key, call)                                                                                 \
    do {                                                                                                         \
        fabpool_status st_ = (st);                                                                               \
        if (!fault_refusal(st_))                                                                                 \
            EXPECT(st_ == FABPOOL_OK, key, "%s -> %s: %s", call, fabpool_status_name(st_), fabpool_last_error()); \
    } while (0)

#include "property_model.h"


/* ------------------------------------------------------------ the sim */

static int (*stream_hold_fn)(void *), (*stream_release_fn)(void *);
static int (*range_mapped_fn)(const void *, size_t);

static int mapped_now(uint64_t va, uint64_t n) { return range_mapped_fn((const void *)(uintptr_t)va, (size_t)n); }

/* ------------------------------------------------------------ features
 *
 * A step's features: those of its operation, and the state of the pool it
 * touched (computed before the operation).  Every pair of them counts as
 * met once for the step. */
enum feat {
    F_PLAIN,   /* fabpool_alloc / fabpool_free */
    F_OWNER,   /* the stream pair on the pool's owner stream; state: a stream owns the pool */
    F_QUEUED,  /* the stream pair on a stream whose frees queue; state: blocks pending in the pool's queue */
    F_PENDING, /* state: blocks freed on a stream whose work still pends */
    F_RESIZE,  /* buffer create / resize / resize_set / destroy */
    F_RETIRED, /* state: buffer memory retired on a stream whose work still pends */
    F_EXPORT,  /* export, export_done, peers_ack; state: an exported buffer not acked for good */
    F_LATE,    /* a late peer (a descriptor of an older generation); state: one holds a descriptor */
    F_VIEW,    /* view open / apply / close; state: views of the pool's buffers, or views in the pool */
    F_DMABUF,  /* dma-buf fds; state: one is open */
    F_SLEEP,   /* sleep / wake / sleep_state; state: the pool is asleep */
    F_TRACE,   /* state: the pool is traced */
    F_CACHE,   /* trim, collect, thread_flush, stats, check */
    F_THREAD,  /* another thread allocates meanwhile */
    F_BAD,     /* a call refused by the rules */
    F_COUNT
};
static const char *const feat_names[F_COUNT] = {"plain", "owner", "queued", "pending", "resize", "retired", "export",
                                                "late", "view", "dmabuf", "sleep", "trace", "cache", "thread", "bad"};
#define FB(f) (1u << (f))
static uint64_t pair_met[F_COUNT][F_COUNT];
static unsigned step_feats;
/* The pools this step called (a bit each): fabpool_check, the dearest check (it walks every structure of
 * a pool), runs on them after the step, and on every pool each 16th step. */
static unsigned step_pools;

/* The pairs this test exists for: a run of enough steps must meet each. */
static const struct {
    enum feat a, b;
    const char *what;
} wanted_pairs[] = {
    {F_SLEEP, F_OWNER, "sleep / wake amid the owner stream's traffic"},
    {F_SLEEP, F_QUEUED, "sleep / wake amid queued streams' traffic"},
    {F_SLEEP, F_PENDING, "sleep / wake while blocks freed on a stream pend"},
    {F_SLEEP, F_RESIZE, "sleep / wake amid buffer resizes"},
    {F_SLEEP, F_EXPORT, "sleep / wake amid exports"},
    {F_SLEEP, F_DMABUF, "sleep / wake with a dma-buf open"},
    {F_SLEEP, F_VIEW, "sleep / wake with views"},
    {F_RESIZE, F_RETIRED, "a resize while another retirement pends"},
    {F_RESIZE, F_LATE, "a resize of an exported buffer with a late peer"},
    {F_RESIZE, F_PENDING, "a resize while blocks freed on a stream pend"},
    {F_VIEW, F_LATE, "a late peer opens a view"},
    {F_TRACE, F_PLAIN, "fabpool_alloc / free traced"},
    {F_TRACE, F_OWNER, "the owner stream traced"},
    {F_TRACE, F_QUEUED, "queued streams traced"},
    {F_TRACE, F_RESIZE, "buffers traced"},
    {F_TRACE, F_SLEEP, "sleep / wake traced"},
    {F_THREAD, F_CACHE, "fabpool_check beside an allocating thread"},
    {F_BAD, F_OWNER, "refused calls of the stream pair"},
};

/* ------------------------------------------------------------ configurations */

/* Each row: three pools; every handle type, owner mode on and off, thread caches on and off, a small
 * reservation, a trace (mixed or stream pair only), a raised slab_max (classes above 4 KiB, with their
 * slabs of sixteen blocks) and large_chunks:whole (large blocks' growths as one chunk of up to max_chunk, 32 MiB
 * here) appear in several rows, in different company. */
static const pool_conf configs[][NPOOL] = {
    {{FABPOOL_HANDLE_POSIX_FD, 1, 1, 0, 0, TRACE_NONE, 0, 0},
     {FABPOOL_HANDLE_FABRIC, 0, 0, 0, 1, TRACE_NONE, 64, 0},
     {FABPOOL_HANDLE_NONE, 1, 1, 1, 0, TRACE_MIXED, 0, 1}},
    {{FABPOOL_HANDLE_FABRIC, 1, 0, 0, 0, TRACE_STREAM_ONLY, 0, 1},
     {FABPOOL_HANDLE_POSIX_FD, 0, 1, 1, 0, TRACE_NONE, 256, 0},
     {FABPOOL_HANDLE_NONE, 0, 0, 0, 1, TRACE_NONE, 0, 1}},
    {{FABPOOL_HANDLE_POSIX_FD, 0, 0, 0, 1, TRACE_MIXED, 0, 0},
     {FABPOOL_HANDLE_FABRIC, 1, 1, 1, 0, TRACE_NONE, 0, 1},
     {FABPOOL_HANDLE_POSIX_FD, 1, 1, 0, 0, TRACE_NONE, 64, 0}},
    {{FABPOOL_HANDLE_FABRIC, 0, 1, 0, 1, TRACE_NONE, 1024, 0},
     {FABPOOL_HANDLE_POSIX_FD, 1, 0, 0, 0, TRACE_STREAM_ONLY, 0, 0},
     {FABPOOL_HANDLE_FABRIC, 1, 0, 1, 0, TRACE_NONE, 0, 1}},
};
#define NCONF ((int)(sizeof configs / sizeof configs[0]))

static const char *htype_name(fabpool_handle_type h)
{
    return h == FABPOOL_HANDLE_FABRIC ? "fabric" : h == FABPOOL_HANDLE_POSIX_FD ? "posix_fd" : "local";
}

/* ------------------------------------------------------------ the model */

/* A late peer: a full descriptor of generation `gen`, received, not yet opened.  The peers' acks take
 * it into account, so its chunks must stay importable until it opens them. */
typedef struct {
    int pool;
    uint64_t id, gen, live;
    size_t src_size, len, nfds;
    uint8_t *desc;
    int fds[MAXFD];
} stash_t;

typedef struct {
    int pool;
    uint64_t id;
    int fd;
} dmabuf_t;

static stash_t stash[MAXSTASH];
static int nstash;
static dmabuf_t dmabufs[MAXDMABUF];
static int ndmabuf;

static const char *replay_path;
static char tmpdir[64];

/* totals printed at the end */
/* reuses that found a kept buffer, missed, were refused for a fault; kept views taken back; resyncs (kept_resync) */
static long n_reuse_hit, n_reuse_miss, n_reuse_refused, n_view_taken, n_kept_resync;
static long n_sleep_partial, n_fault_sleep_unmap;
static long n_limit, n_slept, n_sleep_busy, n_woke_discard, n_asleep_refused, n_late_open[4], n_late_after_change[4],
    n_refit_late, n_bad, n_threads, n_traces, n_replays, n_dmabuf;

/* ------------------------------------------------------------ failures */

/* What each kind of failure means, for the summary at the end. */
static const meaning_t meanings[] = {
    {"asleep.alloc_on_stream", "fabpool_alloc_on_stream on a sleeping pool answered OK, not FABPOOL_ERR_ASLEEP"},
    {"asleep.alloc", "fabpool_alloc on a sleeping pool answered OK, not FABPOOL_ERR_ASLEEP"},
    {"handout.unmapped", "an allocation handed out memory that is not mapped"},
    {"align.base", "a block's base is not a multiple of the alignment fabpool.h promises (256 from 256 bytes, the "
     "size rounded up to a power of two below, or what fabpool_alloc_aligned was asked)"},
    {"fault.refused_changed", "a call refused for a driver fault changed a buffer or a view (size, mapped bytes, "
     "chunk count or generation)"},
    {"fault.wake_state", "a wake refused for a driver fault left the pool awake"},
    {"partial.one_fault", "a resize answered FABPOOL_ERR_PARTIAL after a single driver fault (one fault must leave "
     "it all or nothing)"},
    {"partial.buffer", "a buffer that lost a chunk (FABPOOL_ERR_PARTIAL) does not end where it began: size not "
     "below the size asked, mapped bytes other than its size, not at a chunk's start, or the same generation"},
    {"partial.unmapped", "a buffer that lost a chunk (FABPOOL_ERR_PARTIAL) does not map every byte of its new size"},
    {"partial.view", "a view apply that answered FABPOOL_ERR_PARTIAL does not map every byte its info says"},
    {"partial.nothing_lost", "FABPOOL_ERR_PARTIAL with every buffer at the size asked"},
    {"partial.resize_again", "a buffer left with 0 bytes by a lost chunk could not be resized again"},
    {"block_view.data", "a view of a block's export read other bytes than the block's (a kept view of old memory "
     "taken for new memory at the same address?)"},
    {"block_view.write", "a write through a view of a block's export did not reach the block"},
    {"live.unmapped", "a live block, buffer or view of an awake pool is not mapped in full"},
    {"retired.unmapped", "memory retired on a stream whose work pends was unmapped"},
    {"retired.unmapped_by_grow", "a grow on one stream unmapped memory retired on another whose work pends"},
    {"retired.data", "memory retired on a stream whose work pends lost its data"},
    {"pending.unmapped", "a block freed on a stream whose work pends was unmapped"},
    {"pending.reused", "a block freed on a stream whose work pends went to another stream or to fabpool_alloc"},
    {"record_stream.counted", "fabpool_record_stream answered OK but the pool does not count the recorded block"},
    {"late_peer.open.fabric", "a late peer (acked an older generation) could not open its descriptor: fabric"},
    {"late_peer.open.posix_fd", "a late peer (acked an older generation) could not open its descriptor: POSIX fds"},
    {"owner.claimed_by_refused_free_on_stream", "a refused fabpool_free_on_stream (a bad pointer) claimed the owner "
     "stream"},
    {"owner.claimed_by_refused_alloc_on_stream", "a refused fabpool_alloc_on_stream (asleep) claimed the owner stream "
     "or ended the owner mode"},
    {"owner.ended_by_refused_alloc", "a refused fabpool_alloc (asleep) ended the owner mode"},
    {"owner.changed_by_faulted_stream_call", "a fabpool_alloc_on_stream or fabpool_free_on_stream refused for a "
     "driver fault claimed the owner stream or ended the owner mode"},
    {"owner.changed_by_refused_owner_end", "a fabpool_stream_owner_end refused for a driver fault ended the owner "
     "mode"},
    {"owner_end.unfenced", "fabpool_stream_owner_end returned while the work of a block the owner stream freed still "
     "pended"},
    {"sleep.retired_unfenced", "a sleep unmapped buffer memory retired on a stream whose work pends"},
    {"sleep.owner_unfenced", "a sleep unmapped blocks the owner stream freed while its work pends"},
    {"sleep.failed_state", "a failed sleep left the pool asleep without FABPOOL_ERR_PARTIAL, or awake with it (or "
                           "answered it with no driver fault)"},
    {"owner.model", "the owner stream differs from the rule (fabpool.h) with no refused call before"},
    {"refused.changed", "a refused call changed the pool's counters"},
    {"trace.allocs", "the trace's allocations at its level differ from the program's calls"},
    {"trace.unknown_frees", "the trace frees pointers it never gave out"},
    {"trace.live_end", "the trace leaves memory live that the program freed"},
    {"trace.live_peak", "the trace's peak of live bytes differs from the program's"},
    {"replay.stream_pair", "fabpool_replay --check failed on a trace of the stream pair alone"},
    {"replay.mixed", "fabpool_replay --check failed on a trace of plain calls and the stream pair"},
    {"buffer_release.asleep", "a release of a sleeping pool's buffer kept it (kept_bytes counting memory the pool "
     "does not map, which the wake maps again for no caller) or kept the buffer counted: fabpool.h makes it "
     "fabpool_buffer_destroy(buf, NULL)"},
    {"buffer_reuse.asleep", "fabpool_buffer_reuse of a sleeping pool did not answer FABPOOL_ERR_ASLEEP, or changed "
     "what the pool keeps"},
    {"buffer_reuse.miss", "a reuse that no kept buffer within keep_ms fits did not answer FABPOOL_ERR_NOT_FOUND (a "
     "buffer past keep_ms handed out?)"},
    {"buffer_reuse.best_fit", "a reuse handed out another buffer than the nearest kept one within keep_ms, or under "
     "its released handle"},
    {"kept.bytes", "a pool's kept_bytes differs from what its kept buffers and views mapped at their release (past "
     "keep_ms: given back at the pool's next release, reuse, resize, view release, vouched open or collect), or "
     "exceeds its mapped_bytes"},
    {"keep_expire.mapped", "a collect after keep_ms passed did not unmap exactly the kept buffers' and views' bytes"},
    {"keep_expire.held", "a collect after keep_ms passed gave the driver other device bytes back than the kept "
     "buffers' (and their views', where the exporter let go)"},
    {"view_open.fresh", "a view opened afresh (no kept view due, one past keep_ms among them) did not import every "
     "chunk of its descriptor"},
    {"check.beside_thread", "fabpool_check failed while another thread allocated"},
    {"fabpool_check", "fabpool_check found a broken invariant"},
};

#define EXPECT_ST(st, want, key, call)                                                                           \
    EXPECT((st) == (want), key, "%s -> %s, expected %s: %s", call, fabpool_status_name(st), #want,             \
           fabpool_last_error())

/* ------------------------------------------------------------ patterns */

/* ------------------------------------------------------------ streams */

static void *sptr(int s) { return s < 0 ? NULL : (void *)streams[s]; }
static int stream_choice(void) { return chance(25) ? -1 : (int)below(NSTREAM); }
static const char *stream_name(int s)
{
    static const char *const n[] = {"NULL", "0", "1", "2", "3"};
    return n[s + 1];
}
static void hold(int s)
{
    refresh_streams();
    if (s < 0 || held[s])
        return;
    EXPECT(stream_hold_fn(streams[s]) == 0, "stream_hold", "fabsim_stream_hold failed");
    held[s] = 1;
    epoch[s]++;
}
static void release(int s)
{
    EXPECT(stream_release_fn(streams[s]) == 0, "stream_release", "fabsim_stream_release failed");
    held[s] = 0;
}

/* ------------------------------------------------------------ model helpers */

static fabpool_counters counters(int p)
{
    fabpool_counters c = {.struct_size = sizeof(fabpool_counters)};
    fabpool_get_counters(P[p].p, &c);
    return c;
}
static int shareable(int p) { return P[p].htype != FABPOOL_HANDLE_NONE; }
/* A pool with the owner mode on is used mostly from one stream, as programs do (its "home"), so that the
 * owner mode lasts; any other use ends it for good. */
static int in_owner_mode(int p) { return P[p].c.stream_owner && P[p].own >= -1; }
static int pool_stream(int p) { return in_owner_mode(p) && chance(90) ? p % NSTREAM : stream_choice(); }
static int stream_only(int p) { return P[p].c.trace == TRACE_STREAM_ONLY; }

/* the traced pool's live bytes as its trace counts them: blocks asked and buffer sizes */
static void tr_live(int p, int64_t delta)
{
    P[p].tr_live += (uint64_t)delta;
    if (P[p].tr_live > P[p].tr_peak)
        P[p].tr_peak = P[p].tr_live;
}

/* keep_ms passing: the steps that met it, the kept buffers and views that went, the steps whose ledger was
 * compared to the byte (mapped, and held where nothing else maps the memory); fresh views checked to import every
 * chunk; releases, reuses, view releases and reopens of traced and of sleeping pools */
static long n_expire_steps, n_expired_bufs, n_expired_views, n_expire_exact, n_expire_held_exact, n_fresh_imports,
    n_release_traced, n_reuse_traced, n_release_asleep, n_reuse_asleep, n_view_release_asleep, n_reopen_asleep;

/* The kept buffers past keep_ms (kbuf_t.expired) go at the pool's next release, reuse, resize or collect
 * (fabpool.h names the release, the reuse and the collect; a resize gives them back too, before it maps): the model
 * after such a call of an awake pool.  A driver fault may keep one (kept_resync). */
static void expired_bufs_go(int p)
{
    for (int i = 0; i < P[p].nkbuf; i++)
        n_expired_bufs += P[p].kbuf[i].expired;
    kept_drop(p, 1, 0, 1);
}
/* The kept views past keep_ms go at the pool's next view release, open by a vouched peer (awake: an open asleep is
 * refused first) or collect. */
static void expired_views_go(int t)
{
    for (int i = 0; i < P[t].nkview; i++)
        n_expired_views += P[t].kview[i].expired;
    kept_drop(t, 0, 1, 1);
}

/* A refused call.  Refused, it must change nothing; owner_key (NULL: none) names the failure if the owner
 * stream turns out changed at the next free on a stream (the calls that claim or end the owner mode). */
static void refused(int p, const char *owner_key)
{
    step_feats |= FB(F_BAD);
    if (owner_key)
        P[p].refused = owner_key;
}

/* A refusal of pool p's call answered st where `want` is due: a pool with a small reservation may find
 * it full first (FABPOOL_ERR_LIMIT, as clear a refusal). */
static int refusal_is(int p, fabpool_status st, fabpool_status want)
{
    return st == want || (P[p].c.small_reserve && st == FABPOOL_ERR_LIMIT);
}

/* fabpool_alloc (or another thread's) ends the owner mode */
static void own_end(int p)
{
    if (P[p].own >= -1)
        P[p].own = OWN_OFF;
}

/* ------------------------------------------------------------ late peers, dma-bufs, views */

static void drop_stash(int i)
{
    for (size_t k = 0; k < stash[i].nfds; k++)
        if (stash[i].fds[k] >= 0)
            close(stash[i].fds[k]);
    free(stash[i].desc);
    stash[i] = stash[--nstash];
}
static void drop_stashes_of(uint64_t id, int pool)
{
    for (int i = 0; i < nstash;)
        if (stash[i].id == id || (id == 0 && stash[i].pool == pool))
            drop_stash(i);
        else
            i++;
}
static void close_dmabuf(int i)
{
    close(dmabufs[i].fd);
    dmabufs[i] = dmabufs[--ndmabuf];
}

/* The lowest generation any peer of buffer b (views and late peers) holds, at most its current one. */
static uint64_t peers_gen(const buf_t *b, uint64_t current, int *peers)
{
    uint64_t g = current;
    int n = 0;
    for (int t = 0; t < NPOOL; t++)
        for (int k = 0; k < P[t].nview; k++)
            if (P[t].view[k].id == b->id) {
                n++;
                if (P[t].view[k].gen < g)
                    g = P[t].view[k].gen;
            }
    for (int k = 0; k < nstash; k++)
        if (stash[k].id == b->id) {
            n++;
            if (stash[k].gen < g)
                g = stash[k].gen;
        }
    if (peers)
        *peers = n;
    return g;
}

/* Every peer of pool p's buffers goes: views closed, late peers dropped, acks of "no peer is left". */
static void peers_leave(int p)
{
    for (int t = 0; t < NPOOL; t++)
        for (int k = 0; k < P[t].nview;)
            if (P[t].view[k].src_pool == p) {
                step_pools |= 1u << t;
                fabpool_status st = fabpool_view_close(P[t].view[k].h);
                EXPECT_OK(st, "view_close", "fabpool_view_close");
                if (st == FABPOOL_OK)
                    drop_view(t, k);
                else /* refused for the step's fault: still open, with the chunks it still maps (an unmap refused
                      * twice: a sleep's fault): what it maps is unknown, and a later close frees it */
                    P[t].view[k++].broken = 1;
            } else {
                k++;
            }
    drop_stashes_of(0, p);
    ack_dead(p, P[p].p);
    for (int i = 0; i < P[p].nbuf; i++)
        if (P[p].buf[i].shared) {
            fabpool_buffer_export_done(P[p].buf[i].h);
            fabpool_status st = fabpool_buffer_peers_ack(P[p].buf[i].h, UINT64_MAX);
            EXPECT_OK(st, "peers_ack", "fabpool_buffer_peers_ack(UINT64_MAX)");
            if (st == FABPOOL_OK)
                P[p].buf[i].acked = UINT64_MAX;
        }
    kept_peers_gone(p);
}

/* ------------------------------------------------------------ the checks after every step */

/* The buffers this step grew: a retired range of theirs that is unmapped is the grow's doing. */
static uint64_t grown[8];
static int ngrown;
static int grown_now(uint64_t id)
{
    for (int i = 0; i < ngrown; i++)
        if (grown[i] == id)
            return 1;
    return 0;
}

/* Retired buffer memory and blocks freed on held streams: dropped once done; else mapped, with data. */
static void check_retired(int full)
{
    int w = 0;
    for (int i = 0; i < nrec; i++) {
        rec_t *r = &rec[i];
        if (!rec_pending(r))
            continue;
        rec[w++] = *r;
        if (!rec_stream_pending(r) || P[r->pool].asleep)
            continue;
        uint64_t lo = r->lo;
        if (r->va_lo - r->base > lo)
            lo = r->va_lo - r->base;
        if (!r->destroyed) {
            buf_t *b = find_buf(r->id, NULL);
            if (b && b->size > lo)
                lo = b->size; /* below size: live again, checked as the buffer */
            if (b && b->broken)
                continue;
        }
        t_checks++;
        if (!mapped_now(r->va_lo, r->va_hi - r->va_lo)) {
            fail_(grown_now(r->id) ? "retired.unmapped_by_grow" : "retired.unmapped", __LINE__,
                  "%s %llu: [0x%llx, 0x%llx), retired on stream %d whose work pends, is not mapped in full",
                  r->destroyed ? "destroyed buffer" : "buffer", (unsigned long long)r->id,
                  (unsigned long long)r->va_lo, (unsigned long long)r->va_hi, r->stream);
            rec[w - 1].stream = -1; /* reported once */
            continue;
        }
        check_points("retired.data", r->destroyed ? "retired memory of destroyed buffer" : "retired chunk of buffer",
                     r->id, r->base, r->pts, lo, r->hi, full ? -1 : (int)cur_step);
    }
    nrec = w;
    w = 0;
    for (int i = 0; i < npend; i++) {
        pend_t *q = &pend[i];
        if (!pending_on(q->stream, q->epoch))
            continue;
        pend[w++] = *q;
        if (P[q->pool].asleep)
            continue;
        t_checks++;
        if (!mapped_now((uint64_t)(uintptr_t)q->b.p, q->owner ? 8 : q->b.usable)) {
            fail_("pending.unmapped", __LINE__, "block %llu %p (%zu bytes), freed on stream %d%s whose work pends, is "
                  "not mapped", (unsigned long long)q->b.id, q->b.p, q->b.usable, q->stream,
                  q->owner ? " (the owner)" : "");
            w--;
            continue;
        }
        if (!q->owner && !q->nodata)
            check_blk(&q->b, full ? -1 : (int)cur_step);
    }
    npend = w;
}

/* Every live object of an awake pool (and every view) mapped in full; one sample of each read back. */
static void check_live(int full)
{
    int which = full ? -1 : (int)cur_step;
    for (int p = 0; p < NPOOL; p++) {
        pool_t *q = &P[p];
        for (int i = 0; i < q->nview; i++) {
            view_t *v = &q->view[i];
            if (v->broken)
                continue;
            t_checks++;
            if (!mapped_now(v->base, v->live)) {
                fail_("live.unmapped", __LINE__, "view %llu of buffer %llu: its %llu live bytes at 0x%llx are not "
                      "mapped", (unsigned long long)v->vid, (unsigned long long)v->id, (unsigned long long)v->live,
                      (unsigned long long)v->base);
                v->broken = 1;
                continue;
            }
            check_view(v, which);
        }
        if (q->asleep)
            continue;
        for (int i = 0; i < q->nblk; i++) {
            blk_t *b = &q->blk[i];
            t_checks++;
            if (!mapped_now((uint64_t)(uintptr_t)b->p, b->usable))
                fail_("live.unmapped", __LINE__, "block %llu %p (%zu bytes) of pool %d is not mapped in full",
                      (unsigned long long)b->id, b->p, b->usable, p);
            else
                check_blk(b, which);
        }
        for (int i = 0; i < q->nbuf; i++) {
            buf_t *b = &q->buf[i];
            fabpool_buffer_info bi = binfo(b);
            EXPECT(bi.size == b->size && bi.mapped >= bi.size && (uint64_t)(uintptr_t)bi.base == b->base,
                   "buffer.info", "buffer %llu: info says size %zu, mapped %zu, base %p; the test has size %zu at "
                   "0x%llx", (unsigned long long)b->id, bi.size, bi.mapped, bi.base, b->size,
                   (unsigned long long)b->base);
            if (b->broken)
                continue;
            t_checks++;
            if (!mapped_now(b->base, bi.mapped)) {
                fail_("live.unmapped", __LINE__, "buffer %llu of pool %d: its %zu mapped bytes at 0x%llx are not all "
                      "mapped", (unsigned long long)b->id, p, bi.mapped, (unsigned long long)b->base);
                b->broken = 1;
                continue;
            }
            check_buf(b, which);
        }
    }
}

static void check_step(int full)
{
    refresh_streams();
    check_retired(full);
    fabpool_stats S[NPOOL];
    check_ledger(S, (uint64_t)ndmabuf);
    for (int p = 0; p < NPOOL; p++)
        check_peak(p, &S[p]);
    check_live(full);
    check_overlap(full);
    check_pools(full || cur_step % 16 == 15 ? ~0u : step_pools);
}

/* ------------------------------------------------------------ operations: blocks */

static size_t blk_size(void)
{
    return chance(75) ? (size_t)logsize(1, 256 * KB) : chance(70) ? (size_t)logsize(256 * KB, 4 * MB)
                                                                   : (size_t)logsize(4 * MB, 48 * MB);
}

/* A block just handed out: mapped in full now, not a block whose stream's work pends (only that stream may
 * have it back), not the owner's freed memory unless the owner asks; then its pattern. */
static void took_block(int p, blk_t *b, int s, int owner_call, int on_stream)
{
    pool_t *q = &P[p];
    fabpool_status st = fabpool_usable_size(q->p, b->p, &b->usable);
    size_t align = b->usable & (~b->usable + 1);
    if (align > 256 || !align)
        align = 256;
    EXPECT(st == FABPOOL_OK && b->usable >= b->size && ((uintptr_t)b->p & (align - 1)) == 0, "alloc.usable",
           "block %p of %zu bytes: usable size %zu (%s)", b->p, b->size, b->usable, fabpool_status_name(st));
    if (st != FABPOOL_OK || b->usable < b->size)
        b->usable = b->size;
    t_checks++;
    if (!mapped_now((uint64_t)(uintptr_t)b->p, b->usable))
        fail_("handout.unmapped", __LINE__, "pool %d handed out %p (%zu bytes, %s), not mapped in full", p, b->p,
              b->usable, on_stream ? "fabpool_alloc_on_stream" : "fabpool_alloc");
    refresh_streams();
    for (int i = 0; i < npend; i++) {
        pend_t *e = &pend[i];
        uint64_t a = (uint64_t)(uintptr_t)b->p, e0 = (uint64_t)(uintptr_t)e->b.p;
        if (e->pool != p || !pending_on(e->stream, e->epoch) || a >= e0 + e->b.usable || e0 >= a + b->usable)
            continue;
        if (e->owner) {
            EXPECT(owner_call, "owner.reused", "block %p (%zu bytes) overlaps block %p, freed on the owner stream %d "
                   "whose work pends, and went to %s", b->p, b->size, e->b.p, e->stream,
                   on_stream ? "another stream" : "fabpool_alloc");
        } else {
            EXPECT(on_stream && s == e->stream && a == e0, "pending.reused", "block %p (%zu bytes) overlaps block %p, "
                   "freed on stream %d whose work pends, and went to %s", b->p, b->size, e->b.p, e->stream,
                   on_stream ? (s < 0 ? "the NULL stream" : "another stream") : "fabpool_alloc");
        }
        pend[i--] = pend[--npend];
    }
    write_blk(b);
}

/* The base a block of sz bytes has at least (fabpool.h, "Alignment"), al asked of fabpool_alloc_aligned or 0. */
static uint64_t want_align(size_t sz, uint64_t al)
{
    uint64_t w = 64;
    while (w < sz && w < 256)
        w *= 2;
    return al > w ? al : w;
}

/* 1 while a plain call goes through the per-thread default stream (CU_STREAM_PER_THREAD, a different stream in every
 * thread): an allocation on it is fabpool_alloc's, a free on it waits for the calling thread's stream and is then
 * fabpool_free's (fabpool.h), so the model is the plain calls'. */
static int per_thread;

/* al: 0, or the alignment asked of fabpool_alloc_aligned (not on a stream) */
static void alloc_common(int p, int on_stream, uint64_t al)
{
    pool_t *q = &P[p];
    size_t sz = blk_size();
    int s = on_stream ? pool_stream(p) : -1;
    if (on_stream)
        step_feats |= own_would(p, s) && q->c.stream_owner ? FB(F_OWNER) : FB(F_QUEUED);
    else
        step_feats |= FB(F_PLAIN);
    snprintf(cur_what, sizeof cur_what, "pool %d, %zu bytes%s%s%s", p, sz, on_stream ? ", stream " : "",
             on_stream ? stream_name(s) : "", q->asleep ? ", asleep" : "");
    blk_t b = {NULL, sz, 0, next_id++, 0};
    fabpool_counters c0 = counters(p);
    fabpool_status st = on_stream    ? fabpool_alloc_on_stream(q->p, sz, sptr(s), &b.p)
                        : al         ? fabpool_alloc_aligned(q->p, sz, al, &b.p)
                        : per_thread ? fabpool_alloc_on_stream(q->p, sz, CU_STREAM_PER_THREAD, &b.p)
                                     : fabpool_alloc(q->p, sz, &b.p);
    const char *call = on_stream    ? "fabpool_alloc_on_stream"
                       : al         ? "fabpool_alloc_aligned"
                       : per_thread ? "fabpool_alloc_on_stream(CU_STREAM_PER_THREAD)"
                                    : "fabpool_alloc";
    /* a refusal may not claim the owner stream (alloc_on_stream) nor end the owner mode (either call) */
    const char *owner_key = !q->c.stream_owner || q->own == OWN_OFF || (on_stream && q->own == s) ? NULL
                            : on_stream ? "owner.claimed_by_refused_alloc_on_stream"
                            : q->own != OWN_NONE ? "owner.ended_by_refused_alloc" : NULL;
    if (q->asleep) {
        n_asleep_refused++;
        EXPECT(st == FABPOOL_ERR_ASLEEP, on_stream ? "asleep.alloc_on_stream" : "asleep.alloc", "%s on a sleeping "
               "pool -> %s (%p; %llu blocks pending on streams)", call, fabpool_status_name(st), b.p,
               (unsigned long long)c0.stream_pending_blocks);
        if (st == FABPOOL_OK) { /* the block is unmapped now (its check says so); given back at once */
            t_checks++;
            if (!mapped_now((uint64_t)(uintptr_t)b.p, sz))
                fail_("handout.unmapped", __LINE__, "pool %d (asleep) handed out %p (%zu bytes), not mapped", p, b.p,
                      sz);
            q->tr_allocs++;
            tr_live(p, (int64_t)sz);
            tr_live(p, -(int64_t)sz);
            st = on_stream ? fabpool_free_on_stream(q->p, b.p, sptr(s)) : fabpool_free(q->p, b.p);
            EXPECT_OK(st, "free", "giving back a block handed out while asleep");
        } else {
            refused(p, owner_key);
        }
        return;
    }
    if (st == FABPOOL_ERR_LIMIT && q->c.small_reserve) {
        n_limit++;
        refused(p, owner_key);
        return;
    }
    EXPECT_OK(st, "alloc", call);
    if (st != FABPOOL_OK) { /* a driver fault's refusal too leaves the owner stream as it was */
        refused(p, flt.refused && q->c.stream_owner ? "owner.changed_by_faulted_stream_call" : owner_key);
        return;
    }
    EXPECT((uintptr_t)b.p % want_align(sz, al) == 0, "align.base", "%s of %zu bytes (alignment %llu) gave %p",
           call, sz, (unsigned long long)al, b.p);
    if (al > want_align(sz, 0)) {
        /* the block is fabpool_alloc's of the size fabpool.h says (a class that is a multiple of al up to
         * slab_max, else slab_max + 1), which the trace records and the test keeps */
        fabpool_options o = {.struct_size = sizeof o};
        size_t u = 0;
        EXPECT_OK(fabpool_get_options(q->p, &o), "alloc", "fabpool_get_options");
        EXPECT_OK(fabpool_usable_size(q->p, b.p, &u), "alloc", "fabpool_usable_size");
        if (sz <= o.slab_max_bytes)
            b.size = sz = u <= o.slab_max_bytes ? u : (size_t)o.slab_max_bytes + 1;
    }
    int owner_call = 0;
    if (on_stream) {
        owner_call = q->c.stream_owner && (own_claim(p, s) || own_unknown[p]);
        q->tr_streams = 1;
    } else {
        own_end(p);
    }
    q->tr_allocs++;
    tr_live(p, (int64_t)sz);
    took_block(p, &b, s, owner_call, on_stream);
    q->blk[q->nblk++] = b;
}

static void op_alloc(int p) { alloc_common(p, 0, 0); }
static void op_alloc_on_stream(int p) { alloc_common(p, 1, 0); }
static void op_alloc_per_thread(int p)
{
    per_thread = 1;
    alloc_common(p, 0, 0);
    per_thread = 0;
}
/* a power of two from 1 B to 2 MiB (the sim's granularity) */
static void op_alloc_aligned(int p) { alloc_common(p, 0, 1ull << below(22)); }

static void op_free(int p)
{
    pool_t *q = &P[p];
    int i = (int)below((uint64_t)q->nblk);
    blk_t *b = &q->blk[i];
    step_feats |= FB(F_PLAIN);
    snprintf(cur_what, sizeof cur_what, "pool %d, block %llu (%zu bytes)%s%s", p, (unsigned long long)b->id, b->size,
             per_thread ? ", the per-thread stream" : "", q->asleep ? ", asleep" : "");
    if (!q->asleep)
        check_blk(b, -1);
    fabpool_status st = per_thread ? fabpool_free_on_stream(q->p, b->p, CU_STREAM_PER_THREAD) : fabpool_free(q->p, b->p);
    EXPECT_OK(st, "free", per_thread ? "fabpool_free_on_stream(CU_STREAM_PER_THREAD)" : "fabpool_free");
    if (st != FABPOOL_OK) /* a driver fault's (a recorded block's event, the stream's wait): still the caller's */
        return;
    pend_on_record(p, b, -2);
    tr_live(p, -(int64_t)b->size);
    q->blk[i] = q->blk[--q->nblk];
}

static void op_free_per_thread(int p)
{
    per_thread = 1;
    op_free(p);
    per_thread = 0;
}

/* fabpool_stream_owner_end: the owner mode ends for good (a pool with no owner yet gets none) once the owner's
 * work queued so far is done, so every block the owner freed is safe for anyone on return; a refusal (a driver
 * fault's) leaves the mode as it was. */
static void op_owner_end(int p)
{
    pool_t *q = &P[p];
    step_feats |= FB(F_OWNER);
    snprintf(cur_what, sizeof cur_what, "pool %d (owner mode %s, the owner %d)%s", p, q->c.stream_owner ? "on" : "off",
             q->own, q->asleep ? ", asleep" : "");
    fabpool_status st = fabpool_stream_owner_end(q->p);
    EXPECT_OK(st, "owner_end", "fabpool_stream_owner_end");
    if (st != FABPOOL_OK) {
        refused(p, q->c.stream_owner ? "owner.changed_by_refused_owner_end" : NULL);
        return;
    }
    q->own = OWN_OFF;
    own_unknown[p] = 0;
    q->refused = NULL;
    refresh_streams();
    for (int i = 0; i < npend; i++)
        EXPECT(pend[i].pool != p || !pend[i].owner || !pending_on(pend[i].stream, pend[i].epoch), "owner_end.unfenced",
               "pool %d: block %p, freed on the owner stream %d, still pends after fabpool_stream_owner_end", p,
               pend[i].b.p, pend[i].stream);
}

static void op_free_on_stream(int p)
{
    pool_t *q = &P[p];
    int i = (int)below((uint64_t)q->nblk);
    blk_t *b = &q->blk[i];
    int s = pool_stream(p);
    int expect_owner = q->c.stream_owner && own_would(p, s);
    step_feats |= expect_owner ? FB(F_OWNER) : FB(F_QUEUED);
    snprintf(cur_what, sizeof cur_what, "pool %d, block %llu (%zu bytes), stream %s (%s)%s", p,
             (unsigned long long)b->id, b->size, stream_name(s), s >= 0 && held[s] ? "held" : "free",
             q->asleep ? ", asleep" : "");
    if (!q->asleep)
        check_blk(b, -1);
    fabpool_counters c0 = counters(p);
    fabpool_status st = fabpool_free_on_stream(q->p, b->p, sptr(s));
    EXPECT_OK(st, "free_on_stream", "fabpool_free_on_stream");
    if (st != FABPOOL_OK) { /* a driver fault's: the block stays live, the owner stream as it was */
        if (flt.refused && q->c.stream_owner)
            refused(p, "owner.changed_by_faulted_stream_call");
        return;
    }
    q->tr_streams = 1;
    /* what the library did: an owner's free goes to the pool at once (stream_owner_frees) */
    int was_owner = counters(p).stream_owner_frees == c0.stream_owner_frees + 1;
    if (was_owner != expect_owner && !own_unknown[p])
        fail_(q->refused ? q->refused : "owner.model", __LINE__, "pool %d: a free on stream %s "
              "%s, the owner rule says %s (the owner: %d%s%s)", p, stream_name(s),
              was_owner ? "went to the pool at once (the owner's)" : "was queued", expect_owner ? "the owner's" :
              "queued", q->own, q->refused ? "; refused since then: " : "", q->refused ? q->refused : "");
    q->own = was_owner ? s : q->c.stream_owner ? OWN_OFF : q->own;
    q->refused = NULL;
    own_unknown[p] = 0; /* this free said who owns the pool */
    refresh_streams();
    if (s >= 0 && held[s] && npend < MAXPEND && !q->asleep)
        pend[npend++] = (pend_t){p, s, epoch[s], *b, was_owner, 0};
    pend_on_record(p, b, s);
    tr_live(p, -(int64_t)b->size);
    q->blk[i] = q->blk[--q->nblk];
}

/* fabpool_record_stream: the block is used on stream s too; refused for nothing, counted as a recorded block.
 * Not in a pool whose owner rule still decides (the model of a recorded owner's free is test_record_stream's)
 * nor in a traced one. */
static void op_record_stream(int p)
{
    pool_t *q = &P[p];
    blk_t *b = &q->blk[below((uint64_t)q->nblk)];
    int s = (int)below(NSTREAM);
    step_feats |= FB(F_QUEUED);
    snprintf(cur_what, sizeof cur_what, "pool %d, block %llu (%zu bytes), stream %d (%s)%s", p,
             (unsigned long long)b->id, b->size, s, held[s] ? "held" : "free", q->asleep ? ", asleep" : "");
    fabpool_counters c0 = counters(p);
    fabpool_status st = fabpool_record_stream(q->p, b->p, sptr(s));
    EXPECT_OK(st, "record_stream", "fabpool_record_stream");
    if (st != FABPOOL_OK)
        return;
    fabpool_counters c1 = counters(p);
    EXPECT(c1.stream_recorded_blocks >= 1 && c1.stream_records >= c0.stream_records && c1.stream_records <=
           c0.stream_records + 1, "record_stream.counted", "pool %d: %llu recorded blocks, records %llu -> %llu", p,
           (unsigned long long)c1.stream_recorded_blocks, (unsigned long long)c0.stream_records,
           (unsigned long long)c1.stream_records);
    b->recorded = s + 1;
}

/* A bad pointer to the stream pair (or usable_size) on stream s: refused, and nothing changes (counters,
 * the owner).  interior: always an interior pointer of a block of at least 1 KiB if there is one. */
static void bad_free(int p, int s, int interior)
{
    pool_t *q = &P[p];
    blk_t *b = &q->blk[below((uint64_t)q->nblk)];
    for (int i = 0; interior && i < q->nblk && b->usable < 1024; i++)
        b = &q->blk[i];
    void *bad;
    const char *kind;
    if (b->usable >= 1024 && (interior || chance(60))) {
        bad = (char *)b->p + 256 * (1 + below(b->usable / 256 - 1));
        kind = "an interior pointer";
    } else {
        bad = (void *)(uintptr_t)(q->nbuf ? q->buf[0].base + 64 : 0x10000ull + 256 * below(1000));
        kind = q->nbuf ? "a buffer's address" : "a pointer the pool never gave";
    }
    step_feats |= FB(F_BAD) | (q->c.stream_owner ? FB(F_OWNER) : FB(F_QUEUED));
    snprintf(cur_what, sizeof cur_what, "pool %d, %s %p, stream %s", p, kind, bad, stream_name(s));
    fabpool_counters c0 = counters(p);
    size_t us = 0;
    int freed = interior || chance(70);
    fabpool_status st = freed ? fabpool_free_on_stream(q->p, bad, sptr(s)) : fabpool_usable_size(q->p, bad, &us);
    q->tr_bad_frees += (uint64_t)freed;
    n_bad++;
    EXPECT(st == FABPOOL_ERR_NOT_FOUND, "bad_pointer", "%s -> %s", kind, fabpool_status_name(st));
    fabpool_counters c1 = counters(p);
    EXPECT(c1.stream_frees == c0.stream_frees && c1.stream_pending_blocks == c0.stream_pending_blocks &&
               c1.stream_owner_frees == c0.stream_owner_frees && c1.streams == c0.streams &&
               c1.stream_fences == c0.stream_fences, "refused.changed", "a refused call changed the counters: "
           "stream_frees %llu -> %llu, pending %llu -> %llu, streams %llu -> %llu, fences %llu -> %llu",
           (unsigned long long)c0.stream_frees, (unsigned long long)c1.stream_frees,
           (unsigned long long)c0.stream_pending_blocks, (unsigned long long)c1.stream_pending_blocks,
           (unsigned long long)c0.streams, (unsigned long long)c1.streams, (unsigned long long)c0.stream_fences,
           (unsigned long long)c1.stream_fences);
    refused(p, freed && q->c.stream_owner && q->own != OWN_OFF ? "owner.claimed_by_refused_free_on_stream" : NULL);
}

static void op_bad_free(int p) { bad_free(p, stream_choice(), 0); }

static void op_usable_size(int p)
{
    pool_t *q = &P[p];
    blk_t *b = &q->blk[below((uint64_t)q->nblk)];
    size_t us = 0;
    snprintf(cur_what, sizeof cur_what, "pool %d, block %llu", p, (unsigned long long)b->id);
    fabpool_status st = fabpool_usable_size(q->p, b->p, &us);
    EXPECT(st == FABPOOL_OK && us == b->usable, "usable_size", "-> %s, %zu (it was %zu)", fabpool_status_name(st), us,
           b->usable);
}

/* ------------------------------------------------------------ operations: the pool */

static void op_thread_flush(int p)
{
    step_feats |= FB(F_CACHE);
    flush_thread_cache(p);
}

static void op_collect(int p)
{
    int wait = chance(40);
    step_feats |= FB(F_CACHE);
    snprintf(cur_what, sizeof cur_what, "pool %d, wait %d", p, wait);
    fabpool_status st = fabpool_collect(P[p].p, wait);
    EXPECT_OK(st, "collect", "fabpool_collect");
    expired_bufs_go(p); /* asleep too */
    expired_views_go(p);
}

static void op_trim(int p)
{
    step_feats |= FB(F_CACHE);
    trim_pool(p);
}

static void op_stats(int p)
{
    static char json[1 << 16];
    size_t need = 0;
    fabpool_stats s = {.struct_size = sizeof(fabpool_stats)};
    fabpool_counters c = {.struct_size = sizeof(fabpool_counters)};
    step_feats |= FB(F_CACHE);
    snprintf(cur_what, sizeof cur_what, "pool %d", p);
    EXPECT_OK(fabpool_get_stats(P[p].p, &s), "stats", "fabpool_get_stats");
    EXPECT_OK(fabpool_get_counters(P[p].p, &c), "stats", "fabpool_get_counters");
    fabpool_status st = fabpool_stats_json(P[p].p, json, sizeof json, &need);
    EXPECT(st == FABPOOL_OK || st == FABPOOL_ERR_LIMIT, "stats", "fabpool_stats_json -> %s", fabpool_status_name(st));
    EXPECT(s.stream_pending_blocks == c.stream_pending_blocks, "stats.pending", "stats say %llu blocks pending, "
           "counters %llu", (unsigned long long)s.stream_pending_blocks, (unsigned long long)c.stream_pending_blocks);
}

static void op_check(int p)
{
    step_feats |= FB(F_CACHE);
    snprintf(cur_what, sizeof cur_what, "pool %d", p);
    fabpool_status st = fabpool_check(P[p].p);
    EXPECT_OK(st, "fabpool_check", "fabpool_check");
}

/* Another thread allocates and frees on the pool (its thread cache) while this one checks the pool and
 * reads its stats: fabpool.h makes every function thread-safe unless its comment says otherwise. */
typedef struct {
    fabpool_t *p;
    uint64_t seed;
    int small;                 /* the pool's reservation is small: FABPOOL_ERR_LIMIT is a refusal */
    int errors, allocs, limits;
} thread_arg;

static void *allocating_thread(void *argp)
{
    thread_arg *a = argp;
    void *live[16] = {0};
    for (int k = 0; k < 400; k++) {
        int j = (int)(mix(a->seed + (uint64_t)k) % 16);
        if (live[j]) {
            a->errors += fabpool_free(a->p, live[j]) != FABPOOL_OK;
            live[j] = NULL;
        } else {
            fabpool_status st = fabpool_alloc(a->p, 16 + mix(a->seed ^ (uint64_t)k) % (64 * KB), &live[j]);
            a->allocs += st == FABPOOL_OK;
            a->limits += st == FABPOOL_ERR_LIMIT && a->small;
            a->errors += st != FABPOOL_OK && !(st == FABPOOL_ERR_LIMIT && a->small);
        }
    }
    for (int j = 0; j < 16; j++)
        if (live[j])
            a->errors += fabpool_free(a->p, live[j]) != FABPOOL_OK;
    return NULL;
}

static void op_thread(int p)
{
    step_feats |= FB(F_THREAD) | FB(F_CACHE) | FB(F_PLAIN);
    snprintf(cur_what, sizeof cur_what, "pool %d: another thread allocates, this one checks", p);
    thread_arg a = {P[p].p, rnd(), P[p].c.small_reserve, 0, 0, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, allocating_thread, &a) != 0)
        return;
    n_threads++;
    for (int k = 0; k < 6; k++) {
        fabpool_status st = fabpool_check(P[p].p);
        EXPECT_OK(st, "check.beside_thread", "fabpool_check beside an allocating thread");
        fabpool_stats s = {.struct_size = sizeof(fabpool_stats)};
        fabpool_get_stats(P[p].p, &s);
    }
    pthread_join(t, NULL);
    EXPECT(a.errors == 0, "thread.alloc", "the other thread's %d allocations and frees: %d failed", a.allocs,
           a.errors);
    own_end(p);
}

/* ------------------------------------------------------------ operations: buffers */

/* The model after a resize of b from `old` on stream s. */
static void after_resize(int p, buf_t *b, const fabpool_buffer_info *before, size_t old, int s)
{
    fabpool_buffer_info bi = binfo(b);
    EXPECT(bi.size == b->size, "resize.size", "buffer %llu: size %zu after a resize to %zu", (unsigned long long)b->id,
           bi.size, b->size);
    tr_live(p, (int64_t)b->size - (int64_t)old);
    refresh_streams();
    if (b->size > old) {
        grow_took_back(b, b->base + bi.mapped, s);
        write_points(b->id, b->base, b->pts, old, b->size);
        if (ngrown < 8)
            grown[ngrown++] = b->id;
    } else if (b->size < old) {
        if (before->mapped > bi.mapped)
            add_rec(p, b, b->size, old, bi.mapped, before->mapped - bi.mapped, s, 0, bi.generation);
        b->shrunk_gen = bi.generation;
    }
    if (!P[p].asleep)
        check_buf(b, -1);
}

/* A resize that answered FABPOOL_ERR_PARTIAL (fabpool.h), which only two faults of the step may cause: buffer b,
 * resized from `old` to `sz`, has either the size asked (0: the caller's after_resize follows) or lost a chunk
 * (1): then it ends where that chunk began, below the size asked, with mapped bytes equal to its size, a new
 * generation, all of it mapped (the ledger after the step says that the pool counts no more) and its data below
 * kept; its last byte is written and read back, and the model goes on with that size.  A buffer left with 0
 * bytes is resized to sz at once, the faults cleared ("resize it to use more"). */
static int partial_lost(int p, buf_t *b, const fabpool_buffer_info *before, size_t old, size_t sz, int s)
{
    fabpool_buffer_info bi = binfo(b);
    if (bi.size == sz)
        return 0;
    n_partial_bufs++;
    EXPECT(faults_fired() >= 2, "partial.one_fault", "buffer %llu: FABPOOL_ERR_PARTIAL after %s, of which %d fired: "
           "one fault must leave the call all or nothing (%s)", (unsigned long long)b->id, fault_said(),
           faults_fired(), fabpool_last_error());
    /* below the size asked, not always below the old one: a grow that takes back chunks retired above the old
     * size refits the last of them, and may lose that one (above the old size) */
    EXPECT(bi.size < sz && bi.mapped == bi.size && bi.size % gran == 0 &&
               bi.generation > before->generation && bi.base == before->base,
           "partial.buffer", "buffer %llu lost a chunk resizing %zu -> %zu: size %zu, mapped %zu, generation %llu -> "
           "%llu (expected below the size asked, at a chunk's start, mapped == size, a new generation)",
           (unsigned long long)b->id, old, sz, bi.size, bi.mapped, (unsigned long long)before->generation,
           (unsigned long long)bi.generation);
    b->size = bi.size;
    if (bi.size) {
        t_checks++;
        uint64_t last = b->base + bi.size - 8, v = pat(b->id, bi.size) ^ 0x5a5a, got;
        if (!mapped_now(b->base, bi.size) || !put(last, v) || probe(last, v, &got) != 1) {
            fail_("partial.unmapped", __LINE__, "buffer %llu lost a chunk and says %zu bytes, but [0x%llx, +%zu) is "
                  "not all mapped, or its last 8 bytes do not read back what was written", (unsigned long long)b->id,
                  bi.size, (unsigned long long)b->base, bi.size);
            b->broken = 1;
        }
    }
    after_resize(p, b, before, old, s);
    if (bi.size == 0) {
        fault_spend();
        fabpool_buffer_info zero = binfo(b);
        fabpool_status st = fabpool_buffer_resize(b->h, sz, sptr(s));
        EXPECT_OK(st, "partial.resize_again", "fabpool_buffer_resize of a buffer left with 0 bytes");
        if (st == FABPOOL_OK) {
            b->size = sz;
            after_resize(p, b, &zero, 0, s);
        }
    }
    return 1;
}

static void op_buffer_create(int p)
{
    pool_t *q = &P[p];
    buf_t b;
    memset(&b, 0, sizeof b);
    b.id = next_id++;
    uint64_t max = logsize(4 * KB, 128 * MB);
    b.window = (max + gran - 1) / gran * gran;
    b.size = buf_size(max);
    step_feats |= FB(F_RESIZE);
    snprintf(cur_what, sizeof cur_what, "pool %d, max %llu, size %zu%s", p, (unsigned long long)max, b.size,
             q->asleep ? ", asleep" : "");
    fabpool_status st = fabpool_buffer_create(q->p, (size_t)max, b.size, &b.h);
    if (q->asleep) {
        n_asleep_refused++;
        EXPECT(refusal_is(p, st, FABPOOL_ERR_ASLEEP), "asleep.buffer_create", "fabpool_buffer_create -> %s",
               fabpool_status_name(st));
        if (st == FABPOOL_OK)
            fabpool_buffer_destroy(b.h, NULL);
        refused(p, NULL);
        return;
    }
    if (st == FABPOOL_ERR_LIMIT && q->c.small_reserve) {
        n_limit++;
        refused(p, NULL);
        return;
    }
    EXPECT_OK(st, "buffer_create", "fabpool_buffer_create");
    if (st != FABPOOL_OK)
        return;
    b.base = (uint64_t)(uintptr_t)fabpool_buffer_ptr(b.h);
    fabpool_buffer_info bi = binfo(&b);
    EXPECT(bi.max_size == b.window && bi.size == b.size && bi.mapped >= b.size, "buffer_create.info",
           "max_size %zu (expected %llu), size %zu, mapped %zu", bi.max_size, (unsigned long long)b.window, bi.size,
           bi.mapped);
    t_checks++;
    if (!mapped_now(b.base, bi.mapped))
        fail_("handout.unmapped", __LINE__, "a new buffer's %zu mapped bytes at 0x%llx are not mapped", bi.mapped,
              (unsigned long long)b.base);
    gen_points(b.id, b.window, b.pts);
    write_points(b.id, b.base, b.pts, 0, b.size);
    tr_live(p, (int64_t)b.size);
    q->buf[q->nbuf++] = b;
}

/* Resizes buffer b to sz on stream s, with the asleep and small-reservation refusals. */
static void resize_one(int p, buf_t *b, size_t sz, int s)
{
    pool_t *q = &P[p];
    size_t old = b->size;
    fabpool_buffer_info before = binfo(b);
    fabpool_status st = fabpool_buffer_resize(b->h, sz, sptr(s));
    if (!q->asleep)
        expired_bufs_go(p); /* whatever the resize answers: they go before it maps */
    if (verbose) {
        fabpool_buffer_info bi = binfo(b);
        printf("  (buffer %llu: %zu -> %zu: %s %s; size %zu -> %zu, mapped %zu -> %zu, chunks %u -> %u)\n",
               (unsigned long long)b->id, old, sz, fabpool_status_name(st), st ? fabpool_last_error() : "",
               before.size, bi.size, before.mapped, bi.mapped, before.n_chunks, bi.n_chunks);
    }
    if (q->asleep || (st == FABPOOL_ERR_LIMIT && q->c.small_reserve)) {
        if (q->asleep) {
            n_asleep_refused++;
            EXPECT(refusal_is(p, st, FABPOOL_ERR_ASLEEP), "asleep.buffer_resize", "fabpool_buffer_resize -> %s",
                   fabpool_status_name(st));
        } else {
            n_limit++;
        }
        if (st == FABPOOL_OK) {
            b->size = sz;
            after_resize(p, b, &before, old, s);
        } else {
            same_info("resize.refused_changed", b, &before);
            refused(p, NULL);
        }
        return;
    }
    if (st == FABPOOL_ERR_PARTIAL) {
        n_partial++;
        EXPECT(partial_lost(p, b, &before, old, sz, s), "partial.nothing_lost", "fabpool_buffer_resize %zu -> %zu "
               "answered FABPOOL_ERR_PARTIAL with the buffer at the size asked: %s", old, sz, fabpool_last_error());
        return;
    }
    EXPECT_OK(st, "buffer_resize", "fabpool_buffer_resize");
    if (st != FABPOOL_OK) {
        same_info("resize.failed_changed", b, &before);
        return;
    }
    b->size = sz;
    after_resize(p, b, &before, old, s);
}

static void op_buffer_resize(int p)
{
    buf_t *b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    size_t sz = buf_size(b->window);
    int s = stream_choice();
    step_feats |= FB(F_RESIZE);
    snprintf(cur_what, sizeof cur_what, "pool %d, buffer %llu, %zu -> %zu, stream %s%s%s", p,
             (unsigned long long)b->id, b->size, sz, stream_name(s), b->shared ? ", exported" : "",
             P[p].asleep ? ", asleep" : "");
    resize_one(p, b, sz, s);
}

static void op_buffer_resize_set(int p)
{
    pool_t *q = &P[p];
    fabpool_buffer_t *hs[4];
    size_t sizes[4], old[4];
    fabpool_buffer_info before[4];
    int idx[4], n = 0, dup = chance(15);
    int want = 1 + (int)below((uint64_t)(q->nbuf < 3 ? q->nbuf : 3));
    int start = (int)below((uint64_t)q->nbuf);
    for (int k = 0; k < want; k++)
        idx[n++] = (start + k) % q->nbuf;
    if (dup)
        idx[n] = idx[below((uint64_t)n)], n++;
    int s = stream_choice();
    step_feats |= FB(F_RESIZE) | (dup ? FB(F_BAD) : 0);
    int len = snprintf(cur_what, sizeof cur_what, "pool %d, stream %s%s, ", p, stream_name(s),
                       q->asleep ? ", asleep" : "");
    for (int k = 0; k < n; k++) {
        buf_t *b = &q->buf[idx[k]];
        hs[k] = b->h;
        sizes[k] = buf_size(b->window);
        old[k] = b->size;
        before[k] = binfo(b);
        if (len < (int)sizeof cur_what - 48)
            len += snprintf(cur_what + len, sizeof cur_what - (size_t)len, "%sbuffer %llu %zu -> %zu", k ? "; " : "",
                            (unsigned long long)b->id, old[k], sizes[k]);
    }
    fabpool_status st = fabpool_buffer_resize_set(hs, sizes, (size_t)n, sptr(s));
    if (!q->asleep && !dup)
        expired_bufs_go(p); /* whatever the resize answers: they go before it maps */
    int refusal = dup || q->asleep || (st == FABPOOL_ERR_LIMIT && q->c.small_reserve);
    if (dup)
        EXPECT(st != FABPOOL_OK, "resize_set.duplicate", "a buffer named twice was accepted");
    else if (q->asleep)
        EXPECT(refusal_is(p, st, FABPOOL_ERR_ASLEEP), "asleep.buffer_resize_set", "fabpool_buffer_resize_set -> %s",
               fabpool_status_name(st));
    else if (!refusal && st == FABPOOL_ERR_PARTIAL) { /* every buffer has its new size but those that lost a chunk */
        n_partial++;
        int lost = 0;
        for (int k = 0; k < n; k++) {
            buf_t *b = &q->buf[idx[k]];
            if (!partial_lost(p, b, &before[k], old[k], sizes[k], s)) {
                b->size = sizes[k];
                after_resize(p, b, &before[k], old[k], s);
            } else {
                lost++;
            }
        }
        EXPECT(lost, "partial.nothing_lost", "fabpool_buffer_resize_set answered FABPOOL_ERR_PARTIAL with every "
               "buffer at the size asked: %s", fabpool_last_error());
        return;
    } else if (!refusal)
        EXPECT_OK(st, "buffer_resize_set", "fabpool_buffer_resize_set");
    if (st != FABPOOL_OK) {
        for (int k = 0; k < n; k++) {
            buf_t *b = &q->buf[idx[k]];
            if (same_info("resize_set.refused_changed", b, &before[k]) && !(dup && k == n - 1)) {
                b->size = binfo(b).size; /* the library's word from here on */
                after_resize(p, b, &before[k], old[k], s);
            }
        }
        if (refusal)
            refused(p, NULL);
        return;
    }
    for (int k = 0; k < n; k++) {
        q->buf[idx[k]].size = sizes[k];
        after_resize(p, &q->buf[idx[k]], &before[k], old[k], s);
    }
}

static void op_buffer_destroy(int p)
{
    pool_t *q = &P[p];
    int i = (int)below((uint64_t)q->nbuf);
    for (int k = 0; k < q->nbuf; k++)
        if (q->buf[k].broken)
            i = k;
    buf_t *b = &q->buf[i];
    fabpool_buffer_info before = binfo(b);
    int s = stream_choice();
    step_feats |= FB(F_RESIZE);
    snprintf(cur_what, sizeof cur_what, "pool %d, buffer %llu (size %zu, mapped %zu, gen %llu, %s), stream %s%s", p,
             (unsigned long long)b->id, b->size, before.mapped, (unsigned long long)before.generation,
             !b->shared ? "not exported" : b->acked >= before.generation ? "exported, acked" : "exported, un-acked",
             stream_name(s), q->asleep ? ", asleep" : "");
    if (!q->asleep)
        check_buf(b, -1);
    drop_stashes_of(b->id, p); /* its late peers give up */
    fabpool_status st = fabpool_buffer_destroy(b->h, sptr(s));
    EXPECT_OK(st, "buffer_destroy", "fabpool_buffer_destroy");
    if (st != FABPOOL_OK)
        return;
    refresh_streams();
    for (int k = 0; k < nrec; k++)
        if (rec[k].id == b->id) {
            if (b->acked >= rec[k].gen_after)
                rec[k].ack_wait = 0;
            rec[k].destroyed = 1;
        }
    if (!q->asleep)
        add_rec(p, b, 0, b->size, 0, before.mapped, s, 1, before.generation);
    if (b->shared && ndead < MAXDEAD)
        dead[ndead].pool = p, dead[ndead++].id = before.export_id;
    tr_live(p, -(int64_t)b->size);
    q->buf[i] = q->buf[--q->nbuf];
}

/* A shrink on stream B, then, while B's work pends, a grow on another stream A. */
static void op_shrink_grow(int p)
{
    pool_t *q = &P[p];
    buf_t *b = &q->buf[below((uint64_t)q->nbuf)];
    int sb = (int)below(NSTREAM), sa = (sb + 1 + (int)below(NSTREAM - 1)) % NSTREAM;
    size_t small = (size_t)logsize(1, b->window / 8 > 1 ? b->window / 8 : 1);
    size_t big = (size_t)(b->window / 2 + below(b->window / 2 + 1));
    if (big == 0)
        big = 1;
    step_feats |= FB(F_RESIZE) | FB(F_RETIRED);
    snprintf(cur_what, sizeof cur_what, "pool %d, buffer %llu: %zu -> %zu on stream %d (held), -> %zu on stream %d%s",
             p, (unsigned long long)b->id, b->size, small, sb, big, sa, b->shared ? ", exported" : "");
    if (b->size < 2 * small) /* grow first, so that the shrink retires something */
        resize_one(p, b, b->window, sa);
    hold(sb);
    resize_one(p, b, small, sb);
    resize_one(p, b, big, sa);
}

/* ------------------------------------------------------------ operations: sharing */

static void op_export(int p)
{
    pool_t *q = &P[p];
    buf_t *b = &q->buf[below((uint64_t)q->nbuf)];
    fabpool_buffer_info bi = binfo(b);
    uint64_t since = chance(50) ? 0 : below(bi.generation + 1);
    step_feats |= FB(F_EXPORT);
    snprintf(cur_what, sizeof cur_what, "pool %d (%s), buffer %llu since %llu (gen %llu)%s", p, htype_name(q->htype),
             (unsigned long long)b->id, (unsigned long long)since, (unsigned long long)bi.generation,
             q->asleep ? ", asleep" : "");
    size_t len = 0, nfds = 0;
    fabpool_status st = do_export(p, b, since, &len, &nfds);
    if (!shareable(p) || q->asleep) {
        EXPECT(st == (shareable(p) ? FABPOOL_ERR_ASLEEP : FABPOOL_ERR_NOT_SUPPORTED) ||
                   (q->asleep && st == FABPOOL_ERR_ASLEEP), shareable(p) ? "asleep.export" : "export.local",
               "fabpool_buffer_export -> %s", fabpool_status_name(st));
        if (st != FABPOOL_OK)
            refused(p, NULL);
        n_asleep_refused += q->asleep;
    } else {
        EXPECT_OK(st, "export", "fabpool_buffer_export");
    }
    if (st != FABPOOL_OK)
        return;
    for (size_t k = 0; k < nfds; k++)
        close(mine[k]);
}

static void op_export_done(int p)
{
    step_feats |= FB(F_EXPORT);
    export_done(p);
}

static void op_peers_ack(int p)
{
    pool_t *q = &P[p];
    int any = 0;
    for (int i = 0; i < q->nbuf; i++)
        any |= q->buf[i].shared;
    step_feats |= FB(F_EXPORT);
    if (ndead && (chance(25) || !any)) { /* a destroyed buffer, by its export id */
        int k = (int)below((uint64_t)ndead);
        int dp = dead[k].pool;
        step_pools |= 1u << dp;
        uint64_t g = chance(50) ? UINT64_MAX : below(64);
        snprintf(cur_what, sizeof cur_what, "pool %d, destroyed buffer 0x%llx by export id, ack %llu", dp,
                 (unsigned long long)dead[k].id, (unsigned long long)g);
        fabpool_status st = fabpool_peers_ack(P[dp].p, dead[k].id, g);
        if (!fault_refusal(st))
        EXPECT(st == FABPOOL_OK || st == FABPOOL_ERR_NOT_FOUND || st == FABPOOL_ERR_INVALID_ARG, "ack.dead",
               "fabpool_peers_ack by export id -> %s: %s", fabpool_status_name(st), fabpool_last_error());
        if (st == FABPOOL_ERR_NOT_FOUND || g == UINT64_MAX)
            dead[k] = dead[--ndead];
        return;
    }
    buf_t *b;
    do
        b = &q->buf[below((uint64_t)q->nbuf)];
    while (!b->shared);
    fabpool_buffer_info before = binfo(b);
    int peers;
    uint64_t g = peers_gen(b, before.generation, &peers);
    int bad = chance(15);
    if (bad)
        g = before.generation + 1 + below(1000);
    else if (!peers && chance(25))
        g = UINT64_MAX;
    snprintf(cur_what, sizeof cur_what, "pool %d, buffer %llu, ack %llu (generation %llu, %d peers)%s%s", p,
             (unsigned long long)b->id, (unsigned long long)g, (unsigned long long)before.generation, peers,
             bad ? ", never issued" : "", q->asleep ? ", asleep" : "");
    fabpool_status st = fabpool_buffer_peers_ack(b->h, g);
    if (bad) {
        step_feats |= FB(F_BAD);
        EXPECT(st != FABPOOL_OK, "ack.never_issued", "an ack of generation %llu, past the buffer's %llu, was accepted",
               (unsigned long long)g, (unsigned long long)before.generation);
        if (st != FABPOOL_OK)
            same_info("ack.never_issued_changed", b, &before);
        return;
    }
    EXPECT_OK(st, "peers_ack", "fabpool_buffer_peers_ack");
    if (st == FABPOOL_OK && (g > b->acked || g == UINT64_MAX))
        b->acked = g;
}

/* A late peer of buffer b: receives a full descriptor of its generation now, and opens it later.
 * 1 if it has one. */
static int stash_buffer(int p, buf_t *b)
{
    fabpool_buffer_info bi = binfo(b);
    size_t len = 0, nfds = 0;
    fabpool_status st = do_export(p, b, 0, &len, &nfds);
    EXPECT_OK(st, "export", "fabpool_buffer_export(since 0) for a late peer");
    if (st != FABPOOL_OK)
        return 0;
    stash_t *z = &stash[nstash++];
    *z = (stash_t){p, b->id, bi.generation, bi.mapped, b->size, len, nfds, malloc(len), {0}};
    memcpy(z->desc, desc, len);
    memcpy(z->fds, mine, nfds * sizeof(int));
    if (chance(70))
        fabpool_buffer_export_done(b->h);
    return 1;
}

static void op_late_stash(int p)
{
    pool_t *q = &P[p];
    buf_t *b = &q->buf[below((uint64_t)q->nbuf)];
    step_feats |= FB(F_LATE) | FB(F_EXPORT);
    snprintf(cur_what, sizeof cur_what, "pool %d (%s), buffer %llu at generation %llu", p, htype_name(q->htype),
             (unsigned long long)b->id, (unsigned long long)binfo(b).generation);
    stash_buffer(p, b);
}

/* Opens a view from an exported buffer's descriptor (fresh, or a late peer's) in pool t. */
static void open_view(int t, int src, buf_t *b, const uint8_t *d, size_t len, int *vfds, size_t nfds, uint64_t gen,
                      uint64_t live, size_t src_size, const char *key)
{
    pool_t *q = &P[t];
    view_t v;
    memset(&v, 0, sizeof v);
    step_pools |= 1u << t;
    v.vouched = chance(50); /* the peer is this process: a release keeps the view */
    if (v.vouched && !q->asleep)
        expired_views_go(t); /* the open closes the kept views past keep_ms first */
    int due = v.vouched && !q->asleep && kept_view_of(t, b->id);
    uint64_t imports0 = fault_calls_fn ? fault_calls_fn("cuMemImportFromShareableHandle") : 0;
    fabpool_status st = v.vouched ? fabpool_view_open_peer(q->p, getpid(), d, len, vfds, nfds, &v.h)
                                  : fabpool_view_open(q->p, d, len, vfds, nfds, &v.h);
    if (q->asleep) {
        n_asleep_refused++;
        EXPECT(refusal_is(t, st, FABPOOL_ERR_ASLEEP), "asleep.view_open", "fabpool_view_open -> %s",
               fabpool_status_name(st));
        if (st == FABPOOL_OK)
            fabpool_view_close(v.h);
        else
            refused(t, NULL);
        return;
    }
    if (st == FABPOOL_ERR_LIMIT && q->c.small_reserve) {
        n_limit++;
        refused(t, NULL);
        return;
    }
    if (!fault_refusal(st))
    EXPECT(st == FABPOOL_OK, key, "fabpool_view_open in pool %d of buffer %llu (pool %d, %s) at generation %llu "
           "(its generation now %llu, acked %llu) -> %s: %s", t, (unsigned long long)b->id, src,
           htype_name(P[src].htype), (unsigned long long)gen, (unsigned long long)binfo(b).generation,
           (unsigned long long)b->acked, fabpool_status_name(st), fabpool_last_error());
    if (st != FABPOOL_OK)
        return;
    v.src_pool = src;
    v.id = b->id;
    v.vid = next_id++;
    v.window = b->window;
    v.base = (uint64_t)(uintptr_t)fabpool_view_ptr(v.h);
    kview_t was;
    int took = v.vouched && kept_view_taken(t, v.base, &was);
    /* a kept view of the buffer is taken back (at its address), and only then; a fault in its apply closes it
     * and opens one afresh */
    EXPECT(took ? !was.block && was.v.id == b->id : !due || fault_fired(), "view_open.kept", "pool %d opened buffer "
           "%llu at 0x%llx: %s", t, (unsigned long long)b->id, (unsigned long long)v.base,
           took ? "at a kept view of something else" : "not at the kept view of it");
    n_view_taken += took;
    if (!took && !fault_fired() && fault_calls_fn) { /* afresh (a kept view past keep_ms too): every chunk imported */
        uint64_t imports = fault_calls_fn("cuMemImportFromShareableHandle") - imports0,
                 recs = (len - FABPOOL_DESC_HEADER_BYTES) / FABPOOL_DESC_RECORD_BYTES;
        n_fresh_imports++;
        EXPECT(imports == recs, "view_open.fresh", "pool %d opened buffer %llu afresh at 0x%llx with %llu imports; "
               "its descriptor has %llu chunks (a view kept past keep_ms taken back?)", t, (unsigned long long)b->id,
               (unsigned long long)v.base, (unsigned long long)imports, (unsigned long long)recs);
    }
    v.live = live;
    v.gen = gen;
    v.src_size = src_size;
    memcpy(v.pts, b->pts, sizeof v.pts);
    fabpool_buffer_info vi = {.struct_size = sizeof(fabpool_buffer_info)};
    fabpool_view_get_info(v.h, &vi);
    EXPECT(vi.generation == gen && vi.mapped == live && vi.max_size == b->window, "view_open.info", "view of buffer "
           "%llu: generation %llu, mapped %zu, window %zu; expected %llu, %llu, %llu", (unsigned long long)b->id,
           (unsigned long long)vi.generation, vi.mapped, vi.max_size, (unsigned long long)gen,
           (unsigned long long)live, (unsigned long long)b->window);
    t_checks++;
    if (!mapped_now(v.base, v.live))
        fail_("handout.unmapped", __LINE__, "a new view's %llu live bytes are not mapped", (unsigned long long)v.live);
    check_view(&v, -1);
    q->view[q->nview++] = v;
}

static int other_pool(int p, int (*ok)(int))
{
    int c[NPOOL], n = 0;
    for (int t = 0; t < NPOOL; t++)
        if (t != p && ok(t))
            c[n++] = t;
    return n ? c[below((uint64_t)n)] : -1;
}
static int has_view_room(int t) { return P[t].nview < MAXVIEW; }

static void op_late_open(int p)
{
    int i;
    do
        i = (int)below((uint64_t)nstash);
    while (stash[i].pool != p);
    stash_t z = stash[i];
    stash[i] = stash[--nstash]; /* the fds go to fabpool_view_open, whatever its answer */
    int t = other_pool(p, has_view_room);
    buf_t *b = find_buf(z.id, NULL);
    if (!b) {
        for (size_t k = 0; k < z.nfds; k++)
            close(z.fds[k]);
        free(z.desc);
        return;
    }
    fabpool_buffer_info bi = binfo(b);
    int changed = bi.generation > z.gen && b->shrunk_gen > z.gen;
    step_feats |= FB(F_LATE) | FB(F_VIEW);
    snprintf(cur_what, sizeof cur_what, "pool %d opens buffer %llu of pool %d (%s) at generation %llu, now %llu%s", t,
             (unsigned long long)z.id, p, htype_name(P[p].htype), (unsigned long long)z.gen,
             (unsigned long long)bi.generation, changed ? ", shrunk since" : "");
    n_late_open[P[p].htype]++;
    n_late_after_change[P[p].htype] += changed;
    open_view(t, p, b, z.desc, z.len, z.fds, z.nfds, z.gen, z.live, z.src_size,
              P[p].htype == FABPOOL_HANDLE_FABRIC ? "late_peer.open.fabric" : "late_peer.open.posix_fd");
    free(z.desc);
}

/* An exported buffer shrunk while a late peer holds the generation before (a refit with a late peer),
 * which then opens it in another pool. */
static void op_refit_late(int p)
{
    pool_t *q = &P[p];
    buf_t *b = &q->buf[below((uint64_t)q->nbuf)];
    step_feats |= FB(F_LATE) | FB(F_RESIZE) | FB(F_EXPORT) | FB(F_VIEW);
    if (b->size < 8 * MB)
        resize_one(p, b, b->window >= 12 * MB ? 12 * MB : b->window, stream_choice());
    if (!stash_buffer(p, b))
        return;
    int peers;
    fabpool_buffer_info bi = binfo(b);
    uint64_t g = peers_gen(b, bi.generation, &peers);
    if (fabpool_buffer_peers_ack(b->h, g) == FABPOOL_OK && g > b->acked)
        b->acked = g;
    resize_one(p, b, (size_t)logsize(1, 2 * MB), stream_choice());
    n_refit_late++;
    int i = nstash - 1;
    stash_t z = stash[i];
    stash[i] = stash[--nstash];
    int t = other_pool(p, has_view_room);
    snprintf(cur_what, sizeof cur_what, "pool %d (%s), buffer %llu exported at generation %llu (acked), shrunk to "
             "%zu; the late peer opens it in pool %d", p, htype_name(q->htype), (unsigned long long)b->id,
             (unsigned long long)z.gen, b->size, t);
    n_late_open[q->htype]++;
    n_late_after_change[q->htype] += binfo(b).generation > z.gen;
    if (t < 0) {
        for (size_t k = 0; k < z.nfds; k++)
            close(z.fds[k]);
    } else {
        open_view(t, p, b, z.desc, z.len, z.fds, z.nfds, z.gen, z.live, z.src_size,
                  q->htype == FABPOOL_HANDLE_FABRIC ? "late_peer.open.fabric" : "late_peer.open.posix_fd");
    }
    free(z.desc);
}

/* Pool p's buffer b exported in full (its generation now) and opened in pool t (a failure of the open: `key`);
 * the fds reach the peer most times. */
static void export_open(int t, int p, buf_t *b, const char *key)
{
    fabpool_buffer_info bi = binfo(b);
    size_t len = 0, nfds = 0;
    fabpool_status st = do_export(p, b, 0, &len, &nfds);
    EXPECT_OK(st, "view_open.export", "fabpool_buffer_export(since 0)");
    if (st != FABPOOL_OK)
        return;
    open_view(t, p, b, desc, len, mine, nfds, bi.generation, bi.mapped, b->size, key);
    if (chance(75))
        fabpool_buffer_export_done(b->h);
}

static void op_view_open(int p)
{
    buf_t *b = &P[p].buf[below((uint64_t)P[p].nbuf)];
    int t = other_pool(p, has_view_room);
    fabpool_buffer_info bi = binfo(b);
    step_feats |= FB(F_VIEW) | FB(F_EXPORT);
    snprintf(cur_what, sizeof cur_what, "pool %d%s opens buffer %llu of pool %d (%s, size %zu, gen %llu)", t,
             P[t].asleep ? " (asleep)" : "", (unsigned long long)b->id, p, htype_name(P[p].htype), b->size,
             (unsigned long long)bi.generation);
    export_open(t, p, b, "view_open");
}

/* ---- block exports viewed across new memory at the same address */

static long n_block_views, n_block_same_addr, n_block_renewed_sleep;
static void op_sleep(int p);
static void op_wake(int p);
static int sleep_failed(int p, fabpool_status st, fabpool_sleep_mode mode);
static void slept(int p, fabpool_sleep_mode mode, int partial);

/* Block b of pool p exported and opened in pool t (*v); the block's bytes read through the view at *at.  -1 when
 * a call was refused (the step's fault): nothing is left open. */
static int block_view_open(int p, int t, const blk_t *b, fabpool_view_t **v, uint64_t *at)
{
    size_t len = 0, nfds = 0, off = 0;
    *v = NULL;
    fabpool_status st = fabpool_block_export(P[p].p, b->p, desc, sizeof desc, &len, fds, MAXFD, &nfds, &off);
    EXPECT_OK(st, "block_view.export", "fabpool_block_export");
    if (st != FABPOOL_OK)
        return -1;
    (void)t_ledger(); /* the sim forgets the exported fds closed so far, before a dup may take their numbers */
    for (size_t i = 0; i < nfds; i++)
        mine[i] = dup(fds[i]);
    expired_views_go(t); /* the open closes pool t's kept views past keep_ms first */
    st = fabpool_view_open_peer(P[t].p, getpid(), desc, len, mine, nfds, v); /* kept at its release */
    if (st == FABPOOL_ERR_LIMIT && P[t].c.small_reserve) { /* the viewing pool's small reservation is full */
        n_limit++;
        refused(t, NULL);
        return -1; /* fabpool_view_open closed the fds, as on every outcome */
    }
    EXPECT_OK(st, "block_view.open", "fabpool_view_open of a block's descriptor");
    if (st != FABPOOL_OK)
        return -1;
    block_view_opened(t, *v, 1);
    step_pools |= 1u << t;
    *at = (uint64_t)(uintptr_t)fabpool_view_ptr(*v) + off;
    uint64_t pts[NPTS];
    blk_points(b, pts);
    check_points("block_view.data", "block (read through a view of its export)", b->id, *at, pts, 0, b->usable, -1);
    return 0;
}

/* Pool t's view of block `id`, released (kept by its pool) or closed. */
static void block_view_let_go(int t, fabpool_view_t *v, uint64_t id)
{
    fabpool_status st = block_view_let_go_as(t, v, id, 1, chance(70));
    EXPECT_OK(st, "block_view.release", "fabpool_view_release / fabpool_view_close of a block's view");
}

/* A block of pool p exported and viewed in pool t, the view released (pool t keeps it for keep_ms); then new
 * memory at the block's address: the block freed, the pool trimmed and the same size allocated again (mostly
 * at the same address), or the pool put to sleep and woken; new bytes written; exported and viewed again.  The
 * view must read the new bytes (a kept view of the old memory would read the old ones), and a write through it
 * must reach the block. */
static void op_block_view(int p)
{
    pool_t *q = &P[p];
    int t = other_pool(p, has_view_room), i = -1;
    for (int k = 0; k < q->nblk && i < 0; k++)
        if (!q->blk[(k + p) % q->nblk].recorded)
            i = (k + p) % q->nblk;
    if (i < 0 || t < 0 || P[t].asleep)
        return;
    int by_sleep = chance(35);
    step_feats |= FB(F_VIEW) | FB(F_EXPORT) | FB(F_PLAIN) | (by_sleep ? FB(F_SLEEP) : 0);
    blk_t b = q->blk[i];
    snprintf(cur_what, sizeof cur_what, "pool %d (%s), block %llu (%zu bytes at %p), viewed in pool %d; renewed by %s",
             p, htype_name(q->htype), (unsigned long long)b.id, b.size, b.p, t, by_sleep ? "sleep and wake" :
             "free, trim and alloc");
    check_blk(&b, -1);
    fabpool_view_t *v = NULL;
    uint64_t at = 0;
    if (block_view_open(p, t, &b, &v, &at) != 0)
        return;
    block_view_let_go(t, v, b.id);
    n_block_views++;
    void *old = b.p;
    if (by_sleep) {
        op_sleep(p);
        if (P[p].asleep) {
            op_wake(p);
            n_block_renewed_sleep += !P[p].asleep;
        }
        if (P[p].asleep || P[t].asleep)
            return;
        q->blk[i].id = next_id++; /* new bytes: a view of the old memory would read the old ones */
        write_blk(&q->blk[i]);
        b = q->blk[i];
    } else {
        fabpool_status st = fabpool_free(q->p, b.p);
        EXPECT_OK(st, "block_view.free", "fabpool_free");
        if (st != FABPOOL_OK)
            return;
        tr_live(p, -(int64_t)b.size);
        q->blk[i] = q->blk[--q->nblk];
        st = fabpool_trim(q->p, 0);
        EXPECT_OK(st, "block_view.trim", "fabpool_trim(0)");
        if (st == FABPOOL_OK)
            kept_drop(p, 1, 1, 0);
        blk_t nb = {NULL, b.size, 0, next_id++, 0};
        st = fabpool_alloc(q->p, nb.size, &nb.p);
        EXPECT_OK(st, "block_view.alloc", "fabpool_alloc");
        if (st != FABPOOL_OK)
            return;
        own_end(p);
        q->tr_allocs++;
        tr_live(p, (int64_t)nb.size);
        took_block(p, &nb, -1, 0, 0);
        q->blk[q->nblk++] = nb;
        b = nb;
        n_block_same_addr += b.p == old;
    }
    if (block_view_open(p, t, &b, &v, &at) != 0)
        return;
    uint64_t tag = pat(next_id++, 0), got = 0;
    t_checks++;
    if (!put(at, tag) || probe((uint64_t)(uintptr_t)b.p, tag, &got) != 1)
        fail_("block_view.write", __LINE__, "a write through the view of block %llu at %p did not reach it (reads "
              "0x%llx, wrote 0x%llx)", (unsigned long long)b.id, b.p, (unsigned long long)got,
              (unsigned long long)tag);
    write_blk(&b);
    block_view_let_go(t, v, b.id);
}

static void op_view_apply(int t)
{
    view_t *v;
    buf_t *b;
    int sp;
    do {
        v = &P[t].view[below((uint64_t)P[t].nview)];
        b = find_buf(v->id, &sp);
    } while (!b || v->broken || P[sp].asleep);
    step_pools |= 1u << sp;
    fabpool_buffer_info bi = binfo(b);
    step_feats |= FB(F_VIEW) | FB(F_EXPORT);
    size_t len = 0, nfds = 0;
    fabpool_status st = do_export(sp, b, v->gen, &len, &nfds);
    EXPECT_OK(st, "view_apply.export", "fabpool_buffer_export(since the view's generation)");
    if (st != FABPOOL_OK)
        return;
    snprintf(cur_what, sizeof cur_what, "pool %d%s, view of buffer %llu: gen %llu -> %llu", t,
             P[t].asleep ? " (asleep)" : "", (unsigned long long)b->id, (unsigned long long)v->gen,
             (unsigned long long)bi.generation);
    st = fabpool_view_apply(v->h, desc, len, mine, nfds);
    if (chance(75))
        fabpool_buffer_export_done(b->h);
    if (P[t].asleep) {
        n_asleep_refused++;
        EXPECT(refusal_is(t, st, FABPOOL_ERR_ASLEEP), "asleep.view_apply", "fabpool_view_apply -> %s",
               fabpool_status_name(st));
        if (st != FABPOOL_OK) {
            refused(t, NULL);
            return;
        }
    } else if (st == FABPOOL_ERR_LIMIT && P[t].c.small_reserve) {
        n_limit++;
        refused(t, NULL);
        return;
    }
    if (st == FABPOOL_ERR_PARTIAL && faults_fired() > 1) {
        /* a fault that keeps failing refused the replacement and the map back of what it replaced: the view lost
         * those chunks and ends where its info says, every byte of it mapped */
        flt.refused = 1;
        fabpool_buffer_info va = {.struct_size = sizeof(fabpool_buffer_info)};
        EXPECT(fabpool_view_get_info(v->h, &va) == FABPOOL_OK && (!va.mapped || mapped_now(v->base, va.mapped)),
               "partial.view", "view of buffer %llu after a partial apply: info says %zu bytes mapped, not all are",
               (unsigned long long)b->id, va.mapped);
        v->broken = 1;
        return;
    }
    EXPECT_OK(st, "view_apply", "fabpool_view_apply");
    if (st != FABPOOL_OK) {
        v->broken = 1;
        return;
    }
    v->gen = bi.generation;
    v->live = bi.mapped;
    v->src_size = b->size;
    fabpool_buffer_info va = {.struct_size = sizeof(fabpool_buffer_info)};
    fabpool_view_get_info(v->h, &va);
    EXPECT(va.generation == v->gen && va.mapped == v->live, "view_apply.info", "view of buffer %llu: generation %llu, "
           "mapped %zu after applying generation %llu of %llu bytes", (unsigned long long)b->id,
           (unsigned long long)va.generation, va.mapped, (unsigned long long)v->gen, (unsigned long long)v->live);
    check_view(v, -1);
}

static void op_view_close(int t)
{
    step_feats |= FB(F_VIEW);
    close_view(t);
}

static void op_dmabuf_open(int p)
{
    pool_t *q = &P[p];
    buf_t *b = &q->buf[below((uint64_t)q->nbuf)];
    fabpool_buffer_info bi = binfo(b);
    uint64_t pages = bi.mapped / 4096;
    uint64_t off = below(pages) * 4096, size = (1 + below(pages - off / 4096)) * 4096;
    step_feats |= FB(F_DMABUF);
    snprintf(cur_what, sizeof cur_what, "pool %d, buffer %llu [%llu, +%llu) of %zu mapped%s", p,
             (unsigned long long)b->id, (unsigned long long)off, (unsigned long long)size, bi.mapped,
             q->asleep ? ", asleep" : "");
    int fd = -1;
    fabpool_status st = fabpool_buffer_dmabuf(b->h, (size_t)off, (size_t)size, &fd);
    if (q->asleep) {
        n_asleep_refused++;
        EXPECT_ST(st, FABPOOL_ERR_ASLEEP, "asleep.dmabuf", "fabpool_buffer_dmabuf");
        if (st != FABPOOL_OK)
            refused(p, NULL);
    } else {
        EXPECT_OK(st, "dmabuf", "fabpool_buffer_dmabuf");
    }
    EXPECT((st == FABPOOL_OK) == (fd >= 0), "dmabuf.fd", "-> %s with fd %d", fabpool_status_name(st), fd);
    if (fd >= 0) {
        n_dmabuf++;
        dmabufs[ndmabuf++] = (dmabuf_t){p, b->id, fd};
    }
}

static void op_dmabuf_close(int p)
{
    int i;
    do
        i = (int)below((uint64_t)ndmabuf);
    while (dmabufs[i].pool != p);
    step_feats |= FB(F_DMABUF);
    snprintf(cur_what, sizeof cur_what, "pool %d, the dma-buf of buffer %llu", p, (unsigned long long)dmabufs[i].id);
    close_dmabuf(i);
}

/* ---- released and kept for reuse (keep_ms), with driver faults */

/* After a step whose driver fault fired, a pool may have given back a kept buffer or view the model keeps, or kept
 * one it gave back (a reuse's resize refused, then its give-back; a kept view's apply refused at a reopen, then its
 * close; an out-of-memory retry; a sleep refused early): where kept_bytes says so, a trim (the faults cleared)
 * gives everything kept back, and the model has it exact again. */
static void kept_resync(int fired)
{
    for (int p = 0; p < NPOOL; p++) {
        fabpool_stats s = {.struct_size = sizeof s};
        fabpool_get_stats(P[p].p, &s);
        if (s.kept_bytes == kept_model(p) || !fired)
            continue; /* (without a fault check_ledger reports it) */
        n_kept_resync++;
        fabpool_status st = fabpool_trim(P[p].p, SIZE_MAX);
        EXPECT(st == FABPOOL_OK, "kept.resync", "fabpool_trim after a faulted step -> %s: %s", fabpool_status_name(st),
               fabpool_last_error());
        kept_drop(p, 1, 1, 0);
    }
}

/* fabpool_buffer_release of one of pool p's buffers (acked, if exported): kept, its handle refused, kept_bytes
 * counting what it maps; its late peers give up.  Those kept past keep_ms go first.  A traced pool's trace has the
 * release as the buffer's destroy.  While the pool sleeps (whose sleep gave back what was kept) the release is
 * fabpool_buffer_destroy(buf, NULL) (fabpool.h): nothing is kept, and the wake brings none of it back. */
static int can_release(int p) { return has_releasable(p); }
static void op_buffer_release(int p)
{
    pool_t *q = &P[p];
    int i = (int)below((uint64_t)q->nbuf);
    while (!buf_releasable(&q->buf[i]))
        i = (i + 1) % q->nbuf;
    buf_t *b = &q->buf[i];
    fabpool_buffer_info before = binfo(b);
    step_feats |= FB(F_RESIZE);
    snprintf(cur_what, sizeof cur_what, "pool %d, buffer %llu (size %zu, mapped %zu)%s, %d kept%s", p,
             (unsigned long long)b->id, b->size, before.mapped, b->shared ? ", exported and acked" : "", q->nkbuf,
             q->asleep ? ", asleep: a destroy" : "");
    if (!q->asleep)
        check_buf(b, -1);
    fabpool_stats s0 = {.struct_size = sizeof s0};
    fabpool_get_stats(q->p, &s0);
    fabpool_status st = fabpool_buffer_release(b->h);
    EXPECT_OK(st, "buffer_release", "fabpool_buffer_release");
    if (st != FABPOOL_OK) /* refused for a fault (asleep: the destroy's): the buffer is the caller's as before */
        return;
    drop_stashes_of(b->id, p);
    EXPECT(!fabpool_buffer_ptr(b->h) && fabpool_buffer_resize(b->h, 1, NULL) == FABPOOL_ERR_INVALID_ARG,
           "buffer_release.handle", "the released handle %p still answers", (void *)b->h);
    n_release_traced += q->c.trace != TRACE_NONE;
    tr_live(p, -(int64_t)b->size);
    if (q->asleep) {
        n_release_asleep++;
        fabpool_stats s1 = {.struct_size = sizeof s1};
        fabpool_get_stats(q->p, &s1);
        EXPECT(s1.kept_bytes == s0.kept_bytes && s1.buffers + 1 == s0.buffers, "buffer_release.asleep", "a release "
               "of a sleeping pool's buffer (%zu bytes mapped before the sleep) kept it: kept_bytes %llu -> %llu, "
               "buffers %llu -> %llu (the pool maps %llu)", before.mapped, (unsigned long long)s0.kept_bytes,
               (unsigned long long)s1.kept_bytes, (unsigned long long)s0.buffers, (unsigned long long)s1.buffers,
               (unsigned long long)s1.mapped_bytes);
        if (b->shared && b->acked != UINT64_MAX && ndead < MAXDEAD)
            dead[ndead].pool = p, dead[ndead++].id = before.export_id;
        q->buf[i] = q->buf[--q->nbuf];
        return;
    }
    expired_bufs_go(p);
    q->kbuf[q->nkbuf++] = (kbuf_t){*b, before.mapped, b->h, before.export_id, 0};
    q->buf[i] = q->buf[--q->nbuf];
}

/* fabpool_buffer_reuse on pool p: the nearest kept buffer at its base under a new handle, its data below the
 * smaller of its sizes kept; none fits: FABPOOL_ERR_NOT_FOUND and every kept buffer given back.  Those past keep_ms
 * go first: never handed out.  Refused for a fault: nothing handed out, the buffer given back or kept
 * (kept_resync).  A traced pool's trace has a reuse as a buffer created at its size (a refused one: created and
 * destroyed).  Asleep: FABPOOL_ERR_ASLEEP, nothing handed out, nothing kept given back. */
static int can_reuse(int p) { return P[p].nbuf < MAXBUF && (P[p].nkbuf > 0 || chance(P[p].asleep ? 50 : 10)); }
static void op_buffer_reuse(int p)
{
    pool_t *q = &P[p];
    uint64_t win = q->nkbuf ? q->kbuf[below((uint64_t)q->nkbuf)].b.window : 128 * MB;
    size_t sz = chance(85) ? buf_size(win) : (size_t)logsize(1, 128 * MB);
    int s = stream_choice(), best = -1, expired = 0;
    uint64_t best_d = UINT64_MAX;
    for (int k = 0; k < q->nkbuf; k++) {
        uint64_t live = q->kbuf[k].live, d = live > sz ? live - sz : sz - live;
        expired += q->kbuf[k].expired;
        if (q->kbuf[k].b.window >= sz && d < best_d && !q->kbuf[k].expired)
            best = k, best_d = d;
    }
    step_feats |= FB(F_RESIZE);
    snprintf(cur_what, sizeof cur_what, "pool %d, %zu bytes, stream %s, %d kept (%d past keep_ms)%s%s", p, sz,
             stream_name(s), q->nkbuf, expired, best < 0 ? ", none fits" : "", q->asleep ? ", asleep" : "");
    fabpool_stats s0 = {.struct_size = sizeof s0};
    fabpool_get_stats(q->p, &s0);
    fabpool_buffer_t *r = NULL;
    fabpool_status st = fabpool_buffer_reuse(q->p, sz, sptr(s), &r);
    if (q->asleep) { /* refused before anything kept is looked at */
        n_reuse_asleep++;
        n_asleep_refused++;
        fabpool_stats s1 = {.struct_size = sizeof s1};
        fabpool_get_stats(q->p, &s1);
        EXPECT(st == FABPOOL_ERR_ASLEEP && !r && s1.kept_bytes == s0.kept_bytes && s1.buffers == s0.buffers,
               "buffer_reuse.asleep", "fabpool_buffer_reuse of a sleeping pool -> %s (%p), kept_bytes %llu -> %llu, "
               "buffers %llu -> %llu", fabpool_status_name(st), (void *)r, (unsigned long long)s0.kept_bytes,
               (unsigned long long)s1.kept_bytes, (unsigned long long)s0.buffers, (unsigned long long)s1.buffers);
        if (st == FABPOOL_OK)
            (void)fabpool_buffer_destroy(r, NULL);
        refused(p, NULL);
        return;
    }
    n_reuse_traced += q->c.trace != TRACE_NONE;
    uint64_t at = st == FABPOOL_OK ? (uint64_t)(uintptr_t)fabpool_buffer_ptr(r) : 0;
    int k = 0;
    while (k < q->nkbuf && q->kbuf[k].b.base != at)
        k++;
    if (best < 0) {
        EXPECT((st == FABPOOL_ERR_NOT_FOUND && !r) || (fault_fired() && st == FABPOOL_OK && k < q->nkbuf),
               "buffer_reuse.miss", "no kept buffer's window holds %zu bytes (%d kept past keep_ms), the reuse "
               "answered %s", sz, expired, fabpool_status_name(st));
        if (st == FABPOOL_OK) { /* an expired one whose give-back a fault refused: given back, the driver well */
            fault_spend();
            EXPECT(fabpool_buffer_destroy(r, NULL) == FABPOOL_OK, "buffer_reuse.miss", "the destroy of a buffer "
                   "past keep_ms that a reuse handed out after a fault: %s", fabpool_last_error());
        }
        n_expired_bufs += expired;
        kept_drop(p, 1, 0, 0);
        n_reuse_miss++;
        return;
    }
    EXPECT_OK(st, "buffer_reuse", "fabpool_buffer_reuse");
    n_reuse_hit += st == FABPOOL_OK;
    n_reuse_refused += st != FABPOOL_OK;
    EXPECT(st == FABPOOL_OK || !r, "buffer_reuse.refused_out", "a refused reuse handed out %p", (void *)r);
    if (st != FABPOOL_OK) {
        tr_live(p, (int64_t)sz); /* the trace: created, its resize refused, destroyed */
        tr_live(p, -(int64_t)sz);
        expired_bufs_go(p);
        return; /* kept_resync has what the pool kept */
    }
    kbuf_t *e = &q->kbuf[k];
    uint64_t d = k < q->nkbuf ? (e->live > sz ? e->live - sz : sz - e->live) : UINT64_MAX;
    EXPECT(k < q->nkbuf && ((d == best_d && !e->expired) || fault_fired()) && r != e->gone &&
               !fabpool_buffer_ptr(e->gone), "buffer_reuse.best_fit", "the reuse of %zu bytes gave %p at 0x%llx, not "
           "the nearest kept buffer within keep_ms under a new handle (nearest: %llu bytes off; %s)", sz, (void *)r,
           (unsigned long long)at, (unsigned long long)best_d, k == q->nkbuf ? "none kept there" : e->expired ?
           "one past keep_ms" : "another");
    if (k == q->nkbuf) {
        fault_spend();
        (void)fabpool_buffer_destroy(r, NULL);
        expired_bufs_go(p);
        return;
    }
    buf_t b = e->b;
    fabpool_buffer_info before = {.struct_size = sizeof before, .size = b.size, .mapped = (size_t)e->live};
    size_t old = b.size;
    q->kbuf[k] = q->kbuf[--q->nkbuf];
    expired_bufs_go(p);
    b.h = r;
    b.size = sz;
    q->buf[q->nbuf++] = b;
    /* the trace: created at sz (its release was its destroy), where after_resize counts a resize from old */
    tr_live(p, (int64_t)sz);
    q->tr_live -= (uint64_t)((int64_t)sz - (int64_t)old);
    after_resize(p, &q->buf[q->nbuf - 1], &before, old, s);
}

/* fabpool_view_release of one of pool t's views: a vouched peer's is kept for a reopen (those kept past keep_ms
 * go first), the others closed; the same while pool t sleeps (a peer's view stays mapped: fabpool.h). */
static int can_release_view(int t)
{
    for (int i = 0; i < P[t].nview; i++)
        if (!P[t].view[i].broken)
            return P[t].nkview < MAXKEPT;
    return 0;
}
static void op_view_release(int t)
{
    int i = (int)below((uint64_t)P[t].nview);
    while (P[t].view[i].broken)
        i = (i + 1) % P[t].nview;
    view_t *v = &P[t].view[i];
    step_feats |= FB(F_VIEW);
    snprintf(cur_what, sizeof cur_what, "pool %d%s, view of buffer %llu%s%s", t, P[t].asleep ? " (asleep)" : "",
             (unsigned long long)v->id, find_buf(v->id, NULL) ? "" : " (not live)",
             v->vouched ? ", a vouched peer's" : ", closed");
    check_view(v, -1);
    fabpool_status st = fabpool_view_release(v->h);
    EXPECT_OK(st, "view_release", "fabpool_view_release");
    if (st != FABPOOL_OK) {
        v->broken = 1; /* a refused close: open with what it still maps */
        return;
    }
    EXPECT(!fabpool_view_ptr(v->h), "view_release.handle", "the released view's handle %p still answers",
           (void *)v->h);
    n_view_release_asleep += P[t].asleep;
    if (v->vouched) {
        expired_views_go(t);
        P[t].kview[P[t].nkview++] = (kview_t){*v, 0, 0};
    }
    drop_view(t, i);
}

/* A kept view of a live buffer opened again by its peer: taken back at its address, its data the buffer's now;
 * where a fault refuses its apply it is closed (or stays kept) and the open maps one afresh or is refused.  One
 * past keep_ms is closed first: the open maps a view afresh.  While pool t sleeps the open is refused
 * (FABPOOL_ERR_ASLEEP) and the kept view stays kept. */
static int can_reopen(int t)
{
    int sp;
    for (int i = 0; i < P[t].nkview; i++)
        if (!P[t].kview[i].block && find_buf(P[t].kview[i].v.id, &sp) && !find_buf(P[t].kview[i].v.id, &sp)->broken &&
            !P[sp].asleep)
            return P[t].nview < MAXVIEW;
    return 0;
}
static void op_view_reopen(int t)
{
    int i = (int)below((uint64_t)P[t].nkview), sp = 0;
    buf_t *b;
    while (P[t].kview[i].block || !(b = find_buf(P[t].kview[i].v.id, &sp)) || b->broken || P[sp].asleep)
        i = (i + 1) % P[t].nkview;
    fabpool_buffer_info bi = binfo(b);
    step_feats |= FB(F_VIEW) | FB(F_EXPORT);
    step_pools |= 1u << sp;
    snprintf(cur_what, sizeof cur_what, "pool %d%s, kept view of buffer %llu of pool %d opened again (gen %llu -> "
             "%llu)%s", t, P[t].asleep ? " (asleep)" : "", (unsigned long long)b->id, sp,
             (unsigned long long)P[t].kview[i].v.gen, (unsigned long long)bi.generation,
             P[t].kview[i].expired ? ", past keep_ms" : "");
    n_reopen_asleep += P[t].asleep;
    export_open(t, sp, b, "view_reopen");
    view_t *v = P[t].nview ? &P[t].view[P[t].nview - 1] : NULL;
    if (v && v->id == b->id && v->vid >= step_first_id && !v->broken)
        view_reads_buffer(v, b);
}

/* keep_ms passes for what every pool keeps (the pools' clock moves on, property.h), amid whatever the pools hold
 * then (exports, held streams, sleep, a driver fault of the step); pool p then makes a call that gives back what is
 * past it: a collect, whose give-back the ledger sees to the byte (every kept buffer's and view's mapped bytes
 * unmapped, and the device bytes that nothing else maps given back to the driver: a view's memory is its
 * exporter's, a buffer's stays alive under a peer's view or a dma-buf), or a reuse (of a size an expired buffer
 * would fit: none is handed out, FABPOOL_ERR_NOT_FOUND), a reopen of an expired view (a view afresh, every chunk
 * imported), a release, a view release or a resize.  The other pools' expired buffers and views go at their own
 * next such call, meeting the operations between. */
static int has_kept(int p) { return P[p].nkbuf + P[p].nkview > 0; }
static void op_keep_expire(int p)
{
    pool_t *q = &P[p];
    int how = (int)below(8); /* 0-2: collect; 3 reuse; 4 reopen; 5 release; 6 view release; 7 resize */
    if ((how == 3 && !can_reuse(p)) || (how == 4 && !can_reopen(p)) || (how == 5 && !can_release(p)) ||
        (how == 6 && !can_release_view(p)) || (how == 7 && !has_buf(p)))
        how = 0;
    static const char *const said[] = {"a collect", "a collect", "a collect", "a reuse", "a reopen", "a release",
                                       "a view release", "a resize"};
    snprintf(cur_what, sizeof cur_what, "pool %d%s: %d buffers and %d views kept, keep_ms passes, then %s", p,
             q->asleep ? " (asleep)" : "", q->nkbuf, q->nkview, said[how]);
    step_feats |= FB(F_RESIZE) | (q->nkview ? FB(F_VIEW) : 0);
    n_expire_steps++;
    if (how >= 3) {
        kept_expire_all(600000 + 1000);
        if (how == 3)
            op_buffer_reuse(p);
        else if (how == 4)
            op_view_reopen(p);
        else if (how == 5)
            op_buffer_release(p);
        else if (how == 6)
            op_view_release(p);
        else
            op_buffer_resize(p);
        return;
    }
    /* what a collect gives back besides (retired chunks whose work is done, blocks freed on streams) goes first */
    fabpool_status st = fabpool_collect(q->p, 0);
    EXPECT_OK(st, "collect", "fabpool_collect");
    expired_bufs_go(p);
    expired_views_go(p);
    uint64_t want_mapped = 0, want_held = 0, peer_held = 0;
    for (int i = 0; i < q->nkbuf; i++) {
        const kbuf_t *k = &q->kbuf[i];
        int other = 0; /* a view of it (open or kept) in any pool, or a dma-buf of it, keeps its memory alive */
        for (int t = 0; t < NPOOL; t++) {
            for (int j = 0; j < P[t].nview; j++)
                other |= P[t].view[j].id == k->b.id;
            for (int j = 0; j < P[t].nkview; j++)
                other |= !P[t].kview[j].block && P[t].kview[j].v.id == k->b.id;
        }
        for (int j = 0; j < ndmabuf; j++)
            other |= dmabufs[j].id == k->b.id;
        want_mapped += k->live;
        if (other)
            peer_held += k->live;
        else
            want_held += k->live;
    }
    for (int i = 0; i < q->nkview; i++) {
        want_mapped += q->kview[i].v.live;
        peer_held += q->kview[i].v.live; /* given back only where its exporter let go of the chunk */
    }
    int quiet = !fault_fired();
    fabsim_ledger l0 = t_ledger();
    fabpool_stats s0 = {.struct_size = sizeof s0};
    fabpool_get_stats(q->p, &s0);
    kept_expire_all(600000 + 1000);
    st = fabpool_collect(q->p, 0);
    EXPECT_OK(st, "collect", "fabpool_collect after keep_ms passed");
    int nb = q->nkbuf, nv = q->nkview;
    expired_bufs_go(p);
    expired_views_go(p);
    fabsim_ledger l1 = t_ledger();
    fabpool_stats s1 = {.struct_size = sizeof s1};
    fabpool_get_stats(q->p, &s1);
    if (!quiet || fault_fired())
        return; /* a give-back a fault refused stays kept: kept_resync */
    n_expire_exact++;
    /* a kept buffer goes as a destroy on no stream: the context synchronize completes the held streams, and the
     * memory retired on them goes in the same collect (the pool's retiring_bytes, which the ledger checks hold to
     * the sim's) */
    uint64_t unmapped = l0.bytes_mapped - l1.bytes_mapped, freed = l0.bytes_held - l1.bytes_held,
             retired = s0.retiring_bytes - s1.retiring_bytes;
    EXPECT(unmapped == want_mapped + retired && s0.mapped_bytes - s1.mapped_bytes == unmapped && s1.kept_bytes == 0,
           "keep_expire.mapped", "%d kept buffers and %d kept views past keep_ms, %llu bytes mapped (and %llu retired "
           "bytes done): the collect unmapped %llu bytes (the pool counts %llu fewer), kept_bytes %llu -> %llu", nb,
           nv, (unsigned long long)want_mapped, (unsigned long long)retired, (unsigned long long)unmapped,
           (unsigned long long)(s0.mapped_bytes - s1.mapped_bytes), (unsigned long long)s0.kept_bytes,
           (unsigned long long)s1.kept_bytes);
    n_expire_held_exact += peer_held == 0 && retired == 0;
    EXPECT(freed >= want_held && freed <= want_held + peer_held + retired, "keep_expire.held", "%d kept buffers and "
           "%d kept views past keep_ms: the driver holds %llu bytes fewer after the collect, expected %llu (and up to "
           "%llu more of memory a peer's view or a dma-buf may have kept alive, and of %llu retired bytes done)", nb,
           nv, (unsigned long long)freed, (unsigned long long)want_held, (unsigned long long)peer_held,
           (unsigned long long)retired);
}

/* ---- the high-water marks */

static void op_reset_peak(int p)
{
    step_feats |= FB(F_CACHE);
    reset_peak_pool(p);
}

/* ------------------------------------------------------------ operations: sleep and wake */

static void op_sleep(int p)
{
    pool_t *q = &P[p];
    if (chance(60))
        peers_leave(p); /* the peers of its buffers are gone: a sleep may go ahead */
    int must = 1;       /* no exported buffer still viewed, no destroyed one waiting for its peers */
    for (int i = 0; i < q->nbuf; i++)
        must &= !q->buf[i].shared || q->buf[i].acked == UINT64_MAX;
    for (int i = 0; i < ndead; i++)
        must &= dead[i].pool != p;
    must &= !kept_shared(p);
    fabpool_sleep_mode mode = chance(60) ? FABPOOL_SLEEP_OFFLOAD : FABPOOL_SLEEP_DISCARD;
    int s = stream_choice();
    step_feats |= FB(F_SLEEP);
    snprintf(cur_what, sizeof cur_what, "pool %d, %s, stream %s, %s", p,
             mode == FABPOOL_SLEEP_OFFLOAD ? "offload" : "discard", stream_name(s),
             must ? "no peer left" : "exported buffers");
    fabpool_stats s0 = {.struct_size = sizeof(fabpool_stats)};
    fabpool_get_stats(q->p, &s0);
    fabpool_status st = fabpool_sleep(q->p, mode, sptr(s));
    if (st == FABPOOL_ERR_BUSY && !must) {
        n_sleep_busy++;
        fabpool_stats s1 = {.struct_size = sizeof(fabpool_stats)};
        fabpool_get_stats(q->p, &s1);
        EXPECT(s1.mapped_bytes == s0.mapped_bytes && s1.blocks == s0.blocks, "sleep.busy_changed", "a refused sleep "
               "changed the pool: %llu -> %llu bytes mapped", (unsigned long long)s0.mapped_bytes,
               (unsigned long long)s1.mapped_bytes);
        return;
    }
    kept_drop(p, 1, 1, 0); /* a sleep gives back what was kept for reuse (one a fault refused early: resynced) */
    if (st != FABPOOL_OK && sleep_failed(p, st, mode))
        return;
    EXPECT_OK(st, "sleep", "fabpool_sleep");
    if (st != FABPOOL_OK)
        return;
    n_slept++;
    slept(p, mode, 0);
}

/* A sleep refused for a driver fault (fabpool.h): awake with every byte in place (an exact rollback; the
 * status is the fault's), or asleep where it answers FABPOOL_ERR_PARTIAL (a discard that had dropped contents
 * went on, a rollback that failed too), which no fault-free call answers; the model follows (slept).  1 when
 * the model has what the pool is now. */
static int sleep_failed(int p, fabpool_status st, fabpool_sleep_mode mode)
{
    pool_t *q = &P[p];
    fabpool_sleep_info si = {.struct_size = sizeof(fabpool_sleep_info)};
    fabpool_sleep_state(q->p, &si);
    EXPECT(si.asleep == (st == FABPOOL_ERR_PARTIAL) && (st != FABPOOL_ERR_PARTIAL || fault_fired()),
           "sleep.failed_state", "a sleep that answered %s (%s) left pool %d %s", fabpool_status_name(st),
           fabpool_last_error(), p, si.asleep ? "asleep" : "awake");
    if (!si.asleep) { /* as before the call: every sample reads back */
        for (int i = 0; i < q->nblk; i++)
            check_blk(&q->blk[i], -1);
        for (int i = 0; i < q->nbuf; i++)
            check_buf(&q->buf[i], -1);
        return 0;
    }
    n_sleep_partial++;
    slept(p, mode, 1);
    return 1;
}

/* Pool p asleep after a sleep with `mode` (partial: one that answered FABPOOL_ERR_PARTIAL). */
static void slept(int p, fabpool_sleep_mode mode, int partial)
{
    pool_t *q = &P[p];
    q->asleep = 1;
    q->partial = partial;
    q->mode = mode;
    /* the sleep waited for what it unmaps: retirements and the owner's freed blocks are done (the sim
     * completes a stream that is waited for); blocks pending in the queue stay live, asleep */
    refresh_streams();
    int w = 0;
    for (int i = 0; i < nrec; i++) {
        rec_t *r = &rec[i];
        if (r->pool == p && rec_stream_pending(r))
            fail_("sleep.retired_unfenced", __LINE__, "buffer %llu: memory retired on stream %d whose work pends was "
                  "unmapped by the sleep", (unsigned long long)r->id, r->stream);
        if (r->pool != p)
            rec[w++] = *r;
    }
    nrec = w;
    w = 0;
    for (int i = 0; i < npend; i++) {
        pend_t *e = &pend[i];
        if (e->pool == p && e->owner && pending_on(e->stream, e->epoch))
            fail_("sleep.owner_unfenced", __LINE__, "block %p freed on the owner stream %d whose work pends was "
                  "unmapped by the sleep", e->b.p, e->stream);
        if (e->pool != p || !e->owner)
            pend[w++] = *e;
    }
    npend = w;
    fabpool_sleep_info si = {.struct_size = sizeof(fabpool_sleep_info)};
    fabpool_sleep_state(q->p, &si);
    EXPECT(si.asleep && si.mode == mode, "sleep.state", "after a sleep: asleep %d, mode %d", si.asleep, (int)si.mode);
}

static void op_wake(int p)
{
    pool_t *q = &P[p];
    int s = stream_choice();
    step_feats |= FB(F_SLEEP);
    snprintf(cur_what, sizeof cur_what, "pool %d, slept with %s, stream %s", p,
             q->mode == FABPOOL_SLEEP_OFFLOAD ? "offload" : "discard", stream_name(s));
    fabpool_status st = fabpool_wake(q->p, sptr(s));
    if (fault_refusal(st)) { /* refused: still asleep, with what it restored kept; the next wake completes it */
        fabpool_sleep_info si = {.struct_size = sizeof(fabpool_sleep_info)};
        fabpool_sleep_state(q->p, &si);
        EXPECT(si.asleep, "fault.wake_state", "a wake refused for a driver fault left pool %d awake", p);
        fault_spend();
        st = fabpool_wake(q->p, sptr(s));
    }
    EXPECT_OK(st, "wake", "fabpool_wake");
    if (st != FABPOOL_OK)
        return;
    q->asleep = q->partial = 0;
    fabpool_sleep_info si = {.struct_size = sizeof(fabpool_sleep_info)};
    fabpool_sleep_state(q->p, &si);
    EXPECT(!si.asleep && (q->c.keep_host || si.host_bytes == 0), "wake.state", "after a wake: asleep %d, %llu host "
           "bytes held (sleep_keep_host %d)", si.asleep, (unsigned long long)si.host_bytes, q->c.keep_host);
    if (q->mode == FABPOOL_SLEEP_DISCARD) { /* contents unspecified: the program writes them again */
        n_woke_discard++;
        for (int i = 0; i < q->nblk; i++)
            write_blk(&q->blk[i]);
        for (int i = 0; i < q->nbuf; i++)
            if (!q->buf[i].broken)
                write_points(q->buf[i].id, q->buf[i].base, q->buf[i].pts, 0, q->buf[i].size);
        for (int i = 0; i < npend; i++)
            if (pend[i].pool == p)
                pend[i].nodata = 1;
        return;
    }
    for (int i = 0; i < q->nblk; i++) /* offload: every byte is back */
        check_blk(&q->blk[i], -1);
    for (int i = 0; i < q->nbuf; i++)
        check_buf(&q->buf[i], -1);
}

static void op_sleep_state(int p)
{
    pool_t *q = &P[p];
    fabpool_sleep_info si = {.struct_size = sizeof(fabpool_sleep_info)};
    step_feats |= FB(F_SLEEP);
    snprintf(cur_what, sizeof cur_what, "pool %d%s", p, q->asleep ? ", asleep: and a second sleep" : "");
    fabpool_status st = fabpool_sleep_state(q->p, &si);
    EXPECT(st == FABPOOL_OK && si.asleep == q->asleep, "sleep_state", "-> %s, asleep %d (the test: %d)",
           fabpool_status_name(st), si.asleep, q->asleep);
    if (q->asleep) {
        st = fabpool_sleep(q->p, FABPOOL_SLEEP_OFFLOAD, NULL);
        EXPECT_ST(st, FABPOOL_ERR_ASLEEP, "sleep.twice", "a second fabpool_sleep");
        step_feats |= FB(F_BAD);
    }
}

/* ------------------------------------------------------------ operations: streams */

static void op_hold(int p)
{
    (void)p;
    int s = (int)below(NSTREAM);
    snprintf(cur_what, sizeof cur_what, "stream %d", s);
    hold(s);
}

static void op_release(int p)
{
    (void)p;
    refresh_streams();
    int s = (int)below(NSTREAM);
    for (int k = 0; k < NSTREAM && !held[s]; k++)
        s = (s + 1) % NSTREAM;
    snprintf(cur_what, sizeof cur_what, "stream %d (%s)", s, held[s] ? "held" : "not held");
    release(s);
}

/* ------------------------------------------------------------ operations: pools */

/* Creates pool p with the options of configuration c; the model holds nothing of it yet. */
static int create_pool(int p, const pool_conf *c)
{
    pool_t *q = &P[p];
    memset(q, 0, sizeof *q);
    q->c = *c;
    fabpool_options o;
    fabpool_options_init(&o);
    o.handle_type = c->handle;
    o.reserve_bytes = c->small_reserve ? 512 * MB : 8 * GB;
    o.cache_limit_bytes = 64 * MB;
    o.max_chunk_bytes = 32 * MB;
    o.stream_owner = (uint32_t)c->stream_owner;
    o.thread_cache = (uint32_t)c->thread_cache;
    o.sleep_keep_host = (uint32_t)c->keep_host;
    if (c->slab_max_kib)
        o.slab_max_bytes = (uint64_t)c->slab_max_kib * KB;
    o.large_chunks = c->whole ? FABPOOL_LARGE_CHUNKS_WHOLE : FABPOOL_LARGE_CHUNKS_GRID;
    o.keep_ms = 600000; /* what is released stays kept until the steps give it back, however slow the run */
    if (c->trace != TRACE_NONE)
        snprintf(q->trace_path, sizeof q->trace_path, "%s/seed%llu-pool%d.trace", tmpdir, cur_seed, p);
    snprintf(o.trace_path, sizeof o.trace_path, "%s", q->trace_path);
    q->own = c->stream_owner ? OWN_NONE : OWN_OFF;
    own_unknown[p] = 0;
    peak_seen[p] = 0;
    fabpool_status st = fabpool_create(&o, &q->p);
    EXPECT_OK(st, "pool_create", "fabpool_create");
    if (st != FABPOOL_OK)
        return -1;
    q->htype = fabpool_handle_type_of(q->p);
    EXPECT(q->htype == c->handle, "pool_create", "pool %d: handle type %s, asked %s", p, htype_name(q->htype),
           htype_name(c->handle));
    return 0;
}

/* Everything of pool p given back, as a program that is done with it: the peers of its buffers gone, its
 * dma-bufs and views closed, its buffers destroyed, its blocks freed, their work waited for, the cache
 * trimmed. */
static void drain_pool(int p)
{
    pool_t *q = &P[p];
    if (q->asleep)
        op_wake(p);
    for (int i = 0; i < ndmabuf;)
        if (dmabufs[i].pool == p)
            close_dmabuf(i);
        else
            i++;
    peers_leave(p);
    while (q->nview) {
        EXPECT_OK(fabpool_view_close(q->view[0].h), "view_close", "fabpool_view_close");
        drop_view(p, 0);
    }
    while (q->nbuf) {
        EXPECT_OK(fabpool_buffer_destroy(q->buf[0].h, NULL), "buffer_destroy", "fabpool_buffer_destroy");
        tr_live(p, -(int64_t)q->buf[0].size);
        q->buf[0] = q->buf[--q->nbuf];
    }
    while (q->nblk) { /* (a trace of the stream pair only stays so) */
        EXPECT_OK(stream_only(p) ? fabpool_free_on_stream(q->p, q->blk[0].p, NULL) : fabpool_free(q->p, q->blk[0].p),
                  "free", "fabpool_free");
        tr_live(p, -(int64_t)q->blk[0].size);
        q->blk[0] = q->blk[--q->nblk];
    }
    EXPECT_OK(fabpool_collect(q->p, 1), "collect", "fabpool_collect(wait)");
    EXPECT_OK(fabpool_trim(q->p, 0), "trim", "fabpool_trim(0)");
    kept_drop(p, 1, 1, 0);
    refresh_streams();
    fabpool_stats st = {.struct_size = sizeof(fabpool_stats)};
    fabpool_get_stats(q->p, &st);
    EXPECT(st.mapped_bytes == st.view_bytes && st.buffers == 0 && st.retiring_bytes == 0 &&
               st.stream_pending_blocks == 0, "drain.leak", "pool %d: %llu bytes mapped (%llu of views), %llu "
           "retiring, %llu buffers, %llu blocks pending left after everything was freed, collect(wait) and trim(0)", p,
           (unsigned long long)st.mapped_bytes, (unsigned long long)st.view_bytes,
           (unsigned long long)st.retiring_bytes, (unsigned long long)st.buffers,
           (unsigned long long)st.stream_pending_blocks);
}

/* A pool ends and a new one of the same options takes its place (fabpool_destroy and fabpool_create
 * amid the others' traffic).  Half the time the new pool then meets a bad pointer on a stream before its
 * first stream call, and a good free on another stream, which the owner rule says goes to the pool at once. */
static void op_pool_renew(int p)
{
    pool_t *q = &P[p];
    pool_conf c = q->c;
    snprintf(cur_what, sizeof cur_what, "pool %d (%s, owner %s)", p, htype_name(q->htype),
             c.stream_owner ? "on" : "off");
    drain_pool(p);
    EXPECT_OK(fabpool_destroy(q->p), "pool_destroy", "fabpool_destroy");
    q->p = NULL;
    if (create_pool(p, &c) != 0)
        return;
    if (!c.stream_owner || chance(50))
        return;
    step_feats |= FB(F_OWNER) | FB(F_BAD);
    op_alloc(p);
    op_alloc(p);
    int home = p % NSTREAM;
    bad_free(p, (home + 1) % NSTREAM, 1);
    op_free_on_stream(p);
    snprintf(cur_what, sizeof cur_what, "pool %d (%s, owner on) renewed: a bad pointer on stream %d, then a free on "
             "stream %d", p, htype_name(q->htype), (home + 1) % NSTREAM, home);
}

/* ------------------------------------------------------------ the table of operations */

static int awake(int p) { return !P[p].asleep; }
static int can_alloc(int p) { return P[p].nblk < MAXBLK; }
static int can_plain_alloc(int p) { return can_alloc(p) && !stream_only(p) && (!in_owner_mode(p) || chance(5)); }
static int has_plain_blk(int p) { return has_blk(p) && !stream_only(p); }
static int can_create(int p) { return P[p].nbuf < MAXBUF; }
static int has_awake_buf(int p) { return has_buf(p) && awake(p); }
static int has_shared(int p)
{
    for (int i = 0; i < P[p].nbuf; i++)
        if (P[p].buf[i].shared)
            return 1;
    return ndead > 0 && p == dead[0].pool;
}
static int can_stash(int p) { return has_awake_buf(p) && shareable(p) && nstash < MAXSTASH; }
static int has_stash(int p)
{
    for (int i = 0; i < nstash; i++)
        if (stash[i].pool == p)
            return other_pool(p, has_view_room) >= 0;
    return 0;
}
static int can_refit_late(int p) { return can_stash(p) && other_pool(p, has_view_room) >= 0; }
static int can_view(int p) { return has_awake_buf(p) && shareable(p) && other_pool(p, has_view_room) >= 0; }
static int has_appliable(int t)
{
    for (int i = 0; i < P[t].nview; i++) {
        int sp;
        if (!P[t].view[i].broken && find_buf(P[t].view[i].id, &sp) && !P[sp].asleep)
            return 1;
    }
    return 0;
}
static int can_dmabuf(int p) { return has_buf(p) && ndmabuf < MAXDMABUF; }
static int has_dmabuf(int p)
{
    for (int i = 0; i < ndmabuf; i++)
        if (dmabufs[i].pool == p)
            return 1;
    return 0;
}
static int asleep(int p) { return P[p].asleep; }
static int awake_view_room(int t) { return awake(t) && has_view_room(t); }
static int can_block_view(int p)
{
    return awake(p) && shareable(p) && has_plain_blk(p) && !in_owner_mode(p) && other_pool(p, awake_view_room) >= 0;
}
static int can_thread(int p) { return awake(p) && P[p].c.trace == TRACE_NONE && !in_owner_mode(p); }
static int can_renew(int p) { return awake(p) && P[p].c.trace == TRACE_NONE; }
static int can_record(int p)
{
    return has_blk(p) && P[p].c.trace == TRACE_NONE && (!P[p].c.stream_owner || P[p].own == OWN_OFF);
}

static const op_def ops[] = {
    {"alloc", 8, can_plain_alloc, op_alloc},
    {"alloc_aligned", 3, can_plain_alloc, op_alloc_aligned},
    {"free", 6, has_plain_blk, op_free},
    {"alloc_on_stream", 10, can_alloc, op_alloc_on_stream},
    {"free_on_stream", 9, has_blk, op_free_on_stream},
    {"alloc_per_thread", 1, can_plain_alloc, op_alloc_per_thread},
    {"free_per_thread", 1, has_plain_blk, op_free_per_thread},
    {"owner_end", 1, always, op_owner_end},
    {"record_stream", 2, can_record, op_record_stream},
    {"bad_pointer", 1, has_blk, op_bad_free},
    {"usable_size", 1, has_blk, op_usable_size},
    {"thread_flush", 1, always, op_thread_flush},
    {"collect", 3, always, op_collect},
    {"trim", 2, always, op_trim},
    {"stats", 1, always, op_stats},
    {"check", 1, always, op_check},
    {"thread", 1, can_thread, op_thread},
    {"buffer_create", 4, can_create, op_buffer_create},
    {"buffer_resize", 9, has_buf, op_buffer_resize},
    {"buffer_resize_set", 3, has_buf, op_buffer_resize_set},
    {"buffer_destroy", 3, has_buf, op_buffer_destroy},
    {"shrink_grow", 2, has_awake_buf, op_shrink_grow},
    {"export", 3, has_buf, op_export},
    {"export_done", 2, has_buf, op_export_done},
    {"peers_ack", 5, has_shared, op_peers_ack},
    {"late_peer", 2, can_stash, op_late_stash},
    {"late_peer_open", 2, has_stash, op_late_open},
    {"refit_late_peer", 2, can_refit_late, op_refit_late},
    {"view_open", 4, can_view, op_view_open},
    {"view_apply", 4, has_appliable, op_view_apply},
    {"view_close", 3, has_view, op_view_close},
    {"block_view", 2, can_block_view, op_block_view},
    {"dmabuf_open", 2, can_dmabuf, op_dmabuf_open},
    {"dmabuf_close", 2, has_dmabuf, op_dmabuf_close},
    {"sleep", 3, awake, op_sleep},
    {"wake", 5, asleep, op_wake},
    {"sleep_state", 1, always, op_sleep_state},
    {"stream_hold", 5, always, op_hold},
    {"stream_release", 4, always, op_release},
    {"pool_renew", 1, can_renew, op_pool_renew},
    {"buffer_release", 4, can_release, op_buffer_release},
    {"buffer_reuse", 4, can_reuse, op_buffer_reuse},
    {"view_release", 4, can_release_view, op_view_release},
    {"view_reopen", 8, can_reopen, op_view_reopen},
    {"reset_peak", 1, always, op_reset_peak},
    {"keep_expire", 3, has_kept, op_keep_expire},
};
#define NOPS ((int)(sizeof ops / sizeof ops[0]))
_Static_assert(NOPS <= MAXOPS, "fault_seen has a row for every operation");

static int op_index(const char *name)
{
    for (int o = 0; o < NOPS; o++)
        if (strcmp(ops[o].name, name) == 0)
            return o;
    return -1;
}
static long op_count[NOPS];
static unsigned op_weight[NOPS]; /* 0: not drawn (FABPOOL_TEST_SKIP_OPS) */

/* The state of pool p that a step meets. */
static unsigned state_feats(int p)
{
    pool_t *q = &P[p];
    unsigned f = 0;
    refresh_streams();
    for (int i = 0; i < npend; i++)
        if (pend[i].pool == p && pending_on(pend[i].stream, pend[i].epoch))
            f |= FB(F_PENDING);
    for (int i = 0; i < nrec; i++)
        if (rec[i].pool == p && rec_stream_pending(&rec[i]))
            f |= FB(F_RETIRED);
    for (int i = 0; i < q->nbuf; i++)
        if (q->buf[i].shared && q->buf[i].acked != UINT64_MAX)
            f |= FB(F_EXPORT);
    for (int i = 0; i < nstash; i++)
        if (stash[i].pool == p)
            f |= FB(F_LATE);
    for (int t = 0; t < NPOOL; t++)
        for (int i = 0; i < P[t].nview; i++)
            if (t == p || P[t].view[i].src_pool == p)
                f |= FB(F_VIEW);
    for (int i = 0; i < ndmabuf; i++)
        if (dmabufs[i].pool == p)
            f |= FB(F_DMABUF);
    if (q->own >= -1)
        f |= FB(F_OWNER);
    if (counters(p).stream_pending_blocks)
        f |= FB(F_QUEUED);
    if (q->asleep)
        f |= FB(F_SLEEP);
    if (q->c.trace != TRACE_NONE)
        f |= FB(F_TRACE);
    return f;
}

static void count_pairs(unsigned f)
{
    for (int a = 0; a < F_COUNT; a++)
        if (f & FB(a))
            for (int b = a + 1; b < F_COUNT; b++)
                if (f & FB(b))
                    pair_met[a][b]++;
}

/* ---- driver faults at random steps (FABPOOL_TEST_FAULTS) */

/* What every pool's buffers and views show before a faulted step. */
static fabpool_buffer_info fsnap_buf[NPOOL][MAXBUF], fsnap_view[NPOOL][MAXVIEW];
static uint64_t fsnap_buf_id[NPOOL][MAXBUF], fsnap_view_id[NPOOL][MAXVIEW];
static int fsnap_nbuf[NPOOL], fsnap_nview[NPOOL];

/* The operations that make one call of the library that may change something, whose refusal must leave every
 * buffer and view as it was (sleep, wake, trim and collect have their own rules: fabpool.h). */
static int fault_compares(const char *op)
{
    static const char *const one_call[] = {"alloc", "alloc_aligned", "free", "alloc_on_stream", "free_on_stream",
                                           "buffer_create",
                                           "buffer_resize", "buffer_resize_set", "buffer_destroy", "export",
                                           "export_done", "peers_ack", "view_apply", "view_close", "dmabuf_open",
                                           "dmabuf_close", "usable_size", "bad_pointer", "thread_flush"};
    for (size_t i = 0; i < sizeof one_call / sizeof one_call[0]; i++)
        if (strcmp(op, one_call[i]) == 0)
            return 1;
    return 0;
}

static fabpool_buffer_info vinfo(const view_t *v)
{
    fabpool_buffer_info vi = {.struct_size = sizeof vi};
    fabpool_view_get_info(v->h, &vi);
    return vi;
}

static int op_index(const char *name);

static void fault_arm(void)
{
    flt.refused = 0;
    if (!fault_pct)
        return;
    for (size_t e = 0; e < NFAULT_ENTRIES; e++)
        fault_calls0[e] = fault_calls_fn(fault_entries[e]);
    int o = op_index(cur_op);
    size_t cand[NFAULT_ENTRIES], nc = 0;
    for (size_t e = 0; o >= 0 && e < NFAULT_ENTRIES; e++)
        if (fault_seen[o][e])
            cand[nc++] = e;
    if (!nc || strcmp(cur_op, "thread") == 0 || strcmp(cur_op, "pool_renew") == 0 || !chance(fault_pct))
        return;
    for (int t = 0; t < NPOOL; t++) {
        fsnap_nbuf[t] = P[t].nbuf;
        fsnap_nview[t] = P[t].nview;
        for (int i = 0; i < P[t].nbuf; i++) {
            fsnap_buf[t][i] = binfo(&P[t].buf[i]);
            fsnap_buf_id[t][i] = P[t].buf[i].id;
        }
        for (int i = 0; i < P[t].nview; i++) {
            fsnap_view[t][i] = vinfo(&P[t].view[i]);
            fsnap_view_id[t][i] = P[t].view[i].vid;
        }
    }
    size_t e = cand[below(nc)], unmap = 3; /* fault_entries[3]: cuMemUnmap */
    int sleep_unmap = strcmp(cur_op, "sleep") == 0 && fault_seen[o][unmap] && chance(40);
    if (sleep_unmap)
        e = unmap;
    flt.entry = fault_entries[e];
    flt.nth = 1 + below(sleep_unmap ? fault_seen[o][e] : fault_seen[o][e] < 4 ? fault_seen[o][e] : 4);
    flt.err = fault_errors[below(sizeof fault_errors / sizeof fault_errors[0])];
    flt.c0 = fault_calls_fn(flt.entry);
    flt.armed = 1;
    flt.every = sleep_unmap ? 2 : 0;
    flt.entry2 = NULL;
    n_fault_steps++;
    n_fault_sleep_unmap += sleep_unmap;
    if (!sleep_unmap && chance(25)) { /* a second fault: what mends the first failure meets one */
        n_fault_double++;
        /* a call that gives memory back failing every time keeps that memory by definition (the driver holds
         * it, the ledger cannot agree): those fail twice only as one of two entry points */
        int gives_back = strcmp(flt.entry, "cuMemUnmap") == 0 || strcmp(flt.entry, "cuMemRelease") == 0;
        if (nc < 2 || (!gives_back && chance(50))) {
            flt.every = !gives_back;
        } else {
            size_t e2 = cand[below(nc)];
            while (e2 == e)
                e2 = cand[below(nc)];
            flt.entry2 = fault_entries[e2];
            flt.nth2 = 1 + below(fault_seen[o][e2] < 8 ? fault_seen[o][e2] : 8);
            flt.err2 = fault_errors[below(sizeof fault_errors / sizeof fault_errors[0])];
            flt.c02 = fault_calls_fn(flt.entry2);
            fault_set_fn(flt.entry2, flt.nth2, 0, flt.err2);
        }
    }
    fault_set_fn(flt.entry, flt.nth, flt.every, flt.err);
}

static int same_shown(const fabpool_buffer_info *a, const fabpool_buffer_info *b)
{
    return a->size == b->size && a->mapped == b->mapped && a->n_chunks == b->n_chunks && a->generation == b->generation;
}

/* After a faulted step: a refusal changed no buffer or view of any pool. */
static void fault_disarm(void)
{
    if (!fault_pct)
        return;
    int o = op_index(cur_op);
    for (size_t e = 0; o >= 0 && e < NFAULT_ENTRIES; e++) {
        uint64_t d = fault_calls_fn(fault_entries[e]) - fault_calls0[e];
        if (d > fault_seen[o][e])
            fault_seen[o][e] = (uint32_t)d;
    }
    if (!flt.armed)
        return;
    if (verbose)
        printf("  (the next step's faults: %s; %d fired)\n", fault_said(), faults_fired());
    fault_clear_fn();
    int fired = fault_fired();
    n_fault_double_fired += faults_fired() > 1;
    flt.armed = 0;
    n_fault_fired += fired;
    if (!flt.refused)
        return;
    n_fault_refused++;
    if (!fault_compares(cur_op))
        return;
    n_fault_compared++;
    for (int t = 0; t < NPOOL; t++) {
        for (int i = 0; i < fsnap_nbuf[t]; i++)
            for (int k = 0; k < P[t].nbuf; k++)
                if (P[t].buf[k].id == fsnap_buf_id[t][i] && !P[t].buf[k].broken) {
                    fabpool_buffer_info now = binfo(&P[t].buf[k]), *was = &fsnap_buf[t][i];
                    EXPECT(same_shown(&now, was), "fault.refused_changed", "%s failed and the operation was "
                           "refused, but pool %d's buffer %llu changed: size %zu -> %zu, mapped %zu -> %zu, chunks %u "
                           "-> %u, generation %llu -> %llu", fault_said(), t, (unsigned long long)fsnap_buf_id[t][i],
                           was->size, now.size, was->mapped, now.mapped, was->n_chunks, now.n_chunks,
                           (unsigned long long)was->generation, (unsigned long long)now.generation);
                }
        for (int i = 0; i < fsnap_nview[t]; i++)
            for (int k = 0; k < P[t].nview; k++)
                if (P[t].view[k].vid == fsnap_view_id[t][i] && !P[t].view[k].broken) {
                    fabpool_buffer_info now = vinfo(&P[t].view[k]), *was = &fsnap_view[t][i];
                    EXPECT(same_shown(&now, was), "fault.refused_changed", "%s failed and the operation was "
                           "refused, but pool %d's view %llu changed: mapped %zu -> %zu, chunks %u -> %u, generation "
                           "%llu -> %llu", fault_said(), t, (unsigned long long)fsnap_view_id[t][i], was->mapped,
                           now.mapped, was->n_chunks, now.n_chunks, (unsigned long long)was->generation,
                           (unsigned long long)now.generation);
                }
    }
}

/* before a step's operation: the state of its pool, and the pool fabpool_check visits after it */
static void before_step(int p)
{
    ngrown = 0;
    step_feats = state_feats(p);
    step_pools = 1u << p;
    fault_arm();
}
/* after it: the pairs of features it met, and the rule of a faulted step */
static void after_step(int p)
{
    (void)p;
    int fired = flt.armed && fault_fired();
    fault_disarm();
    kept_resync(fired);
    count_pairs(step_feats);
}

/* nothing drawn applies: a collect, which always does */
static const op_run steps_of = {ops, NOPS, op_weight, op_count, 32, op_collect, before_step, after_step, check_step};

/* ------------------------------------------------------------ a seed */

static int setup_pools(int cfg)
{
    for (int p = 0; p < NPOOL; p++)
        if (create_pool(p, &configs[cfg][p]) != 0)
            return -1;
    nrec = npend = nstash = ndmabuf = ndead = 0;
    for (int s = 0; s < NSTREAM; s++)
        release(s);
    return 0;
}

/* The traced pool's file against what the test did: every allocation at the trace's level, nothing
 * live at the end, the same peak of live bytes, no free of a pointer it never gave out; then the replay. */
static void check_trace(int p)
{
    pool_t *q = &P[p];
    trace_data d;
    char err[512];
    snprintf(cur_what, sizeof cur_what, "pool %d's trace %.200s (%s)", p, q->trace_path,
             q->c.trace == TRACE_MIXED ? "plain calls and the stream pair" : "the stream pair only");
    if (trace_load(q->trace_path, &d, err, sizeof err) != 0) {
        fail_("trace.load", __LINE__, "%s", err);
        return;
    }
    n_traces++;
    trace_summary s;
    trace_summarize(&d, &s);
    trace_free(&d);
    uint64_t allocs = 0;
    for (int k = 0; k < TRACE_HIST; k++)
        allocs += s.hist[k];
    int mixed = q->c.trace == TRACE_MIXED;
    EXPECT(allocs == q->tr_allocs, mixed ? "trace.allocs.mixed" : "trace.allocs.stream_pair", "the trace has %llu allocations at the %s level, the test made %llu",
           (unsigned long long)allocs, s.level_app ? "app" : "pool", (unsigned long long)q->tr_allocs);
    EXPECT(s.unknown_frees <= q->tr_bad_frees, mixed ? "trace.unknown_frees.mixed" : "trace.unknown_frees.stream_pair",
           "%llu frees or buffer calls of pointers the trace never gave out; the test freed %llu bad pointers",
           (unsigned long long)s.unknown_frees, (unsigned long long)q->tr_bad_frees);
    EXPECT(s.live_end == 0 && s.objects_end == 0, mixed ? "trace.live_end.mixed" : "trace.live_end.stream_pair", "the trace ends with %llu bytes live in %llu "
           "objects; the test freed everything", (unsigned long long)s.live_end, (unsigned long long)s.objects_end);
    EXPECT(s.live_peak == q->tr_peak, mixed ? "trace.live_peak.mixed" : "trace.live_peak.stream_pair", "the trace's live peak is %llu bytes, the test's %llu",
           (unsigned long long)s.live_peak, (unsigned long long)q->tr_peak);
    if (!replay_path)
        return;
    char log[128];
    snprintf(log, sizeof log, "%s/replay.log", tmpdir);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        char machine[160];
        snprintf(machine, sizeof machine, "%s-replay", getenv("FABSIM_MACHINE") ? getenv("FABSIM_MACHINE") : "combined");
        setenv("FABSIM_MACHINE", machine, 1);
        execl(replay_path, replay_path, q->trace_path, "--allocators", "fabpool", "--check", (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    n_replays++;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
        return;
    char said[600] = "";
    FILE *f = fopen(log, "r");
    char line[512];
    size_t at = 0;
    while (f && fgets(line, sizeof line, f))
        if ((strstr(line, "CHECK FAILED:") || strstr(line, "not replayed") || strstr(line, "operations failed") ||
             strstr(line, "error")) && at < sizeof said - 1)
            at += (size_t)snprintf(said + at, sizeof said - at, "%s", line);
    if (f)
        fclose(f);
    fail_(mixed ? "replay.mixed" : "replay.stream_pair", __LINE__, "fabpool_replay --check exit "
          "status %d (%s): %s", WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, q->tr_streams ? "the stream pair used" :
          "no stream", said);
}

static void teardown(void)
{
    cur_op = "teardown";
    cur_step = -1;
    snprintf(cur_what, sizeof cur_what, "everything freed and every pool destroyed");
    for (int s = 0; s < NSTREAM; s++)
        release(s);
    for (int p = 0; p < NPOOL; p++)
        drain_pool(p);
    check_step(1);
    for (int p = 0; p < NPOOL; p++) {
        EXPECT_OK(fabpool_destroy(P[p].p), "pool_destroy", "fabpool_destroy");
        P[p].p = NULL;
    }
    check_ledger_empty();
    cur_op = "trace";
    for (int p = 0; p < NPOOL; p++)
        if (P[p].c.trace != TRACE_NONE) {
            check_trace(p);
            unlink(P[p].trace_path);
        }
}

static void run_seed(unsigned long long seed, long steps)
{
    cur_seed = seed;
    cur_step = -1;
    cur_op = "setup";
    next_id = 1;
    int cfg = (int)(seed % (unsigned long long)NCONF);
    rng_s = mix(seed * 0x9e3779b97f4a7c15ull + 2024);
    memset(fault_seen, 0, sizeof fault_seen); /* each seed learns its own: a seed run alone does what it did */
    memset(own_unknown, 0, sizeof own_unknown);
    if (setup_pools(cfg) != 0) {
        for (int p = 0; p < NPOOL; p++)
            if (P[p].p)
                fabpool_destroy(P[p].p);
        return;
    }
    run_steps(&steps_of, seed, steps);
    teardown();
}

static void print_pairs(long steps_each)
{
    printf("  features met, pairs (steps where both were present; the step's operation and its pool's state):\n  %-8s",
           "");
    for (int b = 1; b < F_COUNT; b++)
        printf(" %8s", feat_names[b]);
    printf("\n");
    for (int a = 0; a < F_COUNT - 1; a++) {
        printf("  %-8s", feat_names[a]);
        for (int b = 1; b < F_COUNT; b++)
            if (b <= a)
                printf(" %8s", "");
            else
                printf(" %8llu", (unsigned long long)pair_met[a][b]);
        printf("\n");
    }
    int check = total_steps >= 20000 && steps_each >= 1000;
    for (int o = 0; o < NOPS; o++)
        check &= op_weight[o] > 0 || ops[o].weight == 0; /* (none skipped by FABPOOL_TEST_SKIP_OPS) */
    for (size_t k = 0; k < sizeof wanted_pairs / sizeof wanted_pairs[0]; k++) {
        enum feat a = wanted_pairs[k].a, b = wanted_pairs[k].b;
        uint64_t n = a < b ? pair_met[a][b] : pair_met[b][a];
        if (check && n == 0) {
            t_failures++;
            fprintf(stderr, "test_combined: the pair %s + %s (%s) never met in %ld steps\n", feat_names[a],
                    feat_names[b], wanted_pairs[k].what, total_steps);
        }
    }
}

int main(int argc, char **argv)
{
    int a = 1;
    if (argc > a && strcmp(argv[a], "-v") == 0)
        verbose = 1, a++;
    unsigned long long first = argc > a ? strtoull(argv[a], NULL, 0) : 1;
    long n_seeds = argc > a + 1 ? atol(argv[a + 1]) : 300;
    long steps = argc > a + 2 ? atol(argv[a + 2]) : 2000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    say_where_on_crash();
    setenv("FABSIM_FABRIC", "1", 0); /* fabric pools beside the others (read at cuInit) */
    int is_sim = t_driver_init();
    *(void **)&stream_hold_fn = dlsym(RTLD_DEFAULT, "fabsim_stream_hold");
    *(void **)&stream_release_fn = dlsym(RTLD_DEFAULT, "fabsim_stream_release");
    *(void **)&range_mapped_fn = dlsym(RTLD_DEFAULT, "fabsim_range_mapped");
    if (!is_sim || !stream_hold_fn || !range_mapped_fn) {
        printf("test_combined: needs the simulated driver (ledger, stream holds, fabsim_range_mapped); skipped\n");
        return 0;
    }
    if (SANITIZED && n_seeds >= 20) {
        printf("test_combined: sanitizer build: %ld seeds instead of %ld\n", n_seeds / 10, n_seeds);
        n_seeds /= 10;
    }
    replay_path = getenv("FABPOOL_TEST_REPLAY");
    known_failures = getenv("FABPOOL_TEST_KNOWN_FAILURES");
    const char *faults = getenv("FABPOOL_TEST_FAULTS");
    *(void **)&fault_set_fn = dlsym(RTLD_DEFAULT, "fabsim_fault_set");
    *(void **)&fault_clear_fn = dlsym(RTLD_DEFAULT, "fabsim_fault_clear");
    *(void **)&fault_calls_fn = dlsym(RTLD_DEFAULT, "fabsim_calls");
    fault_pct = faults && fault_set_fn && fault_clear_fn && fault_calls_fn ? atoi(faults) : 0;
    op_weights(&steps_of, "test_combined");
    if (replay_path && !replay_path[0])
        replay_path = NULL;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fabpool_combined.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "test_combined: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    gran = granularity();
    for (int s = 0; s < NSTREAM; s++)
        CHECK_CU(cuStreamCreate(&streams[s], 0));
    printf("test_combined: seeds %llu..%llu, %ld steps each, %d configurations of %d pools, replay %s\n", first,
           first + (unsigned long long)n_seeds - 1, steps, NCONF, NPOOL, replay_path ? replay_path : "(not set)");
    double t0 = now();
    for (long k = 0; k < n_seeds; k++)
        run_seed(first + (unsigned long long)k, steps);
    double dt = now() - t0;
    printf("test_combined: %ld seeds x %ld steps = %ld steps in %.1f s (%.1f us a step), %d checks\n", n_seeds, steps,
           total_steps, dt, total_steps ? dt * 1e6 / (double)total_steps : 0.0, t_checks);
    printf("  slept %ld (%ld refused: exported buffers), woke %ld after a discard, %ld calls refused asleep; %ld "
           "refused by a small reservation; %ld bad pointers\n", n_slept, n_sleep_busy, n_woke_discard,
           n_asleep_refused, n_limit, n_bad);
    printf("  late peers opened: fabric %ld (%ld after a shrink), posix_fd %ld (%ld); refits with a late peer %ld; "
           "grows while a shrink pends on another stream %ld\n", n_late_open[FABPOOL_HANDLE_FABRIC],
           n_late_after_change[FABPOOL_HANDLE_FABRIC], n_late_open[FABPOOL_HANDLE_POSIX_FD],
           n_late_after_change[FABPOOL_HANDLE_POSIX_FD], n_refit_late, n_cross_grow);
    printf("  dma-bufs %ld, threads beside fabpool_check %ld, traces compared %ld, replayed %ld, fabpool_check %llu\n",
           n_dmabuf, n_threads, n_traces, n_replays, (unsigned long long)n_pool_checks);
    printf("  block views kept across new memory %ld (%ld at the same address after free, trim and alloc; %ld after a "
           "sleep and wake)\n", n_block_views, n_block_same_addr, n_block_renewed_sleep);
    printf("  kept for reuse: %ld reuses found a kept buffer, %ld missed, %ld were refused for a fault; %ld kept views "
           "taken back by an open; %ld resyncs after a fault\n", n_reuse_hit, n_reuse_miss, n_reuse_refused,
           n_view_taken, n_kept_resync);
    printf("  keep_ms passed %ld times: %ld kept buffers and %ld kept views went (%ld collects compared with the "
           "ledger, %ld to the held byte); %ld views afresh imported every chunk; traced: %ld releases, %ld reuses; "
           "asleep: %ld releases (destroys), %ld reuses refused, %ld view releases, %ld reopens refused\n",
           n_expire_steps, n_expired_bufs, n_expired_views, n_expire_exact, n_expire_held_exact, n_fresh_imports,
           n_release_traced, n_reuse_traced, n_release_asleep, n_reuse_asleep, n_view_release_asleep,
           n_reopen_asleep);
    if (fault_pct)
        printf("  driver faults (FABPOOL_TEST_FAULTS=%d): %ld steps armed one, %ld fired, %ld refused the step's call "
               "(%ld compared buffer by buffer and view by view)\n", fault_pct, n_fault_steps, n_fault_fired,
               n_fault_refused, n_fault_compared);
    if (fault_pct)
        printf("  double faults: %ld steps armed a second, %ld of them fired both; FABPOOL_ERR_PARTIAL %ld times (%ld "
               "buffers lost a chunk); %ld sleeps armed an unmap refused twice, %ld answered FABPOOL_ERR_PARTIAL "
               "asleep\n", n_fault_double, n_fault_double_fired, n_partial, n_partial_bufs, n_fault_sleep_unmap,
               n_sleep_partial);
    print_op_shares(&steps_of, 0, "test_combined");
    print_pairs(steps);
    print_kinds("test_combined", meanings, sizeof meanings / sizeof meanings[0]);
    for (int s = 0; s < NSTREAM; s++)
        cuStreamDestroy(streams[s]);
    char log[128];
    snprintf(log, sizeof log, "%s/replay.log", tmpdir);
    unlink(log);
    rmdir(tmpdir);
    return t_done("test_combined");
}
