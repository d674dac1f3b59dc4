/* A job's metrics endpoint for ranks on other hosts. Under the local launcher rank 0 inherits a
 * pipe (ZTRAIN_METRICS_FD); a rank that Slurm starts on another node cannot, so ztraind listens
 * on a TCP port per job instead and hands rank 0 ZTRAIN_METRICS_ADDR=HOST:PORT and
 * ZTRAIN_METRICS_TOKEN. Rank 0 connects, sends "ztrain-metrics <token>\n", and then writes the
 * same JSON lines it would write to the pipe. A connection with the wrong first line is closed;
 * the first good one becomes the job's metrics stream and the port closes.
 *
 * Owned by the supervisor thread; nothing here blocks. */
#ifndef ZTRAIN_METRICS_LISTENER_H
#define ZTRAIN_METRICS_LISTENER_H

#include <poll.h>

#include "ztrain/status.h"

typedef struct zt_metrics_listener zt_metrics_listener;

/* The handshake line's first word. */
#define ZT_METRICS_HELLO "ztrain-metrics"

/* Listens on host (an IPv4/IPv6 address or a name) at a free port, with a fresh random token.
 * host is where rank 0 connects, so it must be an address of this host and not the unspecified
 * one (0.0.0.0, ::): those are ZT_ERR_INVALID; a name that does not resolve, or a socket that
 * cannot be made, ZT_ERR_IO. Each message names --metrics-host, the host and the reason.
 * ztraind makes and drops one at startup, so that a bad --metrics-host stops it there rather
 * than failing every job. */
zt_status zt_metrics_listener_create(zt_metrics_listener **out, const char *host);
/* Closes the port and any connection not yet handed out. NULL is fine. */
void zt_metrics_listener_destroy(zt_metrics_listener *l);

/* "HOST:PORT" ("[::1]:PORT" for IPv6) and the token, for the ranks' environment. Valid until
 * destroy. */
const char *zt_metrics_listener_addr(const zt_metrics_listener *l);
const char *zt_metrics_listener_token(const zt_metrics_listener *l);

/* The descriptors to poll for POLLIN (the port, then connections still in their handshake):
 * at most cap go into pfd; returns how many. */
int zt_metrics_listener_fds(const zt_metrics_listener *l, struct pollfd *pfd, int cap);

/* Accepts and reads what is ready, drops handshakes older than 10 s. Returns the descriptor of
 * a connection that sent the right token (non-blocking, close-on-exec, now the caller's; the
 * next byte is the first metrics line), or -1. After one is returned the port is closed and
 * this returns -1. `rejected` (may be NULL) counts connections closed for a bad handshake. */
int zt_metrics_listener_step(zt_metrics_listener *l, int *rejected);

#endif
