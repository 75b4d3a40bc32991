/* json.h - the JSON writer that the library's report (fabpool_print_stats)
 * and the tools that write JSON (fabpool_replay, fabpool_trace,
 * fabpool_bench_stream) share: strings escaped so that any text (a file name
 * with '"', '\' or bytes that are not UTF-8) stays valid JSON, numbers that
 * JSON can hold (NaN and infinities become null).  Header only, so that the
 * tools, which do not all link the library, use the same code (a tools
 * header in lib/LAYERS). */
#ifndef FP_JSON_H
#define FP_JSON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* The length of the UTF-8 sequence at s (2-4), or 0 if s does not start one. */
static inline int fp_json_utf8_len(const unsigned char *s)
{
    int n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

/* s as a JSON string, quotes included; NULL as null.  A byte that does not
 * begin valid UTF-8 is written as the code point of the same number
 * (\u00XX), so the output is always valid. */
static inline void fp_json_str(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
            fputc(*p, f);
        } else if (*p < 0x20 || *p == 0x7f) {
            fprintf(f, "\\u%04x", *p);
        } else if (*p < 0x80) {
            fputc(*p, f);
        } else {
            int n = fp_json_utf8_len(p);
            if (n) {
                fwrite(p, 1, (size_t)n, f);
                p += n - 1;
            } else {
                fprintf(f, "\\u%04x", *p);
            }
        }
    }
    fputc('"', f);
}

/* "key": with a comma before it unless *first (then cleared). */
static inline void fp_json_key(FILE *f, int *first, const char *key)
{
    if (!*first)
        fputc(',', f);
    *first = 0;
    fp_json_str(f, key);
    fputc(':', f);
}

/* A number with the given printf precision, or null where JSON has none (NaN, infinities). */
static inline void fp_json_double(FILE *f, double v, int digits)
{
    if (isfinite(v))
        fprintf(f, "%.*f", digits, v);
    else
        fputs("null", f);
}

#endif
