/* ztraind's gRPC server (grpc_server.h): ztrain.v1.Trainer, grpc.health.v1.Health/Check and
 * server reflection on gRPC's C core, one completion queue drained by zt_grpc_server_run. This
 * file is the queue, the calls, receiving and sending; the methods themselves are
 * grpc_methods.c's and grpc_reflection.c's.
 *
 * Every call is a small state machine (`struct call`) whose tags all come back on that queue.
 * Each call starts a lone RECV_CLOSE_ON_SERVER when it arrives, which returns when the call is
 * over (cancelled = 1 on a client cancel or deadline); its replies go out of a FIFO one
 * SEND_MESSAGE at a time, and the status follows the last message (in the same batch when it can).
 * A call is freed on the queue's thread once it is closed and no batch of it is in flight.
 *
 * Unary methods run to completion on the queue's thread, except SubmitJob: it reads the job's
 * files, and a file system may be slow (or a path a FIFO), so it runs on a thread of its own
 * and the queue keeps serving Health, GetJob and the rest meanwhile (off_queue below).
 * WatchJob registers its watch on a thread of its own too: the history it replays from the
 * state file is paged out as the client reads (that thread waits while a window is queued), so
 * an unread stream holds a window of it rather than all of it.
 * WatchJob and StreamLogs -f register a
 * job-manager watch whose callback runs on other threads with the manager's lock held: it only
 * packs the event and queues it under the call's mutex. Lock order is manager -> call, so no
 * zt_jobs_* function is ever called with a call's mutex held, and the watch is removed from the
 * queue's thread when the call closes, never from inside the callback. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "api/auth.h"
#include "daemon/oplog.h"
#include "grpc_server.h"
#include "grpc_server_internal.h"
#include "api/grpc_util.h"

/* SubmitJobs checked at once on their own threads; one more is answered RESOURCE_EXHAUSTED. */
#define MAX_OFF_QUEUE 16
/* WatchJobs replaying a history at once, each on a thread of its own that waits while its
 * client does not read; one more is answered RESOURCE_EXHAUSTED. */
#define MAX_OFF_QUEUE_WATCHES 256
/* Requests kept posted per method: a burst of new calls beyond this waits for a re-arm, which
 * happens as soon as each one arrives. */
#define POSTED_PER_METHOD 4
#define POLL_MS 200
#define DEFAULT_MAX_MESSAGE (4u << 20)
/* A watcher that falls this far behind is ended with RESOURCE_EXHAUSTED. Metric records are
 * never dropped one by one: a client that sees the stream must see every record. */
#define STREAM_MAX_QUEUED_BYTES ((size_t)64 << 20)
/* Status details travel in HTTP/2 trailers, which clients cap (8 KiB by default). */
#define STATUS_TEXT_MAX 4000
#define KEEPALIVE_MS 60000
#define KEEPALIVE_TIMEOUT_MS 20000

/* ---- sending ----------------------------------------------------------------------------- */

/* Starts a batch of c (c->mu held). A batch the core refuses is a bug; the call is cancelled
 * so that the client is not left waiting for its deadline. */
static bool start_batch(call *c, const grpc_op *ops, size_t n, tag *t) {
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, t, NULL);
    if (e != GRPC_CALL_OK) {
        zt_oplog(ZT_LOG_ERR, "grpc: starting a batch failed: %s\n",
                 grpc_call_error_to_string(e));
        grpc_call_cancel(c->call, NULL);
        return false;
    }
    c->pending++;
    return true;
}

static void drop_queue_locked(call *c) {
    while (c->head) {
        out_msg *m = c->head;
        c->head = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    c->tail = NULL;
    c->queued_bytes = 0;
}

static grpc_byte_buffer *pop_locked(call *c) {
    out_msg *m = c->head;
    c->head = m->next;
    if (!c->head)
        c->tail = NULL;
    c->queued_bytes -= m->bytes;
    grpc_byte_buffer *bb = m->bb;
    free(m);
    return bb;
}

/* Adds the initial metadata to the first batch that sends anything: `server`, the daemon's
 * name and version as HTTP's Server header has them (docs/api.md, "Versions"). */
static size_t add_initial_md_locked(call *c, grpc_op *ops) {
    if (c->md_sent)
        return 0;
    c->md_sent = true;
    memset(ops, 0, sizeof *ops);
    ops->op = GRPC_OP_SEND_INITIAL_METADATA;
    c->server_md.key = grpc_slice_from_static_string("server");
    c->server_md.value = grpc_slice_from_static_string(ZT_SERVER_SOFTWARE);
    ops->data.send_initial_metadata.count = 1;
    ops->data.send_initial_metadata.metadata = &c->server_md;
    return 1;
}

/* Starts the next batch when none is in flight: the next message, or the status once the
 * queue is empty and the status decided. The last message and the status go together. */
static void kick_locked(call *c) {
    if (c->sending || c->status_started || c->broken || c->closed)
        return;
    bool have_message = c->head != NULL;
    bool with_status = c->finishing && (!c->head || !c->head->next);
    if (!have_message && !with_status)
        return;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = add_initial_md_locked(c, ops);
    if (have_message) {
        c->in_flight = pop_locked(c);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->in_flight;
        n++;
    }
    if (!with_status) {
        c->sending = start_batch(c, ops, n, &c->t_send);
        c->broken = !c->sending;
        return;
    }
    grpc_slice details = grpc_slice_from_copied_string(c->status_text ? c->status_text : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = c->status;
    ops[n].data.send_status_from_server.status_details = &details;
    if (c->has_trailer) {
        ops[n].data.send_status_from_server.trailing_metadata_count = 1;
        ops[n].data.send_status_from_server.trailing_metadata = &c->trailer;
    }
    n++;
    c->status_started = start_batch(c, ops, n, &c->t_status);
    c->broken = !c->status_started;
    /* The core copies the details at start_batch. */
    grpc_slice_unref(details);
}

/* A copy of text cut to STATUS_TEXT_MAX bytes on a UTF-8 character boundary. */
static char *status_text_copy(const char *text) {
    size_t n = strlen(text);
    if (n > STATUS_TEXT_MAX) {
        n = STATUS_TEXT_MAX;
        while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80)
            n--;
    }
    return strndup(text, n);
}

void zt_call_finish_locked(call *c, grpc_status_code code, const char *text) {
    if (c->finishing)
        return;
    c->finishing = true;
    c->status = code;
    c->status_text = status_text_copy(text ? text : "");
    if (code != GRPC_STATUS_OK)
        drop_queue_locked(c);
    kick_locked(c);
    pthread_cond_broadcast(&c->room);
}

void zt_call_finish(call *c, grpc_status_code code, const char *text) {
    pthread_mutex_lock(&c->mu);
    zt_call_finish_locked(c, code, text);
    pthread_mutex_unlock(&c->mu);
}

void zt_call_finish_error(call *c, const zt_api_error *error) {
    zt_api_error *e = malloc(sizeof *e);
    if (!e) {
        zt_call_finish(c, error->code, error->message);
        return;
    }
    *e = *error;
    zt_api_error_cut(e, ZT_API_GRPC_MESSAGE_MAX);
    size_t len = 0;
    uint8_t *bin = zt_api_error_status_bin(e, &len);
    pthread_mutex_lock(&c->mu);
    if (bin && !c->finishing && !c->has_trailer) {
        c->trailer.key = grpc_slice_from_static_string("grpc-status-details-bin");
        c->trailer.value = grpc_slice_from_copied_buffer((const char *)bin, len);
        c->has_trailer = true;
    }
    zt_call_finish_locked(c, e->code, e->message);
    pthread_mutex_unlock(&c->mu);
    free(bin);
    free(e);
}

void zt_call_finish_field(call *c, grpc_status_code code, const char *field, const char *text) {
    zt_api_error e;
    zt_api_error_set(&e, code, field, text);
    zt_call_finish_error(c, &e);
}

bool zt_call_page_size(call *c, int32_t page_size, int def, int max, int *out) {
    if (page_size < 0) {
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, "page_size",
                             "page_size must be >= 0");
        return false;
    }
    *out = page_size == 0 ? def : page_size > max ? max : page_size;
    return true;
}

void zt_call_finish_zt(call *c, zt_status s, const char *scope, const char *job_id) {
    zt_api_error e;
    zt_api_error_from_status(&e, s, zt_last_error(), scope, job_id);
    zt_call_finish_error(c, &e);
}

void zt_call_push_locked(call *c, grpc_byte_buffer *bb) {
    size_t bytes = grpc_byte_buffer_length(bb);
    if (c->finishing || c->broken || c->closed) {
        grpc_byte_buffer_destroy(bb);
        return;
    }
    if (c->queued_bytes + bytes > STREAM_MAX_QUEUED_BYTES) {
        grpc_byte_buffer_destroy(bb);
        char text[160];
        snprintf(text, sizeof text, "the client fell more than %zu MiB behind the stream",
                 STREAM_MAX_QUEUED_BYTES >> 20);
        zt_call_finish_locked(c, GRPC_STATUS_RESOURCE_EXHAUSTED, text);
        return;
    }
    out_msg *m = malloc(sizeof *m);
    if (!m) {
        grpc_byte_buffer_destroy(bb);
        zt_call_finish_locked(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind is out of memory");
        return;
    }
    *m = (out_msg){.bb = bb, .bytes = bytes};
    if (c->tail)
        c->tail->next = m;
    else
        c->head = m;
    c->tail = m;
    c->queued_bytes += bytes;
    kick_locked(c);
}

void zt_call_reply(call *c, const ProtobufCMessage *msg) {
    grpc_byte_buffer *bb = zt_pb_pack(msg);
    pthread_mutex_lock(&c->mu);
    zt_call_push_locked(c, bb);
    zt_call_finish_locked(c, GRPC_STATUS_OK, "");
    pthread_mutex_unlock(&c->mu);
}

void zt_call_send(call *c, const ProtobufCMessage *msg) {
    grpc_byte_buffer *bb = zt_pb_pack(msg);
    pthread_mutex_lock(&c->mu);
    zt_call_push_locked(c, bb);
    pthread_mutex_unlock(&c->mu);
}

/* ---- requests that stream in ------------------------------------------------------------- */

/* Asks for the client's next message (at most one RECV_MESSAGE is in flight per call). */
static void receive_next(call *c) {
    pthread_mutex_lock(&c->mu);
    if (!c->finishing && !c->broken && !c->closed) {
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &c->received;
        start_batch(c, &op, 1, &c->t_recv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* A message arrived (or the client closed its side: no message). Runs before the tag's batch
 * is counted as done, so the call cannot be freed under the handler. */
static void on_received(call *c, bool ok) {
    grpc_byte_buffer *bb = c->received;
    c->received = NULL;
    if (!ok || !bb) {
        /* !ok: the call is gone and its CLOSE will follow; else the client is done asking. */
        if (ok)
            zt_call_finish(c, GRPC_STATUS_OK, "");
        if (bb)
            grpc_byte_buffer_destroy(bb);
        return;
    }
    char why[256];
    const method_def *def = &zt_grpc_methods[c->method];
    ProtobufCMessage *req = zt_pb_unpack_request(def->request, bb, why, sizeof why);
    grpc_byte_buffer_destroy(bb);
    if (!req) {
        char text[256], field[160];
        snprintf(text, sizeof text, "a message is not a valid %s", def->request->name);
        zt_api_error_field(why, NULL, field, sizeof field);
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, why[0] ? field : NULL,
                             why[0] ? why : text);
        return;
    }
    def->handle(c, req);
    protobuf_c_message_free_unpacked(req, NULL);
    receive_next(c);
}

/* ---- call lifecycle ---------------------------------------------------------------------- */

static void call_free(call *c) {
    c->srv->n_calls--;
    drop_queue_locked(c);
    if (c->in_flight)
        grpc_byte_buffer_destroy(c->in_flight);
    if (c->received)
        grpc_byte_buffer_destroy(c->received);
    if (c->has_trailer)
        grpc_slice_unref(c->trailer.value);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    grpc_metadata_array_destroy(&c->md);
    if (c->method == M_UNKNOWN)
        grpc_call_details_destroy(&c->details);
    if (c->call)
        grpc_call_unref(c->call);
    free(c->status_text);
    pthread_cond_destroy(&c->room);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Posts one request for a new call of method m. */
static void post_request(zt_grpc_server *s, method_id m) {
    call *c = calloc(1, sizeof *c);
    if (!c) {
        zt_oplog(ZT_LOG_ERR, "grpc: out of memory posting a request\n");
        return;
    }
    s->n_calls++;
    c->srv = s;
    c->method = m;
    c->t_new = (tag){TAG_NEW, c};
    c->t_send = (tag){TAG_SEND, c};
    c->t_status = (tag){TAG_STATUS, c};
    c->t_close = (tag){TAG_CLOSE, c};
    c->t_recv = (tag){TAG_RECV, c};
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->room, NULL);
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    if (m == M_UNKNOWN) {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq,
                                     &c->t_new);
    } else {
        /* A method whose requests stream in reads them with RECV_MESSAGE, not here. */
        e = grpc_server_request_registered_call(s->server, s->handles[m], &c->call, &c->deadline,
                                                &c->md,
                                                zt_grpc_methods[m].stream_in ? NULL : &c->payload,
                                                s->cq, s->cq, &c->t_new);
    }
    if (e != GRPC_CALL_OK) {
        zt_oplog(ZT_LOG_ERR, "grpc: posting a request failed: %s\n",
                 grpc_call_error_to_string(e));
        call_free(c);
    }
}

/* The scope a method needs: its operation's, from the table HTTP's routes use too
 * (api_ops.h). A method nobody registered is read's, so that any token learns it is
 * UNIMPLEMENTED rather than that it lacks a scope. */
static zt_scope scope_needed(method_id m) {
    return m == M_UNKNOWN ? ZT_SCOPE_READ : zt_api_op_scope(zt_grpc_methods[m].op);
}

/* Whether the call's token allows its method; if not, the call is finished. */
static bool authorized(call *c) {
    if (!c->srv->tokens) {
        c->who = (zt_auth_caller){.scope = ZT_SCOPE_ADMIN};
        return true;
    }
    char *header = zt_grpc_metadata_find(&c->md, "authorization");
    c->who = zt_auth_who(c->srv->tokens, header);
    zt_scope have = c->who.scope;
    bool sent = header != NULL;
    free(header);
    zt_scope need = scope_needed(c->method);
    zt_api_error e;
    if (have == ZT_SCOPE_NONE) {
        zt_api_error_refusal(&e, GRPC_STATUS_UNAUTHENTICATED,
                             sent ? "TOKEN_INVALID" : "CREDENTIALS_MISSING",
                             "this server needs \"authorization: Bearer <token>\" metadata "
                             "with one of its tokens");
        zt_call_finish_error(c, &e);
        return false;
    }
    if (have < need) {
        char text[200];
        snprintf(text, sizeof text, "this token's scope is %s; %s needs %s", zt_scope_name(have),
                 c->method == M_UNKNOWN ? "this method" : zt_grpc_methods[c->method].path,
                 zt_scope_name(need));
        zt_api_error_refusal(&e, GRPC_STATUS_PERMISSION_DENIED,
                             "ACCESS_TOKEN_SCOPE_INSUFFICIENT", text);
        zt_api_error_meta(&e, "scope", zt_scope_name(have));
        zt_api_error_meta(&e, "requiredScope", zt_scope_name(need));
        zt_call_finish_error(c, &e);
        return false;
    }
    return true;
}

static bool off_queue(call *c, ProtobufCMessage *req);

static void dispatch(call *c) {
    if (!authorized(c))
        return;
    if (c->method == M_UNKNOWN) {
        char *name = grpc_slice_to_c_string(c->details.method);
        char text[512];
        snprintf(text, sizeof text, "unknown method %s", name);
        gpr_free(name);
        zt_call_finish(c, GRPC_STATUS_UNIMPLEMENTED, text);
        return;
    }
    if (zt_grpc_methods[c->method].stream_in) {
        receive_next(c);
        return;
    }
    char why[256];
    ProtobufCMessage *req = zt_pb_unpack_request(zt_grpc_methods[c->method].request, c->payload,
                                                 why, sizeof why);
    if (!req) {
        char text[256], field[160];
        snprintf(text, sizeof text, "the request is not a valid %s message",
                 zt_grpc_methods[c->method].request->name);
        /* A string that is not UTF-8 names its field ("SubmitJobRequest.spec.name: ..."). */
        zt_api_error_field(why, NULL, field, sizeof field);
        zt_call_finish_field(c, GRPC_STATUS_INVALID_ARGUMENT, why[0] ? field : NULL,
                             why[0] ? why : c->payload ? text : "the request has no message");
        return;
    }
    if (c->method == M_SUBMIT || c->method == M_WATCH) {
        if (!off_queue(c, req))
            protobuf_c_message_free_unpacked(req, NULL);
        return;
    }
    zt_grpc_methods[c->method].handle(c, req);
    protobuf_c_message_free_unpacked(req, NULL);
}

/* ---- calls served off the queue's thread ------------------------------------------------- */

typedef struct {
    call *c;
    ProtobufCMessage *req;
} off_work;

/* The count of off-queue threads that c's method counts against (off_mu held). */
static int *off_count(zt_grpc_server *s, method_id m) {
    return m == M_WATCH ? &s->off_watching : &s->off_running;
}

static void *off_queue_main(void *arg) {
    off_work *w = arg;
    call *c = w->c;
    zt_grpc_methods[c->method].handle(c, w->req);
    protobuf_c_message_free_unpacked(w->req, NULL);
    free(w);
    zt_grpc_server *s = c->srv;
    /* off_mu first and held to the end: once the call is let go the queue's thread may free it
     * and the server may be destroyed, which takes off_mu before it goes. */
    pthread_mutex_lock(&s->off_mu);
    pthread_mutex_lock(&c->mu);
    c->held = false;
    /* Closed with nothing in flight: no tag will come back for it, so the queue's thread is
     * told to free it (n_calls and call_free are that thread's alone). */
    bool orphan = c->closed && c->pending == 0;
    pthread_mutex_unlock(&c->mu);
    *off_count(s, c->method) -= 1;
    if (orphan) {
        c->next_done = s->off_done;
        s->off_done = c;
    }
    pthread_mutex_unlock(&s->off_mu);
    return NULL;
}

/* Hands req to a new detached thread that runs the handler; false when none could start. */
static bool off_queue(call *c, ProtobufCMessage *req) {
    zt_grpc_server *s = c->srv;
    bool watch = c->method == M_WATCH;
    int max = watch ? MAX_OFF_QUEUE_WATCHES : MAX_OFF_QUEUE;
    pthread_mutex_lock(&s->off_mu);
    bool room = *off_count(s, c->method) < max;
    if (room)
        *off_count(s, c->method) += 1;
    pthread_mutex_unlock(&s->off_mu);
    if (!room) {
        char text[160];
        snprintf(text, sizeof text, "ztraind is already %s %d %s; try again shortly",
                 watch ? "replaying" : "checking", max,
                 watch ? "watched histories" : "submitted jobs");
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, text);
        return false;
    }
    off_work *w = malloc(sizeof *w);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&c->mu);
    c->held = true;
    pthread_mutex_unlock(&c->mu);
    bool started = false;
    if (w) {
        *w = (off_work){.c = c, .req = req};
        started = pthread_create(&t, &attr, off_queue_main, w) == 0;
    }
    pthread_attr_destroy(&attr);
    if (!started) {
        free(w);
        pthread_mutex_lock(&c->mu);
        c->held = false;
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_lock(&s->off_mu);
        *off_count(s, c->method) -= 1;
        pthread_mutex_unlock(&s->off_mu);
        zt_call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ztraind cannot start a thread for "
                       "this call");
    }
    return started;
}

/* Frees the calls whose off-queue handler ended after they closed (the queue's thread). */
static void free_off_done(zt_grpc_server *s) {
    pthread_mutex_lock(&s->off_mu);
    call *list = s->off_done;
    s->off_done = NULL;
    pthread_mutex_unlock(&s->off_mu);
    while (list) {
        call *next = list->next_done;
        call_free(list);
        list = next;
    }
}

static void on_new_call(zt_grpc_server *s, call *c, bool ok) {
    if (!ok) {
        /* The server is shutting down and gives back what was posted. */
        call_free(c);
        return;
    }
    if (!s->shutting_down)
        post_request(s, c->method);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    pthread_mutex_lock(&c->mu);
    bool started = start_batch(c, &op, 1, &c->t_close);
    pthread_mutex_unlock(&c->mu);
    if (!started) {
        call_free(c);
        return;
    }
    /* A call that slipped in as shutdown began is not served: the job manager may already be
     * on its way out. */
    if (s->shutting_down)
        zt_call_finish(c, GRPC_STATUS_UNAVAILABLE, "ztraind is shutting down");
    else
        dispatch(c);
    if (c->payload) {
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
    }
}

static void on_call_tag(tag *t, bool ok) {
    call *c = t->c;
    if (t->kind == TAG_CLOSE) {
        /* Closed first, so that a replay waiting for room gives up and a watch registered
         * from now on is removed by its own thread (grpc_methods.c, start_watch). */
        pthread_mutex_lock(&c->mu);
        c->closed = true;
        zt_job_watch *w = c->watch;
        c->watch = NULL;
        pthread_cond_broadcast(&c->room);
        pthread_mutex_unlock(&c->mu);
        /* Outside c->mu: unwatch takes the manager's lock, which callbacks hold while they
         * take c->mu. Once it returns no callback touches c again. */
        if (w)
            zt_jobs_unwatch(c->srv->jm, w);
    }
    if (t->kind == TAG_RECV)
        on_received(c, ok);
    pthread_mutex_lock(&c->mu);
    c->pending--;
    if (t->kind == TAG_SEND || t->kind == TAG_STATUS) {
        if (c->in_flight)
            grpc_byte_buffer_destroy(c->in_flight);
        c->in_flight = NULL;
        c->sending = false;
        if (!ok)
            c->broken = true;
        if (c->broken)
            drop_queue_locked(c);
        else
            kick_locked(c);
        pthread_cond_broadcast(&c->room);
    } else if (t->kind == TAG_CLOSE) {
        c->closed = true;
        drop_queue_locked(c);
    }
    bool done = c->closed && c->pending == 0 && !c->held;
    pthread_mutex_unlock(&c->mu);
    if (done)
        call_free(c);
}

static void on_event(zt_grpc_server *s, grpc_event ev) {
    tag *t = ev.tag;
    if (t->kind == TAG_SHUTDOWN) {
        grpc_server_destroy(s->server);
        s->server = NULL;
        s->server_down = true;
    } else if (t->kind == TAG_NEW) {
        on_new_call(s, t->c, ev.success);
    } else {
        on_call_tag(t, ev.success);
    }
}

/* ---- server ------------------------------------------------------------------------------ */

static void begin_shutdown(zt_grpc_server *s) {
    if (s->shutting_down)
        return;
    s->shutting_down = true;
    /* Before the listener closes, so that its descriptor number, once reused, is not taken
     * for gRPC's. */
    zt_grpc_accept_guard_stop();
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    /* Without this, shutdown waits for every open stream's client deadline. */
    grpc_server_cancel_all_calls(s->server);
}

static void serve(zt_grpc_server *s, volatile sig_atomic_t *stop) {
    while (!s->drained) {
        if (stop && *stop)
            begin_shutdown(s);
        gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                             gpr_time_from_millis(POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(s->cq, deadline, NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            on_event(s, ev);
        else if (ev.type == GRPC_QUEUE_SHUTDOWN)
            s->drained = true;
        free_off_done(s);
        /* The queue shuts down only when no call is left: a watch callback on another thread
         * may still start a batch on a cancelled call until the call's CLOSE is handled. */
        if (s->server_down && s->n_calls == 0 && !s->cq_down) {
            s->cq_down = true;
            grpc_completion_queue_shutdown(s->cq);
        }
    }
}

void zt_grpc_server_run(zt_grpc_server *s, volatile sig_atomic_t *stop) { serve(s, stop); }

static void int_arg(grpc_arg *a, const char *key, int value) {
    a->type = GRPC_ARG_INTEGER;
    a->key = (char *)key;
    a->value.integer = value;
}

static grpc_server *create_core_server(const zt_grpc_server_config *cfg) {
    size_t max = cfg->max_message_bytes ? cfg->max_message_bytes : DEFAULT_MAX_MESSAGE;
    grpc_arg args[6];
    size_t n = 0;
    memset(args, 0, sizeof args);
    /* gRPC turns SO_REUSEPORT on by default, which lets a second daemon bind the same port
     * without an error; off, a port in use fails here. */
    int_arg(&args[n++], GRPC_ARG_ALLOW_REUSEPORT, 0);
    int_arg(&args[n++], GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
            max > INT32_MAX ? INT32_MAX : (int)max);
    /* A connection that never sends the HTTP/2 preface holds a descriptor and a slot of the
     * connection bound; the handshake timeout is what closes it. */
    if (cfg->handshake_timeout_ms > 0)
        int_arg(&args[n++], GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, cfg->handshake_timeout_ms);
    if (cfg->idle_timeout_ms > 0)
        int_arg(&args[n++], GRPC_ARG_MAX_CONNECTION_IDLE_MS, cfg->idle_timeout_ms);
    /* A watcher whose host vanished keeps its call open, so the idle timeout never applies;
     * pings while calls are open find it within KEEPALIVE_MS + KEEPALIVE_TIMEOUT_MS. */
    int_arg(&args[n++], GRPC_ARG_KEEPALIVE_TIME_MS, KEEPALIVE_MS);
    int_arg(&args[n++], GRPC_ARG_KEEPALIVE_TIMEOUT_MS, KEEPALIVE_TIMEOUT_MS);
    grpc_channel_args ch_args = {.num_args = n, .args = args};
    return grpc_server_create(&ch_args, NULL);
}

/* The listening port's credentials: plaintext, or TLS with gRPC's own SSL server credentials.
 * A client CA means mutual TLS: a client without a certificate that CA signed is refused in
 * the handshake, before any call reaches the token check. gRPC copies the PEM text. */
static grpc_server_credentials *server_credentials(const zt_tls_pem *tls) {
    if (!tls || !tls->cert)
        return grpc_insecure_server_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key, .cert_chain = tls->cert};
    grpc_ssl_server_certificate_config *config =
        grpc_ssl_server_certificate_config_create(tls->ca, &pair, 1);
    grpc_ssl_server_credentials_options *options =
        grpc_ssl_server_credentials_create_options_using_config(
            tls->ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            config);
    return grpc_ssl_server_credentials_create_with_options(options);
}

static zt_status register_and_bind(zt_grpc_server *s, const char *addr, int max_connections,
                                   const zt_tls_pem *tls) {
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    for (int m = 0; m < M_COUNT; m++) {
        s->handles[m] = grpc_server_register_method(
            s->server, zt_grpc_methods[m].path, NULL,
            zt_grpc_methods[m].stream_in ? GRPC_SRM_PAYLOAD_NONE
                                         : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
            0);
        if (!s->handles[m])
            return zt_error(ZT_ERR_INVALID, "gRPC: cannot register %s", zt_grpc_methods[m].path);
    }
    grpc_server_credentials *creds = server_credentials(tls);
    /* The failure is said below, naming the address; gRPC core's own text of it is not. */
    zt_grpc_log_mute(true);
    s->port = grpc_server_add_http2_port(s->server, addr, creds);
    zt_grpc_log_mute(false);
    grpc_server_credentials_release(creds);
    if (s->port == 0)
        return zt_error(ZT_ERR_IO, "gRPC: cannot listen on %s: the address is in use or invalid",
                        addr);
    /* A unix socket's clients are local and its "port" is no port. */
    if (strncmp(addr, "unix:", 5) == 0 || strncmp(addr, "unix-abstract:", 14) == 0)
        return ZT_OK;
    return zt_grpc_accept_guard_start(s->port, max_connections);
}

zt_status zt_grpc_server_create(zt_grpc_server **out, const zt_grpc_server_config *cfg,
                                zt_jobs *jm) {
    *out = NULL;
    if (!cfg->page_key)
        return zt_error(ZT_ERR_INVALID, "gRPC server: no page token key");
    zt_grpc_server *s = calloc(1, sizeof *s);
    if (!s)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    grpc_init();
    s->jm = jm;
    s->shutdown_tag.kind = TAG_SHUTDOWN;
    pthread_mutex_init(&s->off_mu, NULL);
    s->tokens = cfg->tokens;
    s->page_key = *cfg->page_key;
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->server = create_core_server(cfg);
    zt_status st = register_and_bind(s, cfg->addr ? cfg->addr : "", cfg->max_connections,
                                     cfg->tls);
    if (st != ZT_OK) {
        zt_grpc_server_destroy(s);
        return st;
    }
    grpc_server_start(s->server);
    for (int m = 0; m <= M_UNKNOWN; m++)
        for (int i = 0; i < POSTED_PER_METHOD; i++)
            post_request(s, (method_id)m);
    *out = s;
    return ZT_OK;
}

int zt_grpc_server_port(const zt_grpc_server *s) { return s->port; }

void zt_grpc_server_destroy(zt_grpc_server *s) {
    if (!s)
        return;
    if (!s->drained) {
        begin_shutdown(s);
        serve(s, NULL);
    }
    zt_grpc_accept_guard_stop();
    grpc_completion_queue_destroy(s->cq);
    /* The last off-queue thread lets go of off_mu as its last act. */
    pthread_mutex_lock(&s->off_mu);
    pthread_mutex_unlock(&s->off_mu);
    pthread_mutex_destroy(&s->off_mu);
    free(s);
    grpc_shutdown();
}
