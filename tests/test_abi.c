/* test_abi.c - what a program built against one fabpool.h can count on from
 * the library it loads: the version (fabpool_version(), the header's macros
 * and the project's CMake version agree), and the size every struct the
 * library fills begins with: the right size is filled, any other is refused
 * with FABPOOL_ERR_INVALID_ARG, a message naming the struct, and the struct
 * left byte for byte as it was; and fabpool_build_info(), which names the
 * build: its version, commit, build type and driver.
 * Usage: test_abi <the project's version> <build type> <test driver> <source tree> (from CMake) */
#include <stddef.h>
#include <unistd.h>

#include "testutil.h"

#define MB (1ull << 20)

/* fill(out) for a struct of `size` bytes whose first member is struct_size: refused at every wrong size
 * (nothing written), filled at the right one; `older`: an older header's size the library also takes (0: none),
 * checked apart. */
#define CHECK_SIZED_OLDER(type, older, call)                                                                 \
    do {                                                                                                     \
        static type v_;                                                                                      \
        static unsigned char before_[sizeof(type)];                                                          \
        const size_t wrong_[] = {0, sizeof(type) - 8, sizeof(type) + 8, sizeof(type) * 2};                   \
        for (size_t k_ = 0; k_ < sizeof wrong_ / sizeof wrong_[0]; k_++) {                                   \
            if (wrong_[k_] == (older))                                                                       \
                continue;                                                                                    \
            memset(&v_, 0xa5, sizeof v_);                                                                    \
            v_.struct_size = wrong_[k_];                                                                     \
            memcpy(before_, &v_, sizeof v_);                                                                 \
            fabpool_status s_ = (call);                                                                      \
            CHECK(s_ == FABPOOL_ERR_INVALID_ARG);                                                            \
            CHECK(memcmp(before_, &v_, sizeof v_) == 0);                                                     \
            CHECK(strstr(fabpool_last_error(), #type) != NULL && strstr(fabpool_last_error(), "struct_size")); \
            if (s_ != FABPOOL_ERR_INVALID_ARG)                                                               \
                fprintf(stderr, "%s with struct_size %zu: %s\n", #call, wrong_[k_], fabpool_status_name(s_)); \
        }                                                                                                    \
        memset(&v_, 0xa5, sizeof v_);                                                                        \
        v_.struct_size = sizeof v_;                                                                          \
        CHECK_OK(call);                                                                                      \
        CHECK(v_.struct_size == sizeof(type));                                                               \
    } while (0)
#define CHECK_SIZED(type, call) CHECK_SIZED_OLDER(type, 0, call)

static void version(const char *project)
{
    char macros[64];
    snprintf(macros, sizeof macros, "%d.%d.%d", FABPOOL_VERSION_MAJOR, FABPOOL_VERSION_MINOR, FABPOOL_VERSION_PATCH);
    CHECK(strcmp(fabpool_version(), FABPOOL_VERSION_STRING) == 0);
    CHECK(strcmp(fabpool_version(), macros) == 0);
    CHECK(strcmp(fabpool_version(), project) == 0);
    CHECK(FABPOOL_VERSION == FABPOOL_VERSION_MAJOR * 10000 + FABPOOL_VERSION_MINOR * 100 + FABPOOL_VERSION_PATCH);
    printf("test_abi: fabpool %s (header %s, project %s)\n", fabpool_version(), FABPOOL_VERSION_STRING, project);
}

static void sized_structs(void)
{
    fabpool_t *a = t_pool(NULL), *v = t_pool(NULL);
    if (!a || !v)
        return;
    CHECK_SIZED(fabpool_stats, fabpool_get_stats(a, &v_));
    CHECK_SIZED(fabpool_counters, fabpool_get_counters(a, &v_));
    CHECK_SIZED(fabpool_sleep_info, fabpool_sleep_state(a, &v_));
    CHECK_SIZED_OLDER(fabpool_options, FABPOOL_OPTIONS_SIZE_0_3, fabpool_get_options(a, &v_));

    fabpool_buffer_t *b = NULL;
    CHECK_OK(fabpool_buffer_create(a, 64 * MB, 8 * MB, &b));
    if (!b)
        return;
    CHECK_SIZED(fabpool_buffer_info, fabpool_buffer_get_info(b, &v_));
    fabpool_handle_type t = fabpool_handle_type_of(a);
    if (t == FABPOOL_HANDLE_POSIX_FD || t == FABPOOL_HANDLE_FABRIC) {
        static uint8_t desc[16384];
        int fds[64];
        size_t len = 0, nfds = 0;
        CHECK_OK(fabpool_buffer_export(b, 0, desc, sizeof desc, &len, fds, 64, &nfds));
        int mine[64];
        for (size_t i = 0; i < nfds; i++)
            mine[i] = dup(fds[i]);
        fabpool_view_t *view = NULL;
        CHECK_OK(fabpool_view_open(v, desc, len, mine, nfds, &view));
        if (view) {
            CHECK_SIZED(fabpool_buffer_info, fabpool_view_get_info(view, &v_));
            CHECK_OK(fabpool_view_close(view));
        }
        CHECK_OK(fabpool_buffer_peers_ack(b, UINT64_MAX));
    } else {
        printf("test_abi: handle type %d cannot export: fabpool_view_get_info not checked\n", (int)t);
    }
    CHECK_OK(fabpool_buffer_destroy(b, NULL));
    CHECK_OK(fabpool_destroy(a));
    CHECK_OK(fabpool_destroy(v));
}

/* A program built against fabpool 0.3's fabpool.h, whose options end before large_chunks: fabpool_create takes
 * them (the later fields at their defaults, its conf string read in full), fabpool_get_options fills them up to
 * their size and not a byte beyond; sizes that are neither 0.3's nor this header's are refused by both. */
static void options_of_an_older_header(void)
{
    CHECK(FABPOOL_OPTIONS_SIZE_0_3 == offsetof(fabpool_options, large_chunks));
    CHECK(FABPOOL_OPTIONS_SIZE_0_3 < sizeof(fabpool_options));
    static unsigned char mem[sizeof(fabpool_options) + 64];
    fabpool_options *o = (fabpool_options *)(void *)mem;
    memset(mem, 0xa5, sizeof mem); /* what lies beyond an older struct: not the caller's to give */
    fabpool_options_init(o);
    memset(mem + FABPOOL_OPTIONS_SIZE_0_3, 0xa5, sizeof mem - FABPOOL_OPTIONS_SIZE_0_3);
    o->struct_size = FABPOOL_OPTIONS_SIZE_0_3;
    o->decay_ms = 1234;
    o->keep_ms = 77;
    fabpool_t *p = NULL;
    CHECK_OK(fabpool_create(o, &p));
    fabpool_options got;
    fabpool_options_init(&got);
    if (p) {
        CHECK_OK(fabpool_get_options(p, &got));
        CHECK(got.decay_ms == 1234 && got.keep_ms == 77);
        CHECK(got.large_chunks == FABPOOL_LARGE_CHUNKS_GRID); /* 0xa5a5a5a5 beyond the struct was not read */
        /* filled up to 0.3's size, struct_size kept, the bytes beyond left as they were */
        static unsigned char out[sizeof(fabpool_options) + 64];
        memset(out, 0x3c, sizeof out);
        fabpool_options *g = (fabpool_options *)(void *)out;
        g->struct_size = FABPOOL_OPTIONS_SIZE_0_3;
        CHECK_OK(fabpool_get_options(p, g));
        CHECK(g->struct_size == FABPOOL_OPTIONS_SIZE_0_3 && g->decay_ms == 1234 && g->keep_ms == 77);
        CHECK(memcmp(out + sizeof g->struct_size, (const char *)&got + sizeof got.struct_size,
                     FABPOOL_OPTIONS_SIZE_0_3 - sizeof got.struct_size) == 0);
        int beyond = 1;
        for (size_t i = FABPOOL_OPTIONS_SIZE_0_3; i < sizeof out; i++)
            beyond &= out[i] == 0x3c;
        CHECK(beyond);
        CHECK_OK(fabpool_destroy(p));
        p = NULL;
    }
    /* the older struct's conf string is read whole: a key of a later field lands in the pool's options */
    o->conf = "large_chunks:whole";
    CHECK_OK(fabpool_create(o, &p));
    if (p) {
        CHECK_OK(fabpool_get_options(p, &got));
        CHECK(got.large_chunks == FABPOOL_LARGE_CHUNKS_WHOLE && got.decay_ms == 1234);
        CHECK_OK(fabpool_destroy(p));
        p = NULL;
    }
    o->conf = NULL;
    /* neither size: refused by both calls, nothing made, nothing written */
    const uint32_t wrong[] = {FABPOOL_OPTIONS_SIZE_0_3 - 4, FABPOOL_OPTIONS_SIZE_0_3 - 8, FABPOOL_OPTIONS_SIZE_0_3 + 4,
                              (uint32_t)sizeof(fabpool_options) + 8, (uint32_t)sizeof(fabpool_options) - 4};
    fabpool_t *q = t_pool(NULL);
    for (size_t k = 0; k < sizeof wrong / sizeof wrong[0]; k++) {
        o->struct_size = wrong[k];
        p = NULL;
        CHECK_STATUS(fabpool_create(o, &p), FABPOOL_ERR_INVALID_ARG);
        CHECK(p == NULL && strstr(fabpool_last_error(), "struct_size") != NULL);
        if (p)
            fabpool_destroy(p);
        if (!q)
            continue;
        static unsigned char out[sizeof(fabpool_options) + 64], before[sizeof out];
        memset(out, 0x3c, sizeof out);
        ((fabpool_options *)(void *)out)->struct_size = wrong[k];
        memcpy(before, out, sizeof out);
        CHECK_STATUS(fabpool_get_options(q, (fabpool_options *)(void *)out), FABPOOL_ERR_INVALID_ARG);
        CHECK(memcmp(before, out, sizeof out) == 0);
        CHECK(strstr(fabpool_last_error(), "fabpool_options") != NULL);
    }
    if (q)
        CHECK_OK(fabpool_destroy(q));
}

/* "fabpool <version> commit <commit> build <type> driver <driver>", the commit being one of the source tree's
 * git commits (12 hex digits, maybe "-dirty": the tree's HEAD at the build, which may have moved since) or, where
 * the tree is no git clone, "unknown". */
static void build_info(const char *version, const char *type, const char *driver, const char *src)
{
    const char *info = fabpool_build_info();
    CHECK(info != NULL);
    if (!info)
        return;
    printf("test_abi: fabpool_build_info(): %s\n", info);
    char want[512], commit[64] = "";
    snprintf(want, sizeof want, "fabpool %s commit ", version);
    CHECK(strncmp(info, want, strlen(want)) == 0);
    if (strncmp(info, want, strlen(want)) == 0)
        sscanf(info + strlen(want), "%63s", commit);
    size_t hex = strspn(commit, "0123456789abcdef");
    snprintf(want, sizeof want, "%s/.git", src);
    if (access(want, F_OK) != 0 || system("git --version >/dev/null 2>&1") != 0) {
        CHECK(strcmp(commit, "unknown") == 0);
    } else {
        CHECK(hex == 12 && (commit[12] == 0 || strcmp(commit + 12, "-dirty") == 0));
        commit[hex] = 0;
        snprintf(want, sizeof want, "git -C '%s' cat-file -e '%s^{commit}'", src, commit);
        CHECK(hex == 12 && system(want) == 0);
    }
    snprintf(want, sizeof want, " build %s driver %s", type[0] ? type : "none", driver);
    CHECK(strlen(info) >= strlen(want) && strcmp(info + strlen(info) - strlen(want), want) == 0);
    CHECK(info == fabpool_build_info()); /* one static string */
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: test_abi <the project's version> <build type> <test driver> <source tree>\n");
        return 2;
    }
    t_driver_init();
    version(argv[1]);
    build_info(argv[1], argv[2], argv[3], argv[4]);
    sized_structs();
    options_of_an_older_header();
    return t_done("test_abi");
}
