/* conf.c - options: defaults, and the FABPOOL_CONF parser
 * ("key:value,key:value", the syntax of MALLOC_CONF and PYTORCH_ALLOC_CONF).
 * One table of keys serves the parser and the messages. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

#define MiB (1ull << 20)

void fabpool_options_init(fabpool_options *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->device = 0;
    o->reserve_bytes = 0;
    o->handle_type = FABPOOL_HANDLE_AUTO;
    o->max_waste_percent = 25;
    o->max_chunk_bytes = 1ull << 30;
    o->slab_max_bytes = 4 * MiB;
    o->cache_limit_bytes = 1ull << 30;
    o->shrink_hysteresis_percent = 25;
    o->thread_cache = 1;
    o->stats_at_destroy = 0;
    o->metadata = FABPOOL_METADATA_AUTO;
}

typedef enum { K_INT, K_SIZE, K_PERCENT, K_BOOL, K_ENUM, K_PEERS } kind;

typedef struct key {
    const char *name;
    kind k;
    size_t off;               /* offset of the field in fabpool_options */
    unsigned long long lo, hi;
    const char *const *words; /* K_ENUM: accepted words, index = value */
    const char *accepts;      /* for messages */
} key;

static const char *const handle_words[] = {"auto", "none", "posix_fd", "fabric", NULL};
static const char *const stats_words[] = {"none", "text", "json", NULL};
static const char *const meta_words[] = {"auto", "jemalloc", "libc", NULL};

#define OFF(f) offsetof(fabpool_options, f)
static const key keys[] = {
    {"device", K_INT, OFF(device), 0, 1023, NULL, "a device ordinal 0..1023"},
    {"reserve", K_SIZE, OFF(reserve_bytes), 0, 1ull << 56, NULL, "0 (8x the device memory) or a size >= 2MiB, e.g. 4TiB"},
    {"handle_type", K_ENUM, OFF(handle_type), 0, 0, handle_words, "auto, none, posix_fd or fabric"},
    {"max_waste", K_PERCENT, OFF(max_waste_percent), 0, 100, NULL, "a percent 0..100, e.g. 25 or 25%"},
    {"max_chunk", K_SIZE, OFF(max_chunk_bytes), 2 * MiB, 1ull << 48, NULL, "a multiple of 2MiB, at least 2MiB, e.g. 1GiB"},
    {"slab_max", K_SIZE, OFF(slab_max_bytes), 256, 64 * MiB, NULL, "a size from 256 bytes to 64MiB"},
    {"cache_limit", K_SIZE, OFF(cache_limit_bytes), 0, 1ull << 56, NULL, "a size, e.g. 512MiB (0: keep nothing cached)"},
    {"shrink_hysteresis", K_PERCENT, OFF(shrink_hysteresis_percent), 0, 1000, NULL, "a percent 0..1000"},
    {"thread_cache", K_BOOL, OFF(thread_cache), 0, 1, NULL, "true, false, 1 or 0"},
    {"stats_print", K_ENUM, OFF(stats_at_destroy), 0, 0, stats_words, "none, text or json (or 0, 1, 2)"},
    {"metadata", K_ENUM, OFF(metadata), 0, 0, meta_words, "auto, jemalloc or libc"},
    {"peers", K_PEERS, OFF(n_peer_devices), 0, 1023, NULL, "device ordinals separated by ';' or '+', e.g. 1;2;3, or none"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

static void known_keys(char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NKEYS && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", keys[i].name);
}

static fabpool_status bad(const key *k, const char *v, size_t vlen, const char *why)
{
    return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF key '%s': value '%.*s' %s; accepted: %s", k->name, (int)vlen, v,
                    why, k->accepts);
}

/* A whole unsigned decimal number, no sign, no spaces. */
static int parse_u64(const char *s, size_t n, unsigned long long *out)
{
    if (n == 0 || n > 20)
        return -1;
    unsigned long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (~0ull - d) / 10)
            return -2;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_size(const char *s, size_t n, unsigned long long *out)
{
    size_t digits = 0;
    while (digits < n && s[digits] >= '0' && s[digits] <= '9')
        digits++;
    unsigned long long v;
    int r = parse_u64(s, digits, &v);
    if (r)
        return r;
    const char *u = s + digits;
    size_t ul = n - digits;
    static const struct { const char *u; unsigned shift; } units[] = {
        {"", 0},     {"b", 0},   {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20},  {"mb", 20}, {"mib", 20},
        {"g", 30},   {"gb", 30}, {"gib", 30}, {"t", 40}, {"tb", 40},  {"tib", 40}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].u) == ul && strncasecmp(u, units[i].u, ul) == 0) {
            if (units[i].shift && v > (~0ull >> units[i].shift))
                return -2;
            *out = v << units[i].shift;
            return 0;
        }
    }
    return -3;
}

static fabpool_status set_value(fabpool_options *o, const key *k, const char *v, size_t n)
{
    char *field = (char *)o + k->off;
    unsigned long long x = 0;
    int r;
    switch (k->k) {
    case K_INT:
        if ((r = parse_u64(v, n, &x)) != 0)
            return bad(k, v, n, r == -2 ? "is too large" : "is not a whole number");
        if (x < k->lo || x > k->hi)
            return bad(k, v, n, "is out of range");
        *(int *)field = (int)x;
        return FABPOOL_OK;
    case K_SIZE:
        if ((r = parse_size(v, n, &x)) != 0)
            return bad(k, v, n, r == -2 ? "overflows 64 bits" : r == -3 ? "has an unknown unit (B, KiB, MiB, GiB, TiB)"
                                                                        : "is not a size");
        if (x < k->lo || x > k->hi || (strcmp(k->name, "reserve") == 0 && x && x < 2 * MiB))
            return bad(k, v, n, "is out of range");
        if (strcmp(k->name, "max_chunk") == 0 && x % (2 * MiB))
            return bad(k, v, n, "is not a multiple of 2MiB");
        *(uint64_t *)field = x;
        return FABPOOL_OK;
    case K_PERCENT: {
        size_t m = n && v[n - 1] == '%' ? n - 1 : n;
        if ((r = parse_u64(v, m, &x)) != 0)
            return bad(k, v, n, "is not a whole percent");
        if (x > k->hi)
            return bad(k, v, n, "is out of range");
        *(uint32_t *)field = (uint32_t)x;
        return FABPOOL_OK;
    }
    case K_BOOL:
        if ((n == 4 && !strncasecmp(v, "true", 4)) || (n == 1 && v[0] == '1'))
            *(uint32_t *)field = 1;
        else if ((n == 5 && !strncasecmp(v, "false", 5)) || (n == 1 && v[0] == '0'))
            *(uint32_t *)field = 0;
        else
            return bad(k, v, n, "is not a boolean");
        return FABPOOL_OK;
    case K_ENUM:
        for (int i = 0; k->words[i]; i++)
            if (strlen(k->words[i]) == n && strncmp(v, k->words[i], n) == 0) {
                *(int *)field = i;
                return FABPOOL_OK;
            }
        if (k->words == stats_words && n == 1 && v[0] >= '0' && v[0] <= '2') {
            *(int *)field = v[0] - '0';
            return FABPOOL_OK;
        }
        return bad(k, v, n, "is not one of the words accepted");
    case K_PEERS: {
        if (n == 4 && strncmp(v, "none", 4) == 0) {
            o->n_peer_devices = 0;
            return FABPOOL_OK;
        }
        int count = 0, list[FABPOOL_MAX_PEERS];
        size_t i = 0;
        while (i <= n) {
            size_t j = i;
            while (j < n && v[j] != ';' && v[j] != '+')
                j++;
            if (parse_u64(v + i, j - i, &x) != 0 || x > k->hi)
                return bad(k, v, n, "has an entry that is not a device ordinal");
            if (count == FABPOOL_MAX_PEERS)
                return bad(k, v, n, "names more than 16 devices");
            for (int c = 0; c < count; c++)
                if (list[c] == (int)x)
                    return bad(k, v, n, "names a device twice");
            list[count++] = (int)x;
            i = j + 1;
        }
        o->n_peer_devices = count;
        memcpy(o->peer_devices, list, (size_t)count * sizeof list[0]);
        return FABPOOL_OK;
    }
    }
    return FABPOOL_ERR_CONFIG;
}

fabpool_status fabpool_options_parse(fabpool_options *o, const char *conf)
{
    if (!o)
        return fp_error(FABPOOL_ERR_INVALID_ARG, "fabpool_options_parse: the options are NULL");
    if (!conf || !*conf)
        return FABPOOL_OK;
    fabpool_options t = *o;
    int seen[NKEYS] = {0};
    const char *p = conf;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0)
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF '%s': an empty entry at offset %d (%s); write "
                            "key:value pairs separated by single commas",
                            conf, (int)(p - conf), p == conf ? "a leading comma" : !end ? "a trailing comma"
                                                                                          : "a doubled comma");
        const char *colon = memchr(p, ':', len);
        if (!colon)
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF '%s': '%.*s' has no ':'; write key:value (e.g. "
                            "thread_cache:true), pairs separated by ','", conf, (int)len, p);
        size_t klen = (size_t)(colon - p), vlen = len - klen - 1;
        const char *v = colon + 1;
        if (klen == 0)
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF '%s': an empty key before ':%.*s'", conf, (int)vlen, v);
        size_t ki = NKEYS;
        for (size_t i = 0; i < NKEYS; i++)
            if (strlen(keys[i].name) == klen && strncmp(p, keys[i].name, klen) == 0)
                ki = i;
        if (ki == NKEYS) {
            char list[512];
            known_keys(list, sizeof list);
            const char *ws = memchr(p, ' ', klen);
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF '%s': unknown key '%.*s'%s; known keys: %s", conf,
                            (int)klen, p, ws ? " (spaces are not allowed around keys and values)" : "", list);
        }
        const key *k = &keys[ki];
        if (seen[ki])
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF '%s': key '%s' is given twice", conf, k->name);
        seen[ki] = 1;
        if (vlen == 0)
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF key '%s': the value is empty; accepted: %s", k->name,
                            k->accepts);
        /* a wrong separator between pairs shows as a second ':' or a '=' in the value */
        const char *sep = NULL;
        for (size_t i = 0; i < vlen && !sep; i++)
            if (v[i] == ':' || v[i] == '=' || v[i] == ' ')
                sep = v + i;
        if (sep) {
            const char *wrong = sep;
            /* the separator is the last ';', '=' or ' ' before the stray ':' */
            for (const char *q = sep; q > v; q--)
                if (q[-1] == ';' || q[-1] == '=' || q[-1] == ' ' || q[-1] == '&') {
                    wrong = q - 1;
                    break;
                }
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF key '%s': value '%.*s' holds '%c': separate pairs with "
                            "',' (key:value,key:value), with no spaces", k->name, (int)vlen, v, *wrong);
        }
        fabpool_status st = set_value(&t, k, v, vlen);
        if (st != FABPOOL_OK)
            return st;
        if (!end)
            break;
        p = end + 1;
        if (!*p)
            return fp_error(FABPOOL_ERR_CONFIG, "FABPOOL_CONF '%s': a trailing comma; remove it", conf);
    }
    *o = t;
    return FABPOOL_OK;
}
