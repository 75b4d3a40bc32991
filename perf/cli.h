/* cli.h - what fabpool's tools share on their command lines, parsed with
 * getopt_long: numbers read whole and checked against their range, and the
 * exit codes.  Every tool answers --help with what each option does on
 * stdout (exit 0); an unknown option, a missing or bad argument, or a
 * missing operand exits 2 with a message and the usage line on stderr; a
 * failure to do the work exits 1.  Header only (the demo in examples/ uses
 * it too). */
#ifndef FABPOOL_CLI_H
#define FABPOOL_CLI_H

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CLI_OK = 0, CLI_FAILED = 1, CLI_USAGE = 2 };

/* v as a whole decimal number in [lo, hi] into *out; else a message naming tool and opt, and -1. */
static inline int cli_u64(const char *tool, const char *opt, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = v && *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
    if (!v || !end || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "%s: %s '%s': not a whole number from %" PRIu64 " to %" PRIu64 "\n", tool, opt, v ? v : "",
                lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* v as a number > 0 (a ratio) into *out; else a message and -1. */
static inline int cli_ratio(const char *tool, const char *opt, const char *v, double *out)
{
    char *end = NULL;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !end || end == v || *end || errno || !(x > 0)) {
        fprintf(stderr, "%s: %s '%s': not a number above 0\n", tool, opt, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* getopt_long said '?' or ':' (its message is on stderr already), or an operand is wrong: the usage line, 2. */
static inline int cli_usage_error(const char *usage)
{
    fprintf(stderr, "%s(--help says what each option does)\n", usage);
    return CLI_USAGE;
}

/* The libdir of an install, relative to its prefix (CMake's CMAKE_INSTALL_LIBDIR, perf/CMakeLists.txt). */
#ifndef FABPOOL_CLI_LIBDIR
#define FABPOOL_CLI_LIBDIR "lib"
#endif

/* What a tool that cannot load the driver adds to its message: how to run it on the simulated driver, with the
 * path of the one beside the tool where there is one (an install's <prefix>/<libdir>/fabpool/sim/libcuda.so.1,
 * from `cmake --install <build> --component sim`; a build folder's sim/libcuda.so.1), else how to install it. */
static inline const char *cli_sim_hint(void)
{
    static char hint[4096 + 512];
    char exe[4096], sim[4096 + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1); /* a path without links: the tool's own */
    char *bin = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
    if (bin) {
        *bin = 0; /* exe: the tool's folder */
        char *up = strrchr(exe, '/');
        const char *found = NULL;
        if (up) { /* an install: <prefix>/bin/tool and <prefix>/<libdir>/fabpool/sim */
            snprintf(sim, sizeof sim, "%.*s/" FABPOOL_CLI_LIBDIR "/fabpool/sim/libcuda.so.1", (int)(up - exe), exe);
            found = access(sim, F_OK) == 0 ? sim : NULL;
        }
        if (!found) { /* a build folder: <build>/tool and <build>/sim */
            snprintf(sim, sizeof sim, "%s/sim/libcuda.so.1", exe);
            found = access(sim, F_OK) == 0 ? sim : NULL;
        }
        if (found) {
            snprintf(hint, sizeof hint, "; without a GPU, run it on the simulated driver: FABPOOL_CUDA_LIBRARY=%s",
                     found);
            return hint;
        }
    }
    return "; without a GPU, run it on the simulated driver: `cmake --install <build> --component sim` puts it in "
           "<prefix>/" FABPOOL_CLI_LIBDIR "/fabpool/sim/, then FABPOOL_CUDA_LIBRARY=<prefix>/" FABPOOL_CLI_LIBDIR
           "/fabpool/sim/libcuda.so.1";
}

#endif
