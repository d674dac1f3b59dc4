/* A small blocking gRPC client on gRPC's C core (one channel, one pluck completion queue), for
 * the ztrain CLI: unary calls and server streams of protobuf-c messages, an optional bearer
 * token, a deadline, and errors worded for people:
 *
 *   127.0.0.1:50051: UNAVAILABLE: failed to connect to all addresses; ...
 *   NOT_FOUND: job job-000009 not found
 *
 * Not thread-safe: one client per thread. */
#ifndef ZTRAIN_GRPC_CLIENT_H
#define ZTRAIN_GRPC_CLIENT_H

#include <stdbool.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "api/tls.h"
#include "ztrain/status.h"

typedef struct zt_rpc_client zt_rpc_client;

/* A client of the server at addr ("host:port" or "unix:/path"); the connection is made by the
 * first call. token (may be NULL) is sent as "authorization: Bearer <token>" on every call.
 * timeout_s bounds each unary call (<= 0: 30 s); streams have no deadline.
 *
 * tls NULL: plaintext. Else TLS: the server's certificate must chain to tls->ca (NULL: gRPC's
 * default roots) and name addr's host (an IP address in the certificate's subjectAltName when
 * addr is one); tls->cert and tls->key, when set, are presented for mutual TLS. Copied: tls
 * may be freed once this returns. A failed connection's message says when TLS is the likely
 * cause (a plaintext client at a TLS server, or the reverse, or a certificate not trusted). */
zt_status zt_rpc_client_create(zt_rpc_client **out, const char *addr, const char *token,
                               const zt_tls_pem *tls, double timeout_s);
void zt_rpc_client_destroy(zt_rpc_client *c);

/* Calls `method` ("/ztrain.v1.Trainer/GetJob") with req and unpacks the reply as reply_desc
 * into *reply (free with protobuf_c_message_free_unpacked(*reply, NULL)). A status other than
 * OK fails with the message above in zt_last_error(): ZT_ERR_NOT_FOUND, ZT_ERR_INVALID
 * (INVALID_ARGUMENT), ZT_ERR_LIMIT (RESOURCE_EXHAUSTED), ZT_ERR_TIMEOUT (DEADLINE_EXCEEDED),
 * ZT_ERR_IO for the rest; zt_rpc_last_code says which status it was. */
zt_status zt_rpc_call(zt_rpc_client *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply);

/* Called for each message of a stream; the message is freed after the call returns. Returning
 * false cancels the stream, which then counts as a success. */
typedef bool (*zt_rpc_message_fn)(void *ctx, const ProtobufCMessage *msg);

/* Calls a server-streaming method and hands every message to fn until the stream ends. Errors
 * as for zt_rpc_call. */
zt_status zt_rpc_stream(zt_rpc_client *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *msg_desc, zt_rpc_message_fn fn, void *ctx);

/* The status of the last call (GRPC_STATUS_OK after a success). */
grpc_status_code zt_rpc_last_code(const zt_rpc_client *c);

#endif
