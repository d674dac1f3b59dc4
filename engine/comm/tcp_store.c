/* The TCP key-value store's client (engine/comm/tcp_store.h): one connection to the server, one
 * request at a time, every read and write bounded by the client's timeout. A get that waits for
 * a key asks again at short, growing intervals: rendezvous reads a few keys once, so polling
 * costs nothing that matters and keeps the server free of per-client waiting state. */
#define _GNU_SOURCE /* before any header */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_store.h"
#include "comm_transport.h"

/* How long a waiting get sleeps between asks: from the first to the last, doubling. */
#define POLL_FIRST_S 0.002
#define POLL_LAST_S 0.05

struct zt_tcp_store {
    int fd;
    double timeout_s;
    char where[300]; /* "host:port", for messages */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void put_be(unsigned char *p, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static uint64_t get_be(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

/* One non-blocking connect attempt, bounded by the time left. 0 or an errno. */
static int connect_once(const struct addrinfo *a, double left_s, int *fd_out) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
        return errno;
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int k = poll(&p, 1, (int)(left_s * 1e3) + 1);
            socklen_t len = sizeof err;
            if (k == 0)
                err = ETIMEDOUT;
            else if (k < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        }
    }
    if (err) {
        close(fd);
        return err;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *fd_out = fd;
    return 0;
}

static zt_status request(zt_tcp_store *c, int op, const char *key, uint64_t arg,
                         const void *value, size_t vlen, int *status, void **out, size_t *olen);

const char *zt_tcp_store_secret(void) {
    const char *s = getenv(ZT_TCP_STORE_SECRET_ENV);
    return s && *s ? s : NULL;
}

const char *zt_tcp_store_bind_host(const char *master_addr) {
    const char *b = getenv(ZT_TCP_STORE_BIND_ENV);
    return b && *b ? b : master_addr;
}

zt_status zt_tcp_store_serve_job(zt_tcp_store_server **out, const zt_dist_info *d) {
    zt_status s = zt_tcp_store_server_start(out, zt_tcp_store_bind_host(d->master_addr),
                                            d->master_port, zt_tcp_store_secret());
    const char *said = zt_last_error(), *at = strstr(said, "(MASTER_PORT)");
    if (s == ZT_OK || !at || !d->port_origin[0] || strcmp(d->port_origin, "MASTER_PORT") == 0)
        return s;
    char msg[1024];
    snprintf(msg, sizeof msg, "%.*s(%s)%s", (int)(at - said), said, d->port_origin,
             at + strlen("(MASTER_PORT)"));
    return zt_error(s, "%s", msg);
}

/* Proves the job's secret: the server answers OK, or drops a connection with another one. */
static zt_status authenticate(zt_tcp_store *c, const char *secret) {
    int status = -1;
    zt_status s = request(c, ZT_TCP_STORE_AUTH, secret, 0, NULL, 0, &status, NULL, NULL);
    if (s == ZT_OK && status == ZT_TCP_STORE_OK)
        return ZT_OK;
    return zt_error(ZT_ERR_IO, "rendezvous store at %s refused this rank: its %s is not the "
                    "job's (every rank of a job must have the same one)", c->where,
                    ZT_TCP_STORE_SECRET_ENV);
}

zt_status zt_tcp_store_resolve(const char *what, const char *host, int port, int socktype,
                               double timeout_s, struct addrinfo **res) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = socktype,
                             .ai_flags = AI_NUMERICSERV};
    double deadline = now_s() + timeout_s, pause = 0.05;
    for (;;) {
        *res = NULL;
        int rc = getaddrinfo(host, service, &hints, res);
        if (rc == 0)
            return ZT_OK;
        double left = deadline - now_s();
        if (zt_comm_stop_requested())
            return zt_error(ZT_ERR_STOPPED, "%s '%s': a stop was asked for while it did not "
                            "resolve: %s", what, host,
                            rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        if (left <= 0)
            return zt_error(ZT_ERR_TIMEOUT, "%s '%s' did not resolve within %g s: %s", what, host,
                            timeout_s, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        sleep_s(pause < left ? pause : left);
        pause = pause * 2 < 1.0 ? pause * 2 : 1.0;
    }
}

zt_status zt_tcp_store_connect(zt_tcp_store **out, const char *host, int port, double timeout_s,
                               const char *secret) {
    *out = NULL;
    if (!host || !*host)
        return zt_error(ZT_ERR_INVALID, "rendezvous store: MASTER_ADDR is empty");
    if (port < 1 || port > 65535)
        return zt_error(ZT_ERR_INVALID, "rendezvous store: port %d is not in [1, 65535]", port);
    /* The deadline covers the name's resolution and the connection together. */
    double deadline = now_s() + timeout_s, pause = 0.01;
    struct addrinfo *res = NULL;
    ZT_TRY(zt_tcp_store_resolve("rendezvous store: MASTER_ADDR", host, port, SOCK_STREAM,
                                timeout_s, &res));
    zt_tcp_store *c = calloc(1, sizeof *c);
    if (!c) {
        freeaddrinfo(res);
        return zt_error(ZT_ERR_NOMEM, "rendezvous store: out of memory");
    }
    c->fd = -1;
    c->timeout_s = timeout_s;
    zt_dist_endpoint(host, port, c->where, sizeof c->where);
    /* Until the deadline: every address in turn, then a pause and again. A refusal means rank 0
     * is not listening yet; an unreachable network may come up (a link being configured). The
     * message gives the timeout to three digits: a caller that resolved the name first passes
     * what is left of its own timeout (7.9998 s of 8), which the user knows as the whole. */
    int err = 0;
    for (;;) {
        for (struct addrinfo *a = res; a && c->fd < 0; a = a->ai_next) {
            double left = deadline - now_s();
            err = connect_once(a, left > 0 ? left : 0, &c->fd);
        }
        if (c->fd >= 0)
            break;
        double left = deadline - now_s();
        bool stop = zt_comm_stop_requested();
        if (stop || left <= 0) {
            zt_status s =
                stop ? zt_error(ZT_ERR_STOPPED,
                                "rendezvous store: a stop was asked for while no server answered "
                                "at %s (MASTER_ADDR:MASTER_PORT): %s; is rank 0 running there?",
                                c->where, strerror(err))
                     : zt_error(ZT_ERR_TIMEOUT,
                                "rendezvous store: no server at %s (MASTER_ADDR:MASTER_PORT) "
                                "within %.3g s: %s; is rank 0 running there?",
                                c->where, timeout_s, strerror(err));
            freeaddrinfo(res);
            free(c);
            return s;
        }
        sleep_s(pause < left ? pause : left);
        pause = pause * 2 < 0.5 ? pause * 2 : 0.5;
    }
    freeaddrinfo(res);
    if (secret && *secret) {
        zt_status s = authenticate(c, secret);
        if (s != ZT_OK) {
            zt_tcp_store_close(c);
            return s;
        }
    }
    *out = c;
    return ZT_OK;
}

void zt_tcp_store_close(zt_tcp_store *c) {
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

void zt_tcp_store_set_timeout(zt_tcp_store *c, double timeout_s) { c->timeout_s = timeout_s; }

/* Moves len bytes through the socket (send or receive), bounded by the deadline. */
static zt_status transfer(zt_tcp_store *c, bool sending, void *buf, size_t len, double deadline) {
    unsigned char *p = buf;
    while (len) {
        double left = deadline - now_s();
        struct pollfd pfd = {.fd = c->fd, .events = sending ? POLLOUT : POLLIN};
        int k = left > 0 ? poll(&pfd, 1, (int)(left * 1e3) + 1) : 0;
        if (k < 0 && errno == EINTR)
            continue;
        if (k == 0)
            return zt_error(ZT_ERR_TIMEOUT,
                            "rendezvous store at %s did not %s within %g s (is its host "
                            "reachable?)",
                            c->where, sending ? "take a request" : "reply", c->timeout_s);
        ssize_t n = sending ? send(c->fd, p, len, MSG_NOSIGNAL) : recv(c->fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            continue;
        return zt_error(ZT_ERR_IO,
                        "rendezvous store at %s closed the connection (%s): has rank 0 exited?",
                        c->where, n == 0 ? "end of stream" : strerror(errno));
    }
    return ZT_OK;
}

/* Sends one request and reads its reply; *value gets the reply's bytes (malloc'd) when asked. */
static zt_status request(zt_tcp_store *c, int op, const char *key, uint64_t arg,
                         const void *value, size_t vlen, int *status, void **out, size_t *olen) {
    size_t klen = strlen(key);
    if (klen == 0 || klen > ZT_TCP_STORE_MAX_KEY)
        return zt_error(ZT_ERR_INVALID, "rendezvous store: key '%.64s' is empty or longer than %d",
                        key, ZT_TCP_STORE_MAX_KEY);
    if (c->fd < 0)
        return zt_error(ZT_ERR_IO, "rendezvous store at %s: the connection failed earlier",
                        c->where);
    double deadline = now_s() + c->timeout_s;
    unsigned char head[1 + 4 + ZT_TCP_STORE_MAX_KEY + 8];
    head[0] = (unsigned char)op;
    put_be(head + 1, klen, 4);
    memcpy(head + 5, key, klen);
    put_be(head + 5 + klen, arg, 8);
    zt_status s = transfer(c, true, head, 13 + klen, deadline);
    if (s == ZT_OK && vlen)
        s = transfer(c, true, (void *)value, vlen, deadline);
    unsigned char reply[9];
    if (s == ZT_OK)
        s = transfer(c, false, reply, sizeof reply, deadline);
    uint64_t rlen = s == ZT_OK ? get_be(reply + 1, 8) : 0;
    if (s == ZT_OK && rlen > ZT_TCP_STORE_MAX_VALUE)
        s = zt_error(ZT_ERR_IO, "rendezvous store at %s sent a reply of %llu bytes: is it a "
                                "ztrain store?", c->where, (unsigned long long)rlen);
    unsigned char *buf = NULL;
    if (s == ZT_OK && !(buf = malloc((size_t)rlen + 1)))
        s = zt_error(ZT_ERR_NOMEM, "rendezvous store: out of memory for %llu bytes",
                     (unsigned long long)rlen);
    if (s == ZT_OK)
        s = transfer(c, false, buf, (size_t)rlen, deadline);
    if (s != ZT_OK) {
        /* The stream may be mid-message: nothing more can be read from it in step. */
        free(buf);
        close(c->fd);
        c->fd = -1;
        return s;
    }
    buf[rlen] = '\0';
    *status = reply[0];
    if (out) {
        *out = buf;
        *olen = (size_t)rlen;
    } else {
        free(buf);
    }
    return ZT_OK;
}

zt_status zt_tcp_store_set(zt_tcp_store *c, const char *key, const void *value, size_t len) {
    if (len > ZT_TCP_STORE_MAX_VALUE)
        return zt_error(ZT_ERR_INVALID, "rendezvous store: value of '%s' is %zu bytes, over %zu",
                        key, len, ZT_TCP_STORE_MAX_VALUE);
    int st;
    ZT_TRY(request(c, ZT_TCP_STORE_SET, key, len, value, len, &st, NULL, NULL));
    if (st != ZT_TCP_STORE_OK)
        return zt_error(ZT_ERR_IO, "rendezvous store at %s refused to set '%s'", c->where, key);
    return ZT_OK;
}

zt_status zt_tcp_store_get(zt_tcp_store *c, const char *key, void **value, size_t *len,
                           double timeout_s) {
    *value = NULL;
    *len = 0;
    double deadline = now_s() + timeout_s, pause = POLL_FIRST_S;
    for (;;) {
        int st;
        void *v;
        size_t n;
        ZT_TRY(request(c, ZT_TCP_STORE_GET, key, 0, NULL, 0, &st, &v, &n));
        if (st == ZT_TCP_STORE_OK) {
            *value = v;
            *len = n;
            return ZT_OK;
        }
        free(v);
        double left = deadline - now_s();
        if (left <= 0)
            return zt_error(ZT_ERR_TIMEOUT,
                            "rendezvous store at %s: key '%s' did not appear within %g s",
                            c->where, key, timeout_s);
        sleep_s(pause < left ? pause : left);
        pause = pause * 2 < POLL_LAST_S ? pause * 2 : POLL_LAST_S;
    }
}

zt_status zt_tcp_store_wait(zt_tcp_store *c, const char *const *keys, int nkeys, double timeout_s,
                            int *missing) {
    double deadline = now_s() + timeout_s;
    for (int i = 0; i < nkeys; i++) {
        void *v;
        size_t n;
        double left = deadline - now_s();
        zt_status s = zt_tcp_store_get(c, keys[i], &v, &n, left > 0 ? left : 0);
        if (s != ZT_OK) {
            if (missing)
                *missing = i;
            if (s == ZT_ERR_TIMEOUT)
                return zt_error(ZT_ERR_TIMEOUT,
                                "rendezvous store at %s: key '%s' did not appear within %g s",
                                c->where, keys[i], timeout_s);
            return s;
        }
        free(v);
    }
    return ZT_OK;
}

zt_status zt_tcp_store_add(zt_tcp_store *c, const char *key, int64_t delta, int64_t *result) {
    int st;
    void *v;
    size_t n;
    ZT_TRY(request(c, ZT_TCP_STORE_ADD, key, (uint64_t)delta, NULL, 0, &st, &v, &n));
    if (st != ZT_TCP_STORE_OK) {
        free(v);
        return zt_error(ZT_ERR_INVALID, "rendezvous store at %s: key '%s' does not hold an integer",
                        c->where, key);
    }
    *result = strtoll(v, NULL, 10);
    free(v);
    return ZT_OK;
}
