/* conn_wait.h - the connections a listener has accepted whose first message has not come whole, watched all at
 * once until it comes (the tensor fd server, torch_ipc.cpp; the symmetric buffer's mesh, symm.c), and which of
 * them gives way when one more does not fit: C and C++.
 *
 * An honest peer sends its first message whole right after its connect, so it waits here only for the moment
 * between the two; what gives way is what cannot be it, or else the user that holds the most room.  So a flood of
 * connections that stay silent or send junk, from one user or many (FABPOOL_PEERS=any_user lets them in), takes
 * turns in its own room and never closes a connection whose message is on its way.  The caller looks at every
 * waiting connection before it takes one into a full table, so that one whose message has come is answered
 * rather than chosen. */
#ifndef FP_CONN_WAIT_H
#define FP_CONN_WAIT_H

#include <poll.h>
#include <stdint.h>
#include <unistd.h>

/* Another user than the listener's holds at most this share of the table (cap / CW_SHARE). */
#define CW_SHARE 4

typedef struct cw_conn {
    int fd;
    int partial;    /* part of a first message came: no honest peer sends it so (it goes out in one send) */
    unsigned uid;   /* the peer's, as of its connect (SO_PEERCRED) */
    uint64_t seq;   /* the order of accepts: larger is newer */
    int64_t until;  /* the caller's deadline for it, in the caller's clock */
} cw_conn;

/* Whether the peer of connection fd has hung up or shut its side down: a part of a first message it left unread
 * will never be whole (and poll reports the hang-up at once, again and again, while it waits). */
static inline int cw_hung_up(int fd)
{
    struct pollfd q = {fd, POLLRDHUP, 0};
    return poll(&q, 1, 0) == 1 && (q.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
}

/* How many of w[0..n) and `in` are of user uid. */
static inline int cw_count(const cw_conn *w, int n, const cw_conn *in, unsigned uid)
{
    int k = in->uid == uid;
    for (int i = 0; i < n; i++)
        k += w[i].uid == uid;
    return k;
}

/* Whether a gives way before b: one that sent part of a message; one of another user than own_uid; of two such,
 * the one whose user holds more; then the older. */
static inline int cw_before(const cw_conn *w, int n, const cw_conn *in, unsigned own_uid, const cw_conn *a,
                            const cw_conn *b)
{
    if (a->partial != b->partial)
        return a->partial;
    if ((a->uid != own_uid) != (b->uid != own_uid))
        return a->uid != own_uid;
    if (a->uid != own_uid && a->uid != b->uid) {
        int ca = cw_count(w, n, in, a->uid), cb = cw_count(w, n, in, b->uid);
        if (ca != cb)
            return ca > cb;
    }
    return a->seq < b->seq;
}

/* Which connection gives way for `in`: -1 where it fits (fewer than cap wait, and in's user, if not own_uid,
 * holds less than its share), the index of one in w[0..n), or n for `in` itself.  Past its share another user's
 * connection takes the room of that user's own. */
static inline int cw_victim(const cw_conn *w, int n, int cap, const cw_conn *in, unsigned own_uid)
{
    int over = in->uid != own_uid && cw_count(w, n, in, in->uid) > cap / CW_SHARE;
    if (n < cap && !over)
        return -1;
    int v = n;
    for (int i = 0; i < n; i++)
        if ((!over || w[i].uid == in->uid) && cw_before(w, n, in, own_uid, &w[i], v == n ? in : &w[v]))
            v = i;
    return v;
}

/* Takes `in` into w[0..*n), closing the connection that gives way, which may be `in`: 1 where one was closed. */
static inline int cw_admit(cw_conn *w, int *n, int cap, const cw_conn *in, unsigned own_uid)
{
    int v = cw_victim(w, *n, cap, in, own_uid);
    if (v == *n) {
        close(in->fd);
        return 1;
    }
    if (v >= 0) {
        close(w[v].fd);
        w[v] = w[--*n];
    }
    w[(*n)++] = *in;
    return v >= 0;
}

#endif
