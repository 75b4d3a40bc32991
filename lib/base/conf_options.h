/* conf_options.h - the rules of fabpool_options: the FABPOOL_CONF parser is public
 * (fabpool_options_parse); this is the check of a whole options struct, and
 * the options written back as a conf string or JSON. */
#ifndef FP_CONF_OPTIONS_H
#define FP_CONF_OPTIONS_H

#include <stdio.h>

#include "fabpool.h"

/* Every field of o within the range of its FABPOOL_CONF key, with the key's
 * words in the message (FABPOOL_ERR_CONFIG names the field and the key). */
fabpool_status fp_options_check(const fabpool_options *o);

/* The options as FABPOOL_CONF writes them ("device:0,reserve:640GiB,...",
 * every key: a string that gives the same options back) or as one JSON
 * object ({"device":0,"reserve":687194767360,...}: sizes in bytes, words as
 * strings, peers a list, trace a string or null); changed_only: only the
 * keys whose value differs from fabpool_options_init's. */
void fp_options_print(FILE *f, const fabpool_options *o, int changed_only, int json);

/* The handle type's conf word ("auto", "none", "posix_fd", "fabric"). */
const char *fp_handle_type_name(fabpool_handle_type t);

#endif
