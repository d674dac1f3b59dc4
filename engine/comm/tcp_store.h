/* A small TCP key-value store for the rendezvous of ranks on several hosts (internal to the
 * engine): rank 0 serves it at MASTER_ADDR:MASTER_PORT, every rank (rank 0 too) is a client. The
 * Gloo transport publishes its addresses through it, as torch.distributed's TCPStore does for
 * PyTorch; Debian's Gloo has file, hash and Redis stores but none over plain TCP.
 *
 * Values are byte strings under string keys; a key, once set, may be set again (the last value
 * wins). Every call that waits is bounded by a timeout and fails with ZT_ERR_TIMEOUT naming what
 * it waited for; a server that goes away is ZT_ERR_IO naming its address. One thread at a time
 * may use a client; the server runs its own thread. */
#ifndef ZTRAIN_TCP_STORE_H
#define ZTRAIN_TCP_STORE_H

#include <netdb.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/comm.h"
#include "ztrain/status.h"

/* Limits the server enforces: a request past them drops the connection that sent it. */
#define ZT_TCP_STORE_MAX_KEY 1024
#define ZT_TCP_STORE_MAX_VALUE ((size_t)64 << 20)

/* The wire format, shared by the server and the client. A request: op (1 byte), key length (4
 * bytes), the key, then an 8-byte argument (SET: the value's length, followed by the value; ADD:
 * the delta; GET and AUTH: 0). A reply: status (1 byte), length (8 bytes), that many bytes of
 * value. Integers are big-endian, so hosts of either byte order may share a job. AUTH's key is
 * the job's shared secret: a server started with a secret drops a client whose first request is
 * anything else, or another secret. */
enum { ZT_TCP_STORE_SET = 1, ZT_TCP_STORE_GET = 2, ZT_TCP_STORE_ADD = 3, ZT_TCP_STORE_AUTH = 4 };
enum { ZT_TCP_STORE_OK = 0, ZT_TCP_STORE_ABSENT = 1, ZT_TCP_STORE_BAD = 2 };
#define ZT_TCP_STORE_HEADER (1 + 4 + 8)
/* Replies a client may leave unread before the server stops reading its requests: pipelined
 * requests then wait in the client's socket, not in the server's memory (issue 34). */
#define ZT_TCP_STORE_MAX_PENDING_REPLY ((size_t)1 << 20)
/* The environment variable that carries a job's rendezvous secret to its ranks (ztraind sets
 * a fresh one per job; under torchrun or Slurm, set the same value on every rank), and the one
 * that overrides the address rank 0's store binds (default: MASTER_ADDR itself). */
#define ZT_TCP_STORE_SECRET_ENV "ZTRAIN_RDZV_SECRET"
#define ZT_TCP_STORE_BIND_ENV "ZTRAIN_RDZV_BIND"

/* One request parsed from the front of a buffer. key is not NUL-terminated. */
typedef struct {
    int op;
    const char *key;
    size_t key_len;
    uint64_t arg;
    const unsigned char *value; /* SET: the value's bytes */
    size_t value_len;
    size_t total;               /* bytes the request takes */
} zt_tcp_store_request;

/* Parses the request at the front of buf[0, len): 1 with *req filled when it is whole, 0 when
 * more bytes are needed, -1 when it is malformed (an unknown op, a key empty, over
 * ZT_TCP_STORE_MAX_KEY or holding a NUL, a value over ZT_TCP_STORE_MAX_VALUE, AUTH with an
 * argument). Reads nothing past buf + len. */
int zt_tcp_store_parse(const unsigned char *buf, size_t len, zt_tcp_store_request *req);

typedef struct zt_tcp_store_server zt_tcp_store_server;
typedef struct zt_tcp_store zt_tcp_store;

/* Listens on bind_host's address (MASTER_ADDR, or $ZTRAIN_RDZV_BIND; NULL: every address of
 * this host) at port (0: a free port the kernel picks, see zt_tcp_store_server_port) and serves
 * any number of clients from a thread of its own until zt_tcp_store_server_stop. With a secret
 * (not NULL or empty), a client must AUTH with it first. A port in use is ZT_ERR_IO saying so
 * and naming the port; an address not of this host names it. */
zt_status zt_tcp_store_server_start(zt_tcp_store_server **out, const char *bind_host, int port,
                                    const char *secret);
int zt_tcp_store_server_port(const zt_tcp_store_server *s);
/* Stops the thread, closes every connection (clients then see ZT_ERR_IO) and frees the server;
 * NULL is fine. */
void zt_tcp_store_server_stop(zt_tcp_store_server *s);

/* Connects to the server at host:port, retrying while it is not listening yet (rank 0 may start
 * after the others) for up to timeout_s seconds, which also bounds every later request's reply,
 * and authenticates with secret when there is one (a refusal is ZT_ERR_IO saying so).
 * A host that does not resolve within the timeout is ZT_ERR_TIMEOUT naming it
 * (zt_tcp_store_resolve); no server within the timeout is ZT_ERR_TIMEOUT naming host:port and
 * the last error. Free with zt_tcp_store_close. */
zt_status zt_tcp_store_connect(zt_tcp_store **out, const char *host, int port, double timeout_s,
                               const char *secret);
/* Resolves host:port (MASTER_ADDR's name) for sockets of socktype into *res (the caller frees
 * it with freeaddrinfo), asking again at growing intervals while it does not resolve, for up to
 * timeout_s seconds: a pod's DNS name on Kubernetes may appear after the pod that looks it up
 * starts, and PyTorch waits for it as long. A name still unresolved at the deadline is
 * ZT_ERR_TIMEOUT "<what> '<host>' did not resolve within T s: <reason>". */
zt_status zt_tcp_store_resolve(const char *what, const char *host, int port, int socktype,
                               double timeout_s, struct addrinfo **res);
/* Rank 0's store for the job d describes: zt_tcp_store_server_start at d->master_port on
 * zt_tcp_store_bind_host(d->master_addr) with zt_tcp_store_secret(). A port in use is named
 * with where it came from (d->port_origin: "MASTER_PORT+1: torchrun's agent store holds
 * MASTER_PORT=29500"). */
zt_status zt_tcp_store_serve_job(zt_tcp_store_server **out, const zt_dist_info *d);
/* The job's rendezvous secret ($ZTRAIN_RDZV_SECRET; NULL when unset or empty) and the address
 * rank 0's store binds: $ZTRAIN_RDZV_BIND when set, else master_addr. */
const char *zt_tcp_store_secret(void);
const char *zt_tcp_store_bind_host(const char *master_addr);
void zt_tcp_store_close(zt_tcp_store *c);
/* Changes the bound on each later request's reply (a short one for a last message on the way
 * out, when the server's host may be gone). */
void zt_tcp_store_set_timeout(zt_tcp_store *c, double timeout_s);

zt_status zt_tcp_store_set(zt_tcp_store *c, const char *key, const void *value, size_t len);
/* Waits up to timeout_s seconds (0: not at all) for key to exist, then returns a copy of its
 * value in *value (malloc'd, the caller frees; NUL-terminated past len for text) and its length.
 * A key still absent at the deadline is ZT_ERR_TIMEOUT naming it, with *value NULL. */
zt_status zt_tcp_store_get(zt_tcp_store *c, const char *key, void **value, size_t *len,
                           double timeout_s);
/* Waits up to timeout_s seconds for every key to exist. On ZT_ERR_TIMEOUT, *missing (when not
 * NULL) is the index of the first key still absent. */
zt_status zt_tcp_store_wait(zt_tcp_store *c, const char *const *keys, int nkeys, double timeout_s,
                            int *missing);
/* Adds delta to the integer under key (absent counts as 0) and returns the new value in *result:
 * an atomic counter, e.g. to elect the first of several ranks. The value is stored as decimal
 * text, so a get reads it too; adding to a key that holds something else is ZT_ERR_INVALID. */
zt_status zt_tcp_store_add(zt_tcp_store *c, const char *key, int64_t delta, int64_t *result);

#endif
