/* fuzz_desc: fabpool_view_open and fabpool_view_apply on fuzzed descriptor
 * bytes, against the simulated driver.  The process exports a real buffer
 * once, so the fds passed with every input are real exported fds.  After each
 * input: a refused descriptor mapped nothing (the sim's ledger and the pool's
 * stats are as before); an accepted one is closed again and leaves nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../tests/testutil.h"

#define MB (1ull << 20)

static fabpool_t *exporter, *importer;
static int fds[16];
static size_t nfds;

static void init(void)
{
    t_driver_init();
    if (fabpool_create(NULL, &exporter) != FABPOOL_OK || fabpool_create(NULL, &importer) != FABPOOL_OK) {
        fprintf(stderr, "fuzz_desc: %s\n", fabpool_last_error());
        abort();
    }
    fabpool_buffer_t *b;
    if (fabpool_buffer_create(exporter, 256 * MB, 8 * MB, &b) != FABPOOL_OK ||
        fabpool_buffer_resize(b, 40 * MB, NULL) != FABPOOL_OK || fabpool_buffer_resize(b, 100 * MB, NULL) != FABPOOL_OK)
        abort();
    static uint8_t d[1 << 14];
    size_t len;
    if (fabpool_buffer_export(b, 0, d, sizeof d, &len, fds, 16, &nfds) != FABPOOL_OK)
        abort();
}

static void same(const fabsim_ledger *a, const fabsim_ledger *b, uint64_t m0, const char *when)
{
    if (a->mappings != b->mappings || a->handles != b->handles || a->reservations != b->reservations ||
        a->bytes_mapped != b->bytes_mapped || t_mapped(importer) != m0) {
        fprintf(stderr, "fuzz_desc: %s: the driver's ledger changed (mappings %llu -> %llu, handles %llu -> %llu)\n",
                when, (unsigned long long)a->mappings, (unsigned long long)b->mappings,
                (unsigned long long)a->handles, (unsigned long long)b->handles);
        abort();
    }
}

static void give_fds(int *out)
{
    for (size_t i = 0; i < nfds; i++)
        out[i] = dup(fds[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!exporter)
        init();
    fabsim_ledger l0 = t_ledger();
    uint64_t m0 = t_mapped(importer);
    int mine[16];
    give_fds(mine);
    fabpool_view_t *v = NULL;
    fabpool_status st = fabpool_view_open(importer, data, size, mine, nfds, &v);
    if (st != FABPOOL_OK) {
        if (v || fabpool_last_error()[0] == 0)
            abort();
        fabsim_ledger l1 = t_ledger();
        same(&l0, &l1, m0, "refused view_open");
        return 0;
    }
    /* accepted: the same bytes again as a delta, then close; nothing may stay */
    give_fds(mine);
    fabsim_ledger la = t_ledger();
    uint64_t ma = t_mapped(importer);
    if (fabpool_view_apply(v, data, size, mine, nfds) != FABPOOL_OK) {
        fabsim_ledger lb = t_ledger();
        same(&la, &lb, ma, "refused view_apply");
    }
    if (fabpool_view_close(v) != FABPOOL_OK)
        abort();
    fabsim_ledger l2 = t_ledger();
    same(&l0, &l2, m0, "after view_close");
    return 0;
}
