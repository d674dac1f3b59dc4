/* ztraind's gRPC server: the ztrain.v1.Trainer service, grpc.health.v1.Health/Check and gRPC
 * server reflection (grpc.reflection.v1 and v1alpha, answered from the descriptors compiled at
 * build time, so grpcurl needs no .proto) on gRPC's C core (no C++), one completion queue
 * drained by the thread that calls zt_grpc_server_run, one state machine per call. Every
 * Trainer method goes through the job manager (job_manager.h). */
#ifndef ZTRAIN_GRPC_SERVER_H
#define ZTRAIN_GRPC_SERVER_H

#include <signal.h>
#include <stddef.h>

#include "daemon/job_manager.h"
#include "api/page_token.h"
#include "api/tls.h"
#include "ztrain/status.h"

typedef struct {
    const char *addr;           /* "127.0.0.1:50051"; port 0 picks a free one */
    /* NULL: no authentication; else every call needs "authorization: Bearer <token>" with
     * one of these tokens (UNAUTHENTICATED), whose scope allows the method (PERMISSION_DENIED):
     * SubmitJob needs submit, CancelJob and any method not known to read needs admin, the
     * others read (api/auth.h). They must outlive the server. */
    const struct zt_auth_tokens *tokens;
    size_t max_message_bytes;   /* largest request accepted (0: 4 MiB) */
    int max_connections;        /* TCP connections open at once; past it a new one is closed
                                   as it is accepted (0: no bound). Running out of file
                                   descriptors never stops the listener: what cannot be
                                   accepted is closed, and serving goes on once fds are free */
    int handshake_timeout_ms;   /* a connection that has not begun HTTP/2 within this is closed
                                   (0: gRPC's 120 s) */
    int idle_timeout_ms;        /* a connection with no call open for this long is closed with
                                   a GOAWAY, which clients take as "reconnect when needed"
                                   (0: never) */
    /* NULL, or no cert in it: plaintext. Else TLS with tls->cert and tls->key; with tls->ca
     * too, every client must present a certificate that one of those CAs signed (mutual TLS),
     * or its handshake fails. Copied by zt_grpc_server_create. */
    const zt_tls_pem *tls;
    /* Signs and checks page tokens (api/page_token.h): the state directory's key, so that
     * tokens outlive a restart and both servers read each other's. Required; copied. */
    const zt_page_key *page_key;
} zt_grpc_server_config;

typedef struct zt_grpc_server zt_grpc_server;

/* Binds and starts serving. SO_REUSEPORT is off, so a port already in use is ZT_ERR_IO naming
 * the address, never a second silent server. jm must outlive the server. One server per
 * process: the connection bound lives in process-wide state (grpc_accept.c). */
zt_status zt_grpc_server_create(zt_grpc_server **out, const zt_grpc_server_config *cfg, zt_jobs *jm);
/* The bound port (useful with port 0). */
int zt_grpc_server_port(const zt_grpc_server *s);
/* Serves on the calling thread until *stop becomes non-zero (polled at least every 200 ms), then
 * cancels every open call (streams end UNAVAILABLE) and returns. */
void zt_grpc_server_run(zt_grpc_server *s, volatile sig_atomic_t *stop);
void zt_grpc_server_destroy(zt_grpc_server *s);

#endif
