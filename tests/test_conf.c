/* test_conf.c - fabpool_options_init's defaults and the FABPOOL_CONF parser.
 *
 * Links lib/conf.c and lib/error.c only: no driver, no pool.  Every check
 * that fails prints a line; main returns 1 if any did.  Every bad string is
 * checked for FABPOOL_ERR_CONFIG, for options left byte for byte as they
 * were, and for a message that names the key and the offending text. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fabpool.h"
#include "conf_options.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

static int failures;
static int checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

/* Options that differ from the defaults in many fields, so that "left
 * unchanged" means something. */
static void start(fabpool_options *o)
{
    fabpool_options_init(o);
    o->device = 5;
    o->reserve_bytes = 4 * TiB;
    o->handle_type = FABPOOL_HANDLE_POSIX_FD;
    o->max_waste_percent = 10;
    o->slab_max_bytes = 1 * MiB;
    o->thread_cache = 0;
    o->stats_at_destroy = 2;
    o->metadata = FABPOOL_METADATA_LIBC;
    o->n_peer_devices = 2;
    o->peer_devices[0] = 6;
    o->peer_devices[1] = 7;
}

/* conf must parse; *o gets the result, starting from the defaults. */
static int good_at(int line, const char *conf, fabpool_options *o)
{
    fabpool_options_init(o);
    fabpool_status s = fabpool_options_parse(o, conf);
    checks++;
    if (s != FABPOOL_OK) {
        failures++;
        fprintf(stderr, "%s:%d: parsing '%s' gave %s: %s\n", __FILE__, line, conf, fabpool_status_name(s),
                fabpool_last_error());
        return 0;
    }
    return 1;
}
#define GOOD(conf, o) good_at(__LINE__, (conf), (o))

/* conf must fail with FABPOOL_ERR_CONFIG, leave the options as they were,
 * and say each of the needles (NULL: none). */
static void bad_at(int line, const char *conf, const char *n1, const char *n2, const char *n3)
{
    fabpool_options o, copy;
    start(&o);
    memcpy(&copy, &o, sizeof o);
    fabpool_status s = fabpool_options_parse(&o, conf);
    const char *msg = fabpool_last_error();
    checks++;
    if (s != FABPOOL_ERR_CONFIG) {
        failures++;
        fprintf(stderr, "%s:%d: parsing '%s' gave %s, expected FABPOOL_ERR_CONFIG (message: %s)\n", __FILE__, line,
                conf, fabpool_status_name(s), msg);
    }
    checks++;
    if (memcmp(&o, &copy, sizeof o) != 0) {
        failures++;
        fprintf(stderr, "%s:%d: parsing '%s' failed but changed the options\n", __FILE__, line, conf);
    }
    const char *needles[] = {n1, n2, n3};
    for (int i = 0; i < 3; i++) {
        if (!needles[i])
            continue;
        checks++;
        if (!strstr(msg, needles[i])) {
            failures++;
            fprintf(stderr, "%s:%d: parsing '%s': the message does not say \"%s\": %s\n", __FILE__, line, conf,
                    needles[i], msg);
        }
    }
    checks++;
    if (strlen(msg) == 0 || strlen(msg) > 700) {
        failures++;
        fprintf(stderr, "%s:%d: parsing '%s': message of %zu characters: %s\n", __FILE__, line, conf, strlen(msg),
                msg);
    }
}
#define BAD(conf, n1, n2) bad_at(__LINE__, (conf), (n1), (n2), NULL)
#define BAD3(conf, n1, n2, n3) bad_at(__LINE__, (conf), (n1), (n2), (n3))

static void test_defaults(void)
{
    fabpool_options o;
    memset(&o, 0xa5, sizeof o);
    fabpool_options_init(&o);
    CHECK(o.struct_size == sizeof(fabpool_options));
    CHECK(o.device == 0);
    CHECK(o.reserve_bytes == 0);
    CHECK(o.handle_type == FABPOOL_HANDLE_AUTO);
    CHECK(o.max_waste_percent == 25);
    CHECK(o.max_chunk_bytes == 1 * GiB);
    CHECK(o.slab_max_bytes == 4096);
    CHECK(o.cache_limit_bytes == UINT64_MAX);
    CHECK(o.decay_ms == 10000);
    CHECK(o.large_slack_percent == 4);
    CHECK(o.stream_owner == 1);
    CHECK(o.sleep_keep_host == 0);
    CHECK(o.shrink_hysteresis_percent == 25);
    CHECK(o.thread_cache == 1);
    CHECK(o.stats_at_destroy == 0);
    CHECK(o.metadata == FABPOOL_METADATA_AUTO);
    CHECK(o.n_peer_devices == 0);
    for (int i = 0; i < FABPOOL_MAX_PEERS; i++)
        CHECK(o.peer_devices[i] == 0);
    CHECK(o.conf == NULL);
    CHECK(o.trace_path[0] == '\0');
    CHECK(o.rdma == FABPOOL_RDMA_AUTO);
    CHECK(o.debug == FABPOOL_LOG_NONE);
    CHECK(o.large_chunks == FABPOOL_LARGE_CHUNKS_GRID);
    /* every default is within its key's range */
    CHECK(fp_options_check(&o) == FABPOOL_OK);
    /* a field set directly is held to its key's range too: max_chunk_bytes at most 1 PiB */
    o.max_chunk_bytes = 1024 * TiB;
    CHECK(fp_options_check(&o) == FABPOOL_OK);
    o.max_chunk_bytes = UINT64_MAX - (2 * MiB - 1);
    CHECK(fp_options_check(&o) == FABPOOL_ERR_CONFIG && strstr(fabpool_last_error(), "max_chunk_bytes") &&
          strstr(fabpool_last_error(), "above the maximum") && strstr(fabpool_last_error(), "1PiB"));
    o.max_chunk_bytes = 1 * GiB;

    /* NULL and "" change nothing */
    fabpool_options a, b;
    start(&a);
    memcpy(&b, &a, sizeof a);
    CHECK(fabpool_options_parse(&a, NULL) == FABPOOL_OK);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK(fabpool_options_parse(&a, "") == FABPOOL_OK);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK(fabpool_options_parse(NULL, "device:1") == FABPOOL_ERR_INVALID_ARG);
    /* options never initialized (a size of neither this header's nor 0.3's): refused, nothing written */
    fabpool_options z;
    memset(&z, 0, sizeof z);
    CHECK(fabpool_options_parse(&z, "device:1") == FABPOOL_ERR_INVALID_ARG && z.device == 0 &&
          strstr(fabpool_last_error(), "fabpool_options_init") != NULL);

    /* keys not given keep their values, conf is not touched */
    const char *mine = "not parsed";
    a.conf = mine;
    CHECK(fabpool_options_parse(&a, "device:3") == FABPOOL_OK);
    CHECK(a.device == 3);
    CHECK(a.conf == mine);
    CHECK(a.reserve_bytes == 4 * TiB);
    CHECK(a.n_peer_devices == 2 && a.peer_devices[0] == 6 && a.peer_devices[1] == 7);

    /* options of fabpool 0.3's size: read and written up to it, the bytes beyond never touched; a key of a
     * later field is refused, changing nothing */
    unsigned char old_[sizeof(fabpool_options)];
    fabpool_options *op = (fabpool_options *)(void *)old_;
    memset(old_, 0x5a, sizeof old_);
    start(op);
    memset(old_ + FABPOOL_OPTIONS_SIZE_0_3, 0x5a, sizeof old_ - FABPOOL_OPTIONS_SIZE_0_3);
    op->struct_size = FABPOOL_OPTIONS_SIZE_0_3;
    CHECK(fabpool_options_parse(op, "device:4,decay_ms:7") == FABPOOL_OK);
    CHECK(op->device == 4 && op->decay_ms == 7 && op->struct_size == FABPOOL_OPTIONS_SIZE_0_3);
    int beyond_kept = 1;
    for (size_t i = FABPOOL_OPTIONS_SIZE_0_3; i < sizeof old_; i++)
        beyond_kept &= old_[i] == 0x5a;
    CHECK(beyond_kept);
    unsigned char copy_[sizeof(fabpool_options)];
    memcpy(copy_, old_, sizeof old_);
    CHECK(fabpool_options_parse(op, "device:6,large_chunks:whole") == FABPOOL_ERR_CONFIG);
    CHECK(strstr(fabpool_last_error(), "'large_chunks'") && strstr(fabpool_last_error(), "struct_size"));
    CHECK(memcmp(copy_, old_, sizeof old_) == 0);
}

static void test_sizes(void)
{
    static const struct {
        const char *conf;
        uint64_t bytes;
    } cases[] = {
        {"cache_limit:0", 0},
        {"cache_limit:1", 1},
        {"cache_limit:1000", 1000},
        {"cache_limit:007", 7},
        {"cache_limit:12B", 12},
        {"cache_limit:12b", 12},
        {"cache_limit:3K", 3 * KiB},
        {"cache_limit:3k", 3 * KiB},
        {"cache_limit:3KB", 3 * KiB},
        {"cache_limit:3kb", 3 * KiB},
        {"cache_limit:3KiB", 3 * KiB},
        {"cache_limit:3kib", 3 * KiB},
        {"cache_limit:3KIB", 3 * KiB},
        {"cache_limit:5M", 5 * MiB},
        {"cache_limit:5MB", 5 * MiB},
        {"cache_limit:5MiB", 5 * MiB},
        {"cache_limit:5mib", 5 * MiB},
        {"cache_limit:7G", 7 * GiB},
        {"cache_limit:7GB", 7 * GiB},
        {"cache_limit:7GiB", 7 * GiB},
        {"cache_limit:7gB", 7 * GiB},
        {"cache_limit:2T", 2 * TiB},
        {"cache_limit:2TB", 2 * TiB},
        {"cache_limit:2TiB", 2 * TiB},
        {"cache_limit:18446744073709551615", UINT64_MAX},
        {"cache_limit:16777215TiB", 16777215ull * TiB},
        {"cache_limit:17179869183GiB", 17179869183ull * GiB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fabpool_options o;
        if (GOOD(cases[i].conf, &o) && o.cache_limit_bytes != cases[i].bytes) {
            failures++;
            fprintf(stderr, "%s:%d: '%s' gave %llu bytes, expected %llu\n", __FILE__, __LINE__, cases[i].conf,
                    (unsigned long long)o.cache_limit_bytes, (unsigned long long)cases[i].bytes);
        }
        checks++;
    }
}

static void test_good_values(void)
{
    fabpool_options o;

    if (GOOD("device:0", &o))
        CHECK(o.device == 0);
    if (GOOD("device:7", &o))
        CHECK(o.device == 7);
    if (GOOD("device:1023", &o))
        CHECK(o.device == 1023);

    if (GOOD("reserve:0", &o))
        CHECK(o.reserve_bytes == 0);
    if (GOOD("reserve:2MiB", &o))
        CHECK(o.reserve_bytes == 2 * MiB);
    if (GOOD("reserve:2097152", &o))
        CHECK(o.reserve_bytes == 2 * MiB);
    if (GOOD("reserve:4TiB", &o))
        CHECK(o.reserve_bytes == 4 * TiB);
    if (GOOD("reserve:1PiB", &o))
        CHECK(o.reserve_bytes == 1024 * TiB);
    if (GOOD("reserve:1pib", &o))
        CHECK(o.reserve_bytes == 1024 * TiB);
    if (GOOD("reserve:1024TiB", &o))
        CHECK(o.reserve_bytes == 1024 * TiB);

    if (GOOD("handle_type:auto", &o))
        CHECK(o.handle_type == FABPOOL_HANDLE_AUTO);
    if (GOOD("handle_type:none", &o))
        CHECK(o.handle_type == FABPOOL_HANDLE_NONE);
    if (GOOD("handle_type:posix_fd", &o))
        CHECK(o.handle_type == FABPOOL_HANDLE_POSIX_FD);
    if (GOOD("handle_type:fabric", &o))
        CHECK(o.handle_type == FABPOOL_HANDLE_FABRIC);
    if (GOOD("handle_type:FABRIC", &o))
        CHECK(o.handle_type == FABPOOL_HANDLE_FABRIC);

    if (GOOD("max_waste:0", &o))
        CHECK(o.max_waste_percent == 0);
    if (GOOD("max_waste:25", &o))
        CHECK(o.max_waste_percent == 25);
    if (GOOD("max_waste:25%", &o))
        CHECK(o.max_waste_percent == 25);
    if (GOOD("max_waste:100%", &o))
        CHECK(o.max_waste_percent == 100);

    if (GOOD("max_chunk:2MiB", &o))
        CHECK(o.max_chunk_bytes == 2 * MiB);
    if (GOOD("max_chunk:512MiB", &o))
        CHECK(o.max_chunk_bytes == 512 * MiB);
    if (GOOD("max_chunk:4G", &o))
        CHECK(o.max_chunk_bytes == 4 * GiB);
    if (GOOD("max_chunk:6291456", &o))
        CHECK(o.max_chunk_bytes == 6 * MiB);
    if (GOOD("max_chunk:1PiB", &o))
        CHECK(o.max_chunk_bytes == 1024 * TiB);

    if (GOOD("slab_max:256", &o))
        CHECK(o.slab_max_bytes == 256);
    if (GOOD("slab_max:256B", &o))
        CHECK(o.slab_max_bytes == 256);
    if (GOOD("slab_max:1000", &o))
        CHECK(o.slab_max_bytes == 1000);
    if (GOOD("slab_max:64MiB", &o))
        CHECK(o.slab_max_bytes == 64 * MiB);

    if (GOOD("cache_limit:512MiB", &o))
        CHECK(o.cache_limit_bytes == 512 * MiB);
    if (GOOD("large_slack:0", &o))
        CHECK(o.large_slack_percent == 0);
    if (GOOD("large_slack:12%", &o))
        CHECK(o.large_slack_percent == 12);
    BAD("large_slack:1001", "'large_slack'", "'1001'");
    if (GOOD("stream_owner:false", &o))
        CHECK(o.stream_owner == 0);
    if (GOOD("stream_owner:1", &o))
        CHECK(o.stream_owner == 1);
    BAD("stream_owner:maybe", "'stream_owner'", "'maybe'");
    if (GOOD("large_chunks:whole", &o))
        CHECK(o.large_chunks == FABPOOL_LARGE_CHUNKS_WHOLE);
    if (GOOD("large_chunks:WHOLE", &o))
        CHECK(o.large_chunks == FABPOOL_LARGE_CHUNKS_WHOLE);
    if (GOOD("large_chunks:grid", &o))
        CHECK(o.large_chunks == FABPOOL_LARGE_CHUNKS_GRID);
    BAD3("large_chunks:1", "'large_chunks'", "'1'", "grid or whole");
    BAD3("large_chunks:wholes", "'large_chunks'", "not a known word", "grid or whole");
    BAD("large_chunk:whole", "unknown key 'large_chunk'", "did you mean 'large_chunks'");
    if (GOOD("sleep_keep_host:true", &o))
        CHECK(o.sleep_keep_host == 1);
    BAD("sleep_keep_host:2", "'sleep_keep_host'", "'2'");
    if (GOOD("decay_ms:0", &o))
        CHECK(o.decay_ms == 0);
    if (GOOD("decay_ms:4294967295", &o))
        CHECK(o.decay_ms == UINT32_MAX);
    BAD("decay_ms:4294967296", "'decay_ms'", "'4294967296'");
    BAD("decay_ms:1s", "'decay_ms'", "'1s'");
    BAD("decay_ms:-1", "'decay_ms'", "'-1'");

    if (GOOD("shrink_hysteresis:0", &o))
        CHECK(o.shrink_hysteresis_percent == 0);
    if (GOOD("shrink_hysteresis:50%", &o))
        CHECK(o.shrink_hysteresis_percent == 50);
    if (GOOD("shrink_hysteresis:1000", &o))
        CHECK(o.shrink_hysteresis_percent == 1000);

    if (GOOD("thread_cache:false", &o))
        CHECK(o.thread_cache == 0);
    if (GOOD("thread_cache:0", &o))
        CHECK(o.thread_cache == 0);
    if (GOOD("thread_cache:False", &o))
        CHECK(o.thread_cache == 0);
    o.thread_cache = 0;
    CHECK(fabpool_options_parse(&o, "thread_cache:true") == FABPOOL_OK && o.thread_cache == 1);
    o.thread_cache = 0;
    CHECK(fabpool_options_parse(&o, "thread_cache:1") == FABPOOL_OK && o.thread_cache == 1);
    o.thread_cache = 0;
    CHECK(fabpool_options_parse(&o, "thread_cache:TRUE") == FABPOOL_OK && o.thread_cache == 1);

    if (GOOD("stats_print:none", &o))
        CHECK(o.stats_at_destroy == 0);
    if (GOOD("stats_print:text", &o))
        CHECK(o.stats_at_destroy == 1);
    if (GOOD("stats_print:json", &o))
        CHECK(o.stats_at_destroy == 2);
    if (GOOD("stats_print:0", &o))
        CHECK(o.stats_at_destroy == 0);
    if (GOOD("stats_print:1", &o))
        CHECK(o.stats_at_destroy == 1);
    if (GOOD("stats_print:2", &o))
        CHECK(o.stats_at_destroy == 2);

    if (GOOD("metadata:auto", &o))
        CHECK(o.metadata == FABPOOL_METADATA_AUTO);
    if (GOOD("metadata:jemalloc", &o))
        CHECK(o.metadata == FABPOOL_METADATA_JEMALLOC);
    if (GOOD("metadata:libc", &o))
        CHECK(o.metadata == FABPOOL_METADATA_LIBC);

    if (GOOD("peers:1", &o))
        CHECK(o.n_peer_devices == 1 && o.peer_devices[0] == 1);
    if (GOOD("peers:1;2;3", &o))
        CHECK(o.n_peer_devices == 3 && o.peer_devices[0] == 1 && o.peer_devices[1] == 2 && o.peer_devices[2] == 3);
    if (GOOD("peers:3+1+2", &o))
        CHECK(o.n_peer_devices == 3 && o.peer_devices[0] == 3 && o.peer_devices[1] == 1 && o.peer_devices[2] == 2);
    if (GOOD("peers:4;5+6", &o))
        CHECK(o.n_peer_devices == 3 && o.peer_devices[2] == 6);
    if (GOOD("peers:0;1;2;3;4;5;6;7;8;9;10;11;12;13;14;1023", &o)) {
        CHECK(o.n_peer_devices == FABPOOL_MAX_PEERS);
        CHECK(o.peer_devices[15] == 1023);
    }
    if (GOOD("peers:none", &o))
        CHECK(o.n_peer_devices == 0);

    /* peers replaces the list; none clears it */
    start(&o);
    CHECK(fabpool_options_parse(&o, "peers:9") == FABPOOL_OK);
    CHECK(o.n_peer_devices == 1 && o.peer_devices[0] == 9 && o.peer_devices[1] == 0);
    start(&o);
    CHECK(fabpool_options_parse(&o, "peers:none") == FABPOOL_OK);
    CHECK(o.n_peer_devices == 0 && o.peer_devices[0] == 0);

    /* every key at once */
    if (GOOD("device:2,reserve:2TiB,handle_type:none,max_waste:10%,max_chunk:256MiB,slab_max:1MiB,cache_limit:0,"
             "shrink_hysteresis:100,thread_cache:false,stats_print:json,metadata:libc,peers:0;1",
             &o)) {
        CHECK(o.device == 2);
        CHECK(o.reserve_bytes == 2 * TiB);
        CHECK(o.handle_type == FABPOOL_HANDLE_NONE);
        CHECK(o.max_waste_percent == 10);
        CHECK(o.max_chunk_bytes == 256 * MiB);
        CHECK(o.slab_max_bytes == 1 * MiB);
        CHECK(o.cache_limit_bytes == 0);
        CHECK(o.shrink_hysteresis_percent == 100);
        CHECK(o.thread_cache == 0);
        CHECK(o.stats_at_destroy == 2);
        CHECK(o.metadata == FABPOOL_METADATA_LIBC);
        CHECK(o.n_peer_devices == 2 && o.peer_devices[0] == 0 && o.peer_devices[1] == 1);
        CHECK(o.struct_size == sizeof(fabpool_options));
    }

    /* two strings applied one after the other: the second wins */
    fabpool_options_init(&o);
    CHECK(fabpool_options_parse(&o, "device:1,max_waste:5") == FABPOOL_OK);
    CHECK(fabpool_options_parse(&o, "device:2") == FABPOOL_OK);
    CHECK(o.device == 2 && o.max_waste_percent == 5);
}

static void test_syntax_errors(void)
{
    /* missing ':' */
    BAD("expandable_segments,True", "expandable_segments", "':'");
    BAD3("thread_cache", "thread_cache", "':'", "true, false");
    BAD("device:1,thread_cache", "thread_cache", "':'");
    BAD("garbage", "garbage", "known keys");
    BAD("device=1", "device=1", "device:1");
    /* empty key */
    BAD(":1", "empty key", ":1");
    BAD("device:1,:2MiB", "empty key", ":2MiB");
    /* empty value */
    BAD3("device:", "device", "empty value", "0..1023");
    BAD("device:1,reserve:", "reserve", "empty value");
    /* unknown key, with the list of known keys */
    BAD3("expandable_segments:True", "unknown key 'expandable_segments'", "known keys", "device, reserve");
    BAD3("foo:1", "'foo'", "shrink_hysteresis", "peers");
    BAD("Device:1", "'Device'", "'device'");
    BAD("device:1,colour:blue", "'colour'", "known keys");
    /* a key misspelt: the nearest key named (a letter missing, extra, changed, two swapped), none for a far one */
    BAD3("reserv:1GiB", "unknown key 'reserv'", "(did you mean 'reserve'?)", "known keys");
    BAD3("max_wast:10", "'max_wast'", "did you mean 'max_waste'?", "known keys");
    BAD3("thraed_cache:false", "'thraed_cache'", "did you mean 'thread_cache'?", "known keys");
    BAD3("decay_mss:5", "'decay_mss'", "did you mean 'decay_ms'?", "known keys");
    BAD3("devise:1", "'devise'", "did you mean 'device'?", "known keys");
    fabpool_options far;
    fabpool_options_init(&far);
    CHECK(fabpool_options_parse(&far, "expandable_segments:True") == FABPOOL_ERR_CONFIG &&
          strstr(fabpool_last_error(), "did you mean") == NULL);
    CHECK(fabpool_options_parse(&far, "foo:1") == FABPOOL_ERR_CONFIG && strstr(fabpool_last_error(), "did you") == NULL);
    /* whitespace */
    BAD(" device:1", "' device'", "whitespace");
    BAD("device :1", "'device '", "whitespace");
    BAD("device: 1", "' 1'", "whitespace");
    BAD("device:1 ", "'1 '", "whitespace");
    BAD("device:1\t", "device", "whitespace");
    BAD("device:1, reserve:2GiB", "' reserve'", "whitespace");
    BAD("device:1 ,reserve:2GiB", "'1 '", "whitespace");
    BAD("device:1 reserve:2GiB", "'1 reserve:2GiB'", "whitespace");
    BAD("max_waste:25 %", "'25 %'", "whitespace");
    /* wrong separators between pairs */
    BAD3("a:1;b:2", "'1;b:2'", "';'", "','");
    BAD3("device:1;reserve:2GiB", "'device'", "'1;reserve:2GiB'", "';' is not a separator");
    BAD3("peers:1;reserve:2GiB", "'peers'", "'1;reserve:2GiB'", "';' is not a separator");
    BAD3("peers:1;2;3;device:4", "'peers'", "'1;2;3;device:4'", "';'");
    BAD("max_chunk:4MiB&device:2", "'4MiB&device:2'", "'&'");
    BAD("device:1;max_waste=5", "'1;max_waste=5'", "';'");
    BAD3("a=1;b=2", "a=1;b=2", "key:value", "';'");
    BAD("device:1=reserve:4GiB", "'1=reserve:4GiB'", "'='");
    BAD("reserve:2GiB:4GiB", "'2GiB:4GiB'", "':'");
    BAD("thread_cache;device:1", "'thread_cache;device'", "';'");
    BAD("device:1;2", "'1;2'", "','");
    /* commas */
    BAD("device:1,", "trailing comma", "offset 8");
    BAD(",device:1", "leading comma", "offset 0");
    BAD(",", "leading comma", NULL);
    BAD("device:1,,reserve:2GiB", "doubled comma", "offset 8");
    BAD("device:1,,", "doubled comma", NULL);
    /* a key given twice */
    BAD3("device:1,device:2", "'device'", "twice", "'device:2'");
    BAD3("peers:1,reserve:0,peers:none", "'peers'", "twice", "'peers:none'");
    BAD("thread_cache:1,thread_cache:1", "'thread_cache'", "twice");
}

static void test_value_errors(void)
{
    /* device */
    BAD3("device:1024", "'device'", "'1024'", "0..1023");
    BAD("device:-1", "'-1'", "sign");
    BAD("device:+1", "'+1'", "sign");
    BAD("device:abc", "'device'", "'abc'");
    BAD("device:1x", "'device'", "'1x'");
    BAD("device:0x1", "'device'", "'0x1'");
    BAD("device:99999999999999999999", "'device'", "'99999999999999999999'");
    BAD("device:1.0", "'device'", "'1.0'");
    /* sizes */
    BAD("reserve:1MiB", "'reserve'", "'1MiB'");
    BAD("reserve:1", "'reserve'", "'1'");
    BAD3("reserve:2097151", "'reserve'", "'2097151'", "2MiB");
    /* 1PiB is the documented maximum, and PiB a unit */
    BAD3("reserve:2PiB", "'reserve'", "'2PiB'", "maximum");
    BAD("reserve:4096TiB", "'reserve'", "'4096TiB'");
    BAD3("reserve:1.5GiB", "'reserve'", "'1.5GiB'", "fraction");
    BAD3("reserve:4XB", "'reserve'", "'4XB'", "unit");
    BAD("reserve:4 GiB", "'reserve'", "'4 GiB'");
    BAD("reserve:GiB", "'reserve'", "'GiB'");
    BAD("reserve:4GiBs", "'reserve'", "'4GiBs'");
    BAD("reserve:4GiB2", "'reserve'", "'4GiB2'");
    BAD("reserve:-4GiB", "'reserve'", "'-4GiB'");
    BAD3("cache_limit:18446744073709551616", "'cache_limit'", "'18446744073709551616'", "64 bits");
    BAD3("cache_limit:16777216TiB", "'cache_limit'", "'16777216TiB'", "64 bits");
    BAD3("cache_limit:17179869184GiB", "'cache_limit'", "'17179869184GiB'", "64 bits");
    BAD("cache_limit:99999999999999999999999", "'cache_limit'", "64 bits");
    BAD3("max_chunk:3MiB", "'max_chunk'", "'3MiB'", "multiple of 2MiB");
    BAD3("max_chunk:1MiB", "'max_chunk'", "'1MiB'", "2MiB");
    BAD("max_chunk:0", "'max_chunk'", "'0'");
    BAD("max_chunk:2097153", "'max_chunk'", "'2097153'");
    /* at most 1PiB, as reserve: a chunk no reservation holds is no setting ("no limit" near 2^64 included) */
    BAD3("max_chunk:1026TiB", "'max_chunk'", "maximum", "1PiB");
    BAD3("max_chunk:18446744073707454464", "'max_chunk'", "maximum", "1PiB");
    BAD3("slab_max:255", "'slab_max'", "'255'", "256B");
    BAD3("slab_max:65MiB", "'slab_max'", "'65MiB'", "64MiB");
    BAD("slab_max:0", "'slab_max'", "'0'");
    /* percents */
    BAD3("max_waste:101", "'max_waste'", "'101'", "0..100");
    BAD("max_waste:101%", "'max_waste'", "'101%'");
    BAD("max_waste:25%%", "'max_waste'", "'25%%'");
    BAD("max_waste:%", "'max_waste'", "'%'");
    BAD("max_waste:%25", "'max_waste'", "'%25'");
    BAD("max_waste:12.5", "'max_waste'", "'12.5'");
    BAD("max_waste:-1", "'max_waste'", "'-1'");
    BAD("max_waste:0.25", "'max_waste'", "'0.25'");
    BAD3("shrink_hysteresis:1001", "'shrink_hysteresis'", "'1001'", "0..1000");
    BAD("shrink_hysteresis:lots", "'shrink_hysteresis'", "'lots'");
    BAD("shrink_hysteresis:4294967321", "'shrink_hysteresis'", "'4294967321'");
    /* booleans */
    BAD3("thread_cache:yes", "'thread_cache'", "'yes'", "true, false, 1 or 0");
    BAD("thread_cache:2", "'thread_cache'", "'2'");
    BAD("thread_cache:truee", "'thread_cache'", "'truee'");
    BAD("thread_cache:on", "'thread_cache'", "'on'");
    /* words */
    BAD3("handle_type:cuda", "'handle_type'", "'cuda'", "auto, none, posix_fd or fabric");
    BAD("handle_type:posix", "'handle_type'", "'posix'");
    BAD("handle_type:2", "'handle_type'", "'2'");
    BAD3("stats_print:xml", "'stats_print'", "'xml'", "none, text or json");
    BAD("stats_print:3", "'stats_print'", "'3'");
    BAD("stats_print:-1", "'stats_print'", "'-1'");
    BAD3("metadata:tcmalloc", "'metadata'", "'tcmalloc'", "auto, jemalloc or libc");
    BAD("metadata:jemallocx", "'metadata'", "'jemallocx'");
    /* peers */
    BAD3("peers:1;;2", "'peers'", "'1;;2'", "empty entry");
    BAD("peers:;1", "'peers'", "';1'");
    BAD("peers:1;", "'peers'", "'1;'");
    BAD("peers:1+", "'peers'", "'1+'");
    BAD3("peers:1;x", "'peers'", "'1;x'", "'x'");
    BAD3("peers:1;1024", "'peers'", "'1;1024'", "'1024'");
    BAD("peers:-1", "'peers'", "'-1'");
    BAD("peers:1.5", "'peers'", "'1.5'");
    BAD3("peers:2;2", "'peers'", "'2;2'", "twice");
    BAD3("peers:0;1;2;3;4;5;6;7;8;9;10;11;12;13;14;15;16", "'peers'", "0;1;2;3;4;5;6;7;8;9;10;11;12;13;14;15;16",
         "more than 16");
    BAD("peers:1,2", "'2'", "':'");
    BAD("peers:1 2", "'peers'", "whitespace");
    BAD("peers:all", "'peers'", "'all'");

    /* a failure after good pairs changes nothing (bad_at compares the bytes) */
    BAD("device:3,reserve:8TiB,peers:1;2,max_chunk:3MiB", "'max_chunk'", "'3MiB'");
    BAD("device:3,thread_cache:1,device:4", "'device'", "twice");
    BAD("peers:none,max_waste:200", "'max_waste'", "'200'");

    /* a very long value is cut short in the message */
    char longconf[2048];
    size_t n = (size_t)snprintf(longconf, sizeof longconf, "device:");
    memset(longconf + n, '9', sizeof longconf - n - 1);
    longconf[sizeof longconf - 1] = '\0';
    BAD(longconf, "'device'", "...");
    n = (size_t)snprintf(longconf, sizeof longconf, "x");
    memset(longconf + n, 'x', sizeof longconf - n - 3);
    memcpy(longconf + sizeof longconf - 3, ":1", 3);
    BAD(longconf, "unknown key", "known keys");
}

int main(void)
{
    test_defaults();
    test_sizes();
    test_good_values();
    test_syntax_errors();
    test_value_errors();
    if (failures) {
        fprintf(stderr, "test_conf: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("test_conf: all %d checks passed\n", checks);
    return 0;
}
