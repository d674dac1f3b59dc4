/* The TCP key-value store's server (engine/comm/tcp_store.h): one thread polls the listening socket
 * and every client's connection, reads requests as their bytes arrive and queues the replies, so
 * a slow or silent client never holds up the others, and a client that disconnects or sends
 * garbage loses only its own connection. It listens on MASTER_ADDR's address only, serves only
 * clients that prove the job's secret, and stops reading a client that leaves more than
 * ZT_TCP_STORE_MAX_PENDING_REPLY of replies unread (issue 34: a local client that set an 8 MiB
 * key and pipelined 40 GETs without reading grew rank 0 by 336 MB). */
#define _GNU_SOURCE /* before any header */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_store.h"

enum { BUCKETS = 4096, HEADER_BYTES = ZT_TCP_STORE_HEADER };

typedef struct entry {
    struct entry *next;
    char *key;
    unsigned char *value;
    size_t len;
} entry;

typedef struct {
    int fd;
    unsigned char *in;    /* bytes of the request being read */
    size_t in_len, in_cap;
    unsigned char *out;   /* replies not yet written */
    size_t out_len, out_pos, out_cap;
    bool authed;          /* sent the secret (or the server has none) */
} client;

struct zt_tcp_store_server {
    int listen_fd, port;
    int wake[2]; /* a byte on wake[1] tells the thread to stop */
    pthread_t thread;
    client *clients;
    size_t nclients, cap_clients;
    entry *buckets[BUCKETS];
    char *secret;         /* NULL: any client may ask */
};

static size_t pending_out(const client *c) { return c->out_len - c->out_pos; }

/* Compares in time that does not depend on where the bytes first differ. */
static bool same_secret(const char *want, const char *got, size_t got_len) {
    size_t n = strlen(want);
    unsigned char diff = n != got_len;
    for (size_t i = 0; i < got_len; i++)
        diff |= (unsigned char)(got[i] ^ want[i % (n ? n : 1)]);
    return diff == 0;
}

static void put_be(unsigned char *p, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static size_t hash_key(const char *k) {
    uint64_t h = 1469598103934665603ULL;
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 1099511628211ULL;
    return (size_t)(h % BUCKETS);
}

static entry *find(zt_tcp_store_server *s, const char *key) {
    for (entry *e = s->buckets[hash_key(key)]; e; e = e->next)
        if (strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

/* Stores a copy of value under key; false when out of memory (the old value is kept). */
static bool put(zt_tcp_store_server *s, const char *key, const void *value, size_t len) {
    unsigned char *copy = malloc(len + 1);
    if (!copy)
        return false;
    memcpy(copy, value, len);
    copy[len] = '\0';
    entry *e = find(s, key);
    if (!e) {
        e = calloc(1, sizeof *e);
        char *k = strdup(key);
        if (!e || !k) {
            free(e);
            free(k);
            free(copy);
            return false;
        }
        e->key = k;
        size_t b = hash_key(key);
        e->next = s->buckets[b];
        s->buckets[b] = e;
    }
    free(e->value);
    e->value = copy;
    e->len = len;
    return true;
}

static bool reserve(unsigned char **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 256;
    while (n < need)
        n *= 2;
    unsigned char *p = realloc(*buf, n);
    if (!p)
        return false;
    *buf = p;
    *cap = n;
    return true;
}

static bool queue_reply(client *c, int status, const void *value, size_t len) {
    if (!reserve(&c->out, &c->out_cap, c->out_len + 9 + len))
        return false;
    unsigned char *p = c->out + c->out_len;
    p[0] = (unsigned char)status;
    put_be(p + 1, len, 8);
    if (len)
        memcpy(p + 9, value, len);
    c->out_len += 9 + len;
    return true;
}

/* ADD: the stored decimal text plus delta, stored back; ZT_TCP_STORE_BAD when the key holds
 * something that is not an integer. */
static bool do_add(zt_tcp_store_server *s, client *c, const char *key, int64_t delta) {
    entry *e = find(s, key);
    int64_t v = 0;
    if (e) {
        char *end;
        errno = 0;
        v = strtoll((const char *)e->value, &end, 10);
        if (errno || end == (const char *)e->value || *end)
            return queue_reply(c, ZT_TCP_STORE_BAD, NULL, 0);
    }
    v = (int64_t)((uint64_t)v + (uint64_t)delta);
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    if (!put(s, key, text, (size_t)n))
        return false;
    return queue_reply(c, ZT_TCP_STORE_OK, text, (size_t)n);
}

/* Serves the complete requests in c->in while the client's unread replies stay under
 * ZT_TCP_STORE_MAX_PENDING_REPLY; the rest wait for it to read. False drops the client: a
 * malformed request, a first request that is not the right AUTH, or no memory for the reply. */
static bool serve_requests(zt_tcp_store_server *s, client *c) {
    size_t pos = 0;
    zt_tcp_store_request rq;
    while (pending_out(c) < ZT_TCP_STORE_MAX_PENDING_REPLY) {
        /* Before the secret, nothing but AUTH is even buffered: no 64 MiB SET from a stranger. */
        if (!c->authed && c->in_len > pos && c->in[pos] != ZT_TCP_STORE_AUTH)
            return false;
        int got = zt_tcp_store_parse(c->in + pos, c->in_len - pos, &rq);
        if (got < 0)
            return false;
        if (got == 0)
            break;
        if (rq.op == ZT_TCP_STORE_AUTH || !c->authed) {
            if (rq.op != ZT_TCP_STORE_AUTH ||
                (s->secret && !same_secret(s->secret, rq.key, rq.key_len)))
                return false;
            c->authed = true;
            if (!queue_reply(c, ZT_TCP_STORE_OK, NULL, 0))
                return false;
            pos += rq.total;
            continue;
        }
        char key[ZT_TCP_STORE_MAX_KEY + 1];
        memcpy(key, rq.key, rq.key_len);
        key[rq.key_len] = '\0';
        int op = rq.op;
        uint64_t arg = rq.arg;
        size_t total = rq.total;
        bool ok;
        if (op == ZT_TCP_STORE_SET) {
            ok = put(s, key, rq.value, rq.value_len) && queue_reply(c, ZT_TCP_STORE_OK, NULL, 0);
        } else if (op == ZT_TCP_STORE_GET) {
            entry *e = find(s, key);
            ok = e ? queue_reply(c, ZT_TCP_STORE_OK, e->value, e->len)
                   : queue_reply(c, ZT_TCP_STORE_ABSENT, NULL, 0);
        } else {
            ok = do_add(s, c, key, (int64_t)arg);
        }
        if (!ok)
            return false;
        pos += total;
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return true;
}

/* Reads what the socket has; false when the client has gone or must be dropped. */
static bool on_readable(zt_tcp_store_server *s, client *c) {
    for (;;) {
        if (!reserve(&c->in, &c->in_cap, c->in_len + 65536))
            return false;
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n > 0) {
            c->in_len += (size_t)n;
            if (!serve_requests(s, c))
                return false;
            /* Its replies are not being read: leave the rest in its socket. */
            if (pending_out(c) >= ZT_TCP_STORE_MAX_PENDING_REPLY)
                return true;
            /* A request can announce at most one value; more buffered than that is garbage. */
            if (c->in_len > HEADER_BYTES + ZT_TCP_STORE_MAX_KEY + ZT_TCP_STORE_MAX_VALUE)
                return false;
            continue;
        }
        if (n == 0)
            return false;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
}

/* Writes what the socket takes; once every reply is out, serves the requests that waited for
 * it. False when the client has gone or must be dropped. */
static bool on_writable(zt_tcp_store_server *s, client *c) {
    while (c->out_pos < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_pos, c->out_len - c->out_pos, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c->out_pos += (size_t)n;
    }
    c->out_pos = c->out_len = 0;
    /* A large reply's buffer is not kept for a client that may never ask again. */
    if (c->out_cap > ZT_TCP_STORE_MAX_PENDING_REPLY) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return serve_requests(s, c);
}

static void drop_client(zt_tcp_store_server *s, size_t i) {
    client *c = &s->clients[i];
    close(c->fd);
    free(c->in);
    free(c->out);
    s->clients[i] = s->clients[--s->nclients];
}

static void accept_clients(zt_tcp_store_server *s) {
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        if (s->nclients == s->cap_clients) {
            size_t n = s->cap_clients ? 2 * s->cap_clients : 16;
            client *p = realloc(s->clients, n * sizeof *p);
            if (!p) {
                close(fd);
                return;
            }
            s->clients = p;
            s->cap_clients = n;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        s->clients[s->nclients++] = (client){.fd = fd, .authed = s->secret == NULL};
    }
}

static void *serve(void *arg) {
    zt_tcp_store_server *s = arg;
    struct pollfd *fds = NULL;
    size_t cap = 0;
    for (;;) {
        size_t n = s->nclients + 2;
        if (n > cap) {
            struct pollfd *p = realloc(fds, n * sizeof *p);
            if (!p) {
                /* Keep serving the clients that fit; new ones wait in the backlog. */
                n = cap;
            } else {
                fds = p;
                cap = n;
            }
        }
        fds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        fds[1] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
        size_t polled = n - 2;
        for (size_t i = 0; i < polled; i++) {
            client *c = &s->clients[i];
            /* A client with too many unread replies is not read until it reads them. */
            bool full = pending_out(c) >= ZT_TCP_STORE_MAX_PENDING_REPLY;
            fds[i + 2] = (struct pollfd){
                .fd = c->fd,
                .events = (short)((full ? 0 : POLLIN) | (pending_out(c) ? POLLOUT : 0))};
        }
        if (poll(fds, n, -1) < 0 && errno != EINTR)
            break;
        if (fds[0].revents)
            break;
        /* Backwards, so that dropping client i (which moves the last one into its place) leaves
         * the ones still to visit where they were. */
        for (size_t i = polled; i-- > 0;) {
            short ev = fds[i + 2].revents;
            client *c = &s->clients[i];
            bool keep = true;
            if (ev & (POLLIN | POLLHUP | POLLERR))
                keep = on_readable(s, c);
            if (keep && c->out_len > c->out_pos)
                keep = on_writable(s, c);
            if (!keep)
                drop_client(s, i);
        }
        if (fds[1].revents & POLLIN)
            accept_clients(s);
    }
    free(fds);
    return NULL;
}

/* A socket on host's first address that binds (the store then answers only there). */
static int listen_host(const char *host, int port, int *err) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        *err = EADDRNOTAVAIL;
        return -1;
    }
    int fd = -1, one = 1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *err = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        *err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* A socket on every address: IPv6 with IPv4 mapped into it where the host has IPv6, else IPv4. */
static int listen_any(int port, int *err) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1, zero = 0;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                                 .sin6_addr = in6addr_any};
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1024) == 0)
            return fd;
        *err = errno;
        close(fd);
        if (*err == EADDRINUSE)
            return -1;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1024) == 0)
        return fd;
    *err = errno;
    close(fd);
    return -1;
}

zt_status zt_tcp_store_server_start(zt_tcp_store_server **out, const char *bind_host, int port,
                                    const char *secret) {
    *out = NULL;
    if (port < 0 || port > 65535)
        return zt_error(ZT_ERR_INVALID, "rendezvous store: port %d is not in [0, 65535]", port);
    zt_tcp_store_server *s = calloc(1, sizeof *s);
    if (!s)
        return zt_error(ZT_ERR_NOMEM, "rendezvous store: out of memory");
    if (secret && *secret && !(s->secret = strdup(secret))) {
        free(s);
        return zt_error(ZT_ERR_NOMEM, "rendezvous store: out of memory");
    }
    int err = 0;
    s->listen_fd = bind_host && *bind_host ? listen_host(bind_host, port, &err)
                                           : listen_any(port, &err);
    if (s->listen_fd < 0) {
        free(s->secret);
        free(s);
        if (err == EADDRNOTAVAIL && bind_host)
            return zt_error(ZT_ERR_IO, "rendezvous store: cannot listen on %s port %d: it is not "
                            "an address of this host (rank 0 must run where MASTER_ADDR points; "
                            "$%s names another address to listen on)", bind_host, port,
                            ZT_TCP_STORE_BIND_ENV);
        if (err == EADDRINUSE)
            return zt_error(ZT_ERR_IO,
                            "rendezvous store: port %d (MASTER_PORT) is already in use on this "
                            "host: another job or program listens there; pick another MASTER_PORT",
                            port);
        return zt_error(ZT_ERR_IO, "rendezvous store: cannot listen on port %d: %s", port,
                        strerror(err));
    }
    struct sockaddr_storage a;
    socklen_t alen = sizeof a;
    getsockname(s->listen_fd, (struct sockaddr *)&a, &alen);
    s->port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                            : ((struct sockaddr_in *)&a)->sin_port);
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        err = errno;
        close(s->listen_fd);
        free(s->secret);
        free(s);
        return zt_error(ZT_ERR_IO, "rendezvous store: pipe: %s", strerror(err));
    }
    err = pthread_create(&s->thread, NULL, serve, s);
    if (err) {
        close(s->wake[0]);
        close(s->wake[1]);
        close(s->listen_fd);
        free(s->secret);
        free(s);
        return zt_error(ZT_ERR_IO, "rendezvous store: cannot start its thread: %s",
                        strerror(err));
    }
    *out = s;
    return ZT_OK;
}

int zt_tcp_store_server_port(const zt_tcp_store_server *s) { return s->port; }

void zt_tcp_store_server_stop(zt_tcp_store_server *s) {
    if (!s)
        return;
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->thread, NULL);
    while (s->nclients)
        drop_client(s, s->nclients - 1);
    free(s->clients);
    for (size_t i = 0; i < BUCKETS; i++) {
        for (entry *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->value);
            free(e);
        }
    }
    close(s->wake[0]);
    close(s->wake[1]);
    close(s->listen_fd);
    free(s->secret);
    free(s);
}
