/* conn_flood.h - a process that floods a listener of an abstract Unix socket with connections, as another user
 * on the same host could (with other_user_fork_as): connect and close at once, or keep up to CONN_FLOOD_HELD
 * connections open, silent or after a few bytes of a start, the oldest closed for each new one.  It loops until
 * killed.  C and C++. */
#ifndef FP_CONN_FLOOD_H
#define FP_CONN_FLOOD_H

#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define CONN_FLOOD_HELD 100

enum { CONN_FLOOD_CLOSE, CONN_FLOOD_SILENT, CONN_FLOOD_PART };

typedef struct conn_flood {
    char name[108];          /* the listener's abstract name, without the leading NUL (107 characters at most) */
    int mode;                /* CONN_FLOOD_* */
    unsigned char part[64];  /* CONN_FLOOD_PART: what each connection sends, then nothing */
    size_t part_len;
    int ready;               /* a byte goes here once the first connection is in (-1: none) */
} conn_flood;

/* *a made the abstract address of name (without its leading NUL; cut at 107 characters); its length. */
static inline socklen_t abstract_addr(struct sockaddr_un *a, const char *name)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strnlen(name, sizeof a->sun_path - 1);
    memcpy(a->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* The flood (other_user_fork_as's fn): never returns. */
static inline int conn_flood_run(void *arg)
{
    conn_flood *f = (conn_flood *)arg;
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, f->name);
    int held[CONN_FLOOD_HELD];
    for (int i = 0; i < CONN_FLOOD_HELD; i++)
        held[i] = -1;
    for (unsigned k = 0;; k++) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0 || connect(s, (struct sockaddr *)&a, len) != 0) { /* blocking: as soon as the queue has room */
            if (s >= 0)
                close(s);
            continue;
        }
        if (f->ready >= 0) {
            (void)!write(f->ready, "f", 1);
            close(f->ready);
            f->ready = -1;
        }
        if (f->mode == CONN_FLOOD_CLOSE) {
            close(s);
            continue;
        }
        if (f->mode == CONN_FLOOD_PART)
            (void)send(s, f->part, f->part_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        int *slot = &held[k % CONN_FLOOD_HELD]; /* the oldest held gives way */
        if (*slot >= 0)
            close(*slot);
        *slot = s;
    }
    return 0;
}

#endif
