/* test_log.c - the log (FABPOOL_DEBUG, FABPOOL_DEBUG_FILE, the conf key
 * debug), read back from what a child process wrote: the log is the
 * process's and never quietens, so each case runs in a process of its own
 * (this program again, exec'ed with the case's environment).
 *   info:   the creation line (version, device, handle type and why,
 *           reservation, the options other than the defaults), growth,
 *           release, trim, decay, sleep and wake with their bytes, a peer's
 *           acknowledgement, out of memory and its retry (sim), destroy; no
 *           driver call; the file named with %p and %h.
 *   trace:  every driver call, cuInit first, with its result.
 *   off:    FABPOOL_DEBUG_FILE alone writes nothing.
 *   conf:   debug:info in FABPOOL_CONF logs too; FABPOOL_DEBUG wins over it;
 *           FABPOOL_DEBUG=2 is info, as debug:2 is.
 *   bad:    FABPOOL_DEBUG=loud makes pool creation fail, naming it.
 *   files:  FABPOOL_DEBUG_FILE in a folder others may write: a symbolic
 *           link planted by another user, a FIFO, a file of another user
 *           refuse pool creation (FABPOOL_ERR_CONFIG, naming the path and
 *           why) and change nothing; a file of ours is truncated and
 *           written, a new one made with mode 0600; %d stays as written.
 * Usage: test_log (the cases run as test_log child <case>). */
#include "testutil.h"

#include "planted.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1ull << 20)

static char dir[256];

/* ------------------------------------------------------------ the children */

static fabpool_t *pool(const char *conf)
{
    fabpool_t *p = t_pool(conf);
    if (!p)
        exit(3);
    return p;
}

/* What the info case logs: each event once. */
static int child_events(int sim)
{
    fabpool_t *p = pool("decay_ms:0,max_waste:10");
    void *a = NULL, *b = NULL;
    CHECK_OK(fabpool_alloc(p, MB, &a));                 /* a slab: grow */
    CHECK_OK(fabpool_alloc(p, 64 * MB, &b));            /* a large block: grow */
    CHECK_OK(fabpool_free(p, b));                       /* decay_ms:0: back at once (decay) */
    CHECK_OK(fabpool_free(p, a));
    CHECK_OK(fabpool_trim(p, 0));                       /* trim */
    CHECK_OK(fabpool_alloc(p, 8 * MB + 1, &a));
    CHECK_OK(fabpool_sleep(p, FABPOOL_SLEEP_OFFLOAD, NULL));
    CHECK_OK(fabpool_wake(p, NULL));
    CHECK_OK(fabpool_free(p, a));
    fabpool_handle_type t = fabpool_handle_type_of(p);
    if (t == FABPOOL_HANDLE_POSIX_FD || t == FABPOOL_HANDLE_FABRIC) {
        fabpool_buffer_t *buf = NULL;
        CHECK_OK(fabpool_buffer_create(p, 256 * MB, 64 * MB, &buf));
        static uint8_t desc[16384];
        int fds[64];
        size_t len = 0, nfds = 0;
        CHECK_OK(fabpool_buffer_export(buf, 0, desc, sizeof desc, &len, fds, 64, &nfds));
        CHECK_OK(fabpool_buffer_export_done(buf));
        CHECK_OK(fabpool_buffer_resize(buf, 2 * MB, NULL));
        CHECK_OK(fabpool_buffer_peers_ack(buf, UINT64_MAX)); /* peer ack */
        CHECK_OK(fabpool_buffer_destroy(buf, NULL));
    }
    CHECK_OK(fabpool_destroy(p));
    if (sim) { /* FABSIM_MEMORY=1GiB: the second 600 MiB block finds no memory, even after the retry */
        p = pool("decay_ms:0");
        CHECK_OK(fabpool_alloc(p, 600 * MB, &a));
        CHECK_STATUS(fabpool_alloc(p, 600 * MB, &b), FABPOOL_ERR_OUT_OF_MEMORY);
        CHECK_OK(fabpool_free(p, a));
        CHECK_OK(fabpool_destroy(p));
    }
    return t_failures ? 1 : 0;
}

static int child(const char *c)
{
    int sim = t_driver_init();
    if (!strcmp(c, "info") || !strcmp(c, "trace"))
        return child_events(sim && !strcmp(c, "info"));
    if (!strcmp(c, "off") || !strcmp(c, "conf")) {
        fabpool_t *p = pool(NULL);
        void *a = NULL;
        CHECK_OK(fabpool_alloc(p, MB, &a));
        CHECK_OK(fabpool_free(p, a));
        CHECK_OK(fabpool_destroy(p));
        return t_failures ? 1 : 0;
    }
    if (!strcmp(c, "refused")) { /* TEST_LOG_WANT: a word the message must hold; a FIFO must not hang the open */
        alarm(30);
        const char *want = getenv("TEST_LOG_WANT"), *file = getenv("FABPOOL_DEBUG_FILE");
        fabpool_t *p = NULL;
        fabpool_status st = fabpool_create(NULL, &p);
        alarm(0);
        printf("%s: %s\n", fabpool_status_name(st), fabpool_last_error());
        return st == FABPOOL_ERR_CONFIG && p == NULL && want && file && strstr(fabpool_last_error(), want) &&
                       strstr(fabpool_last_error(), file)
                   ? 0
                   : 1;
    }
    if (!strcmp(c, "bad")) {
        fabpool_t *p = NULL;
        fabpool_status st = fabpool_create(NULL, &p);
        printf("%s: %s\n", fabpool_status_name(st), fabpool_last_error());
        return st == FABPOOL_ERR_CONFIG && strstr(fabpool_last_error(), "FABPOOL_DEBUG='loud'") ? 0 : 1;
    }
    return 2;
}

/* ------------------------------------------------------------ the parent */

/* Runs `test_log child <c>` with the variables env ("NAME=value", NULL-ended) added; its pid, or -1 if it
 * failed. */
static pid_t run(const char *self, const char *c, const char *const *env)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("FABPOOL_DEBUG");
        unsetenv("FABPOOL_DEBUG_FILE");
        unsetenv("FABPOOL_CONF");
        for (int i = 0; env[i]; i++) {
            char name[64];
            const char *eq = strchr(env[i], '=');
            snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
            setenv(name, eq + 1, 1);
        }
        execl(self, self, "child", c, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "test_log: the %s case's child failed (status 0x%x)\n", c, status);
        return -1;
    }
    return pid;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* The first line of log that contains every one of the NULL-ended words, or NULL. */
static const char *line_with(const char *log, const char *const *words)
{
    for (const char *l = log; l && *l;) {
        const char *end = strchr(l, '\n');
        size_t n = end ? (size_t)(end - l) : strlen(l);
        int all = 1;
        for (int i = 0; words[i] && all; i++) {
            const char *w = strstr(l, words[i]);
            all = w && w < l + n;
        }
        if (all)
            return l;
        l = end ? end + 1 : NULL;
    }
    return NULL;
}

#define HAS(log, ...)                                                                                        \
    do {                                                                                                     \
        const char *const w_[] = {__VA_ARGS__, NULL};                                                        \
        t_checks++;                                                                                          \
        if (!line_with(log, w_)) {                                                                           \
            t_failures++;                                                                                    \
            fprintf(stderr, "%s:%d: no line of the log has all of: %s\n", __FILE__, __LINE__, #__VA_ARGS__); \
        }                                                                                                    \
    } while (0)

static void case_info(const char *self, int sim)
{
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    char *dot = strchr(host, '.');
    if (dot)
        *dot = '\0';
    char file[400];
    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s/log-%%h-%%p.txt", dir);
    const char *env[] = {"FABPOOL_DEBUG=info", file, "FABSIM_MEMORY=1GiB", NULL};
    pid_t pid = run(self, "info", env);
    CHECK(pid > 0);
    char path[512];
    snprintf(path, sizeof path, "%s/log-%s-%ld.txt", dir, host, (long)pid);
    const char *log = slurp(path);
    CHECK(log != NULL);
    if (!log)
        return;
    char version[64];
    snprintf(version, sizeof version, "fabpool %s: pool created on device 0", fabpool_version());
    HAS(log, " fabpool INFO pool ", version, "handle type ", "reservation ", "GiB at 0x",
        "options other than the defaults: ", "decay_ms:0", "max_waste:10");
    HAS(log, "handle type ", "auto: ");
    HAS(log, "INFO", "grow: mapped ", " bytes at 0x", "the pool maps ");
    HAS(log, "INFO", "grow: mapped 67108864 bytes at 0x");
    HAS(log, "INFO", "release: unmapped ", " bytes at 0x", "the pool maps ");
    HAS(log, "INFO", "decay: 67108864 bytes in ", " chunks back to the driver (decay_ms 0");
    HAS(log, "INFO", "trim (keep 0 bytes cached): ", "back to the driver");
    HAS(log, "INFO", "sleep (offload): ", "bytes offloaded to host memory");
    HAS(log, "INFO", "wake: ", "bytes restored from host memory");
    HAS(log, "INFO", "peer ack: buffer 0x", "(no peer left)", "held for peers");
    HAS(log, "INFO", ": destroyed");
    if (sim) {
        HAS(log, "INFO", "out of memory: cuMemCreate of ", " bytes failed while the pool maps ");
        HAS(log, "WARN", "an allocation of 629145600 bytes failed: ", "out of memory");
    }
    const char *const driver[] = {"cuMemCreate(", NULL};
    CHECK(line_with(log, driver) == NULL); /* driver calls only at trace */
}

static void case_trace(const char *self)
{
    char file[400];
    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s/trace-%%p.txt", dir);
    const char *env[] = {"FABPOOL_DEBUG=TRACE", file, NULL};
    pid_t pid = run(self, "trace", env);
    CHECK(pid > 0);
    char path[512];
    snprintf(path, sizeof path, "%s/trace-%ld.txt", dir, (long)pid);
    const char *log = slurp(path);
    CHECK(log != NULL);
    if (!log)
        return;
    HAS(log, " fabpool TRACE cuInit(0) -> CUDA_SUCCESS, ", " us");
    HAS(log, " fabpool TRACE cuMemCreate(", ") -> CUDA_SUCCESS");
    HAS(log, " fabpool TRACE cuMemMap(", ") -> CUDA_SUCCESS");
    HAS(log, " fabpool TRACE cuMemUnmap(");
    HAS(log, " fabpool TRACE cuMemAddressReserve(");
    HAS(log, " fabpool INFO pool ", "pool created");
    CHECK(strstr(log, "cuInit(0)") < strstr(log, "cuMemAddressReserve(")); /* the first call is logged too */
}

static void case_off_conf_bad(const char *self)
{
    char file[400], path[512];
    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s/off.txt", dir);
    snprintf(path, sizeof path, "%s/off.txt", dir);
    const char *off[] = {file, NULL};
    CHECK(run(self, "off", off) > 0);
    struct stat sb;
    CHECK(stat(path, &sb) != 0); /* no level: no file, nothing written */

    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s/conf.txt", dir);
    snprintf(path, sizeof path, "%s/conf.txt", dir);
    const char *conf[] = {file, "FABPOOL_CONF=debug:info", NULL};
    CHECK(run(self, "conf", conf) > 0);
    const char *log = slurp(path);
    CHECK(log != NULL);
    if (log) {
        HAS(log, " fabpool INFO pool ", "pool created", "options other than the defaults: debug:info");
        CHECK(strstr(log, " TRACE ") == NULL);
    }

    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s/conf-wins.txt", dir);
    snprintf(path, sizeof path, "%s/conf-wins.txt", dir);
    const char *wins[] = {file, "FABPOOL_CONF=debug:info", "FABPOOL_DEBUG=warn", NULL};
    CHECK(run(self, "conf", wins) > 0);
    CHECK(stat(path, &sb) == 0 && sb.st_size == 0); /* warn: the file, and no line (nothing went wrong) */

    /* the level's number, as the conf key takes it (debug:2): FABPOOL_DEBUG=2 is info */
    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s/number.txt", dir);
    snprintf(path, sizeof path, "%s/number.txt", dir);
    const char *number[] = {file, "FABPOOL_DEBUG=2", NULL};
    CHECK(run(self, "conf", number) > 0);
    log = slurp(path);
    CHECK(log != NULL);
    if (log) {
        HAS(log, " fabpool INFO pool ", "pool created");
        CHECK(strstr(log, " TRACE ") == NULL);
    }

    const char *bad[] = {"FABPOOL_DEBUG=loud", NULL};
    CHECK(run(self, "bad", bad) > 0);
}

/* Runs the refused case with FABPOOL_DEBUG_FILE=path and the message word want; 1 if it was refused so. */
static int refused(const char *self, const char *path, const char *want)
{
    char file[400], w[120];
    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s", path);
    snprintf(w, sizeof w, "TEST_LOG_WANT=%s", want);
    const char *env[] = {"FABPOOL_DEBUG=info", file, w, NULL};
    return run(self, "refused", env) > 0;
}

static void case_files(const char *self)
{
    planted pl;
    if (planted_setup(&pl, dir, "fabpool.log", "log") != 0) {
        CHECK(0);
        return;
    }

    /* a link: refused, and the file it names keeps its bytes */
    CHECK(refused(self, pl.link, "symbolic link"));
    CHECK(planted_holds(pl.target, PLANTED_PRECIOUS));
    /* a FIFO with no reader: refused at once, not an open that waits for a reader (the child's alarm) */
    CHECK(mkfifo(pl.fifo, 0666) == 0);
    CHECK(refused(self, pl.fifo, "FIFO"));
    /* another user's file: refused, unchanged */
    if (pl.other > 0) {
        CHECK(refused(self, pl.theirs, "owned by uid 65534"));
        CHECK(planted_holds(pl.theirs, PLANTED_THEIRS));
    }

    /* a file of ours: truncated, then the log in it */
    char path[400], file[420];
    snprintf(path, sizeof path, "%s/own.log", dir);
    CHECK(planted_write(path, "old lines that must not stay\n", 0644) == 0);
    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s", path);
    const char *own[] = {file, "FABPOOL_DEBUG=info", NULL};
    CHECK(run(self, "conf", own) > 0);
    const char *log = slurp(path);
    CHECK(log && strstr(log, "pool created") && !strstr(log, "old lines"));
    /* a new one: mode 0600 whatever the umask lets through; %d (no device's in the log) stays as written */
    snprintf(file, sizeof file, "FABPOOL_DEBUG_FILE=%s/new-%%d-%%p.log", dir);
    const char *fresh[] = {file, "FABPOOL_DEBUG=info", NULL};
    mode_t um = umask(0);
    pid_t pid = run(self, "conf", fresh);
    umask(um);
    CHECK(pid > 0);
    snprintf(path, sizeof path, "%s/new-%%d-%ld.log", dir, (long)pid);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 07777) == 0600 && sb.st_size > 0);

    CHECK(planted_remove(&pl) == 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "child"))
        return child(argv[2]);
    snprintf(dir, sizeof dir, "/tmp/fabpool-test-log-XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    int sim = t_driver_init();
    char self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    case_info(self, sim);
    case_trace(self);
    case_off_conf_bad(self);
    case_files(self);
    if (!t_failures) { /* the logs go; a failure leaves them to read */
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d));) {
            char f[600];
            snprintf(f, sizeof f, "%s/%s", dir, e->d_name);
            if (e->d_name[0] != '.')
                CHECK(unlink(f) == 0);
        }
        if (d)
            closedir(d);
        CHECK(rmdir(dir) == 0);
    }
    return t_done("test_log");
}
