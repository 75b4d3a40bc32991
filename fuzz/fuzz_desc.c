/* fuzz_desc: the sharing descriptor's parser (lib/desc.c) on fuzzed bytes,
 * on its own: no pool, no driver, no fd.  For every input:
 *  - a refusal is FABPOOL_ERR_DESCRIPTOR (INVALID_ARG for NULL) with a message;
 *  - an accepted descriptor keeps every promise the views rely on: its
 *    length is that of its records, each record lies inside the live bytes
 *    on the granularity, after the one before it, with a generation in
 *    (since, generation], and for posix_fd names its own fd; with the fd
 *    count checked, n fds are accepted and n + 1 refused;
 *  - written again from what was parsed (fp_desc_put_*), it parses to the
 *    same header and records (the codec's writer and reader agree).
 * What a view does with an accepted descriptor (imports, maps, undo on
 * failure) is tested against the simulated driver by tests/test_share.c and
 * the fault sweep of tests/reliability. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "desc.h"

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_desc: %s\n", what);
    abort();
}

static int same_header(const fp_desc *a, const fp_desc *b)
{
    return a->n == b->n && a->handle_type == b->handle_type && a->generation == b->generation &&
           a->since == b->since && a->window == b->window && a->live == b->live && a->uid == b->uid &&
           a->pid == b->pid && a->device == b->device && a->gran == b->gran;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fp_desc ds;
    fabpool_status st = fp_desc_parse(data, size, FP_DESC_ANY_FDS, &ds);
    if (st != FABPOOL_OK) {
        if (st != FABPOOL_ERR_DESCRIPTOR || fabpool_last_error()[0] == 0)
            fail("a refusal without FABPOOL_ERR_DESCRIPTOR and a message");
        return 0;
    }
    if (size != fabpool_desc_size(ds.n))
        fail("accepted with a length that is not its records'");
    if (ds.since > ds.generation || !ds.gran || (ds.gran & (ds.gran - 1)) || ds.live > ds.window)
        fail("accepted a header that breaks its own rules");
    uint64_t end = 0;
    for (uint32_t i = 0; i < ds.n; i++) {
        fp_desc_rec r;
        fp_desc_record(&ds, i, &r);
        if (r.size == 0 || r.off % ds.gran || r.size % ds.gran || r.off < end || r.off + r.size > ds.live ||
            r.off + r.size < r.off)
            fail("accepted a record outside the live bytes, off the granularity, or out of order");
        if (r.gen <= ds.since || r.gen > ds.generation)
            fail("accepted a record whose generation is outside (since, generation]");
        if (ds.handle_type == FABPOOL_HANDLE_POSIX_FD && r.fd_index != i)
            fail("accepted a posix_fd record that does not name its own fd");
        end = r.off + r.size;
    }
    fp_desc chk;
    if (fp_desc_parse(data, size, ds.n, &chk) != FABPOOL_OK)
        fail("refused with as many fds as records");
    if (ds.handle_type == FABPOOL_HANDLE_POSIX_FD && fp_desc_parse(data, size, (size_t)ds.n + 1, &chk) == FABPOOL_OK)
        fail("accepted a posix_fd descriptor with one fd too many");

    /* written again from what was parsed: the same descriptor */
    uint8_t *again = calloc(1, size);
    if (!again)
        return 0;
    for (uint32_t i = 0; i < ds.n; i++) {
        fp_desc_rec r;
        fp_desc_record(&ds, i, &r);
        fp_desc_put_record(again, i, &r);
    }
    fp_desc_put_header(again, &ds);
    fp_desc back;
    if (fp_desc_parse(again, size, FP_DESC_ANY_FDS, &back) != FABPOOL_OK || !same_header(&ds, &back))
        fail("written again, the header does not parse to the same");
    for (uint32_t i = 0; i < ds.n; i++) {
        fp_desc_rec a, b;
        fp_desc_record(&ds, i, &a);
        fp_desc_record(&back, i, &b);
        if (a.off != b.off || a.size != b.size || a.gen != b.gen || a.fd_index != b.fd_index ||
            memcmp(a.fabric, b.fabric, sizeof a.fabric) != 0)
            fail("written again, a record does not parse to the same");
    }
    free(again);
    return 0;
}
