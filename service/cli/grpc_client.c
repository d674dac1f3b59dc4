/* The CLI's blocking gRPC client (grpc_client.h): every batch is started and then plucked from
 * the client's own completion queue, so a call reads top to bottom. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "grpc_client.h"
#include "api/grpc_util.h"
#include "daemon/job_manager.h"

#define DEFAULT_TIMEOUT_S 30.0
/* Replies larger than gRPC's 4 MiB default: a ListJobs page of 1000 jobs with their specs. */
#define MAX_REPLY_BYTES (64 << 20)

struct zt_rpc_client {
    char *addr;
    char *auth;                 /* "Bearer <token>", or NULL */
    double timeout_s;
    bool tls, client_cert;
    /* The server has answered over this client's connection: a socket it closes later is a
     * server that went away (a restart), not one that wants TLS. */
    bool answered;
    grpc_channel *channel;
    grpc_completion_queue *cq;
    grpc_status_code last_code;
};

/* Plaintext, or TLS with the given trust roots and, for mutual TLS, the client's own pair.
 * gRPC copies the PEM text. */
static grpc_channel_credentials *channel_credentials(const zt_tls_pem *tls) {
    if (!tls)
        return grpc_insecure_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key, .cert_chain = tls->cert};
    return grpc_ssl_credentials_create_ex(tls->ca, tls->cert ? &pair : NULL, NULL, NULL);
}

/* gRPC logs each failed TLS handshake on stderr, which repeats what the call's status says. */
static void drop_log(gpr_log_func_args *args) {
    (void)args;
}

zt_status zt_rpc_client_create(zt_rpc_client **out, const char *addr, const char *token,
                               const zt_tls_pem *tls, double timeout_s) {
    *out = NULL;
    zt_rpc_client *c = calloc(1, sizeof *c);
    if (!c || !(c->addr = strdup(addr))) {
        free(c);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    if (token && *token) {
        size_t n = strlen(token) + sizeof "Bearer ";
        c->auth = malloc(n);
        if (!c->auth) {
            free(c->addr);
            free(c);
            return zt_error(ZT_ERR_NOMEM, "out of memory");
        }
        snprintf(c->auth, n, "Bearer %s", token);
    }
    c->timeout_s = timeout_s > 0 ? timeout_s : DEFAULT_TIMEOUT_S;
    c->tls = tls != NULL;
    c->client_cert = tls && tls->cert;
    /* Whoever sets GRPC_VERBOSITY wants gRPC's own log lines. */
    if (!getenv("GRPC_VERBOSITY"))
        gpr_set_log_function(drop_log);
    grpc_init();
    grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                    .value.integer = MAX_REPLY_BYTES};
    grpc_channel_args args = {.num_args = 1, .args = &arg};
    grpc_channel_credentials *creds = channel_credentials(tls);
    c->channel = grpc_channel_create(addr, creds, &args);
    grpc_channel_credentials_release(creds);
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    *out = c;
    return ZT_OK;
}

void zt_rpc_client_destroy(zt_rpc_client *c) {
    if (!c)
        return;
    grpc_channel_destroy(c->channel);
    grpc_completion_queue_shutdown(c->cq);
    grpc_completion_queue_destroy(c->cq);
    free(c->addr);
    free(c->auth);
    free(c);
    grpc_shutdown();
}

grpc_status_code zt_rpc_last_code(const zt_rpc_client *c) { return c->last_code; }

static grpc_call *new_call(zt_rpc_client *c, const char *method, bool with_deadline) {
    gpr_timespec deadline =
        with_deadline ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                     gpr_time_from_millis((int64_t)(c->timeout_s * 1000),
                                                          GPR_TIMESPAN))
                      : gpr_inf_future(GPR_CLOCK_REALTIME);
    return grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                    grpc_slice_from_static_string(method), NULL, deadline, NULL);
}

static bool wait_tag(zt_rpc_client *c, void *tag) {
    grpc_event ev = grpc_completion_queue_pluck(c->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* Starts a batch and waits for it; false when the batch failed (the status says why). */
static bool run_batch(zt_rpc_client *c, grpc_call *call, const grpc_op *ops, size_t n, void *tag) {
    grpc_call_error e = grpc_call_start_batch(call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        fprintf(stderr, "ztrain: grpc: starting a batch failed: %s\n", grpc_call_error_to_string(e));
        return false;
    }
    return wait_tag(c, tag);
}

/* Why a connection failed, when TLS is the likely cause: gRPC only says the socket closed or
 * which OpenSSL check failed, which does not tell a user which flag to change. */
static const char *tls_hint(const zt_rpc_client *c, const char *details) {
    bool closed = strstr(details, "Socket closed") != NULL;
    if (!c->tls)
        return closed && !c->answered
                   ? " (a TLS server closes plaintext connections: if ztraind runs with "
                     "--tls-cert, give --tls-ca FILE or set ZTRAIN_TLS_CA)"
                   : "";
    if (strstr(details, "wrong version number"))
        return " (the server does not speak TLS: is ztraind running without --tls-cert?)";
    if (strstr(details, "certificate verify failed"))
        return " (the server's certificate is not signed by a CA of --tls-ca, or does not name "
               "the host of --server in its subjectAltName)";
    if (closed)
        return c->client_cert ? " (a server under mutual TLS closes connections whose client "
                                "certificate no CA of its --tls-client-ca signed)"
                              : " (a server under mutual TLS closes connections without a "
                                "client certificate: give --tls-cert and --tls-key)";
    return "";
}

/* What a status becomes: the code's name and the details, with the address first when the
 * trouble is reaching the server rather than what it answered. */
static zt_status status_error(zt_rpc_client *c, grpc_status_code code, grpc_slice details) {
    c->last_code = code;
    if (code == GRPC_STATUS_OK)
        return ZT_OK;
    char *text = grpc_slice_to_c_string(details);
    bool transport = code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED;
    zt_status s = code == GRPC_STATUS_NOT_FOUND           ? ZT_ERR_NOT_FOUND
                  : code == GRPC_STATUS_INVALID_ARGUMENT   ? ZT_ERR_INVALID
                  : code == GRPC_STATUS_RESOURCE_EXHAUSTED ? ZT_ERR_LIMIT
                  : code == GRPC_STATUS_DEADLINE_EXCEEDED  ? ZT_ERR_TIMEOUT
                                                           : ZT_ERR_IO;
    zt_error(s, "%s%s%s%s%s%s", transport ? c->addr : "", transport ? ": " : "",
             zt_grpc_status_name(code), text[0] ? ": " : "", text,
             code == GRPC_STATUS_UNAVAILABLE ? tls_hint(c, text) : "");
    gpr_free(text);
    return s;
}

/* The request's ops: initial metadata (the token), the message, and the end of the request. */
static size_t request_ops(zt_rpc_client *c, grpc_op *ops, grpc_metadata *md, grpc_byte_buffer *bb) {
    memset(ops, 0, 3 * sizeof *ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (c->auth) {
        md->key = grpc_slice_from_static_string("authorization");
        md->value = grpc_slice_from_static_string(c->auth);
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = md;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    return 3;
}

/* The ops and results of receiving a call's status. */
typedef struct {
    grpc_metadata_array initial, trailing;
    grpc_status_code code;
    grpc_slice details;
} call_result;

static void result_init(call_result *r) {
    grpc_metadata_array_init(&r->initial);
    grpc_metadata_array_init(&r->trailing);
    r->code = GRPC_STATUS_UNKNOWN;
    r->details = grpc_empty_slice();
}

static void result_destroy(call_result *r) {
    grpc_metadata_array_destroy(&r->initial);
    grpc_metadata_array_destroy(&r->trailing);
    grpc_slice_unref(r->details);
}

static void status_op(grpc_op *op, call_result *r) {
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op->data.recv_status_on_client.trailing_metadata = &r->trailing;
    op->data.recv_status_on_client.status = &r->code;
    op->data.recv_status_on_client.status_details = &r->details;
}

static zt_status bad_reply(zt_rpc_client *c, const ProtobufCMessageDescriptor *desc) {
    c->last_code = GRPC_STATUS_INTERNAL;
    return zt_error(ZT_ERR_FORMAT, "%s: the server's reply is not a valid %s", c->addr, desc->name);
}

zt_status zt_rpc_call(zt_rpc_client *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply) {
    *reply = NULL;
    grpc_call *call = new_call(c, method, true);
    grpc_byte_buffer *bb = zt_pb_pack(req), *got = NULL;
    call_result r;
    result_init(&r);
    grpc_op ops[6];
    grpc_metadata md;
    size_t n = request_ops(c, ops, &md, bb);
    memset(&ops[n], 0, 3 * sizeof ops[0]);
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &r.initial;
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &got;
    status_op(&ops[n++], &r);
    int tag;
    zt_status s = run_batch(c, call, ops, n, &tag)
                      ? status_error(c, r.code, r.details)
                      : zt_error(ZT_ERR_IO, "%s: the call to %s failed", c->addr, method);
    c->answered |= got != NULL;
    if (s == ZT_OK && !(*reply = zt_pb_unpack(reply_desc, got)))
        s = bad_reply(c, reply_desc);
    if (got)
        grpc_byte_buffer_destroy(got);
    grpc_byte_buffer_destroy(bb);
    result_destroy(&r);
    grpc_call_unref(call);
    return s;
}

/* Reads messages until the stream ends, fn asks to stop (*stopped), or a message does not
 * decode. */
static zt_status read_stream(zt_rpc_client *c, grpc_call *call,
                             const ProtobufCMessageDescriptor *desc, zt_rpc_message_fn fn, void *ctx,
                             bool *stopped) {
    *stopped = false;
    for (;;) {
        grpc_byte_buffer *got = NULL;
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &got;
        int tag;
        if (!run_batch(c, call, &op, 1, &tag) || !got)
            return ZT_OK;
        c->answered = true;
        ProtobufCMessage *m = zt_pb_unpack(desc, got);
        grpc_byte_buffer_destroy(got);
        if (!m) {
            grpc_call_cancel(call, NULL);
            return bad_reply(c, desc);
        }
        bool go_on = fn(ctx, m);
        protobuf_c_message_free_unpacked(m, NULL);
        if (!go_on) {
            *stopped = true;
            grpc_call_cancel(call, NULL);
            return ZT_OK;
        }
    }
}

zt_status zt_rpc_stream(zt_rpc_client *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *msg_desc, zt_rpc_message_fn fn,
                        void *ctx) {
    grpc_call *call = new_call(c, method, false);
    grpc_byte_buffer *bb = zt_pb_pack(req);
    call_result r;
    result_init(&r);
    grpc_op ops[4];
    grpc_metadata md;
    size_t n = request_ops(c, ops, &md, bb);
    memset(&ops[n], 0, sizeof ops[0]);
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &r.initial;
    /* The status is asked for at once; it completes last, after the final message. */
    grpc_op st;
    status_op(&st, &r);
    int send_tag, status_tag;
    zt_status s = ZT_OK;
    bool stopped_by_fn = false;
    if (grpc_call_start_batch(call, &st, 1, &status_tag, NULL) != GRPC_CALL_OK) {
        s = zt_error(ZT_ERR_IO, "%s: the call to %s could not start", c->addr, method);
    } else {
        if (run_batch(c, call, ops, n, &send_tag))
            s = read_stream(c, call, msg_desc, fn, ctx, &stopped_by_fn);
        wait_tag(c, &status_tag);
        if (s == ZT_OK)
            s = status_error(c, r.code, r.details);
        /* A stream the caller cancelled ends CANCELLED, which is what it asked for. */
        if (s != ZT_OK && stopped_by_fn && r.code == GRPC_STATUS_CANCELLED) {
            c->last_code = GRPC_STATUS_OK;
            s = ZT_OK;
        }
    }
    grpc_byte_buffer_destroy(bb);
    result_destroy(&r);
    grpc_call_unref(call);
    return s;
}
