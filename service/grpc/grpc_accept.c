/* The gate in front of gRPC's listener (grpc_server_internal.h): a bound on the connections it
 * holds, and a way through file-descriptor exhaustion that gRPC 1.51 does not have.
 *
 * gRPC's C core (1.51, Debian bookworm) treats any accept4 error other than EAGAIN and
 * ECONNABORTED as the end of its listener: after one EMFILE the port is never polled again and
 * every later client waits in the backlog for ever. Nor does it have a connection bound (that
 * arrived in later releases as grpc.max_allowed_incoming_connections). Both need a say in the
 * accept itself, so this file defines accept4: the executable's definition comes before libc's
 * for every shared library the program loads, libgrpc's included. Calls on any other socket
 * (libmicrohttpd's listener, a job's metrics listener) go straight to the system call.
 *
 * On gRPC's listening sockets it admits a connection while fewer than the bound are open, and
 * closes it at once otherwise. Open connections are counted by their socket inodes: gRPC closes
 * them without telling us, so when the bound is reached the list is pruned of entries whose
 * descriptor no longer names the same socket. When the process is out of descriptors, a spare
 * one (/dev/null) is given up to accept and close what waits in the backlog, and gRPC is told
 * EAGAIN: the listener stays armed and serves the next client once descriptors are free. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "grpc_server_internal.h"
#include "daemon/oplog.h"

/* A wildcard address may give gRPC one socket for IPv6 and one for IPv4. */
#define MAX_LISTENERS 4
/* Pruning stats every counted connection; under a flood at the bound it runs at most this
 * often, and connections in between are refused on the last count. */
#define PRUNE_EVERY_MS 100
/* Connections accepted and refused in one call before gRPC's thread gets back to its other
 * work; the rest wait for the next readiness of the listener. */
#define REFUSE_PER_CALL 1024
#define LOG_EVERY_MS 10000

typedef struct {
    int fd;
    dev_t dev;
    ino_t ino;
} counted;

static struct {
    pthread_mutex_t mu;
    int listeners[MAX_LISTENERS];
    int n_listeners;
    int max;                 /* the bound; 0: none */
    counted *open;           /* connections admitted and maybe still open */
    int n_open, cap;
    int64_t last_prune_ms;
    int spare;               /* /dev/null, given up to drain the backlog at EMFILE */
    int64_t last_log_ms;
    long refused_bound, refused_fds;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .spare = -1};

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int raw_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    return (int)syscall(SYS_accept4, fd, addr, len, flags);
}

static bool is_listener_locked(int fd) {
    for (int i = 0; i < g.n_listeners; i++)
        if (g.listeners[i] == fd)
            return true;
    return false;
}

/* Drops the entries whose descriptor was closed (or now names another file). */
static void prune_locked(void) {
    int64_t now = mono_ms();
    if (now - g.last_prune_ms < PRUNE_EVERY_MS)
        return;
    g.last_prune_ms = now;
    int kept = 0;
    for (int i = 0; i < g.n_open; i++) {
        struct stat st;
        counted c = g.open[i];
        if (fstat(c.fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == c.dev &&
            st.st_ino == c.ino)
            g.open[kept++] = c;
    }
    g.n_open = kept;
}

static bool admit_locked(int fd) {
    if (g.max <= 0)
        return true;
    if (g.n_open >= g.max)
        prune_locked();
    if (g.n_open >= g.max)
        return false;
    if (g.n_open == g.cap) {
        int cap = g.cap ? 2 * g.cap : 64;
        counted *p = realloc(g.open, (size_t)cap * sizeof *p);
        if (!p)
            return false;
        g.open = p;
        g.cap = cap;
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        return false;
    g.open[g.n_open++] = (counted){fd, st.st_dev, st.st_ino};
    return true;
}

/* With no descriptor left, one waiting connection is taken in place of the spare and closed. */
static bool shed_one_locked(int listener) {
    if (g.spare < 0)
        g.spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (g.spare < 0)
        return false;
    close(g.spare);
    int c = raw_accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (c >= 0)
        close(c);
    g.spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return c >= 0;
}

static void log_refusals_locked(void) {
    int64_t now = mono_ms();
    if ((!g.refused_bound && !g.refused_fds) || now - g.last_log_ms < LOG_EVERY_MS)
        return;
    g.last_log_ms = now;
    if (g.refused_bound)
        zt_oplog(ZT_LOG_WARNING, "grpc: refused %ld connection(s): %d are open, which is the bound "
                                 "(--max-grpc-connections)\n", g.refused_bound, g.n_open);
    if (g.refused_fds)
        zt_oplog(ZT_LOG_WARNING, "grpc: refused %ld connection(s): the process is out of file "
                                 "descriptors\n", g.refused_fds);
    g.refused_bound = g.refused_fds = 0;
}

static int guarded_accept_locked(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    int refused = 0;
    while (refused < REFUSE_PER_CALL) {
        socklen_t len_in = len ? *len : 0;
        int c = raw_accept4(fd, addr, len, flags);
        if (c >= 0) {
            if (admit_locked(c))
                return c;
            close(c);
            g.refused_bound++;
            refused++;
            if (len)
                *len = len_in;
            continue;
        }
        if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM) {
            int e = errno;
            log_refusals_locked();
            errno = e;
            return -1;
        }
        if (!shed_one_locked(fd))
            break;
        g.refused_fds++;
        refused++;
    }
    log_refusals_locked();
    /* Every way out but a connection says "nothing now": any other error would end gRPC's
     * listener for good. */
    errno = EAGAIN;
    return -1;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    pthread_mutex_lock(&g.mu);
    if (!is_listener_locked(fd)) {
        pthread_mutex_unlock(&g.mu);
        return raw_accept4(fd, addr, len, flags);
    }
    int c = guarded_accept_locked(fd, addr, len, flags);
    int e = errno;
    pthread_mutex_unlock(&g.mu);
    errno = e;
    return c;
}

/* Whether fd is a listening TCP socket bound to `port`. */
static bool listens_on(int fd, int port) {
    int yes = 0, type = 0;
    socklen_t n = sizeof yes;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &yes, &n) != 0 || !yes)
        return false;
    n = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n) != 0 || type != SOCK_STREAM)
        return false;
    struct sockaddr_storage a;
    n = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &n) != 0)
        return false;
    if (a.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&a)->sin_port) == port;
    if (a.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&a)->sin6_port) == port;
    return false;
}

zt_status zt_grpc_accept_guard_start(int port, int max_connections) {
    /* The gate works only if the dynamic linker resolves accept4 to this file's, which it does
     * when the executable exports it (the linker does so because libgrpc refers to it). A
     * build where that fails must not serve without the gate unnoticed. */
    if (dlsym(RTLD_DEFAULT, "accept4") != (void *)accept4)
        return zt_error(ZT_ERR_UNSUPPORTED, "gRPC: this build's accept4 is not the one libgrpc "
                        "calls, so the connection bound cannot be enforced");
    /* The listening sockets are gRPC's own; they are found among the process' descriptors by
     * the port gRPC reported. ztraind's other listeners (HTTP, a job's metrics) bind other
     * ports, or are not open yet. */
    int found[MAX_LISTENERS], n = 0;
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return zt_error(ZT_ERR_IO, "gRPC: /proc/self/fd: %s", strerror(errno));
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && n < MAX_LISTENERS) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (end != e->d_name && !*end && fd != dirfd(dir) && listens_on((int)fd, port))
            found[n++] = (int)fd;
    }
    closedir(dir);
    if (n == 0)
        return zt_error(ZT_ERR_IO, "gRPC: no listening socket on port %d to guard", port);
    int spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (spare < 0)
        return zt_error(ZT_ERR_IO, "gRPC: /dev/null: %s", strerror(errno));
    pthread_mutex_lock(&g.mu);
    memcpy(g.listeners, found, sizeof found[0] * (size_t)n);
    g.n_listeners = n;
    g.max = max_connections;
    g.n_open = 0;
    g.spare = spare;
    pthread_mutex_unlock(&g.mu);
    return ZT_OK;
}

void zt_grpc_accept_guard_stop(void) {
    pthread_mutex_lock(&g.mu);
    g.n_listeners = 0;
    g.max = 0;
    free(g.open);
    g.open = NULL;
    g.n_open = g.cap = 0;
    if (g.spare >= 0)
        close(g.spare);
    g.spare = -1;
    pthread_mutex_unlock(&g.mu);
}
