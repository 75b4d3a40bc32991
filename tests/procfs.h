/* procfs.h - what /proc tells a test about this process and the system: the fds this process has open (a
 * test that a call leaves no fd behind compares two counts) and Yama's ptrace_scope (whether one process may
 * copy another's fds).  For C and C++ tests. */
#ifndef FP_PROCFS_H
#define FP_PROCFS_H

#include <dirent.h>
#include <stdio.h>

/* the fds this process has open, not counting the one that reads them; -1 without /proc */
static inline int fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;
}

/* Yama's ptrace_scope, or -1 where Yama is absent */
static inline int yama_ptrace_scope(void)
{
    int v = -1;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

#endif
