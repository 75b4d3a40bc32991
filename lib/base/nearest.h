/* nearest.h - the name a misspelt one was probably meant to be, for messages that say "did you mean ...?", and
 * the match of a word ignoring case. */
#ifndef FP_NEAREST_H
#define FP_NEAREST_H

#include <stddef.h>

/* Of the n names, the one nearest to word[0..len) by edit distance (a letter missing, extra,
 * changed, or two neighbours swapped: "reserv", "max_wast", "thraed_cache"), if it is near enough to be the one
 * meant: one slip in a word of up to seven letters, two from eight on, none under three letters; else NULL. */
const char *fp_nearest_name(const char *word, size_t len, const char *const *names, size_t n);

/* Whether s[0..n) is the NUL-terminated word w, ignoring ASCII case (whatever the locale): how the words of
 * FABPOOL_CONF and FABPOOL_PEERS are matched. */
int fp_same_word(const char *s, size_t n, const char *w);

#endif
