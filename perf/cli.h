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

#endif
