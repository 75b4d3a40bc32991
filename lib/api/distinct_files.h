/* distinct_files.h - a descriptor's fds, each the file of its own chunk. */
#ifndef FP_DISTINCT_FILES_H
#define FP_DISTINCT_FILES_H

#include <stdint.h>

#include "fabpool.h"

/* Refuses (FABPOOL_ERR_DESCRIPTOR, naming the two records) n fds of which two are one open file: the same fd
 * given twice, or a dup (kcmp).  A descriptor may hold tens of thousands of fds, so the check costs n log n
 * kcmp calls, not n^2.  scratch: room for n ints.  Negative fds are left to the import; where the kernel cannot
 * order files (no kcmp, a seccomp filter), only equal fd numbers are found. */
fabpool_status fp_distinct_files(const int *fds, uint32_t n, int *scratch);

#endif
