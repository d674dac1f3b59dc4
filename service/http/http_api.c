/* ztraind's HTTP server on libmicrohttpd (http_api.h): starting and stopping it, reading each
 * request (its body within the size limit) once its Host and Origin have passed, bearer auth
 * and CORS preflights, and the routing of every URL to its handler. The handlers live beside
 * it: the job routes (http_jobs.c), submitting (http_submit.c), a job's lists
 * (http_job_lists.c), the metric series (http_series.c), the history's downloads
 * (http_export.c, http_tensorboard.c), the OpenAPI document (http_openapi.c), the live event
 * stream (http_events.c), Prometheus' /metrics (http_prometheus.c) and the dashboard's files
 * (http_static.c); who may ask is
 * http_guard.c (with client certificates, http_tls.c, which also sets up HTTPS), how they
 * answer is http_reply.c, and what they share is http_internal.h.
 *
 * Threading: one thread per connection (MHD_USE_THREAD_PER_CONNECTION), because an event
 * stream's content reader blocks until the job manager has something to say; ordinary requests
 * copy what they need out of the manager (which holds its lock only for the copy) and encode
 * it on their own thread. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/api_ops.h"
#include "daemon/oplog.h"
#include "api/auth.h"
#include "http_internal.h"

/* A connection nothing happens on is closed after the idle timeout (30 s unless configured).
 * Event streams stay open: their keepalive comments count as activity. */
#define ZT_HTTP_IDLE_TIMEOUT_S 30u
#define ZT_HTTP_HEADER_TIMEOUT_S 10u
#define ZT_HTTP_MEMORY_LIMIT ((size_t)64 * 1024)
/* The nice value of connection threads: under load the HTTP side yields the cores to the
 * training ranks (nice 0), which are what the machine is for. */
#define ZT_HTTP_NICE 10

/* A submit's body is a job spec, which gRPC's SubmitJob takes up to its message limit: the
 * same bound here, so that a spec the job manager would judge is not refused by size first
 * (the manager's own spec limit applies to both, as RESOURCE_EXHAUSTED). */
#define ZT_HTTP_SUBMIT_MAX_BODY ((size_t)4 << 20)

/* ---- routing ----------------------------------------------------------------------------- */

/* A request body, kept only for requests that send one. Other requests carry &no_body as
 * their per-request pointer, so GETs allocate nothing. */
typedef struct {
    zt_jbuf body;
} http_req;

static char no_body;

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* The Allow header of the routes that only read. */
#define GET_ONLY "GET, HEAD, OPTIONS"

/* OPTIONS asks which methods a resource takes (RFC 9110 9.3.7): 204 with them in Allow. It is
 * also a browser's CORS preflight, which may cache the answer for Max-Age seconds. */
static enum MHD_Result options_answer(struct MHD_Connection *c, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    return zt_http_queue(c, MHD_HTTP_NO_CONTENT, r);
}

/* A method the route does not dispatch: 405 naming the route's methods in Allow. OPTIONS, which
 * no route dispatches, reaches here for every route there is, and is answered with them. */
static enum MHD_Result method_not_allowed(struct MHD_Connection *c, const char *method,
                                          const char *url, const char *allow) {
    if (!strcmp(method, "OPTIONS"))
        return options_answer(c, allow);
    return zt_http_send_error_with_header(c, MHD_HTTP_METHOD_NOT_ALLOWED, MHD_HTTP_HEADER_ALLOW,
                                          allow, "%s is not allowed on %s (%s)", method, url,
                                          allow);
}

/* /api/v1/jobs/{id}[/{sub}] once the token has been checked by route(). */
static enum MHD_Result route_job(zt_http_server *s, struct MHD_Connection *c, const char *method,
                                 const char *url, const char *rest, const http_req *req) {
    const char *slash = strchr(rest, '/');
    size_t id_len = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *sub = slash ? slash + 1 : "";
    char id[sizeof(((zt_job_info *)0)->id)];
    enum { JOB, METRICS, RECORDS, LOGS, EVENTS, CANCEL, CSV, JSONL, TENSORBOARD, ANOMALIES,
           WEBHOOKS, CHECKPOINTS, CONFIG, N_SUBS };
    static const char *const subs[N_SUBS] = {
        "",       "metrics",     "records",       "logs",            "events",   "cancel",
        "metrics.csv", "metrics.jsonl", "tensorboard.tar", "anomalies", "webhooks",
        "checkpoints", "config"};
    int which = 0;
    while (which < N_SUBS && strcmp(sub, subs[which]) != 0)
        which++;
    if (which == N_SUBS)
        return zt_http_send_error(c, MHD_HTTP_NOT_FOUND, "no route %s %s", method, url);
    if (!zt_http_valid_job_id(rest, id_len)) {
        /* No job has such an id: NOT_FOUND with its whole resource name, in the message and
         * as the problem's resource, what gRPC answers for the same id. */
        char *bad = strndup(rest, id_len), *msg = bad ? malloc(id_len + 32) : NULL;
        if (!msg) {
            free(bad);
            return MHD_NO;
        }
        snprintf(msg, id_len + 32, "jobs/%s not found", bad);
        zt_api_error e;
        zt_api_error_from_status(&e, ZT_ERR_NOT_FOUND, msg, NULL, bad);
        free(msg);
        free(bad);
        return zt_http_send_api_error(c, &e);
    }
    memcpy(id, rest, id_len);
    id[id_len] = '\0';
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (which == CANCEL) {
        if (strcmp(method, "POST") != 0)
            return method_not_allowed(c, method, url, "POST, OPTIONS");
        /* Every route that changes state takes JSON only: a cross-origin form or "simple"
         * request cannot send that type, and one that can is preflighted first. */
        enum MHD_Result ret;
        if (!zt_http_guard_json(c, method, &ret))
            return ret;
        return zt_http_job_cancel(s, c, id, req ? &req->body : NULL);
    }
    /* An event stream has no HEAD: its headers would promise a body that never ends. */
    if (which == EVENTS && strcmp(method, "GET") != 0)
        return method_not_allowed(c, method, url, "GET, OPTIONS");
    if (!get)
        return method_not_allowed(c, method, url, GET_ONLY);
    switch (which) {
    case JOB: return zt_http_job_get(s, c, id);
    case METRICS: return zt_http_job_metrics(s, c, id);
    case RECORDS: return zt_http_job_list(s, c, id, ZT_LIST_RECORDS);
    case LOGS: return zt_http_job_list(s, c, id, ZT_LIST_LOGS);
    case CSV: return zt_http_job_export(s, c, id, true);
    case JSONL: return zt_http_job_export(s, c, id, false);
    case TENSORBOARD: return zt_http_job_tensorboard(s, c, id);
    case ANOMALIES: return zt_http_job_list(s, c, id, ZT_LIST_ANOMALIES);
    case WEBHOOKS: return zt_http_job_list(s, c, id, ZT_LIST_WEBHOOKS);
    case CHECKPOINTS: return zt_http_job_checkpoints(s, c, id);
    case CONFIG: return zt_http_job_config(s, c, id);
    default: return zt_http_job_events(s, c, id);
    }
}

zt_auth_caller zt_http_caller(const zt_http_server *s, struct MHD_Connection *c) {
    if (!s->tokens)
        return (zt_auth_caller){.scope = ZT_SCOPE_ADMIN};
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return zt_auth_who(s->tokens, h);
}

/* The operation a request is (api_ops.h), whose scope it needs: the same table as gRPC's
 * methods. A GET or HEAD that reaches no route is a query (it is answered 404); any other
 * method on a route that takes none is admin's, as is whatever comes later. */
static zt_api_op http_op(const char *method, const char *url, bool get) {
    static const struct {
        const char *sub;
        zt_api_op op;
    } job_routes[] = {
        {"", ZT_OP_GET}, {"metrics", ZT_OP_METRICS}, {"records", ZT_OP_RECORDS},
        {"logs", ZT_OP_LOGS}, {"events", ZT_OP_WATCH}, {"metrics.csv", ZT_OP_EXPORT},
        {"metrics.jsonl", ZT_OP_EXPORT}, {"tensorboard.tar", ZT_OP_EXPORT},
        {"anomalies", ZT_OP_ANOMALIES}, {"webhooks", ZT_OP_DELIVERIES},
        {"checkpoints", ZT_OP_CHECKPOINTS}, {"config", ZT_OP_EFFECTIVE_CONFIG},
    };
    bool post = !strcmp(method, "POST");
    if (!strcmp(url, "/metrics"))
        return get ? ZT_OP_PROMETHEUS : ZT_OP_OTHER;
    if (!strcmp(url, "/api/v1/openapi.json"))
        return get ? ZT_OP_API_DOC : ZT_OP_OTHER;
    if (!strcmp(url, "/api/v1/jobs"))
        return get ? ZT_OP_LIST : post ? ZT_OP_SUBMIT : ZT_OP_OTHER;
    if (starts_with(url, "/api/v1/jobs/")) {
        const char *slash = strchr(url + strlen("/api/v1/jobs/"), '/');
        const char *sub = slash ? slash + 1 : "";
        if (post && !strcmp(sub, "cancel"))
            return ZT_OP_CANCEL;
        for (size_t i = 0; get && i < sizeof job_routes / sizeof job_routes[0]; i++)
            if (!strcmp(sub, job_routes[i].sub))
                return job_routes[i].op;
    }
    return get ? ZT_OP_GET : ZT_OP_OTHER;
}

static bool is_events_url(const char *url) {
    size_t n = strlen(url);
    return starts_with(url, "/api/v1/jobs/") && n > 7 && strcmp(url + n - 7, "/events") == 0;
}

/* %00 in a URL: libmicrohttpd decodes the path and the query arguments in place, and every
 * handler reads them as C strings, which would stop at a decoded NUL ("/api/v1/jobs%00x" routed
 * as "/api/v1/jobs", a page_token "%00x" read as ""). So a NUL decodes to DEL (0x7F) instead, a
 * control character that no route, job id or token holds, and which route() refuses in the
 * path and in any query argument. The length stays the decoded one. */
static size_t unescape_url(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c;
    size_t n = MHD_http_unescape(s);
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\0')
            s[i] = 0x7f;
    return n;
}

static bool has_control(const char *s) {
    for (; s && *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

/* The first query argument whose name or value holds a control character (%00-%1F, %7F), which
 * none of the API's arguments takes. The event stream's access_token is a credential, judged
 * whole by zt_http_events_token_scope: one with such a byte matches no token, so 401 unless the
 * request has another. */
static enum MHD_Result find_control_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                        const char *value) {
    (void)kind;
    if (!has_control(key) && (!has_control(value) || !strcmp(key, "access_token")))
        return MHD_YES;
    *(const char **)cls = key;
    return MHD_NO;
}

static const char *control_arg(struct MHD_Connection *c) {
    const char *bad = NULL;
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, find_control_arg, &bad);
    return bad;
}

/* Whether the caller's token may make this request: if not, *ret is the 401 or 403. */
static bool caller_may(zt_http_server *s, struct MHD_Connection *c, const char *method,
                       const char *url, bool get, enum MHD_Result *ret) {
    zt_scope have = zt_http_caller(s, c).scope;
    if (have == ZT_SCOPE_NONE && is_events_url(url))
        have = zt_http_events_token_scope(s, c);
    zt_scope need = zt_api_op_scope(http_op(method, url, get));
    zt_api_error e;
    if (have == ZT_SCOPE_NONE) {
        bool sent = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION) ||
                    (is_events_url(url) && zt_http_arg(c, "access_token"));
        zt_api_error_refusal(&e, GRPC_STATUS_UNAUTHENTICATED,
                             sent ? "TOKEN_INVALID" : "CREDENTIALS_MISSING",
                             "missing or invalid bearer token");
        *ret = zt_http_send_refusal_error(c, MHD_HTTP_UNAUTHORIZED,
                                          MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer", &e);
        return false;
    }
    if (have < need) {
        char text[512];
        snprintf(text, sizeof text, "this token's scope is %s; %s %.300s needs %s",
                 zt_scope_name(have), method, url, zt_scope_name(need));
        zt_api_error_refusal(&e, GRPC_STATUS_PERMISSION_DENIED,
                             "ACCESS_TOKEN_SCOPE_INSUFFICIENT", text);
        zt_api_error_meta(&e, "scope", zt_scope_name(have));
        zt_api_error_meta(&e, "requiredScope", zt_scope_name(need));
        *ret = zt_http_send_refusal_error(c, MHD_HTTP_FORBIDDEN, NULL, NULL, &e);
        return false;
    }
    return true;
}

static enum MHD_Result route(zt_http_server *s, struct MHD_Connection *c, const char *url,
                             const char *method, const http_req *req) {
    /* No route or resource name holds a control character; one decoded from the path (%00,
     * which unescape_url turned into DEL, or %01-%1F, %7F) is refused by where it is rather
     * than echoed as a byte the client did not send. */
    for (const char *p = url; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                      "path: a control character (%%00-%%1F, %%7F) at byte %zu "
                                      "of the decoded path, which no route or name holds",
                                      (size_t)(p - url));
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool api = starts_with(url, "/api/");
    if (api || !strcmp(url, "/metrics")) {
        /* OPTIONS needs no token: a browser's CORS preflight carries none, and what it learns,
         * a route's methods, the OpenAPI document says to anyone. It goes down the routes
         * below like any method, so an unknown path is 404 as for GET, and method_not_allowed
         * answers it for every route. */
        enum MHD_Result ret;
        if (strcmp(method, "OPTIONS") != 0 && !caller_may(s, c, method, url, get, &ret))
            return ret;
        const char *bad_arg = control_arg(c);
        if (bad_arg)
            return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                      "%.64s: a query argument may not hold a control character "
                                      "(%%00-%%1F, %%7F)", bad_arg);
        if (!api)
            return get ? zt_http_prometheus(s, c) : method_not_allowed(c, method, url, GET_ONLY);
        if (!strcmp(url, "/api/v1/jobs")) {
            if (get)
                return zt_http_jobs_list(s, c);
            if (strcmp(method, "POST") != 0)
                return method_not_allowed(c, method, url, "GET, HEAD, POST, OPTIONS");
            if (!zt_http_guard_json(c, method, &ret))
                return ret;
            return zt_http_jobs_submit(s, c, req ? &req->body : NULL);
        }
        if (starts_with(url, "/api/v1/jobs/"))
            return route_job(s, c, method, url, url + strlen("/api/v1/jobs/"), req);
        if (!strcmp(url, "/api/v1/openapi.json"))
            return get ? zt_http_openapi(s, c) : method_not_allowed(c, method, url, GET_ONLY);
        return zt_http_send_error(c, MHD_HTTP_NOT_FOUND, "no route %s %s", method, url);
    }
    const char *file_dir = NULL, *rel = NULL, *cache = "no-cache";
    if (!strcmp(url, "/healthz")) {
        return get ? zt_http_healthz(s, c) : method_not_allowed(c, method, url, GET_ONLY);
    } else if (!strcmp(url, "/")) {
        file_dir = s->web_dir, rel = "index.html";
    } else if (starts_with(url, "/static/")) {
        file_dir = s->web_dir, rel = url + strlen("/static/");
    } else if (starts_with(url, "/vendor/chart.js/")) {
        /* A Debian package's file changes only with the package. */
        file_dir = s->chartjs_dir, rel = url + strlen("/vendor/chart.js/"), cache = "max-age=86400";
    } else {
        return zt_http_send_error(c, MHD_HTTP_NOT_FOUND, "no route %s %s", method, url);
    }
    if (!get)
        return method_not_allowed(c, method, url, GET_ONLY);
    return zt_http_serve_file(c, file_dir, rel, cache);
}

static size_t body_limit(const zt_http_server *s, const char *url, const char *method) {
    bool submit = !strcmp(url, "/api/v1/jobs") && !strcmp(method, "POST");
    return submit && s->max_body < ZT_HTTP_SUBMIT_MAX_BODY ? ZT_HTTP_SUBMIT_MAX_BODY : s->max_body;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **req_cls) {
    zt_http_server *s = cls;
    if (*req_cls == NULL) {
        /* Each connection has its own thread, so this runs once per connection. Raising the
         * nice value needs no privilege; a failure just leaves the thread as it was. */
        static __thread bool niced;
        if (!niced) {
            setpriority(PRIO_PROCESS, (id_t)gettid(), ZT_HTTP_NICE);
            niced = true;
        }
        /* First call, headers only. A request from a name or an origin that may not ask, or
         * with a body announced as too large, is refused before its body is read; MHD then
         * closes the connection. */
        *req_cls = &no_body;
        enum MHD_Result ret;
        if (!zt_http_guard_client_cert(s, c, &ret) || !zt_http_guard_request(s, c, version, &ret))
            return ret;
        zt_http_conns_request_begun(s->conns, c);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        size_t limit = body_limit(s, url, method);
        if (cl && strtoull(cl, NULL, 10) > limit)
            return zt_http_send_error(c, MHD_HTTP_CONTENT_TOO_LARGE,
                                      "request body over %zu bytes", limit);
        return MHD_YES;
    }
    http_req *req = *req_cls == &no_body ? NULL : *req_cls;
    if (*upload_size > 0) {
        if (!req) {
            req = calloc(1, sizeof *req);
            if (!req)
                return MHD_NO;
            *req_cls = req;
        }
        /* A chunked body that grows past the cap: no status can be sent mid-body, so the
         * connection is dropped. */
        if (req->body.buf.len + *upload_size > body_limit(s, url, method))
            return MHD_NO;
        zt_jbuf_text(&req->body, upload_data, *upload_size);
        *upload_size = 0;
        return req->body.buf.oom ? MHD_NO : MHD_YES;
    }
    zt_http_conns_request_read(s->conns, c);
    return route(s, c, url, method, req);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
    zt_http_server *s = cls;
    zt_http_conns_request_done(s->conns, c);
    if (*req_cls && *req_cls != &no_body) {
        http_req *req = *req_cls;
        zt_jbuf_free(&req->body);
        free(req);
    }
    *req_cls = NULL;
}

/* MHD reports every malformed request; a client sending junk in a loop must not fill the
 * daemon's log, so at most ZT_HTTP_LOG_BURST messages go out per minute. */
#define ZT_HTTP_LOG_BURST 20
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int64_t window_start;
    static int in_window, dropped;
    int64_t now = zt_http_mono_ms();
    pthread_mutex_lock(&mu);
    if (now - window_start >= 60000) {
        if (dropped)
            zt_oplog(ZT_LOG_WARNING, "http: %d more messages were not logged\n", dropped);
        window_start = now;
        in_window = dropped = 0;
    }
    bool show = in_window++ < ZT_HTTP_LOG_BURST;
    dropped += !show;
    if (show) {
        char text[1024];
        vsnprintf(text, sizeof text, fmt, ap);
        zt_oplog(ZT_LOG_WARNING, "http: %s", text);
    }
    pthread_mutex_unlock(&mu);
}

/* ---- start and stop ---------------------------------------------------------------------- */

/* Our own listening socket, so that a port in use is an error naming it (MHD only logs it). */
static zt_status open_listener(const char *host, int port, int *fd_out) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (port < 0 || port > 65535)
        return zt_error(ZT_ERR_INVALID, "HTTP port %d is out of range", port);
    if (inet_pton(AF_INET, strcmp(host, "localhost") ? host : "127.0.0.1", &a.sin_addr) != 1)
        return zt_error(ZT_ERR_INVALID, "HTTP host '%s' is not an IPv4 address", host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "HTTP socket: %s", strerror(errno));
    /* SO_REUSEADDR only lets a restart bind past old connections in TIME_WAIT; on Linux it
     * does not let two servers listen on one port. */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        return zt_error(ZT_ERR_IO, "HTTP: cannot listen on %s:%d: %s", host, port, strerror(e));
    }
    *fd_out = fd;
    return ZT_OK;
}

static int bound_port(int fd) {
    struct sockaddr_in a;
    socklen_t n = sizeof a;
    return getsockname(fd, (struct sockaddr *)&a, &n) == 0 ? ntohs(a.sin_port) : -1;
}

static void server_free(zt_http_server *s) {
    zt_http_conns_destroy(s->conns);
    zt_series_cache_destroy(s->cache);
    zt_http_guard_free(&s->guard);
    free(s->web_dir);
    free(s->chartjs_dir);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static char *dup_or_null(const char *p) {
    return p ? strdup(p) : NULL;
}

zt_status zt_http_start(zt_http_server **out, const zt_http_config *cfg, zt_jobs *jm) {
    *out = NULL;
    if (!cfg->page_key)
        return zt_error(ZT_ERR_INVALID, "HTTP server: no page token key");
    zt_http_server *s = calloc(1, sizeof *s);
    if (!s)
        return ZT_ERR_NOMEM;
    pthread_mutex_init(&s->mu, NULL);
    s->jm = jm;
    s->cache = zt_series_cache_create();
    s->tokens = cfg->tokens;
    s->page_key = *cfg->page_key;
    s->web_dir = dup_or_null(cfg->web_dir);
    s->chartjs_dir = dup_or_null(cfg->chartjs_dir);
    s->max_body = cfg->max_request_bytes ? cfg->max_request_bytes : 64 * 1024;
    s->metrics_window_ms = (cfg->metrics_window_s < 0 ? 3600 : cfg->metrics_window_s) * 1000;
    if (!s->cache || (cfg->web_dir && !s->web_dir) ||
        (cfg->chartjs_dir && !s->chartjs_dir)) {
        server_free(s);
        return ZT_ERR_NOMEM;
    }
    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    zt_status st = zt_http_guard_init(&s->guard, host, cfg->hosts, cfg->n_hosts, cfg->origins,
                                      cfg->n_origins);
    struct MHD_OptionItem tls_opts[ZT_HTTP_TLS_OPTIONS];
    unsigned tls_flags = 0;
    if (st == ZT_OK)
        st = zt_http_tls_options(s, cfg->tls, tls_opts, &tls_flags);
    if (st != ZT_OK) {
        server_free(s);
        return st;
    }
    int fd = -1;
    st = open_listener(host, cfg->port, &fd);
    if (st != ZT_OK) {
        server_free(s);
        return st;
    }
    s->port = bound_port(fd);
    unsigned max_conn = cfg->max_connections ? cfg->max_connections : 256;
    /* On loopback every client shares one address; the per-address cap matters when serving
     * a network, where one host should not take every slot. */
    unsigned per_ip = max_conn > 16 ? max_conn / 2 : max_conn;
    st = zt_http_conns_create(&s->conns, s, max_conn, per_ip,
                              cfg->header_timeout_s ? cfg->header_timeout_s
                                                    : ZT_HTTP_HEADER_TIMEOUT_S);
    if (st != ZT_OK) {
        close(fd);
        server_free(s);
        return st;
    }
    /* The slots are ztraind's (http_conns.c). libmicrohttpd's own bound only has to leave room
     * for connections that were displaced and are still being closed. */
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ITC | MHD_USE_ERROR_LOG | tls_flags,
        0, zt_http_conns_admit, s->conns, on_request, s,
        /* First, so that MHD's own messages about the options below go through it too. */
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * max_conn),
        MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(cfg->idle_timeout_s ? cfg->idle_timeout_s : ZT_HTTP_IDLE_TIMEOUT_S),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)ZT_HTTP_MEMORY_LIMIT,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, zt_http_conns_notify, s->conns,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape_url, NULL,
        MHD_OPTION_ARRAY, tls_opts,
        MHD_OPTION_END);
    if (!s->daemon) {
        close(fd);
        server_free(s);
        return zt_error(ZT_ERR_IO, "HTTP %s:%d: libmicrohttpd failed to start", host, cfg->port);
    }
    *out = s;
    return ZT_OK;
}

int zt_http_port(const zt_http_server *s) {
    return s ? s->port : -1;
}

void zt_http_stop(zt_http_server *s) {
    if (!s)
        return;
    /* First, because MHD_stop_daemon joins the connection threads, and a stream's thread
     * waits for events until it is told to end. */
    zt_http_events_stop_all(s);
    MHD_stop_daemon(s->daemon);
    server_free(s);
}
