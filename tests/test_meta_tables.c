/* test_meta_tables.c - the aligned tables of the pool's metadata (lib/base/meta.c, fp_meta_alloc_aligned) on
 * their own: a size's first tables from libc, the rest from 2 MiB regions advised as huge pages (the kernel's
 * VmFlags "hg" of their mapping), each table aligned to its size and zeroed when given (fresh or reused), its
 * pages given back to the kernel when it is freed, tables of three sizes mixed and freed in a random order, the
 * regions that empty going back to the kernel but one a size, every region gone at destroy, the bytes counted
 * back to 0, and threads taking and giving tables of one metadata at once.  Built with the base files it uses:
 * no driver, no pool. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "meta.h"
#include "unit.h"

#define REGION (2ull << 20)
enum { N = 1200, THREADS = 4, ROUNDS = 400 };

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Whether the kernel has transparent huge pages at all (else the advice is refused and no mapping says hg). */
static int thp_present(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (!f)
        return 0;
    int ok = fgets(line, sizeof line, f) != NULL && strstr(line, "[never]") == NULL;
    fclose(f);
    return ok;
}

/* Whether the mapping that holds p was advised MADV_HUGEPAGE (its VmFlags in /proc/self/smaps has "hg"). */
static int advised_huge(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int in = 0, hg = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') == line + strspn(line, "0123456789abcdef"))
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in && !strncmp(line, "VmFlags:", 8)) {
            hg = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return hg;
}

/* Whether any page of [p, p + n) is mapped (a mapping of /proc/self/maps meets it). */
static int mapped(uintptr_t p, size_t n)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    char line[512];
    int hit = 0;
    while (!hit && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            hit = lo < p + n && p < hi;
    }
    fclose(f);
    return hit;
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

typedef struct {
    fp_meta *m;
    unsigned seed;
    int bad;
} worker;

/* Tables of 8 KiB taken and given at random by one of several threads: each zeroed and aligned when given,
 * its own pattern read back before it goes. */
static void *work(void *arg)
{
    worker *w = arg;
    enum { K = 48, SZ = 8192 };
    unsigned char *held[K] = {0};
    uint64_t s = w->seed;
    for (int r = 0; r < ROUNDS * 4; r++) {
        unsigned k = (unsigned)(rng(&s) % K);
        if (held[k]) {
            for (size_t i = 0; i < SZ; i += 512)
                w->bad += held[k][i] != (unsigned char)(w->seed + k);
            fp_meta_free_aligned(w->m, held[k], SZ);
            held[k] = NULL;
        } else if ((held[k] = fp_meta_alloc_aligned(w->m, SZ)) != NULL) {
            w->bad += ((uintptr_t)held[k] & (SZ - 1)) != 0 || !all_zero(held[k], SZ);
            memset(held[k], (unsigned char)(w->seed + k), SZ);
        } else {
            w->bad++;
        }
    }
    for (unsigned k = 0; k < K; k++)
        fp_meta_free_aligned(w->m, held[k], SZ);
    return NULL;
}

int main(void)
{
    static const size_t sizes[3] = {4096, 8192, 32768};
    static unsigned char *t[N];
    static size_t tsz[N];
    int thp = thp_present();
    fp_meta meta;
    CHECK(fp_meta_init(&meta, FABPOOL_METADATA_LIBC) == FABPOOL_OK);

    /* a size's first tables from libc (a small pool keeps its small pages), then from advised regions */
    size_t in_regions = 0, early_in_regions = 0;
    for (int i = 0; i < 600; i++) {
        t[i] = fp_meta_alloc_aligned(&meta, 4096);
        tsz[i] = 4096;
        CHECK(t[i] != NULL && ((uintptr_t)t[i] & 4095) == 0 && all_zero(t[i], 4096));
        memset(t[i], 0x5a, 4096);
        if (thp) {
            int hg = advised_huge(t[i]);
            in_regions += hg == 1;
            early_in_regions += hg == 1 && i < 64 - 1;
        }
    }
    if (thp) {
        CHECK(early_in_regions == 0);           /* 512 slots a region, an eighth of them first from libc */
        CHECK(in_regions >= 600 - 64);
    } else {
        printf("test_meta_tables: no transparent huge pages in this kernel: the advice is not checked\n");
    }
    CHECK(fp_counter(&meta.bytes) == 600 * 4096);

    /* three sizes mixed, each with its pattern; freed and taken again in a random order, zeroed each time */
    uint64_t s = 11;
    for (int i = 600; i < N; i++) {
        tsz[i] = sizes[rng(&s) % 3];
        t[i] = fp_meta_alloc_aligned(&meta, tsz[i]);
        CHECK(t[i] != NULL && ((uintptr_t)t[i] & (tsz[i] - 1)) == 0 && all_zero(t[i], tsz[i]));
        memset(t[i], (unsigned char)i, tsz[i]);
    }
    for (int step = 0; step < 4000; step++) {
        int i = (int)(rng(&s) % N);
        unsigned char want = i < 600 ? 0x5a : (unsigned char)i;
        CHECK(t[i][0] == want && t[i][tsz[i] - 1] == want);
        fp_meta_free_aligned(&meta, t[i], tsz[i]);
        t[i] = fp_meta_alloc_aligned(&meta, tsz[i]);
        CHECK(t[i] != NULL && ((uintptr_t)t[i] & (tsz[i] - 1)) == 0 && all_zero(t[i], tsz[i]));
        memset(t[i], want, tsz[i]);
    }
    /* every table distinct: each still holds its own pattern after all the others were written */
    size_t bytes = 0, distinct_bad = 0;
    for (int i = 0; i < N; i++) {
        unsigned char want = i < 600 ? 0x5a : (unsigned char)i;
        distinct_bad += t[i][tsz[i] / 2] != want;
        bytes += tsz[i];
    }
    CHECK(distinct_bad == 0);
    CHECK(fp_counter(&meta.bytes) == bytes);

    /* the regions that held them, then everything freed: at most one region a size stays mapped */
    static uintptr_t region[N];
    size_t nr = 0;
    for (int i = 0; i < N; i++) {
        uintptr_t r = (uintptr_t)t[i] & ~(uintptr_t)(REGION - 1);
        if (advised_huge(t[i]) == 1) {
            size_t j = 0;
            while (j < nr && region[j] != r)
                j++;
            if (j == nr)
                region[nr++] = r;
        }
    }
    if (thp)
        CHECK(nr >= 3);
    /* a table given back gives its memory back to the kernel: none of its pages stays resident */
    size_t resident_after_free = 0, checked_free = 0;
    for (int i = 0; i < N; i++) {
        int in_region = advised_huge(t[i]) == 1;
        fp_meta_free_aligned(&meta, t[i], tsz[i]);
        unsigned char v[8];
        if (in_region && mapped((uintptr_t)t[i], tsz[i]) == 1 && mincore(t[i], tsz[i], v) == 0) {
            for (size_t pg = 0; pg < tsz[i] / 4096; pg++)
                resident_after_free += v[pg] & 1;
            checked_free++;
        }
    }
    if (thp)
        CHECK(checked_free > 0);
    CHECK(resident_after_free == 0);
    CHECK(fp_counter(&meta.bytes) == 0);
    size_t still = 0;
    for (size_t j = 0; j < nr; j++)
        still += mapped(region[j], REGION) == 1;
    CHECK(still <= 3);

    /* threads on one metadata at once */
    pthread_t th[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){&meta, 100u + (unsigned)i, 0};
        CHECK(pthread_create(&th[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].bad == 0);
    }
    CHECK(fp_counter(&meta.bytes) == 0);

    /* destroy: no region left */
    fp_meta_destroy(&meta);
    size_t left = 0;
    for (size_t j = 0; j < nr; j++)
        left += mapped(region[j], REGION) == 1;
    CHECK(left == 0);
    return unit_result("test_meta_tables");
}
