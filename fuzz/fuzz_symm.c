/* fuzz_symm: the symmetric buffer's rounds (adapters/torch/symm.c) on fuzzed peers, on the simulated driver.
 * One rank of a group of 2 to 4 is real; the all-gather callback gives it, for every other rank, a message of
 * the round made from the input: its own message as a template (so that heads, hellos and descriptors are
 * plausible, and a peer that is left alone is a copy of this rank that says it is rank q), then the fields
 * the input picks overwritten (the round's values, the status, bytes of the head or the body).  With fabric
 * handles a copy of this rank's descriptor maps its own memory as the peer's view, so the create, the
 * resizes and their deltas run all the way; with POSIX fds the sockets and the pidfd turns run against this
 * process.  The pid of every HELLO stays this process's: it comes from the group's trusted channel, and a
 * fuzzed one would make the target open other processes.  For every input:
 *  - no crash, no sanitizer report (the bounds of every length and count a peer states);
 *  - every call answers, within the 1 ms timeout of the sockets;
 *  - once the object is closed (or its create failed), no fd stays open and the driver holds nothing
 *    (the sim's ledger).
 * The input: nranks, rank, flags (fabric, pidfd, this rank under Yama ptrace_scope 1, resizes), the size
 * asked, then for each round a byte per peer that says what to overwrite, and the bytes to write. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fz_yama = -1;
static int fz_yama_scope(void) { return fz_yama; }
#define SY_YAMA_SCOPE fz_yama_scope
#include "symm.c"
#include "symm_pass.c"
#include "../sim/fabsim.h"

#define FZ_MB (1ull << 20)

static const uint8_t *fz_in;
static size_t fz_left;
static int fz_rank, fz_nranks;
static int fz_token[4]; /* pidfd transport: this process holds the token of each fuzzed rank, at these fds */

static int fz_take(void *p, size_t n)
{
    if (fz_left < n)
        return 0;
    memcpy(p, fz_in, n);
    fz_in += n;
    fz_left -= n;
    return 1;
}

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_symm: %s\n", what);
    abort();
}

/* Overwrites up to 255 bytes of m[0..cap) at an offset the input picks. */
static int fz_patch(uint8_t *m, size_t cap, int wide)
{
    uint16_t off = 0;
    uint8_t n = 0;
    if (cap == 0)
        return 1;
    if (!fz_take(&off, wide ? 2 : 1) || !fz_take(&n, 1))
        return 0;
    size_t at = off % cap, k = n % 32 + 1;
    if (k > cap - at)
        k = cap - at;
    return fz_take(m + at, k);
}

/* The group's all-gather: this rank's message where it belongs, every other rank's from the input.  The input
 * running out fails the all-gather (which breaks the object, as a failed collective does). */
static int fz_allgather(void *ctx, const void *send, void *recv, size_t bytes)
{
    (void)ctx;
    uint8_t *all = recv;
    size_t hs = sizeof(sy_head);
    if (bytes < hs)
        fail("a round smaller than its head");
    sy_head mine;
    memcpy(&mine, send, hs);
    for (int q = 0; q < fz_nranks; q++) {
        uint8_t *m = all + (size_t)q * bytes;
        memcpy(m, send, bytes);
        if (q == fz_rank)
            continue;
        uint8_t how = 0;
        if (!fz_take(&how, 1))
            return 1;
        sy_head h;
        memcpy(&h, m, hs);
        h.rank = q;
        if ((how & 0x01) && !fz_take(&h.v[0], 8))
            return 1;
        if ((how & 0x02) && !fz_take(&h.v[1], 8))
            return 1;
        if (how & 0x04) { /* a small value: lengths and counts near the real ones */
            uint16_t v = 0;
            if (!fz_take(&v, 2))
                return 1;
            h.v[how & 0x08 ? 1 : 0] = v;
        }
        if (how & 0x10) {
            uint8_t st = 0;
            if (!fz_take(&st, 1))
                return 1;
            h.status = st % 18;
            snprintf(h.err, sizeof h.err, "fuzzed failure %u", st);
        }
        memcpy(m, &h, hs);
        if ((how & 0x20) && !fz_patch(m, hs, 0)) /* the head itself: magic, version, phase, seq, group */
            return 1;
        if ((how & 0x40) && !fz_patch(m + hs, bytes - hs, 1))
            return 1;
        if ((how & 0x80) && !fz_patch(m + hs, bytes - hs, 1))
            return 1;
        if (mine.phase == SY_MESH && fz_token[q] >= 0 && !(how & 0x0b)) {
            uint64_t v = (uint64_t)fz_token[q];
            memcpy(m + offsetof(sy_head, v) + 8, &v, 8);
        }
        if (mine.phase == SY_HELLO && mine.op == SY_CREATE && bytes >= hs + sizeof(sy_hello)) {
            int32_t pid = (int32_t)getpid();
            memcpy(m + hs + offsetof(sy_hello, pid), &pid, sizeof pid);
        }
    }
    return 0;
}

/* The fds of the kinds this code takes or makes (sockets, pidfds, memfds: tokens and the sim's memory
 * handles, files of shared memory), listed to stderr with list set.  libFuzzer's own (pipes, /dev/null)
 * are not counted: it opens them between inputs. */
static int fz_count_fds(int list)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], to[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, to, sizeof to - 1);
        if (k <= 0)
            continue;
        to[k] = 0;
        int ours = !strncmp(to, "socket:", 7) || !strcmp(to, "anon_inode:[pidfd]") || !strncmp(to, "/memfd:", 7) ||
                   !strncmp(to, "/dev/shm/", 9);
        n += ours;
        if (list && ours)
            fprintf(stderr, "fuzz_symm:   fd %s: %s\n", e->d_name, to);
    }
    if (d)
        closedir(d);
    return n;
}

static void fz_check_clean(void)
{
    static int base = -1;
    int now = fz_count_fds(0);
    if (base < 0)
        base = now; /* after the first input: the driver's own files are open by then */
    else if (now != base) {
        fprintf(stderr, "fuzz_symm: %d fds open after the input, %d after the first\n", now, base);
        fz_count_fds(1);
        fail("an fd stayed open");
    }
    fabsim_ledger l;
    memset(&l, 0, sizeof l);
    fabsim_get_ledger(&l);
    if (l.bytes_held || l.mappings || l.handles || l.reservations) {
        fprintf(stderr, "fuzz_symm: the driver holds %llu bytes, %llu mappings, %llu handles, %llu reservations\n",
                (unsigned long long)l.bytes_held, (unsigned long long)l.mappings, (unsigned long long)l.handles,
                (unsigned long long)l.reservations);
        fail("the driver still holds something after close");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        setenv("FABPOOL_DEBUG", "none", 0); /* refusals are logged as warnings: thousands of them */
        setenv("FABSIM_FABRIC", "1", 0);    /* the sim's devices share fabric handles */
        quiet = 1;
    }
    uint8_t cfg[4];
    if (size < sizeof cfg)
        return 0;
    memcpy(cfg, data, sizeof cfg);
    fz_in = data + sizeof cfg;
    fz_left = size - sizeof cfg;
    fz_nranks = 2 + cfg[0] % 3;
    fz_rank = cfg[1] % fz_nranks;
    int fabric = cfg[2] & 1, pidfd = (cfg[2] >> 1) & 1, resizes = (cfg[2] >> 4) & 3;
    fz_yama = cfg[2] & 4 ? 1 : -1;
    /* where this rank is not rank 0, rank 0's HELLO is a copy of this rank's, whose secret is zeros: the
     * fuzzed ranks' tokens are those of that secret, held here, so that the pidfd copies (out of this
     * process) and the views over them run too */
    for (int q = 0; q < 4; q++) {
        fz_token[q] = -1;
        if (pidfd && fz_rank != 0 && q != fz_rank && q < fz_nranks) {
            fabpool_torch_symm_t fake;
            uint8_t tok[SY_TOKEN];
            memset(&fake, 0, sizeof fake);
            sy_token_of(&fake, q, tok);
            if (fabpool_fd_token_make(tok, sizeof tok, &fz_token[q]) != FABPOOL_OK)
                fail("fabpool_fd_token_make");
        }
    }

    fabpool_torch_symm_options o;
    fabpool_torch_symm_options_init(&o);
    o.rank = fz_rank;
    o.nranks = fz_nranks;
    o.max_bytes = 8 * FZ_MB;
    o.bytes = (uint64_t)(cfg[3] % 9) * FZ_MB;
    o.conf = fabric ? "handle_type:fabric" : "handle_type:posix_fd";
    o.fd_transport = pidfd ? FABPOOL_TORCH_SYMM_FD_PIDFD : FABPOOL_TORCH_SYMM_FD_SOCKET;
    o.timeout_ms = 1;
    o.host = "fuzz";
    o.allgather = fz_allgather;
    fabpool_torch_symm_t *s = NULL;
    fabpool_status st = fabpool_torch_symm_create(&o, &s);
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("FUZZ_SYMM_VERBOSE") != NULL; /* what each input came to, for writing seeds */
    if (verbose)
        fprintf(stderr, "fuzz_symm: %d of %d, %s, %s: create %s %s\n", fz_rank, fz_nranks, o.conf,
                pidfd ? "pidfd" : "socket", fabpool_status_name(st), st ? fabpool_torch_symm_last_error() : "");
    if ((st == FABPOOL_OK) != (s != NULL))
        fail("create's status and object disagree");
    if (st != FABPOOL_OK && fabpool_torch_symm_last_error()[0] == 0)
        fail("a failed create without a message");
    for (int i = 0; s && i < resizes; i++) {
        uint8_t b = 0;
        if (!fz_take(&b, 1))
            break;
        st = fabpool_torch_symm_resize(s, (uint64_t)((b + 3) % 10) * FZ_MB); /* 0: what the peers ask */
        if (verbose)
            fprintf(stderr, "fuzz_symm:   resize to %d MiB: %s %s\n", (b + 3) % 10, fabpool_status_name(st),
                    st ? fabpool_torch_symm_last_error() : "");
        if (st != FABPOOL_OK && fabpool_torch_symm_last_error()[0] == 0)
            fail("a failed resize without a message");
        fabpool_torch_symm_info in = {.struct_size = sizeof in};
        uint64_t sizes[4];
        if (fabpool_torch_symm_get_info(s, &in) != FABPOOL_OK || fabpool_torch_symm_sizes(s, sizes, 4) != FABPOOL_OK)
            fail("the getters refused a live object");
        if (in.size > o.max_bytes || sizes[fz_rank] != in.size)
            fail("a size past max_bytes, or the sizes disagree");
    }
    if (fabpool_torch_symm_close(s) != FABPOOL_OK)
        fail("close failed");
    for (int q = 0; q < 4; q++)
        if (fz_token[q] >= 0)
            close(fz_token[q]);
    fz_check_clean();
    return 0;
}
