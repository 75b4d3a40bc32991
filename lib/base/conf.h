/* conf.h - the table of FABPOOL_CONF keys (conf.c), for the files of
 * the options that read it (conf_options.c).  Private to base/. */
#ifndef FP_CONF_H
#define FP_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "fabpool.h"

/* The type of the field a key writes. */
/* F_STRING: a char array of the options, NUL-terminated; its parser writes
 * it (values may hold ':' and '=', as paths do; never ',' or whitespace). */
typedef enum field_kind { F_INT, F_U32, F_U64, F_HANDLE, F_METADATA, F_PEERS, F_STRING } field_kind;

struct key;
/* Reads the value v[0..n) into *out (F_PEERS: into *o directly); on a bad
 * value returns FABPOOL_ERR_CONFIG with the message set. */
typedef fabpool_status (*parse_fn)(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o);

struct key {
    const char *name;
    field_kind field;
    size_t offset;             /* of the field in fabpool_options */
    const char *field_name;    /* its name there, for messages about fabpool_options */
    uint64_t def;              /* the default (fabpool_options_init); F_PEERS and F_STRING: none, "" */
    parse_fn parse;
    uint64_t lo, hi;           /* the range of the number read */
    uint64_t multiple;         /* 0, or: the number must be a multiple of this */
    int zero_ok;               /* 0 is accepted although lo > 0 (reserve:0) */
    const char *const *words;  /* word parsers: the words, index = value, NULL-ended */
    const char *doc;           /* what is accepted, as the messages say it */
};

/* Whether k's value is a size (printed with units) or a boolean (true/false). */
int fp_conf_key_is_size(const struct key *k);
int fp_conf_key_is_bool(const struct key *k);

/* Every key, in the order the messages list them. */
extern const struct key fp_conf_keys[];
extern const size_t fp_conf_nkeys;

#endif
