/* conf.h - the rules of fabpool_options: the FABPOOL_CONF parser is public
 * (fabpool_options_parse); this is the check of a whole options struct.
 * Layer base.  Calls: error. */
#ifndef FP_CONF_H
#define FP_CONF_H

#include "fabpool.h"

/* Every field of o within the range of its FABPOOL_CONF key, with the key's
 * words in the message (FABPOOL_ERR_CONFIG names the field and the key). */
fabpool_status fp_options_check(const fabpool_options *o);

/* The handle type's conf word ("auto", "none", "posix_fd", "fabric"). */
const char *fp_handle_type_name(fabpool_handle_type t);

#endif
