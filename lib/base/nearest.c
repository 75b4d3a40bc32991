/* nearest.c - the nearest name to a misspelt one, and a word matched ignoring case (nearest.h). */
#include "nearest.h"

#include <string.h>

#define FP_NEAREST_MAX 40 /* longer words are never near: the table below stays on the stack */

/* The edit distance of a[0..n) and b (insertions, deletions, changes and swaps of neighbours, 1 each), or cap + 1
 * where it is more than cap. */
static size_t distance(const char *a, size_t n, const char *b, size_t cap)
{
    size_t m = strlen(b);
    if (n > FP_NEAREST_MAX || m > FP_NEAREST_MAX || (n > m ? n - m : m - n) > cap)
        return cap + 1;
    size_t d[FP_NEAREST_MAX + 1][FP_NEAREST_MAX + 1];
    for (size_t i = 0; i <= n; i++)
        for (size_t j = 0; j <= m; j++) {
            if (!i || !j) {
                d[i][j] = i + j;
                continue;
            }
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m] > cap ? cap + 1 : d[n][m];
}

const char *fp_nearest_name(const char *word, size_t len, const char *const *names, size_t n)
{
    if (len < 3)
        return NULL;
    /* a guess farther off than that misleads more than it helps */
    size_t cap = len >= 8 ? 2 : 1, best = cap + 1;
    const char *found = NULL;
    for (size_t i = 0; i < n; i++) {
        size_t d = distance(word, len, names[i], cap);
        if (d < best) {
            best = d;
            found = names[i];
        }
    }
    return found;
}

static char lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

int fp_same_word(const char *s, size_t n, const char *w)
{
    size_t i = 0;
    for (; i < n && w[i]; i++)
        if (lower(s[i]) != lower(w[i]))
            return 0;
    return i == n && w[i] == '\0';
}
