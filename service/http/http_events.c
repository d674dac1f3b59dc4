/* GET /api/v1/jobs/{id}/events (http_internal.h): a job's live event stream as Server-Sent
 * Events. A job manager watch queues formatted events, the connection's content reader sends
 * them, with a keepalive comment when the job is quiet, and zt_http_stop ends every stream. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/auth.h"
#include "api/job_proto.h"
#include "http_internal.h"

/* A quiet stream sends a comment this often, so that neither the server's idle timeout
 * (ZT_HTTP_TIMEOUT_S in http_api.c) nor a proxy closes it. */
#define ZT_SSE_KEEPALIVE_MS 15000
/* How often a waiting stream checks whether its client went away. */
#define ZT_SSE_POLL_MS 1000
/* A client that reads slower than the job writes is cut off rather than grow without bound;
 * the replay of a long history counts too (about 60000 records of a GPT-2 job), and a client
 * that wants more reads /records first and streams from where it ends. */
#define ZT_SSE_MAX_QUEUED ((size_t)32 * 1024 * 1024)
/* The stored history is replayed a window at a time: the replaying thread waits while this
 * much is queued, so a client that does not read holds at most about this much of it (issue
 * 34: 24 unread streams of a 20,000-record job took ztraind from 30 to 514 MB). */
#define ZT_SSE_REPLAY_WINDOW ((size_t)256 * 1024)

/* One formatted event waiting to be sent. */
typedef struct sse_chunk {
    struct sse_chunk *next;
    char *data;
    size_t len;
} sse_chunk;

struct zt_sse {
    zt_http_server *srv;
    zt_sse *prev, *next;      /* in srv->streams, under srv->mu */
    zt_job_watch *watch;
    int fd;                   /* the client's socket, to notice that it went away */
    pthread_mutex_t mu;       /* guards the fields up to `stop` */
    pthread_cond_t cv;
    pthread_cond_t room;      /* the reader took a chunk: a waiting replay may go on */
    bool closing;             /* the response is being freed: a waiting replay gives up */
    sse_chunk *head, *tail;
    size_t queued;
    bool ended;               /* the terminal job event is queued: nothing follows */
    /* A terminal state came while zt_jobs_watch replayed: an ended job's comes first, before
     * its history, so the stream ends only when the replay is over (replay_main). */
    bool terminal_seen, replayed;
    bool overflow;
    bool stop;                /* the server is stopping */
    /* The thread that registers the watch and replays the history (replay_main). */
    pthread_t replayer;
    bool has_replayer;
    char *job_id;
    int what, log_tail;
    int64_t since;
    zt_watch_cursor after;
    /* The stream's cursor, its events' id: the seq of the last record, anomaly event and log
     * line it has queued (from the resume point on). Only sse_on_event touches it, and the
     * watch calls it for one event at a time. */
    zt_watch_cursor sent;
    /* Owned by the content reader (one MHD thread). */
    char *out;
    size_t out_len, out_off;
    int64_t last_send_ms;
};

static void chunk_free(sse_chunk *ch) {
    free(ch->data);
    free(ch);
}

/* The data of an event: the proto3 JSON of the message that WatchJob's JobEvent carries for it
 * (Job, MetricRecord, AnomalyEvent, LogLine). A message that cannot be built (out of memory)
 * leaves the buffer short of its value, which the caller treats as an overflow. */
static bool event_data(zt_jbuf *b, const zt_job_event *ev) {
    ProtobufCMessage *m = NULL;
    zt_status st;
    if (ev->kind == ZT_EVENT_STATE) {
        Ztrain__V1__Job *j = NULL;
        st = zt_job_proto_job_from_info(ev->job, zt_http_wall_ms(), &j);
        m = j ? &j->base : NULL;
    } else if (ev->kind == ZT_EVENT_METRICS) {
        Ztrain__V1__MetricRecord *r = NULL;
        st = zt_job_proto_record_from_metric(ev->record, &r);
        m = r ? &r->base : NULL;
    } else if (ev->kind == ZT_EVENT_ANOMALY) {
        Ztrain__V1__AnomalyEvent *a = NULL;
        st = zt_job_proto_anomaly_from(ev->anomaly, &a);
        m = a ? &a->base : NULL;
    } else {
        Ztrain__V1__LogLine *l = NULL;
        st = zt_job_proto_log_from_line(ev->log, &l);
        m = l ? &l->base : NULL;
    }
    if (st != ZT_OK || !m) {
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        return false;
    }
    zt_proto_json(b, m);
    protobuf_c_message_free_unpacked(m, NULL);
    return true;
}

/* The watch callback: runs under the job manager's lock, on the supervisor's thread or ours
 * (or on ours without it, replaying the part of the history read from the store). It only
 * formats and queues; the content reader does the rest. */
static void sse_on_event(void *ctx, const zt_job_event *ev) {
    zt_sse *st = ctx;
    zt_jbuf b;
    zt_jbuf_init(&b);
    bool terminal = false;
    if (ev->kind == ZT_EVENT_STATE) {
        zt_jbuf_puts(&b, "event: job\ndata: ");
        terminal = zt_job_state_terminal(ev->job->state);
    } else {
        /* One cursor over the three sequences as the event id, "<record seq>:<anomaly
         * seq>:<log seq>": a reconnecting client sends it back as Last-Event-ID and gets only
         * the records, events and log lines after those (not a step, which an eval step's two
         * records share). */
        const char *name = "log";
        if (ev->kind == ZT_EVENT_METRICS) {
            st->sent.seq = ev->record->seq;
            name = "metrics";
        } else if (ev->kind == ZT_EVENT_ANOMALY) {
            st->sent.anomaly_seq = ev->anomaly->seq;
            name = "anomaly";
        } else {
            st->sent.log_seq = ev->log->seq;
        }
        zt_jbuf_printf(&b, "event: %s\nid: %" PRId64 ":%" PRId64 ":%" PRId64 "\ndata: ", name,
                       st->sent.seq, st->sent.anomaly_seq, st->sent.log_seq);
    }
    /* The printer writes no line breaks (strings escape theirs), so the data is one line. */
    bool built = event_data(&b, ev);
    zt_jbuf_puts(&b, "\n\n");
    sse_chunk *ch = calloc(1, sizeof *ch);
    size_t len = 0;
    char *data = zt_jbuf_take(&b, &len);
    pthread_mutex_lock(&st->mu);
    /* A stored record replayed without the manager's lock waits for the reader to make room. */
    while (ev->may_block && st->head && st->queued + len > ZT_SSE_REPLAY_WINDOW && !st->stop &&
           !st->closing && !st->overflow)
        pthread_cond_wait(&st->room, &st->mu);
    if (st->closing) {
        free(ch);
        free(data);
    } else if (!ch || !data || !built || st->queued + len > ZT_SSE_MAX_QUEUED) {
        st->overflow = true;
        free(ch);
        free(data);
    } else {
        ch->data = data;
        ch->len = len;
        if (st->tail)
            st->tail->next = ch;
        else
            st->head = ch;
        st->tail = ch;
        st->queued += len;
        st->terminal_seen |= terminal;
        st->ended = st->terminal_seen && st->replayed;
    }
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static bool peer_gone(int fd) {
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Hands a dequeued chunk's bytes to the reader. */
static void sse_take_chunk(zt_sse *st, sse_chunk *ch) {
    st->out = ch->data;
    st->out_len = ch->len;
    ch->data = NULL;
    st->out_off = 0;
    chunk_free(ch);
}

/* Waits for the next chunk; returns false when the stream must end, with *result set. */
static bool sse_next(zt_sse *st, ssize_t *result) {
    pthread_mutex_lock(&st->mu);
    for (;;) {
        if (st->stop || st->overflow) {
            *result = st->stop ? MHD_CONTENT_READER_END_OF_STREAM
                               : MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        if (st->head) {
            sse_chunk *ch = st->head;
            st->head = ch->next;
            if (!st->head)
                st->tail = NULL;
            st->queued -= ch->len;
            pthread_cond_signal(&st->room);
            pthread_mutex_unlock(&st->mu);
            sse_take_chunk(st, ch);
            return true;
        }
        if (st->ended) {
            *result = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        int64_t now = zt_http_mono_ms();
        if (now - st->last_send_ms >= ZT_SSE_KEEPALIVE_MS) {
            pthread_mutex_unlock(&st->mu);
            st->out = strdup(": keepalive\n\n");
            st->out_len = st->out ? strlen(st->out) : 0;
            st->out_off = 0;
            return true;
        }
        if (peer_gone(st->fd)) {
            *result = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        int64_t wait = st->last_send_ms + ZT_SSE_KEEPALIVE_MS - now;
        if (wait > ZT_SSE_POLL_MS)
            wait = ZT_SSE_POLL_MS;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += wait / 1000;
        ts.tv_nsec += (wait % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&st->cv, &st->mu, &ts);
    }
    pthread_mutex_unlock(&st->mu);
    return false;
}

/* MHD's content reader, on the connection's own thread: blocking here is what that thread is
 * for. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    zt_sse *st = cls;
    while (st->out_off >= st->out_len) {
        free(st->out);
        st->out = NULL;
        st->out_len = st->out_off = 0;
        ssize_t end;
        if (!sse_next(st, &end))
            return end;
    }
    size_t n = st->out_len - st->out_off;
    if (n > max)
        n = max;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    st->last_send_ms = zt_http_mono_ms();
    return (ssize_t)n;
}

static void sse_unregister(zt_sse *st) {
    zt_http_server *s = st->srv;
    pthread_mutex_lock(&s->mu);
    if (st->prev)
        st->prev->next = st->next;
    else if (s->streams == st)
        s->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
    pthread_mutex_unlock(&s->mu);
}

/* MHD's free callback, when the response is done with. The watch goes first: after
 * zt_jobs_unwatch no callback can touch the stream. */
static void sse_free(void *cls) {
    zt_sse *st = cls;
    sse_unregister(st);
    if (st->has_replayer) {
        pthread_mutex_lock(&st->mu);
        st->closing = true;
        pthread_cond_broadcast(&st->room);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->replayer, NULL);
    }
    if (st->watch)
        zt_jobs_unwatch(st->srv->jm, st->watch);
    while (st->head) {
        sse_chunk *ch = st->head;
        st->head = ch->next;
        chunk_free(ch);
    }
    free(st->out);
    free(st->job_id);
    pthread_cond_destroy(&st->room);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static zt_sse *sse_create(zt_http_server *s, struct MHD_Connection *c) {
    zt_sse *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&st->room, NULL);
    pthread_mutex_init(&st->mu, NULL);
    st->srv = s;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    st->last_send_ms = zt_http_mono_ms();
    return st;
}

/* Registers the stream so that zt_http_events_stop_all can end it; false when the server is
 * stopping. */
static bool sse_register(zt_http_server *s, zt_sse *st) {
    pthread_mutex_lock(&s->mu);
    bool ok = !s->stopping;
    if (ok) {
        st->next = s->streams;
        if (s->streams)
            s->streams->prev = st;
        s->streams = st;
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* EventSource can set no headers, so the stream also takes the token as ?access_token=
 * (RFC 6750 §2.3). */
zt_scope zt_http_events_token_scope(const zt_http_server *s, struct MHD_Connection *c) {
    const char *t = zt_http_arg(c, "access_token");
    if (!s->tokens || !t)
        return ZT_SCOPE_NONE;
    size_t n = strlen(t);
    char *h = malloc(n + 8);
    if (!h)
        return ZT_SCOPE_NONE;
    memcpy(h, "Bearer ", 7);
    memcpy(h + 7, t, n + 1);
    zt_scope sc = zt_auth_scope(s->tokens, h);
    free(h);
    return sc;
}

/* The stream's replaying thread: registers the watch, whose replay of the stored history runs
 * here and waits for the reader as it goes (sse_on_event), so the history is paged out as the
 * client reads. A watch that cannot be made ends the stream with an error. */
static void *replay_main(void *arg) {
    zt_sse *st = arg;
    zt_job_watch *w = NULL;
    zt_status s = zt_jobs_watch(st->srv->jm, st->job_id, st->what, st->since, st->after,
                                st->log_tail, sse_on_event, st, &w);
    pthread_mutex_lock(&st->mu);
    st->replayed = true;
    st->ended = st->terminal_seen;
    st->watch = s == ZT_OK ? w : NULL;
    if (s != ZT_OK)
        st->overflow = true;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* A Last-Event-ID: "<record seq>:<anomaly seq>:<log seq>" (this stream's ids) moves the
 * resume point past all three; "<record seq>:<anomaly seq>", the ids of streams before log
 * lines had one, past those two. A bare number is the id of streams before that, a record's
 * step, and resumes at the next step (since_step = n + 1); anything else is ignored, and the
 * stream starts where the query says. */
static void read_last_event_id(const char *lei, int64_t *since, zt_watch_cursor *after) {
    int64_t r, a, l = 0, step;
    char end;
    if (!lei)
        return;
    bool digits = strspn(lei, "0123456789:") == strlen(lei);
    int n = sscanf(lei, "%" SCNd64 ":%" SCNd64 ":%" SCNd64 "%c", &r, &a, &l, &end);
    if (digits && (n == 3 || (n == 2 && strchr(lei, ':') == strrchr(lei, ':'))) && r >= 0 &&
        a >= 0 && l >= 0) {
        if (r > after->seq)
            after->seq = r;
        if (a > after->anomaly_seq)
            after->anomaly_seq = a;
        if (l > after->log_seq)
            after->log_seq = l;
    } else if (sscanf(lei, "%" SCNd64 "%c", &step, &end) == 1 && step >= 0 &&
               step < INT64_MAX && strspn(lei, "0123456789") == strlen(lei)) {
        if (step + 1 > *since)
            *since = step + 1;
    }
}

/* GET /api/v1/jobs/{id}/events?since_step=&after_seq=&after_anomaly_seq=&logs=&tail=
 * &after_log_seq=: the job, its records from since_step (and after the record numbered
 * after_seq), its anomaly events (after the one numbered after_anomaly_seq) and (logs=1) those
 * of its last `tail` log lines (0: none) after the one numbered after_log_seq, then live events
 * until a terminal state. A reconnecting EventSource's Last-Event-ID (the id of the last event
 * it had) stands for the three cursors, so it goes on after that record, event and log line,
 * also inside a step of several records. */
enum MHD_Result zt_http_job_events(zt_http_server *s, struct MHD_Connection *c,
                                   const char *id) {
    enum MHD_Result ret;
    int64_t since = 0, tail = ZT_LOG_TAIL_DEFAULT;
    zt_watch_cursor after = {0};
    bool logs = false;
    if (!zt_http_arg_int(c, "since_step", 0, INT64_MAX, &since, &ret) ||
        !zt_http_arg_int(c, "after_seq", 0, INT64_MAX, &after.seq, &ret) ||
        !zt_http_arg_int(c, "after_anomaly_seq", 0, INT64_MAX, &after.anomaly_seq, &ret) ||
        !zt_http_arg_int(c, "after_log_seq", 0, INT64_MAX, &after.log_seq, &ret) ||
        !zt_http_arg_int(c, "tail", 0, ZT_MAX_LOG_TAIL, &tail, &ret) ||
        !zt_http_arg_bool(c, "logs", &logs, &ret))
        return ret;
    read_last_event_id(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID"), &since,
                       &after);
    zt_sse *st = sse_create(s, c);
    if (!st)
        return MHD_NO;
    if (!sse_register(s, st)) {
        sse_free(st);
        return zt_http_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "ztraind is stopping");
    }
    /* An unknown job is a 404 before the stream starts; the watch itself is made by the
     * replaying thread once the response exists. */
    zt_job_info probe;
    memset(&probe, 0, sizeof probe);
    zt_status zs = zt_jobs_get(s->jm, id, &probe);
    if (zs != ZT_OK) {
        sse_free(st);
        return zt_http_send_status(c, zs, id);
    }
    zt_job_info_free(&probe);
    st->what = ZT_WATCH_STATE | ZT_WATCH_METRICS | (logs ? ZT_WATCH_LOGS : 0);
    st->since = since;
    st->after = after;
    st->sent = after;
    st->log_tail = (int)tail;
    st->job_id = strdup(id);
    struct MHD_Response *r =
        st->job_id ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, sse_read,
                                                       st, sse_free)
                   : NULL;
    if (!r) {
        sse_free(st);
        return MHD_NO;
    }
    st->has_replayer = pthread_create(&st->replayer, NULL, replay_main, st) == 0;
    if (!st->has_replayer) {
        pthread_mutex_lock(&st->mu);
        st->overflow = true;
        pthread_mutex_unlock(&st->mu);
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return zt_http_queue(c, MHD_HTTP_OK, r);
}

/* Streams block in their readers; they are woken and ended here, or MHD would wait on their
 * threads forever. Streams that start from now on are refused (sse_register). */
void zt_http_events_stop_all(zt_http_server *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    for (zt_sse *st = s->streams; st; st = st->next) {
        pthread_mutex_lock(&st->mu);
        st->stop = true;
        pthread_cond_signal(&st->cv);
        pthread_cond_broadcast(&st->room);
        pthread_mutex_unlock(&st->mu);
    }
    pthread_mutex_unlock(&s->mu);
}
