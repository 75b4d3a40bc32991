/* conf_options.c - a fabpool_options struct as a whole: checked against every
 * key's rules (fp_options_check), printed (the options in force, or those that
 * differ from the defaults), and the handle types' names.  The keys are
 * conf.c's table (conf.h). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "conf_options.h"
#include "error.h"
#include "json.h"
#include "conf.h"

#define keys fp_conf_keys
#define NKEYS fp_conf_nkeys

/* ------------------------------------------------------------ fabpool_options */

/* The number in o's field for key k (F_INT fields may be negative). */
static int64_t field_value(const fabpool_options *o, const struct key *k)
{
    const char *field = (const char *)o + k->offset;
    switch (k->field) {
    case F_INT:
        return *(const int *)(const void *)field;
    case F_U32:
        return (int64_t)*(const uint32_t *)(const void *)field;
    case F_U64: {
        uint64_t x = *(const uint64_t *)(const void *)field;
        return x > INT64_MAX ? INT64_MAX : (int64_t)x;
    }
    case F_HANDLE:
        return (int64_t)*(const fabpool_handle_type *)(const void *)field;
    case F_METADATA:
        return (int64_t)*(const fabpool_metadata *)(const void *)field;
    case F_PEERS:
        return o->n_peer_devices;
    case F_STRING:
        return 0;
    }
    return 0;
}

static fabpool_status bad_field(const struct key *k, long long x, const char *why)
{
    return fp_error(FABPOOL_ERR_CONFIG, "fabpool_options.%s (conf key '%s') is %lld, which %s; accepted: %s",
                    k->field_name, k->name, x, why, k->doc);
}

fabpool_status fp_options_check(const fabpool_options *o)
{
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        if (k->field == F_PEERS) {
            if (o->n_peer_devices < 0 || o->n_peer_devices > FABPOOL_MAX_PEERS)
                return bad_field(k, o->n_peer_devices, "is not a count of 0 to 16 peer devices");
            for (int a = 0; a < o->n_peer_devices; a++) {
                if (o->peer_devices[a] < 0 || (uint64_t)o->peer_devices[a] > k->hi)
                    return fp_error(FABPOOL_ERR_CONFIG, "fabpool_options.peer_devices[%d] (conf key 'peers') is %d, "
                                    "not a device ordinal; accepted: %s", a, o->peer_devices[a], k->doc);
                for (int b = 0; b < a; b++)
                    if (o->peer_devices[b] == o->peer_devices[a])
                        return fp_error(FABPOOL_ERR_CONFIG, "fabpool_options.peer_devices[%d] and [%d] (conf key "
                                        "'peers') both name device %d; accepted: %s", b, a, o->peer_devices[a], k->doc);
            }
            continue;
        }
        if (k->field == F_STRING) {
            const char *field = (const char *)o + k->offset;
            if (!memchr(field, '\0', FABPOOL_TRACE_PATH_MAX))
                return fp_error(FABPOOL_ERR_CONFIG, "fabpool_options.%s (conf key '%s') is not NUL-terminated within "
                                "its %d bytes; accepted: %s", k->field_name, k->name, FABPOOL_TRACE_PATH_MAX, k->doc);
            continue;
        }
        int64_t x = field_value(o, k);
        if (x < 0)
            return bad_field(k, (long long)x, "is negative");
        uint64_t u = (uint64_t)x;
        if (k->field == F_U64)
            u = *(const uint64_t *)(const void *)((const char *)o + k->offset);
        if (u == 0 && k->zero_ok)
            continue;
        if (u < k->lo)
            return bad_field(k, (long long)x, "is below the minimum");
        if (u > k->hi)
            return bad_field(k, (long long)x, "is above the maximum");
        if (k->multiple && u % k->multiple)
            return bad_field(k, (long long)x, "is not a multiple of 2MiB");
    }
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ printing */

/* Whether key k's field differs between a and b. */
static int field_differs(const fabpool_options *a, const fabpool_options *b, const struct key *k)
{
    if (k->field == F_STRING)
        return strcmp((const char *)a + k->offset, (const char *)b + k->offset) != 0;
    if (k->field == F_PEERS)
        return a->n_peer_devices != b->n_peer_devices ||
               memcmp(a->peer_devices, b->peer_devices, sizeof a->peer_devices) != 0;
    if (k->field == F_U64)
        return *(const uint64_t *)(const void *)((const char *)a + k->offset) !=
               *(const uint64_t *)(const void *)((const char *)b + k->offset);
    return field_value(a, k) != field_value(b, k);
}

/* Key k's value in o, as a conf string writes it (text) or as a JSON value. */
static void print_value(FILE *f, const fabpool_options *o, const struct key *k, int json)
{
    const char *field = (const char *)o + k->offset;
    if (k->field == F_STRING) {
        if (json)
            fp_json_str(f, field[0] ? field : NULL);
        else
            fputs(field[0] ? field : "none", f);
        return;
    }
    if (k->field == F_PEERS) {
        fputs(json ? "[" : o->n_peer_devices ? "" : "none", f);
        for (int i = 0; i < o->n_peer_devices && i < FABPOOL_MAX_PEERS; i++)
            fprintf(f, "%s%d", i ? (json ? "," : ";") : "", o->peer_devices[i]);
        if (json)
            fputs("]", f);
        return;
    }
    uint64_t u = k->field == F_U64 ? *(const uint64_t *)(const void *)field : (uint64_t)field_value(o, k);
    if (k->words && u < 8) {
        size_t i = 0;
        while (k->words[i] && i < u)
            i++;
        if (k->words[i]) {
            if (json)
                fp_json_str(f, k->words[i]);
            else
                fputs(k->words[i], f);
            return;
        }
    }
    if (fp_conf_key_is_bool(k)) {
        fputs(u ? "true" : "false", f);
        return;
    }
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    int unit = -1;
    for (int i = 4; !json && fp_conf_key_is_size(k) && u && i >= 0 && unit < 0; i--)
        if (u % (1ull << (10 * (i + 1))) == 0)
            unit = i;
    if (unit >= 0)
        fprintf(f, "%llu%s", (unsigned long long)(u >> (10 * (unit + 1))), units[unit]);
    else
        fprintf(f, "%llu", (unsigned long long)u);
}

void fp_options_print(FILE *f, const fabpool_options *o, int changed_only, int json)
{
    fabpool_options d;
    fabpool_options_init(&d);
    int first = 1;
    if (json)
        fputc('{', f);
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        if (changed_only && !field_differs(o, &d, k))
            continue;
        if (json) {
            fp_json_key(f, &first, k->name);
        } else {
            fprintf(f, "%s%s:", first ? "" : ",", k->name);
            first = 0;
        }
        print_value(f, o, k, json);
    }
    if (json)
        fputc('}', f);
}

const char *fp_handle_type_name(fabpool_handle_type t)
{
    switch (t) {
    case FABPOOL_HANDLE_AUTO: return "auto";
    case FABPOOL_HANDLE_NONE: return "none";
    case FABPOOL_HANDLE_POSIX_FD: return "posix_fd";
    case FABPOOL_HANDLE_FABRIC: return "fabric";
    }
    return "?";
}
