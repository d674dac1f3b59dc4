/* A job's TCP metrics endpoint for a remote rank 0 (metrics_listener.h). */
#define _GNU_SOURCE
#include "metrics_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PENDING 4           /* handshakes in progress at once; more are refused */
#define HANDSHAKE_S 10.0        /* a connection must send its first line within this */
#define HELLO_MAX 128           /* "ztrain-metrics " + 32 hex digits + "\n" fits */

typedef struct {
    int fd;                     /* -1: free slot */
    double since;
    char buf[HELLO_MAX + 1];
    size_t len;
} pending_conn;

struct zt_metrics_listener {
    int fd;                     /* the listening socket; -1 once a connection was handed out */
    char addr[300];
    char token[33];
    pending_conn pending[MAX_PENDING];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static zt_status make_token(char out[33]) {
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t k = getrandom(raw + got, sizeof raw - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return zt_error(ZT_ERR_IO, "getrandom: %s", strerror(errno));
        got += (size_t)k;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return ZT_OK;
}

static bool is_unspecified(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return false;
}

zt_status zt_metrics_listener_create(zt_metrics_listener **out, const char *host) {
    zt_metrics_listener *l = calloc(1, sizeof *l);
    if (!l)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    l->fd = -1;
    for (int i = 0; i < MAX_PENDING; i++)
        l->pending[i].fd = -1;
    zt_status s = make_token(l->token);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = s == ZT_OK ? getaddrinfo(host, "0", &hints, &res) : 0;
    if (s == ZT_OK && rc != 0)
        s = zt_error(ZT_ERR_IO, "--metrics-host %s: %s", host, gai_strerror(rc));
    int err = 0;
    bool unspecified = false;
    for (struct addrinfo *a = res; s == ZT_OK && a && l->fd < 0; a = a->ai_next) {
        /* Bound, 0.0.0.0 or :: would listen everywhere, but the address handed to rank 0 is
         * where it connects: on another node that is the node itself. */
        if (is_unspecified(a->ai_addr)) {
            unspecified = true;
            continue;
        }
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, MAX_PENDING) != 0) {
            err = errno;
            close(fd);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        getsockname(fd, (struct sockaddr *)&ss, &len);
        int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        bool v6 = a->ai_family == AF_INET6 && strchr(host, ':');
        snprintf(l->addr, sizeof l->addr, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
        l->fd = fd;
    }
    if (res)
        freeaddrinfo(res);
    if (s == ZT_OK && l->fd < 0 && unspecified)
        s = zt_error(ZT_ERR_INVALID, "--metrics-host %s is the unspecified address: rank 0 "
                     "connects to this address, so it must be one of this host's that the "
                     "nodes reach", host);
    else if (s == ZT_OK && l->fd < 0 && (err == 0 || err == EADDRNOTAVAIL))
        s = zt_error(ZT_ERR_INVALID, "--metrics-host %s is not an address of this host: "
                     "ztraind listens there for rank 0's metrics, so it must be one of this "
                     "host's addresses that the nodes reach", host);
    else if (s == ZT_OK && l->fd < 0)
        s = zt_error(ZT_ERR_IO, "cannot listen for metrics on --metrics-host %s: %s", host,
                     strerror(err));
    if (s != ZT_OK) {
        free(l);
        return s;
    }
    *out = l;
    return ZT_OK;
}

static void drop(pending_conn *p) {
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    p->len = 0;
}

void zt_metrics_listener_destroy(zt_metrics_listener *l) {
    if (!l)
        return;
    for (int i = 0; i < MAX_PENDING; i++)
        drop(&l->pending[i]);
    if (l->fd >= 0)
        close(l->fd);
    free(l);
}

const char *zt_metrics_listener_addr(const zt_metrics_listener *l) {
    return l->addr;
}

const char *zt_metrics_listener_token(const zt_metrics_listener *l) {
    return l->token;
}

int zt_metrics_listener_fds(const zt_metrics_listener *l, struct pollfd *pfd, int cap) {
    int n = 0;
    if (l->fd >= 0 && n < cap)
        pfd[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN};
    for (int i = 0; i < MAX_PENDING && n < cap; i++)
        if (l->pending[i].fd >= 0)
            pfd[n++] = (struct pollfd){.fd = l->pending[i].fd, .events = POLLIN};
    return n;
}

/* Every byte of the expected line is compared, so the time taken says nothing about the token. */
static bool hello_ok(const zt_metrics_listener *l, const char *line) {
    char want[HELLO_MAX];
    int n = snprintf(want, sizeof want, "%s %s", ZT_METRICS_HELLO, l->token);
    if ((int)strlen(line) != n)
        return false;
    unsigned char diff = 0;
    for (int i = 0; i < n; i++)
        diff |= (unsigned char)(want[i] ^ line[i]);
    return diff == 0;
}

/* Reads the handshake one byte at a time, so that nothing after its newline is consumed: those
 * bytes are the first metrics line, for the caller's reader. 1: done and good; -1: drop it;
 * 0: not complete yet. */
static int read_hello(const zt_metrics_listener *l, pending_conn *p) {
    for (;;) {
        char ch;
        ssize_t k = read(p->fd, &ch, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            return 0;
        if (k <= 0)
            return -1;
        if (ch == '\n') {
            p->buf[p->len] = '\0';
            return hello_ok(l, p->buf) ? 1 : -1;
        }
        if (p->len == HELLO_MAX)
            return -1;
        p->buf[p->len++] = ch;
    }
}

int zt_metrics_listener_step(zt_metrics_listener *l, int *rejected) {
    if (l->fd < 0)
        return -1;
    double now = now_s();
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            break;
        pending_conn *slot = NULL;
        for (int i = 0; i < MAX_PENDING && !slot; i++)
            if (l->pending[i].fd < 0)
                slot = &l->pending[i];
        if (!slot) {
            close(fd);
            if (rejected)
                ++*rejected;
            continue;
        }
        slot->fd = fd;
        slot->since = now;
        slot->len = 0;
    }
    for (int i = 0; i < MAX_PENDING; i++) {
        pending_conn *p = &l->pending[i];
        if (p->fd < 0)
            continue;
        int r = read_hello(l, p);
        if (r == 0 && now - p->since <= HANDSHAKE_S)
            continue;
        if (r != 1) {
            drop(p);
            if (rejected)
                ++*rejected;
            continue;
        }
        int fd = p->fd;
        p->fd = -1;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (int k = 0; k < MAX_PENDING; k++)
            drop(&l->pending[k]);
        close(l->fd);
        l->fd = -1;
        return fd;
    }
    return -1;
}
