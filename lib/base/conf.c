/* conf.c - the defaults of fabpool_options, and the parser of FABPOOL_CONF
 * strings: "key:value,key:value", the syntax of jemalloc's MALLOC_CONF and
 * PyTorch's PYTORCH_ALLOC_CONF (docs/config.md).
 *
 * One table of keys drives everything: which keys exist, their defaults
 * (fabpool_options_init), how each value is read, its range, the field it
 * lands in, and the words the messages use.
 * The parser works on a copy of the options and copies it back only when
 * every pair was good, so a failure leaves the caller's options as they were.
 * Messages name the key, the value and what is accepted; where the string
 * came from (options.conf, the FABPOOL_CONF variable) is the caller's to add. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "json.h"
#include "nearest.h"
#include "sizeclass.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* ------------------------------------------------------------ the table */

#include "conf.h"

static fabpool_status parse_uint(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);
static fabpool_status parse_size(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);
static fabpool_status parse_bool(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);
static fabpool_status parse_percent(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);
static fabpool_status parse_word(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);
static fabpool_status parse_word_or_index(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);
static fabpool_status parse_peers(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);
static fabpool_status parse_path(const struct key *, const char *, size_t, uint64_t *, fabpool_options *);

static const char *const handle_words[] = {"auto", "none", "posix_fd", "fabric", NULL};
static const char *const stats_words[] = {"none", "text", "json", NULL};
static const char *const metadata_words[] = {"auto", "jemalloc", "libc", NULL};
static const char *const rdma_words[] = {"auto", "on", "off", NULL};
static const char *const debug_words[] = {"none", "warn", "info", "trace", NULL};
static const char *const large_chunks_words[] = {"grid", "whole", NULL};

#define FIELD(f) offsetof(fabpool_options, f), #f

const struct key fp_conf_keys[] = {
    {"device", F_INT, FIELD(device), 0, parse_uint, 0, 1023, 0, 0, NULL, "a device ordinal 0..1023"},
    /* reserve: 0 by default, 8x the device memory, decided at pool creation */
    {"reserve", F_U64, FIELD(reserve_bytes), 0, parse_size, 2 * MiB, FP_RESERVE_MAX, 0, 1, NULL,
     "0 (8x the device memory) or a size from 2MiB to 1PiB, e.g. 2TiB"},
    {"handle_type", F_HANDLE, FIELD(handle_type), FABPOOL_HANDLE_AUTO, parse_word, 0, 3, 0, 0, handle_words,
     "auto, none, posix_fd or fabric"},
    {"max_waste", F_U32, FIELD(max_waste_percent), 25, parse_percent, 0, 100, 0, 0, NULL,
     "a whole percent 0..100, e.g. 25 or 25%"},
    {"max_chunk", F_U64, FIELD(max_chunk_bytes), 1 * GiB, parse_size, 2 * MiB, FP_RESERVE_MAX, 2 * MiB, 0, NULL,
     "a size that is a multiple of 2MiB, from 2MiB to 1PiB, e.g. 1GiB"},
    {"slab_max", F_U64, FIELD(slab_max_bytes), 4096, parse_size, 256, 64 * MiB, 0, 0, NULL,
     "a size from 256B to 64MiB, e.g. 4KiB (rounded up to a size class)"},
    /* cache_limit: no limit by default, the decay and the OOM trim return memory */
    {"cache_limit", F_U64, FIELD(cache_limit_bytes), UINT64_MAX, parse_size, 0, UINT64_MAX, 0, 0, NULL,
     "a size, e.g. 1GiB (0: keep no free memory mapped)"},
    {"decay_ms", F_U32, FIELD(decay_ms), 10000, parse_uint, 0, UINT32_MAX, 0, 0, NULL,
     "milliseconds 0..4294967295, e.g. 1000 (0: return free memory at once)"},
    {"large_slack", F_U32, FIELD(large_slack_percent), 4, parse_percent, 0, 1000, 0, 0, NULL,
     "a whole percent 0..1000, e.g. 4 or 4%"},
    {"shrink_hysteresis", F_U32, FIELD(shrink_hysteresis_percent), 25, parse_percent, 0, 1000, 0, 0, NULL,
     "a whole percent 0..1000, e.g. 25 or 25%"},
    {"thread_cache", F_U32, FIELD(thread_cache), 1, parse_bool, 0, 1, 0, 0, NULL, "true, false, 1 or 0"},
    {"stats_print", F_INT, FIELD(stats_at_destroy), 0, parse_word_or_index, 0, 2, 0, 0, stats_words,
     "none, text or json (or 0, 1, 2)"},
    {"metadata", F_METADATA, FIELD(metadata), FABPOOL_METADATA_AUTO, parse_word, 0, 2, 0, 0, metadata_words,
     "auto, jemalloc or libc"},
    {"peers", F_PEERS, FIELD(n_peer_devices), 0, parse_peers, 0, 1023, 0, 0, NULL,
     "none, or up to 16 distinct device ordinals 0..1023 separated by ';' or '+', e.g. 1;2;3"},
    {"trace", F_STRING, FIELD(trace_path), 0, parse_path, 0, FABPOOL_TRACE_PATH_MAX - 1, 0, 0, NULL,
     "none, or the path of a file to record the trace to (at most 511 bytes, no ',' and no whitespace; %p: the "
     "pid, %h: the host, %d: the device), e.g. /tmp/fabpool-%p.trace"},
    {"rdma", F_INT, FIELD(rdma), FABPOOL_RDMA_AUTO, parse_word, 0, 2, 0, 0, rdma_words, "auto, on or off"},
    {"sleep_keep_host", F_U32, FIELD(sleep_keep_host), 0, parse_bool, 0, 1, 0, 0, NULL, "true, false, 1 or 0"},
    {"stream_owner", F_U32, FIELD(stream_owner), 1, parse_bool, 0, 1, 0, 0, NULL, "true, false, 1 or 0"},
    {"debug", F_INT, FIELD(debug), FABPOOL_LOG_NONE, parse_word_or_index, 0, 3, 0, 0, debug_words,
     "none, warn, info or trace (or 0 to 3)"},
    {"keep_ms", F_U32, FIELD(keep_ms), 1000, parse_uint, 0, UINT32_MAX, 0, 0, NULL,
     "milliseconds 0..4294967295, e.g. 1000 (0: a released buffer or view is given back at once)"},
    {"large_chunks", F_INT, FIELD(large_chunks), FABPOOL_LARGE_CHUNKS_GRID, parse_word, 0, 1, 0, 0,
     large_chunks_words, "grid or whole"},
};

const size_t fp_conf_nkeys = sizeof fp_conf_keys / sizeof fp_conf_keys[0];
#define keys fp_conf_keys
#define NKEYS (sizeof fp_conf_keys / sizeof fp_conf_keys[0])

static void store(fabpool_options *o, const struct key *k, uint64_t x);

void fabpool_options_init(fabpool_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o); /* conf NULL, no peers, no trace */
    o->struct_size = (uint32_t)sizeof *o;
    for (size_t i = 0; i < NKEYS; i++)
        store(o, &keys[i], keys[i].def);
}

/* ------------------------------------------------------------- helpers */

/* A value or key in a message: at most SHOW_MAX characters, then "...". */
#define SHOW_MAX 96
#define SHOW(s, n) (int)((n) > SHOW_MAX ? SHOW_MAX : (n)), (s), ((n) > SHOW_MAX ? "..." : "")

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_key_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_'; }

/* How a whitespace character is shown: "' '", "'\\t'". */
static const char *space_name(char c)
{
    static const char *const names[] = {"'\\t'", "'\\n'", "'\\v'", "'\\f'", "'\\r'"}; /* '\t' is 9 .. '\r' 13 */
    return c >= '\t' && c <= '\r' ? names[c - '\t'] : "' '";
}

static const char *find_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (is_space(s[i]))
            return s + i;
    return NULL;
}


static int same_key(const char *s, size_t n, const char *name) { return strlen(name) == n && memcmp(s, name, n) == 0; }

/* "device, reserve, ..." from the table, into buf. */
#define KNOWN_KEYS_MAX 256
static const char *known_keys(char buf[KNOWN_KEYS_MAX])
{
    size_t len = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t l = strlen(keys[i].name);
        if (len + l + 3 >= KNOWN_KEYS_MAX)
            break;
        if (i) {
            memcpy(buf + len, ", ", 2);
            len += 2;
        }
        memcpy(buf + len, keys[i].name, l);
        len += l;
    }
    buf[len] = '\0';
    return buf;
}

static fabpool_status bad_value(const struct key *k, const char *v, size_t n, const char *why)
{
    const char *hint = k->field != F_PEERS && memchr(v, ';', n) ? " (';' does not separate pairs: use ',')" : "";
    return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' %s%s; accepted: %s", k->name, SHOW(v, n), why, hint,
                    k->doc);
}

/* A whole decimal number: digits only, no sign, no fraction. */
static fabpool_status read_number(const struct key *k, const char *v, size_t n, uint64_t *out, size_t *used)
{
    size_t i = 0;
    uint64_t x = 0;
    if (n == 0)
        return bad_value(k, v, n, "is empty");
    if (!is_digit(v[0]))
        return bad_value(k, v, n, v[0] == '-' || v[0] == '+' ? "has a sign (none is accepted)"
                                                             : "is not a number (it does not start with a digit)");
    for (; i < n && is_digit(v[i]); i++) {
        unsigned d = (unsigned)(v[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return bad_value(k, v, n, "overflows 64 bits");
        x = x * 10 + d;
    }
    if (i < n && v[i] == '.' && i + 1 < n && is_digit(v[i + 1]))
        return bad_value(k, v, n, "has a fraction (whole numbers only: write e.g. 1536MiB, not 1.5GiB)");
    *out = x;
    *used = i;
    return FABPOOL_OK;
}

/* ------------------------------------------------------------- parsers */

/* A whole number: all of v, or v with `suffix` after it (0: none). */
static fabpool_status read_whole(const struct key *k, const char *v, size_t n, uint64_t *out, char suffix,
                                 const char *not_what)
{
    size_t used = 0;
    fabpool_status st = read_number(k, v, n, out, &used);
    if (st != FABPOOL_OK)
        return st;
    if (used == n || (suffix && used + 1 == n && v[used] == suffix))
        return FABPOOL_OK;
    return bad_value(k, v, n, not_what);
}

static fabpool_status parse_uint(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o)
{
    (void)o;
    return read_whole(k, v, n, out, 0, "is not a whole number");
}

static fabpool_status parse_size(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o)
{
    (void)o;
    static const struct {
        const char *unit;
        unsigned shift;
    } units[] = {
        {"b", 0},    {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20}, {"mb", 20},  {"mib", 20},
        {"g", 30},   {"gb", 30}, {"gib", 30}, {"t", 40},  {"tb", 40}, {"tib", 40},
        {"p", 50},   {"pb", 50}, {"pib", 50},
    };
    size_t used = 0;
    uint64_t x = 0;
    fabpool_status st = read_number(k, v, n, &x, &used);
    if (st != FABPOOL_OK)
        return st;
    if (used == n) {
        *out = x;
        return FABPOOL_OK;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!fp_same_word(v + used, n - used, units[i].unit))
            continue;
        if (x > (UINT64_MAX >> units[i].shift))
            return bad_value(k, v, n, "overflows 64 bits");
        *out = x << units[i].shift;
        return FABPOOL_OK;
    }
    return fp_error(FABPOOL_ERR_CONFIG,
                    "key '%s': value '%.*s%s' has an unknown unit '%.*s%s' (units: B, KiB, MiB, GiB, TiB, PiB; also K, "
                    "M, G, T, P and KB, MB, GB, TB, PB, all powers of 1024; any case); accepted: %s",
                    k->name, SHOW(v, n), SHOW(v + used, n - used), k->doc);
}

static fabpool_status parse_percent(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o)
{
    (void)o;
    return read_whole(k, v, n, out, '%', "is not a whole percent");
}

static fabpool_status parse_bool(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o)
{
    (void)o;
    if (fp_same_word(v, n, "true") || fp_same_word(v, n, "1"))
        *out = 1;
    else if (fp_same_word(v, n, "false") || fp_same_word(v, n, "0"))
        *out = 0;
    else
        return bad_value(k, v, n, "is not a boolean");
    return FABPOOL_OK;
}

static fabpool_status parse_word(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o)
{
    (void)o;
    for (size_t i = 0; k->words[i]; i++)
        if (fp_same_word(v, n, k->words[i])) {
            *out = i;
            return FABPOOL_OK;
        }
    return bad_value(k, v, n, "is not a known word");
}

static fabpool_status parse_word_or_index(const struct key *k, const char *v, size_t n, uint64_t *out,
                                          fabpool_options *o)
{
    for (size_t i = 0; k->words[i]; i++)
        if (fp_same_word(v, n, k->words[i])) {
            *out = i;
            return FABPOOL_OK;
        }
    if (n > 0 && is_digit(v[0]))
        return parse_uint(k, v, n, out, o); /* the range check follows */
    return bad_value(k, v, n, "is not a known word");
}

static fabpool_status parse_peers(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o)
{
    int list[FABPOOL_MAX_PEERS];
    int count = 0;
    *out = 0;
    if (fp_same_word(v, n, "none")) {
        o->n_peer_devices = 0;
        memset(o->peer_devices, 0, sizeof o->peer_devices);
        return FABPOOL_OK;
    }
    for (size_t i = 0; i <= n;) {
        size_t j = i;
        while (j < n && v[j] != ';' && v[j] != '+')
            j++;
        if (j == i)
            return bad_value(k, v, n, "has an empty entry (write ordinals separated by single ';' or '+')");
        uint64_t d = 0;
        size_t used = 0;
        if (!is_digit(v[i]))
            return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' has an entry '%.*s%s' that is not a device "
                            "ordinal; accepted: %s", k->name, SHOW(v, n), SHOW(v + i, j - i), k->doc);
        fabpool_status st = read_number(k, v + i, j - i, &d, &used);
        if (st != FABPOOL_OK || used != j - i || d > k->hi)
            return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' has an entry '%.*s%s' that is not a device "
                            "ordinal 0..%llu; accepted: %s", k->name, SHOW(v, n), SHOW(v + i, j - i),
                            (unsigned long long)k->hi, k->doc);
        if (count == FABPOOL_MAX_PEERS)
            return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' names more than %d devices; accepted: %s",
                            k->name, SHOW(v, n), FABPOOL_MAX_PEERS, k->doc);
        for (int c = 0; c < count; c++)
            if (list[c] == (int)d)
                return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' names device %d twice; accepted: %s",
                                k->name, SHOW(v, n), (int)d, k->doc);
        list[count++] = (int)d;
        if (j == n)
            break;
        i = j + 1;
        if (i == n)
            return bad_value(k, v, n, "ends with a separator (write ordinals separated by single ';' or '+')");
    }
    o->n_peer_devices = count;
    memset(o->peer_devices, 0, sizeof o->peer_devices);
    memcpy(o->peer_devices, list, (size_t)count * sizeof list[0]);
    return FABPOOL_OK;
}

static fabpool_status parse_path(const struct key *k, const char *v, size_t n, uint64_t *out, fabpool_options *o)
{
    char *field = (char *)o + k->offset;
    *out = 0;
    if (fp_same_word(v, n, "none")) {
        memset(field, 0, FABPOOL_TRACE_PATH_MAX);
        return FABPOOL_OK;
    }
    if (n > k->hi)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' is %zu bytes long, above the maximum of %llu; "
                        "accepted: %s", k->name, SHOW(v, n), n, (unsigned long long)k->hi, k->doc);
    if (memchr(v, '\0', n))
        return bad_value(k, v, n, "holds a NUL byte");
    memset(field, 0, FABPOOL_TRACE_PATH_MAX);
    memcpy(field, v, n);
    return FABPOOL_OK;
}

/* ------------------------------------------------------------ one pair */

static fabpool_status check_range(const struct key *k, const char *v, size_t n, uint64_t x)
{
    const char *why = NULL;
    if (x == 0 && k->zero_ok)
        return FABPOOL_OK;
    if (x < k->lo)
        why = "is below the minimum";
    else if (x > k->hi)
        why = "is above the maximum";
    else if (k->multiple && x % k->multiple)
        why = "is not a multiple of 2MiB"; /* max_chunk is the one key with a multiple */
    if (!why)
        return FABPOOL_OK;
    int plain = 1; /* digits only: the bytes are the text itself */
    for (size_t i = 0; i < n; i++)
        plain &= is_digit(v[i]);
    if (k->parse == parse_size && !plain)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' (%llu bytes) %s; accepted: %s", k->name,
                        SHOW(v, n), (unsigned long long)x, why, k->doc);
    if (k->parse == parse_size)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' %s; accepted: %s", k->name, SHOW(v, n), why,
                        k->doc);
    return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' is out of range; accepted: %s", k->name, SHOW(v, n),
                    k->doc);
}

static void store(fabpool_options *o, const struct key *k, uint64_t x)
{
    char *field = (char *)o + k->offset;
    switch (k->field) {
    case F_INT:
        *(int *)(void *)field = (int)x;
        break;
    case F_U32:
        *(uint32_t *)(void *)field = (uint32_t)x;
        break;
    case F_U64:
        *(uint64_t *)(void *)field = x;
        break;
    case F_HANDLE:
        *(fabpool_handle_type *)(void *)field = (fabpool_handle_type)x;
        break;
    case F_METADATA:
        *(fabpool_metadata *)(void *)field = (fabpool_metadata)x;
        break;
    case F_PEERS:
    case F_STRING:
        break; /* its parser wrote the field */
    }
}

/* In a value, a ':' or '=' means that a second pair was glued on with a
 * separator other than ','.  Returns that separator (0 if none shows, e.g.
 * "reserve:2:3"), and in *at the offset of the ':' or '='; -1: no such sign. */
static int glued_pair(const char *v, size_t n, size_t *at)
{
    size_t i = 0;
    while (i < n && v[i] != ':' && v[i] != '=')
        i++;
    if (i == n)
        return -1;
    *at = i;
    size_t j = i;
    while (j > 0 && is_key_char(v[j - 1]))
        j--;
    return j > 0 ? (unsigned char)v[j - 1] : 0;
}

/* A pair without ':': which mistake it is (a key alone, key=value, other separators). */
static fabpool_status refuse_no_colon(const char *p, size_t len)
{
    char kk[KNOWN_KEYS_MAX];
    for (size_t i = 0; i < NKEYS; i++)
        if (same_key(p, len, keys[i].name))
            return fp_error(FABPOOL_ERR_CONFIG, "key '%s' has no ':' and no value: write %s:<value>; accepted: %s",
                            keys[i].name, keys[i].name, keys[i].doc);
    const char *eq = memchr(p, '=', len);
    char other = 0;
    for (size_t i = 0; i < len && !other; i++)
        if (p[i] == ';' || p[i] == '&' || p[i] == '|')
            other = p[i];
    if (eq && other)
        return fp_error(FABPOOL_ERR_CONFIG, "'%.*s%s' has no ':': pairs are written key:value (not key=value) and "
                        "separated by ',' (not '%c')", SHOW(p, len), other);
    if (eq)
        return fp_error(FABPOOL_ERR_CONFIG, "'%.*s%s' has no ':': write key:value (%.*s%s:%.*s%s), not "
                        "key=value", SHOW(p, len), SHOW(p, (size_t)(eq - p)), SHOW(eq + 1, len - (size_t)(eq - p) - 1));
    return fp_error(FABPOOL_ERR_CONFIG, "'%.*s%s' has no ':': write key:value pairs separated by ',' "
                    "(e.g. thread_cache:false,max_chunk:512MiB); known keys: %s", SHOW(p, len), known_keys(kk));
}

/* A value that holds a second pair glued on with a wrong separator: said
 * before anything else, as it explains an unknown key or a bad value too.
 * *sep and *at: what glued_pair found (a path may hold ':' and '=': none). */
static fabpool_status refuse_glued(const char *kname, size_t klen, const char *v, size_t vlen, int *sep, size_t *at)
{
    *at = 0;
    *sep = glued_pair(v, vlen, at);
    for (size_t i = 0; i < NKEYS; i++)
        if (keys[i].field == F_STRING && same_key(kname, klen, keys[i].name))
            *sep = -1;
    if (*sep > 0 && is_space((char)*sep))
        return fp_error(FABPOOL_ERR_CONFIG, "key '%.*s%s': value '%.*s%s' holds a second pair after whitespace %s: "
                        "pairs are separated by ',', and no spaces or tabs are accepted", SHOW(kname, klen),
                        SHOW(v, vlen), space_name((char)*sep));
    if (*sep > 0)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%.*s%s': value '%.*s%s' holds a second pair after '%c': '%c' is not "
                        "a separator; pairs are separated by ',', each written key:value", SHOW(kname, klen),
                        SHOW(v, vlen), (char)*sep, (char)*sep);
    return FABPOOL_OK;
}

/* The key's row in *ki, or why the key is not one (a wrong separator in it, the wrong case, a misspelling,
 * unknown). */
static fabpool_status find_key(const char *kname, size_t klen, size_t *ki)
{
    char kk[KNOWN_KEYS_MAX];
    for (size_t i = 0; i < NKEYS; i++)
        if (same_key(kname, klen, keys[i].name)) {
            *ki = i;
            return FABPOOL_OK;
        }
    for (size_t i = 0; i < klen; i++)
        if (kname[i] == ';' || kname[i] == '=' || kname[i] == '&' || kname[i] == '|')
            return fp_error(FABPOOL_ERR_CONFIG, "unknown key '%.*s%s': '%c' is not a separator; pairs are "
                            "separated by ',', each written key:value; known keys: %s", SHOW(kname, klen),
                            kname[i], known_keys(kk));
    for (size_t i = 0; i < NKEYS; i++)
        if (fp_same_word(kname, klen, keys[i].name))
            return fp_error(FABPOOL_ERR_CONFIG, "unknown key '%.*s%s': keys are lower-case (did you mean '%s'?); "
                            "known keys: %s", SHOW(kname, klen), keys[i].name, known_keys(kk));
    const char *names[NKEYS];
    for (size_t i = 0; i < NKEYS; i++)
        names[i] = keys[i].name;
    const char *near = fp_nearest_name(kname, klen, names, NKEYS);
    if (near)
        return fp_error(FABPOOL_ERR_CONFIG, "unknown key '%.*s%s' (did you mean '%s'?); known keys: %s",
                        SHOW(kname, klen), near, known_keys(kk));
    return fp_error(FABPOOL_ERR_CONFIG, "unknown key '%.*s%s'; known keys: %s", SHOW(kname, klen), known_keys(kk));
}

/* Key k's value v: checked (not empty, no glued pair, no whitespace), parsed, range-checked and stored in *t. */
static fabpool_status take_value(fabpool_options *t, const struct key *k, const char *v, size_t vlen, int sep,
                                 size_t at)
{
    const char *ws;
    if (vlen == 0)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%s' has an empty value; accepted: %s", k->name, k->doc);
    if (sep == 0)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' holds '%c': write one key:value per pair, pairs "
                        "separated by ','; accepted: %s", k->name, SHOW(v, vlen), v[at], k->doc);
    if ((ws = find_space(v, vlen)) != NULL)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%s': value '%.*s%s' holds whitespace %s: no spaces or tabs are "
                        "accepted around or in keys and values; accepted: %s", k->name, SHOW(v, vlen), space_name(*ws),
                        k->doc);
    uint64_t x = 0;
    fabpool_status st = k->parse(k, v, vlen, &x, t);
    if (st != FABPOOL_OK)
        return st;
    if (k->field != F_PEERS && k->field != F_STRING) {
        if ((st = check_range(k, v, vlen, x)) != FABPOOL_OK)
            return st;
        store(t, k, x);
    }
    return FABPOOL_OK;
}

/* One key:value pair at p (len bytes, at offset p - conf of the whole string): each way it can be wrong is
 * refused with what to write instead, in the order that explains the most. */
static fabpool_status parse_pair(fabpool_options *t, const char *conf, const char *p, size_t len, int comma_follows,
                                 const char *seen[NKEYS], size_t seen_len[NKEYS])
{
    size_t pos = (size_t)(p - conf);
    char kk[KNOWN_KEYS_MAX];
    if (len == 0)
        return fp_error(FABPOOL_ERR_CONFIG, "%s at offset %zu: write key:value pairs separated by single commas, "
                        "with none before the first pair or after the last",
                        pos == 0 ? "a leading comma" : !comma_follows ? "a trailing comma" : "a doubled comma ',,'",
                        pos == 0 ? pos : pos - 1);
    const char *colon = memchr(p, ':', len);
    if (!colon)
        return refuse_no_colon(p, len);
    const char *kname = p, *v = colon + 1;
    size_t klen = (size_t)(colon - p), vlen = len - klen - 1;
    if (klen == 0)
        return fp_error(FABPOOL_ERR_CONFIG, "an empty key before ':%.*s%s' at offset %zu: write key:value; "
                        "known keys: %s", SHOW(v, vlen), pos, known_keys(kk));
    const char *ws = find_space(kname, klen);
    if (ws)
        return fp_error(FABPOOL_ERR_CONFIG, "key '%.*s%s' holds whitespace %s: no spaces or tabs are accepted around "
                        "or in keys and values (write key:value,key:value)", SHOW(kname, klen), space_name(*ws));
    int sep;
    size_t at, ki = NKEYS;
    fabpool_status st = refuse_glued(kname, klen, v, vlen, &sep, &at);
    if (st != FABPOOL_OK || (st = find_key(kname, klen, &ki)) != FABPOOL_OK)
        return st;
    const struct key *k = &keys[ki];
    if (seen[ki])
        return fp_error(FABPOOL_ERR_CONFIG, "key '%s' is given twice ('%s:%.*s%s', then '%s:%.*s%s'): give each key "
                        "once", k->name, k->name, SHOW(seen[ki], seen_len[ki]), k->name, SHOW(v, vlen));
    seen[ki] = v;
    seen_len[ki] = vlen;
    return take_value(t, k, v, vlen, sep, at);
}

/* ------------------------------------------------------------ the string */

fabpool_status fabpool_options_parse(fabpool_options *o, const char *conf)
{
    if (!o)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_options_parse: the options are NULL");
    if (o->struct_size != FABPOOL_OPTIONS_SIZE_0_3 && o->struct_size != sizeof(fabpool_options))
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_options_parse: the options' struct_size is %u, not "
                        "sizeof(fabpool_options) nor 0.3's: call fabpool_options_init on them first", o->struct_size);
    if (!conf || !*conf)
        return FABPOOL_OK;
    /* 0.3's options are read and written up to their size; a key of a later field is refused */
    size_t size = o->struct_size == FABPOOL_OPTIONS_SIZE_0_3 ? FABPOOL_OPTIONS_SIZE_0_3 : sizeof(fabpool_options);
    fabpool_options t;
    fabpool_options_init(&t);
    memcpy(&t, o, size);
    const char *seen[NKEYS] = {NULL};
    size_t seen_len[NKEYS] = {0};
    const char *p = conf;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        fabpool_status st = parse_pair(&t, conf, p, len, comma != NULL, seen, seen_len);
        if (st != FABPOOL_OK)
            return st;
        if (!comma)
            break;
        p = comma + 1;
    }
    for (size_t i = 0; i < NKEYS; i++)
        if (seen[i] && keys[i].offset >= size)
            return fp_error(FABPOOL_ERR_CONFIG, "key '%s': options of struct_size %u (fabpool 0.3's) hold no field for "
                            "it: build against this fabpool.h, or give it in options.conf or FABPOOL_CONF", keys[i].name,
                            o->struct_size);
    memcpy(o, &t, size);
    return FABPOOL_OK;
}

int fp_conf_key_is_size(const struct key *k) { return k->parse == parse_size; }
int fp_conf_key_is_bool(const struct key *k) { return k->parse == parse_bool; }
