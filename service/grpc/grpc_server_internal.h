/* What ztraind's gRPC server shares between grpc_server.c (the completion queue, the call state
 * machine and sending) and grpc_methods.c (the method handlers and the method table). Not an
 * API: nothing outside these two files includes it. */
#ifndef ZTRAIN_GRPC_SERVER_INTERNAL_H
#define ZTRAIN_GRPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <protobuf-c/protobuf-c.h>

#include "grpc_server.h"
#include "api/api_error.h"
#include "api/api_ops.h"
#include "api/auth.h"
#include "daemon/job_manager.h"
#include "ztrain/status.h"

typedef enum {
    M_SUBMIT, M_GET, M_LIST, M_CANCEL, M_WATCH, M_METRICS, M_LOGS, M_HEALTH,
    M_CHECKPOINTS, M_EFFECTIVE_CONFIG, M_ANOMALIES, M_DELIVERIES,
    M_REFLECTION, M_REFLECTION_ALPHA, M_HEALTH_WATCH,
    M_COUNT,
    M_UNKNOWN = M_COUNT /* a method nobody registered: answered UNIMPLEMENTED */
} method_id;

typedef enum { TAG_NEW, TAG_SEND, TAG_STATUS, TAG_CLOSE, TAG_RECV, TAG_SHUTDOWN } tag_kind;

typedef struct call call;

typedef struct {
    tag_kind kind;
    call *c;
} tag;

typedef struct out_msg {
    struct out_msg *next;
    grpc_byte_buffer *bb;
    size_t bytes;
} out_msg;

struct zt_grpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    void *handles[M_COUNT];
    zt_jobs *jm;
    const struct zt_auth_tokens *tokens;
    zt_page_key page_key; /* signs page tokens */
    int port;
    int n_calls;          /* call structs alive, posted requests included */
    bool shutting_down;   /* shutdown_and_notify was called */
    bool server_down;     /* its tag came back and the server is destroyed */
    bool cq_down;         /* grpc_completion_queue_shutdown was called */
    bool drained;         /* the queue returned GRPC_QUEUE_SHUTDOWN */
    tag shutdown_tag;
    /* Calls served off the queue's thread (grpc_server.c, off_queue): how many run now, and
     * those that ended while their handler still held them, freed by the queue's thread. */
    pthread_mutex_t off_mu;
    int off_running;      /* SubmitJob checks */
    int off_watching;     /* WatchJob replays */
    call *off_done;
};

struct call {
    zt_grpc_server *srv;
    method_id method;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;     /* the request of a registered method */
    grpc_byte_buffer *received;    /* a client-streaming method's message just received */
    grpc_call_details details;     /* M_UNKNOWN: the method's name */
    tag t_new, t_send, t_status, t_close, t_recv;
    int cancelled;                 /* written by RECV_CLOSE_ON_SERVER */
    /* The caller's token (scope ADMIN and no identity when the server takes no tokens). */
    zt_auth_caller who;

    /* Everything below is shared with watch callbacks and guarded by mu, which also serialises
     * grpc_call_start_batch on this call. */
    pthread_mutex_t mu;
    /* Signalled when a message has gone out or the call ended: a replay waiting for its client
     * to read (on_job_event, WatchJob) may go on. */
    pthread_cond_t room;
    /* Set by whichever thread registered it; removed by the queue's thread when the call
     * closes, or by the registering thread when the call closed first. */
    zt_job_watch *watch;
    int pending;                   /* batches started whose tags have not come back */
    bool md_sent;                  /* initial metadata went out (with the first batch) */
    grpc_metadata server_md;       /* that metadata: server: ztraind/VERSION */
    bool sending;                  /* a SEND_MESSAGE is in flight: at most one at a time */
    bool status_started;
    bool broken;                   /* a send failed: the call is dead, only CLOSE will come */
    bool closed;
    bool replaying;                /* inside zt_jobs_watch: a terminal state waits for its end */
    bool terminal_seen;
    bool finishing;                /* the status is decided; it follows the queued messages */
    bool held;                     /* a handler on another thread still uses the call */
    call *next_done;               /* in srv->off_done */
    grpc_status_code status;
    char *status_text;
    /* The error's google.rpc.Status (grpc-status-details-bin), kept until the call is freed
     * because the status batch refers to it. */
    grpc_metadata trailer;
    bool has_trailer;
    grpc_byte_buffer *in_flight;   /* the message of the SEND or STATUS batch in flight */
    out_msg *head, *tail;
    size_t queued_bytes;
};

/* grpc_server.c: replying on a call. The _locked ones want c->mu held; the others take it. */

/* Decides the call's status; the first decision wins. An error drops what is still queued. */
void zt_call_finish_locked(call *c, grpc_status_code code, const char *text);
void zt_call_finish(call *c, grpc_status_code code, const char *text);
/* Finishes with a structured error: its code, message and google.rpc.Status detail. */
void zt_call_finish_error(call *c, const zt_api_error *e);
/* An INVALID_ARGUMENT (or other code) naming the request field at fault in a BadRequest. */
void zt_call_finish_field(call *c, grpc_status_code code, const char *field, const char *text);
/* A list request's page_size as the page to serve: 0 asks for def, more than max gets max. A
 * negative one finishes the call (INVALID_ARGUMENT naming page_size) and returns false. */
bool zt_call_page_size(call *c, int32_t page_size, int def, int max, int *out);
/* Finishes with the structured error of a failed zt_status and zt_last_error(), read at once on
 * the calling thread; scope prefixes the field paths the message names ("spec" for a submit) and
 * job_id names the job a NOT_FOUND is about (either may be NULL). */
void zt_call_finish_zt(call *c, zt_status s, const char *scope, const char *job_id);
/* Queues a packed message and takes ownership of bb; a client too far behind ends the call. */
void zt_call_push_locked(call *c, grpc_byte_buffer *bb);
/* A unary reply: the message and status OK in one batch. */
void zt_call_reply(call *c, const ProtobufCMessage *msg);
/* Queues one message of a stream; the call goes on. */
void zt_call_send(call *c, const ProtobufCMessage *msg);

/* grpc_methods.c: what each method's request is and who handles it. The handler runs on the
 * queue's thread with the unpacked request, which the caller frees after; it ends the call, or
 * (streams) leaves a watch that will. A method whose requests stream in (stream_in) gets one
 * handler call per message and ends with OK when the client closes its side, unless a handler
 * ended it first. */
typedef void (*handler_fn)(call *c, ProtobufCMessage *req);

typedef struct {
    const char *path;
    const ProtobufCMessageDescriptor *request;
    handler_fn handle;
    bool stream_in;
    zt_api_op op;         /* what the method does, for the scope it needs (api_ops.h) */
} method_def;

extern const method_def zt_grpc_methods[M_COUNT];

/* grpc_job_lists.c: ListCheckpoints, GetEffectiveConfig, ListAnomalies and
 * ListWebhookDeliveries. */
void zt_grpc_list_checkpoints(call *c, ProtobufCMessage *req);
void zt_grpc_get_effective_config(call *c, ProtobufCMessage *req);
void zt_grpc_list_anomalies(call *c, ProtobufCMessage *req);
void zt_grpc_list_webhook_deliveries(call *c, ProtobufCMessage *req);

/* grpc_reflection.c: one ServerReflectionRequest (v1 or v1alpha: the same messages on the wire)
 * answered from the descriptor set embedded at build time. */
void zt_grpc_reflection_handle(call *c, ProtobufCMessage *req);

/* grpc_accept.c: the gate on gRPC's accept4 calls. Start finds gRPC's listening sockets on
 * `port` (after grpc_server_add_http2_port) and, from then on, keeps at most max_connections
 * (0: no bound) of their connections open and gets the listener through EMFILE. Stop lets
 * every accept through untouched again; it is safe to call when start was not. */
zt_status zt_grpc_accept_guard_start(int port, int max_connections);
void zt_grpc_accept_guard_stop(void);

#endif
