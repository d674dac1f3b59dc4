/* Which process runs each rank of a shared-memory job on this host. A rank claims its place by
 * binding an abstract Unix socket named after the job's segment and its rank, and holds it while
 * its communicator lives. The kernel frees such a name when the last descriptor on it closes, so
 * a rank that ends, however abruptly, leaves nothing behind; and a second process started with
 * the same RANK finds the name taken before it touches the segment, so the job the first one
 * runs goes on and the second one's error says what happened, at once, whether the job is still
 * meeting or long past its rendezvous (when the segment's name is gone). Abstract names belong to
 * a network namespace: ranks of one host share it as they share a PID namespace. */
#define _GNU_SOURCE /* struct ucred; before any header */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "comm_shm.h"

/* Connections a duplicate's probe may leave queued on a claim, which never accepts them. */
enum { CLAIM_BACKLOG = 4 };

/* The abstract address of rank `rank` of the job whose segment is c->name: "ztrain-<uid>-<run
 * id>.rank<r>", or, for a run id too long for sun_path, a hash of it in its place. */
static socklen_t claim_address(const zt_shm_comm *c, int rank, struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    char *name = a->sun_path + 1; /* sun_path[0] = '\0' makes it abstract */
    size_t cap = sizeof a->sun_path - 1;
    int n = snprintf(name, cap, "%s.rank%d", c->name + 1, rank);
    if (n < 0 || (size_t)n >= cap) {
        uint64_t h = 0xcbf29ce484222325ULL;
        for (const char *p = c->name; *p; p++)
            h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
        n = snprintf(name, cap, "ztrain-%u-%016llx.rank%d", (unsigned)getuid(),
                     (unsigned long long)h, rank);
    }
    /* An abstract name is counted, not terminated: the length is all of it. */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* The process that holds the claim at a, through a connection its listener queues: *pid and
 * *uid, or false when that cannot be learnt (the queue is full, or the holder just ended). */
static bool claim_holder(const struct sockaddr_un *a, socklen_t len, pid_t *pid, uid_t *uid) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return false;
    struct ucred cr = {0};
    socklen_t cl = sizeof cr;
    bool ok = connect(fd, (const struct sockaddr *)a, len) == 0 &&
              getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0 && cr.pid > 0;
    close(fd);
    *pid = cr.pid;
    *uid = cr.uid;
    return ok;
}

zt_status zt_shm_claim_rank(zt_shm_comm *c) {
    const int rank = c->comm.rank;
    struct sockaddr_un a;
    socklen_t len = claim_address(c, rank, &a);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "shm rendezvous: rank %d cannot open a socket to claim its "
                        "rank: %s", rank, strerror(errno));
    if (bind(fd, (const struct sockaddr *)&a, len) == 0 && listen(fd, CLAIM_BACKLOG) == 0) {
        c->claim_fd = fd;
        return ZT_OK;
    }
    int err = errno;
    close(fd);
    if (err != EADDRINUSE)
        return zt_error(ZT_ERR_IO, "shm rendezvous: rank %d cannot claim its rank of %s: %s",
                        rank, c->name, strerror(err));
    pid_t pid;
    uid_t uid;
    if (!claim_holder(&a, len, &pid, &uid))
        return zt_error(ZT_ERR_INVALID,
                        "shm rendezvous: rank %d of %s is already held by another process on "
                        "this host: two processes have RANK=%d (is another job running with the "
                        "same run id or MASTER_PORT?)",
                        rank, c->name, rank);
    if (uid != getuid())
        return zt_error(ZT_ERR_INVALID,
                        "shm rendezvous: rank %d of %s is held by pid %d of another user (uid "
                        "%u): pick another run id (ZTRAIN_RUN_ID) or MASTER_PORT",
                        rank, c->name, (int)pid, (unsigned)uid);
    return zt_error(ZT_ERR_INVALID,
                    "shm rendezvous: rank %d of %s is already run by pid %d on this host: two "
                    "processes have RANK=%d (is another job running with the same run id or "
                    "MASTER_PORT?)",
                    rank, c->name, (int)pid, rank);
}

void zt_shm_release_rank(zt_shm_comm *c) {
    if (c->claim_fd >= 0)
        close(c->claim_fd);
    c->claim_fd = -1;
}
