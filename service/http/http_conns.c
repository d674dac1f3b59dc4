/* The HTTP server's connection slots (http_internal.h): who may connect, how long a connection
 * may take to send its request, and whom a new connection displaces when the slots are full.
 *
 * libmicrohttpd's own limits only refuse: with its per-address cap full of connections that
 * send nothing, every further request from that address is reset, and its timeout is an idle
 * timeout that a client sending one byte at a time never reaches. So ztraind keeps its own
 * table. A connection is WAITING from when it opens, and again from each answer's end, until
 * its request's head arrives; then READING until the body is in; then ANSWERING. A watchdog
 * thread shuts down a connection whose request has not arrived in full within the header
 * timeout. A new connection beyond a bound (all connections, or those of its address) takes
 * the slot of the longest-WAITING connection within that bound, which has had the most time to
 * send its request and has not; only when none is WAITING is it refused. A client that sends
 * its request promptly therefore always gets through, however many idle connections its
 * address holds.
 *
 * Connections are ended with shutdown(2), never close: the descriptor stays libmicrohttpd's,
 * whose thread then sees the end of the stream and closes the connection the usual way. An
 * entry leaves the table in the CLOSED notification, which libmicrohttpd sends before it
 * closes the descriptor, and both happen under the table's lock. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_internal.h"

#define WATCH_EVERY_MS 250

typedef enum { WAITING, READING, ANSWERING } conn_state;

typedef struct conn {
    struct conn *prev, *next;
    void *owner;              /* the table's owner (the HTTP server), for zt_http_conns_owner */
    int fd;
    struct sockaddr_storage addr;
    conn_state state;
    int64_t since_ms;          /* when WAITING began: the request's clock */
    bool dropped;              /* shut down by us; no longer holds a slot */
} conn;

struct zt_http_conns {
    void *owner;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t watchdog;
    bool stop;
    conn *head;
    unsigned max, per_address;
    int64_t header_timeout_ms;
};

static bool same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return true;
}

static void drop_locked(conn *c) {
    c->dropped = true;
    shutdown(c->fd, SHUT_RDWR);
}

/* Makes room for one more connection among those `addr` matches (all when addr is NULL) if
 * they hold `bound` slots: by dropping the longest-WAITING one. False when none is WAITING. */
static bool make_room_locked(zt_http_conns *t, const struct sockaddr_storage *addr,
                             unsigned bound) {
    unsigned n = 0;
    conn *oldest = NULL;
    for (conn *c = t->head; c; c = c->next) {
        if (c->dropped || (addr && !same_address(&c->addr, addr)))
            continue;
        n++;
        if (c->state == WAITING && (!oldest || c->since_ms < oldest->since_ms))
            oldest = c;
    }
    if (n < bound)
        return true;
    if (!oldest)
        return false;
    drop_locked(oldest);
    return true;
}

enum MHD_Result zt_http_conns_admit(void *cls, const struct sockaddr *addr, socklen_t len) {
    zt_http_conns *t = cls;
    struct sockaddr_storage a;
    memset(&a, 0, sizeof a);
    memcpy(&a, addr, len < sizeof a ? len : sizeof a);
    pthread_mutex_lock(&t->mu);
    bool ok = make_room_locked(t, &a, t->per_address) && make_room_locked(t, NULL, t->max);
    pthread_mutex_unlock(&t->mu);
    return ok ? MHD_YES : MHD_NO;
}

void zt_http_conns_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    zt_http_conns *t = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn *c = calloc(1, sizeof *c);
        const union MHD_ConnectionInfo *fd, *ad;
        fd = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        ad = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        /* Without an entry the connection is simply not watched; the idle timeout still
         * applies to it. */
        if (!c || !fd || !ad) {
            free(c);
            return;
        }
        c->fd = fd->connect_fd;
        c->owner = t->owner;
        socklen_t len = ad->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                               : sizeof(struct sockaddr_in);
        memcpy(&c->addr, ad->client_addr, len);
        c->state = WAITING;
        c->since_ms = zt_http_mono_ms();
        pthread_mutex_lock(&t->mu);
        c->next = t->head;
        if (t->head)
            t->head->prev = c;
        t->head = c;
        pthread_mutex_unlock(&t->mu);
        *socket_context = c;
        return;
    }
    conn *c = *socket_context;
    if (!c)
        return;
    pthread_mutex_lock(&t->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        t->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&t->mu);
    *socket_context = NULL;
    free(c);
}

void *zt_http_conns_owner(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const conn *c = info ? info->socket_context : NULL;
    return c ? c->owner : NULL;
}

static void set_state(zt_http_conns *t, struct MHD_Connection *mc, conn_state state) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn *c = info ? info->socket_context : NULL;
    if (!c)
        return;
    pthread_mutex_lock(&t->mu);
    if (state == WAITING)
        c->since_ms = zt_http_mono_ms();
    c->state = state;
    pthread_mutex_unlock(&t->mu);
}

void zt_http_conns_request_begun(zt_http_conns *t, struct MHD_Connection *c) {
    set_state(t, c, READING);
}

void zt_http_conns_request_read(zt_http_conns *t, struct MHD_Connection *c) {
    set_state(t, c, ANSWERING);
}

void zt_http_conns_request_done(zt_http_conns *t, struct MHD_Connection *c) {
    set_state(t, c, WAITING);
}

static void *watchdog(void *arg) {
    zt_http_conns *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        int64_t now = zt_http_mono_ms();
        for (conn *c = t->head; c; c = c->next)
            if (!c->dropped && c->state != ANSWERING && now - c->since_ms > t->header_timeout_ms)
                drop_locked(c);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += WATCH_EVERY_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&t->wake, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

zt_status zt_http_conns_create(zt_http_conns **out, void *owner, unsigned max,
                               unsigned per_address, unsigned header_timeout_s) {
    *out = NULL;
    zt_http_conns *t = calloc(1, sizeof *t);
    if (!t)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    t->owner = owner;
    t->max = max;
    t->per_address = per_address;
    t->header_timeout_ms = (int64_t)header_timeout_s * 1000;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->wake, &ca);
    pthread_condattr_destroy(&ca);
    int e = pthread_create(&t->watchdog, NULL, watchdog, t);
    if (e != 0) {
        pthread_cond_destroy(&t->wake);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return zt_error(ZT_ERR_IO, "HTTP: cannot start the connection watchdog: %s", strerror(e));
    }
    *out = t;
    return ZT_OK;
}

void zt_http_conns_destroy(zt_http_conns *t) {
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->watchdog, NULL);
    /* libmicrohttpd is stopped by now and has reported every connection CLOSED. */
    while (t->head) {
        conn *c = t->head;
        t->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
