/* distinct_files.c - whether a descriptor's fds are each a file of its own (distinct_files.h). */
#define _GNU_SOURCE /* syscall(SYS_kcmp), qsort_r */
#include "distinct_files.h"

#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "desc.h"

/* kcmp's order of two fds' open files (KCMP_FILE): <0, 0 (one open file: the same fd twice, or a dup), >0; 2
 * where the kernel cannot order them (no kcmp, a seccomp filter, or files it does not order). */
static int file_order(int a, int b)
{
#ifdef SYS_kcmp
    long r = syscall(SYS_kcmp, (long)getpid(), (long)getpid(), 0 /* KCMP_FILE */, (long)a, (long)b);
    return r == 0 ? 0 : r == 1 ? -1 : r == 2 ? 1 : 2;
#else
    (void)a;
    (void)b;
    return 2;
#endif
}

/* qsort_r's comparison of fds by their open files; *unordered set where the kernel cannot order two */
static int by_file(const void *x, const void *y, void *unordered)
{
    int a = *(const int *)x, b = *(const int *)y;
    int r = a == b ? 0 : file_order(a, b);
    if (r == 2) {
        *(int *)unordered = 1;
        return a < b ? -1 : 1;
    }
    return r;
}

/* Sorted by file in scratch, then neighbours compared: n log n kcmp calls. */
fabpool_status fp_distinct_files(const int *fds, uint32_t n, int *scratch)
{
    uint32_t m = 0;
    for (uint32_t j = 0; j < n; j++)
        if (fds[j] >= 0) /* no fd is no file: the import refuses it */
            scratch[m++] = fds[j];
    int unordered = 0;
    qsort_r(scratch, m, sizeof *scratch, by_file, &unordered);
    for (uint32_t j = 1; j < m; j++) {
        int a = scratch[j - 1], b = scratch[j];
        if (a != b && (unordered || file_order(a, b) != 0))
            continue;
        uint32_t k = 0, i;
        while (fds[k] != a && fds[k] != b)
            k++;
        for (i = k + 1; fds[i] != a && fds[i] != b; i++)
            ;
        return fp_desc_refuse("fds %llu and %llu are one file (the same fd given twice): each record needs the fd of "
                              "its own chunk", k, i);
    }
    return FABPOOL_OK;
}
