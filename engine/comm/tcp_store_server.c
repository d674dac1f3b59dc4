/* The TCP key-value store's server (engine/comm/tcp_store.h): one thread polls the listening socket
 * and every client's connection, reads requests as their bytes arrive and queues the replies, so
 * a slow or silent client never holds up the others, and a client that disconnects or sends
 * garbage loses only its own connection. */
#define _GNU_SOURCE /* before any header */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

enum { BUCKETS = 4096, HEADER_BYTES = 1 + 4 + 8 };

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
} client;

struct zt_tcp_store_server {
    int listen_fd, port;
    int wake[2]; /* a byte on wake[1] tells the thread to stop */
    pthread_t thread;
    client *clients;
    size_t nclients, cap_clients;
    entry *buckets[BUCKETS];
};

static uint64_t get_be(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
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

/* Serves every complete request in c->in. False drops the client: a malformed request or no
 * memory for the reply. */
static bool serve_requests(zt_tcp_store_server *s, client *c) {
    size_t pos = 0;
    while (c->in_len - pos >= HEADER_BYTES) {
        const unsigned char *p = c->in + pos;
        int op = p[0];
        uint64_t klen = get_be(p + 1, 4);
        if (klen == 0 || klen > ZT_TCP_STORE_MAX_KEY)
            return false;
        if (c->in_len - pos < HEADER_BYTES + klen)
            break;
        uint64_t arg = get_be(p + 5 + klen, 8);
        size_t total = HEADER_BYTES + (size_t)klen;
        if (op == ZT_TCP_STORE_SET) {
            if (arg > ZT_TCP_STORE_MAX_VALUE)
                return false;
            total += (size_t)arg;
            if (c->in_len - pos < total)
                break;
        } else if (op != ZT_TCP_STORE_GET && op != ZT_TCP_STORE_ADD) {
            return false;
        }
        char key[ZT_TCP_STORE_MAX_KEY + 1];
        memcpy(key, p + 5, (size_t)klen);
        key[klen] = '\0';
        if (strlen(key) != klen)
            return false;
        bool ok;
        if (op == ZT_TCP_STORE_SET) {
            ok = put(s, key, p + HEADER_BYTES + klen, (size_t)arg) &&
                 queue_reply(c, ZT_TCP_STORE_OK, NULL, 0);
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

static bool on_writable(client *c) {
    while (c->out_pos < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_pos, c->out_len - c->out_pos, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c->out_pos += (size_t)n;
    }
    c->out_pos = c->out_len = 0;
    return true;
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
        s->clients[s->nclients++] = (client){.fd = fd};
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
            fds[i + 2] = (struct pollfd){
                .fd = c->fd, .events = (short)(POLLIN | (c->out_len > c->out_pos ? POLLOUT : 0))};
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
                keep = on_writable(c);
            if (!keep)
                drop_client(s, i);
        }
        if (fds[1].revents & POLLIN)
            accept_clients(s);
    }
    free(fds);
    return NULL;
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

zt_status zt_tcp_store_server_start(zt_tcp_store_server **out, int port) {
    *out = NULL;
    if (port < 0 || port > 65535)
        return zt_error(ZT_ERR_INVALID, "rendezvous store: port %d is not in [0, 65535]", port);
    zt_tcp_store_server *s = calloc(1, sizeof *s);
    if (!s)
        return zt_error(ZT_ERR_NOMEM, "rendezvous store: out of memory");
    int err = 0;
    s->listen_fd = listen_any(port, &err);
    if (s->listen_fd < 0) {
        free(s);
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
        free(s);
        return zt_error(ZT_ERR_IO, "rendezvous store: pipe: %s", strerror(err));
    }
    err = pthread_create(&s->thread, NULL, serve, s);
    if (err) {
        close(s->wake[0]);
        close(s->wake[1]);
        close(s->listen_fd);
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
    free(s);
}
