/* What the files of ztraind's HTTP server share (http_api.c and the route files beside it): the
 * server's state, the helpers every route answers with, and the routes http_api.c dispatches
 * to. Not part of the public interface, which is http_api.h. */
#ifndef ZTRAIN_HTTP_INTERNAL_H
#define ZTRAIN_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <microhttpd.h>

#include "http_api.h"
#include "http_json.h"
#include "api/proto_json.h"
#include "api/api_error.h"
#include "api/auth.h"
#include "daemon/job_manager.h"

/* The largest `tail` of log lines a request may ask for (GET .../logs and .../events): the range
 * of StreamLogsRequest.tail (int32), so that HTTP takes what gRPC takes. The job manager keeps
 * 10,000 lines a job; a larger tail gets them all (zt_jobs_logs). */
#define ZT_MAX_LOG_TAIL INT32_MAX

typedef struct zt_sse zt_sse;
typedef struct zt_series_cache zt_series_cache;
typedef struct zt_http_conns zt_http_conns;

/* Who may send requests (http_guard.c): the config's hosts and origins, normalized. */
typedef struct {
    bool loopback;            /* the listen address is a loopback one */
    bool any_host;            /* "*" was among the hosts */
    char **hosts;             /* lowercase, without a trailing dot */
    size_t n_hosts;
    char **origins;
    size_t n_origins;
} zt_http_guard;

struct zt_http_server {
    struct MHD_Daemon *daemon;
    zt_jobs *jm;
    const struct zt_auth_tokens *tokens;
    zt_page_key page_key;     /* signs page tokens */
    char *web_dir;
    char *chartjs_dir;
    size_t max_body;
    int64_t metrics_window_ms;    /* http_prometheus.c: which ended jobs /metrics still shows */
    int port;
    pthread_mutex_t mu;       /* guards streams and stopping */
    zt_sse *streams;          /* live event streams, so that stop can end them */
    bool stopping;
    zt_series_cache *cache;   /* responses of GET .../metrics (http_series.c) */
    zt_http_guard guard;
    zt_http_conns *conns;     /* connection slots and request deadlines (http_conns.c) */
    bool client_certs;        /* mutual TLS: every request's connection needs a client cert */
};

static inline int64_t zt_http_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t zt_http_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- who may ask (http_guard.c) ------------------------------------------------------------ */

/* Validates and copies the names and origins (zt_http_config); listen_host is the address the
 * server listens on. ZT_ERR_INVALID names a malformed entry. */
zt_status zt_http_guard_init(zt_http_guard *g, const char *listen_host,
                             const char *const *hosts, size_t n_hosts,
                             const char *const *origins, size_t n_origins);
void zt_http_guard_free(zt_http_guard *g);
/* Whether a Host header's value names this server; whether an Origin is in the allowed list. */
bool zt_http_host_ok(const zt_http_guard *g, const char *host);
bool zt_http_origin_allowed(const zt_http_guard *g, const char *origin);
/* The Host and Origin checks, on a request's headers before its body is read; version is the
 * request's HTTP version ("HTTP/1.1"), which must carry a Host. On a refusal (400, 421 or 403)
 * the answer is queued, *ret set, and false returned. */
bool zt_http_guard_request(const zt_http_server *s, struct MHD_Connection *c,
                           const char *version, enum MHD_Result *ret);
/* For every route that changes state: the request's Content-Type must be application/json
 * (parameters such as charset allowed), or 415 is queued into *ret and false returned. */
bool zt_http_guard_json(struct MHD_Connection *c, const char *method, enum MHD_Result *ret);
/* Vary: Origin on every response, and the CORS headers when the request's Origin is an
 * allowed one. The server is found through the connection's socket context, which
 * zt_http_start sets; without it no origin is allowed. */
void zt_http_add_cors(struct MHD_Connection *c, struct MHD_Response *r);

/* ---- HTTPS (http_tls.c) ----------------------------------------------------------------- */

/* The most options zt_http_tls_options writes, MHD_OPTION_END included. */
#define ZT_HTTP_TLS_OPTIONS 4

/* The MHD start flags (*flags) and options (opts, for MHD_OPTION_ARRAY; just MHD_OPTION_END
 * without TLS) that serve tls, and with tls->ca sets s->client_certs. tls must outlive the
 * daemon: MHD keeps the pointers. ZT_ERR_UNSUPPORTED when this libmicrohttpd has no TLS. */
zt_status zt_http_tls_options(zt_http_server *s, const zt_tls_pem *tls,
                              struct MHD_OptionItem opts[ZT_HTTP_TLS_OPTIONS], unsigned *flags);
/* Under mutual TLS (s->client_certs), before a request is read: its connection must have
 * presented a certificate that chains to tls->ca and, when it lists key purposes, is meant for
 * TLS clients. Else 403 naming what was wrong is queued, *ret set, and false returned. */
bool zt_http_guard_client_cert(const zt_http_server *s, struct MHD_Connection *c,
                               enum MHD_Result *ret);

/* ---- answering (http_reply.c) ------------------------------------------------------------ */

/* Queues r with the CORS headers (zt_http_add_cors) and `Server: ztraind/VERSION` added, and
 * drops our reference: MHD keeps the response until it is sent. A NULL r (a failed create) is
 * MHD_NO, which closes the connection. */
enum MHD_Result zt_http_queue(struct MHD_Connection *c, unsigned code, struct MHD_Response *r);
/* Sends the buffer's text, which it takes over (b is left empty), as `type`, not to be cached. */
enum MHD_Result zt_http_send_text(struct MHD_Connection *c, unsigned code, zt_jbuf *b,
                                  const char *type);
enum MHD_Result zt_http_send_json(struct MHD_Connection *c, unsigned code, zt_jbuf *b);
/* An application/problem+json error (RFC 9457, api_error.h) whose detail is the printf of fmt,
 * with the given status, and one more header when hname is not NULL (Allow on a 405,
 * WWW-Authenticate on a 401). Its "code" is the gRPC code of that status; a message that opens
 * with "name: " names that parameter as its "field". */
enum MHD_Result zt_http_send_error_with_header(struct MHD_Connection *c, unsigned code,
                                               const char *hname, const char *hvalue,
                                               const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define zt_http_send_error(c, code, ...) \
    zt_http_send_error_with_header((c), (code), NULL, NULL, __VA_ARGS__)
/* The problem of a job manager failure s, with zt_last_error()'s message: the same code and
 * detail that gRPC gives it (api_error.h); id names the job (NULL when there is none), scope
 * prefixes the field paths of a spec's errors ("spec"). */
enum MHD_Result zt_http_send_status(struct MHD_Connection *c, zt_status s, const char *id);
enum MHD_Result zt_http_send_status_in(struct MHD_Connection *c, zt_status s, const char *scope,
                                       const char *id);
/* An error built by the caller (api_error.h), with the HTTP status of its gRPC code. */
enum MHD_Result zt_http_send_api_error(struct MHD_Connection *c, const zt_api_error *e);
/* A refusal of the caller (zt_api_error_refusal: 401, 403, 421) with the given HTTP status,
 * whose problem carries the ErrorInfo's "reason", "domain" and "metadata"; one more header when
 * hname is not NULL (WWW-Authenticate on a 401). zt_http_send_refusal builds the error from
 * reason and a message, with no metadata. */
enum MHD_Result zt_http_send_refusal_error(struct MHD_Connection *c, unsigned http_status,
                                           const char *hname, const char *hvalue,
                                           const zt_api_error *e);
enum MHD_Result zt_http_send_refusal(struct MHD_Connection *c, unsigned http_status,
                                     const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A message of proto/ztrain.proto as its proto3 JSON (proto_json.h), application/json. */
enum MHD_Result zt_http_send_proto(struct MHD_Connection *c, unsigned code,
                                   const ProtobufCMessage *m);

/* The query argument `name`, or NULL when absent. */
const char *zt_http_arg(struct MHD_Connection *c, const char *name);
/* Read the argument `name` into *out, left as it is when absent. On a malformed or
 * out-of-range value they answer 400 naming the argument, set *ret and return false. */
bool zt_http_arg_int(struct MHD_Connection *c, const char *name, int64_t lo, int64_t hi,
                     int64_t *out, enum MHD_Result *ret);
bool zt_http_arg_bool(struct MHD_Connection *c, const char *name, bool *out,
                      enum MHD_Result *ret);
/* A list's page size as AIP-158 (and gRPC's lists) take it: absent leaves *out, 0 is the
 * default def, above max is max; a negative or malformed value is 400 naming the argument. */
bool zt_http_arg_page_size(struct MHD_Connection *c, const char *name, int64_t def,
                           int64_t max, int64_t *out, enum MHD_Result *ret);
/* http_body.c: the request's body as one JSON value (release *out with cJSON_Delete). A body
 * that is not JSON, has more than JSON whitespace after its value or between tokens, or holds
 * U+0000 in any string (raw or as \u0000, which cJSON would cut the C string at) is answered
 * 400: the string's field path and byte offset ("spec.name: U+0000 (\u0000) at byte 40 ..."),
 * or for the whole body body_field (NULL: none) and the offset. Then *ret is set and false
 * returned. An absent body reads as an empty one, which is not JSON. */
struct cJSON;
bool zt_http_body_json(struct MHD_Connection *c, const zt_jbuf *body, const char *body_field,
                       struct cJSON **out, enum MHD_Result *ret);
/* Whether the n bytes at id can be a job id at all. */
bool zt_http_valid_job_id(const char *id, size_t n);

/* ---- routes ------------------------------------------------------------------------------ */

/* http_jobs.c: /healthz, GET /api/v1/jobs (page_size, page_token, state), GET
 * /api/v1/jobs/{id} and POST /api/v1/jobs/{id}/cancel. `body` is the request body, or NULL
 * when none was sent. */
enum MHD_Result zt_http_healthz(zt_http_server *s, struct MHD_Connection *c);
enum MHD_Result zt_http_jobs_list(zt_http_server *s, struct MHD_Connection *c);
enum MHD_Result zt_http_job_get(zt_http_server *s, struct MHD_Connection *c, const char *id);
/* http_job_lists.c: a job's records (page_size, page_token, since_step), its log's last lines
 * (tail), its anomaly events (page_size, page_token, after_seq) and its webhook delivery
 * attempts (page_size: the newest ones), as {"job_id", <list>, "next_page_token"}. */
typedef enum { ZT_LIST_RECORDS, ZT_LIST_LOGS, ZT_LIST_ANOMALIES, ZT_LIST_WEBHOOKS } zt_job_list_kind;
enum MHD_Result zt_http_job_list(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                 zt_job_list_kind kind);
enum MHD_Result zt_http_job_cancel(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                   const zt_jbuf *body);
/* A job as GET /api/v1/jobs/{id} shows it (the Job message), 200. */
enum MHD_Result zt_http_send_job(struct MHD_Connection *c, const zt_job_info *j);
/* GET /api/v1/jobs/{id}/checkpoints (ListCheckpointsResponse) and /config (EffectiveConfig). */
enum MHD_Result zt_http_job_checkpoints(zt_http_server *s, struct MHD_Connection *c,
                                        const char *id);
enum MHD_Result zt_http_job_config(zt_http_server *s, struct MHD_Connection *c, const char *id);
/* http_openapi.c: GET /api/v1/openapi.json, the API's OpenAPI document embedded at build time. */
enum MHD_Result zt_http_openapi(zt_http_server *s, struct MHD_Connection *c);
/* http_submit.c: POST /api/v1/jobs, gRPC's SubmitJob over HTTP. */
enum MHD_Result zt_http_jobs_submit(zt_http_server *s, struct MHD_Connection *c,
                                    const zt_jbuf *body);

/* http_series.c: GET /api/v1/jobs/{id}/metrics, and the cache of its responses. */
enum MHD_Result zt_http_job_metrics(zt_http_server *s, struct MHD_Connection *c, const char *id);
zt_series_cache *zt_series_cache_create(void);
void zt_series_cache_destroy(zt_series_cache *cache);

/* http_export.c: GET /api/v1/jobs/{id}/metrics.csv (csv) and .../metrics.jsonl (!csv), the
 * job's whole history as it stood at the request, streamed. JSONL: one /records element per
 * line. CSV (RFC 4180, CRLF): columns step, time_unix_ms and every key of the records in
 * first-seen order; numbers as /metrics writes them, empty cells for absent or null values. */
enum MHD_Result zt_http_job_export(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                   bool csv);

/* http_tensorboard.c: GET /api/v1/jobs/{id}/tensorboard.tar, the event files of the job's run
 * directory as a ustar archive (entries <job id>/<file>); 404 when there are none. */
enum MHD_Result zt_http_job_tensorboard(zt_http_server *s, struct MHD_Connection *c,
                                        const char *id);

/* http_events.c: GET /api/v1/jobs/{id}/events, the live event stream. */
enum MHD_Result zt_http_job_events(zt_http_server *s, struct MHD_Connection *c, const char *id);
/* The scope of the token the request carries as ?access_token=, which the event stream takes
 * in place of the Authorization header (EventSource sets no headers). */
zt_scope zt_http_events_token_scope(const zt_http_server *s, struct MHD_Connection *c);
/* Who the request's bearer token is (http_api.c): scope ADMIN and no identity when the server
 * takes no tokens, scope NONE when the header names none of them. */
zt_auth_caller zt_http_caller(const zt_http_server *s, struct MHD_Connection *c);
/* Ends every live stream and refuses new ones, so that MHD can join their threads. */
void zt_http_events_stop_all(zt_http_server *s);

/* ---- connection slots (http_conns.c) ----------------------------------------------------- */

/* At most `max` connections, `per_address` of them from one client address; a request must
 * arrive whole within header_timeout_s of its connection opening or of the previous answer's
 * end, or the connection is shut down. Starts the watchdog thread that enforces it. */
zt_status zt_http_conns_create(zt_http_conns **out, void *owner, unsigned max,
                               unsigned per_address, unsigned header_timeout_s);
/* The owner given at creation for a watched connection (the HTTP server: what request-level code
 * that has only the connection needs), or NULL when the connection is not watched. */
void *zt_http_conns_owner(struct MHD_Connection *mc);
/* After MHD_stop_daemon: stops the watchdog and frees the table. */
void zt_http_conns_destroy(zt_http_conns *t);
/* libmicrohttpd's accept policy (cls: the table): makes room by displacing the connection that
 * has waited longest without sending a request, or refuses when every slot is busy. */
enum MHD_Result zt_http_conns_admit(void *cls, const struct sockaddr *addr, socklen_t len);
/* MHD_OPTION_NOTIFY_CONNECTION (cls: the table): the entry of each connection. */
void zt_http_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code);
/* A request's progress, from the access handler and the completion callback: its head has
 * arrived; its body has too and the answer is being made; the answer is done. */
void zt_http_conns_request_begun(zt_http_conns *t, struct MHD_Connection *c);
void zt_http_conns_request_read(zt_http_conns *t, struct MHD_Connection *c);
void zt_http_conns_request_done(zt_http_conns *t, struct MHD_Connection *c);

/* http_prometheus.c: GET /metrics. */
enum MHD_Result zt_http_prometheus(zt_http_server *s, struct MHD_Connection *c);

/* http_static.c: the file `rel` under dir (404 when dir is NULL, rel is not a plain relative
 * path or no such file exists), with the given Cache-Control. */
enum MHD_Result zt_http_serve_file(struct MHD_Connection *c, const char *dir, const char *rel,
                                   const char *cache);

#endif
