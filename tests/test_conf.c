/* test_conf: FABPOOL_CONF parsing.  Defaults, every key with good values,
 * and every error case: FABPOOL_ERR_CONFIG, the options left as they were,
 * and a message that names the key and the offending value. */
#include <stdio.h>
#include <string.h>

#include "fabpool.h"

static int failures, checks;
#define CHECK(c)                                                                     \
    do {                                                                             \
        checks++;                                                                    \
        if (!(c)) {                                                                  \
            failures++;                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);    \
        }                                                                            \
    } while (0)

static void good(const char *conf, fabpool_options *o)
{
    fabpool_options_init(o);
    fabpool_status s = fabpool_options_parse(o, conf);
    if (s != FABPOOL_OK)
        fprintf(stderr, "'%s': %s\n", conf, fabpool_last_error());
    CHECK(s == FABPOOL_OK);
}

/* must fail, leave o alone, and say each of the words */
static void bad(const char *conf, const char *w1, const char *w2)
{
    fabpool_options o, before;
    fabpool_options_init(&o);
    o.max_waste_percent = 7; /* something not default, to see it kept */
    before = o;
    fabpool_status s = fabpool_options_parse(&o, conf);
    const char *m = fabpool_last_error();
    CHECK(s == FABPOOL_ERR_CONFIG);
    CHECK(memcmp(&o, &before, sizeof o) == 0);
    if (w1 && !strstr(m, w1))
        fprintf(stderr, "'%s': message lacks '%s': %s\n", conf, w1, m), failures++;
    if (w2 && !strstr(m, w2))
        fprintf(stderr, "'%s': message lacks '%s': %s\n", conf, w2, m), failures++;
    checks += 2;
}

int main(void)
{
    fabpool_options o;
    fabpool_options_init(&o);
    CHECK(o.struct_size == sizeof o && o.device == 0 && o.reserve_bytes == 0 && o.handle_type == FABPOOL_HANDLE_AUTO);
    CHECK(o.max_waste_percent == 25 && o.max_chunk_bytes == (1ull << 30) && o.slab_max_bytes == (4u << 20));
    CHECK(o.cache_limit_bytes == (1ull << 30) && o.shrink_hysteresis_percent == 25 && o.thread_cache == 1);
    CHECK(o.stats_at_destroy == 0 && o.metadata == FABPOOL_METADATA_AUTO && o.n_peer_devices == 0);
    CHECK(fabpool_options_parse(&o, NULL) == FABPOOL_OK && fabpool_options_parse(&o, "") == FABPOOL_OK);

    good("device:3", &o);
    CHECK(o.device == 3);
    good("reserve:4TiB", &o);
    CHECK(o.reserve_bytes == (4ull << 40));
    good("reserve:0", &o);
    CHECK(o.reserve_bytes == 0);
    good("reserve:2048mib", &o);
    CHECK(o.reserve_bytes == (2ull << 30));
    good("handle_type:posix_fd", &o);
    CHECK(o.handle_type == FABPOOL_HANDLE_POSIX_FD);
    good("handle_type:fabric", &o);
    CHECK(o.handle_type == FABPOOL_HANDLE_FABRIC);
    good("handle_type:none", &o);
    CHECK(o.handle_type == FABPOOL_HANDLE_NONE);
    good("max_waste:10%", &o);
    CHECK(o.max_waste_percent == 10);
    good("max_waste:0", &o);
    CHECK(o.max_waste_percent == 0);
    good("max_chunk:512MiB", &o);
    CHECK(o.max_chunk_bytes == (512ull << 20));
    good("slab_max:1M", &o);
    CHECK(o.slab_max_bytes == (1u << 20));
    good("slab_max:256", &o);
    CHECK(o.slab_max_bytes == 256);
    good("cache_limit:0", &o);
    CHECK(o.cache_limit_bytes == 0);
    good("cache_limit:3G", &o);
    CHECK(o.cache_limit_bytes == (3ull << 30));
    good("shrink_hysteresis:100", &o);
    CHECK(o.shrink_hysteresis_percent == 100);
    good("thread_cache:false", &o);
    CHECK(o.thread_cache == 0);
    good("thread_cache:1", &o);
    CHECK(o.thread_cache == 1);
    good("stats_print:json", &o);
    CHECK(o.stats_at_destroy == 2);
    good("stats_print:1", &o);
    CHECK(o.stats_at_destroy == 1);
    good("metadata:libc", &o);
    CHECK(o.metadata == FABPOOL_METADATA_LIBC);
    good("peers:1;2;3", &o);
    CHECK(o.n_peer_devices == 3 && o.peer_devices[0] == 1 && o.peer_devices[2] == 3);
    good("peers:4+5", &o);
    CHECK(o.n_peer_devices == 2 && o.peer_devices[1] == 5);
    good("peers:none", &o);
    CHECK(o.n_peer_devices == 0);
    good("device:1,reserve:1TiB,handle_type:posix_fd,thread_cache:false,peers:0;2", &o);
    CHECK(o.device == 1 && o.reserve_bytes == (1ull << 40) && o.handle_type == FABPOOL_HANDLE_POSIX_FD &&
          o.thread_cache == 0 && o.n_peer_devices == 2);

    bad("expandable_segments:True", "unknown key", "expandable_segments");
    bad("expandable_segments,True", "no ':'", "expandable_segments");
    bad("thread_cache", "no ':'", "thread_cache");
    bad(":5", "empty key", NULL);
    bad("device:", "device", "empty");
    bad("device:x", "device", "'x'");
    bad("device:-1", "device", "'-1'");
    bad("device:5000", "device", "out of range");
    bad("reserve:1MiB", "reserve", "'1MiB'");
    bad("reserve:12XB", "reserve", "unit");
    bad("reserve:99999999999999999999", "reserve", "99999999999999999999");
    bad("reserve:17179869184TiB", "reserve", "overflows");
    bad("max_chunk:3MiB", "max_chunk", "multiple of 2MiB");
    bad("max_chunk:1MiB", "max_chunk", "'1MiB'");
    bad("slab_max:128", "slab_max", "'128'");
    bad("max_waste:101", "max_waste", "'101'");
    bad("max_waste:abc", "max_waste", "'abc'");
    bad("handle_type:ipc", "handle_type", "'ipc'");
    bad("thread_cache:yes", "thread_cache", "'yes'");
    bad("stats_print:5", "stats_print", "'5'");
    bad("metadata:tcmalloc", "metadata", "'tcmalloc'");
    bad("peers:1;x", "peers", "'1;x'");
    bad("peers:1;1", "peers", "twice");
    bad("device:1;reserve:2GiB", "device", "';'");
    bad("device:1 reserve:2GiB", "device", "' '");
    bad("device=1", "no ':'", "device=1");
    bad("device:1,", "trailing comma", NULL);
    bad(",device:1", "leading comma", NULL);
    bad("device:1,,reserve:2GiB", "doubled comma", NULL);
    bad("device:1,device:2", "device", "twice");
    bad(" device:1", "unknown key", "spaces");
    bad("device: 1", "device", "' '");
    bad("peers:1;reserve:2GiB", "peers", "';'");

    printf("test_conf: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
