/* ztraind's HTTP server on libmicrohttpd (http_api.h): routing, bearer auth and CORS, the JSON
 * read API over the job manager, job cancellation, Prometheus' /metrics, the live event stream
 * (Server-Sent Events) and the dashboard's static files.
 *
 * Threading: one thread per connection (MHD_USE_THREAD_PER_CONNECTION), because an event
 * stream's content reader blocks until the job manager has something to say; ordinary requests
 * copy what they need out of the manager (which holds its lock only for the copy) and encode
 * it on their own thread. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "auth.h"
#include "http_api.h"
#include "http_json.h"

/* An idle keep-alive connection is closed after this long. Event streams stay open: their
 * keepalive comments count as activity. */
#define ZT_HTTP_TIMEOUT_S 30u
#define ZT_HTTP_MEMORY_LIMIT ((size_t)64 * 1024)
#define ZT_SSE_KEEPALIVE_MS 15000
/* How often a waiting stream checks whether its client went away. */
#define ZT_SSE_POLL_MS 1000
/* A client that reads slower than the job writes is cut off rather than grow without bound;
 * the replay of a long history counts too (about 60000 records of a GPT-2 job), and a client
 * that wants more reads /records first and streams from where it ends. */
#define ZT_SSE_MAX_QUEUED ((size_t)32 * 1024 * 1024)
#define ZT_MAX_KEYS 64
#define ZT_MAX_LIST_LIMIT 1000
#define ZT_MAX_LOG_TAIL 100000
/* The nice value of connection threads: under load the HTTP side yields the cores to the
 * training ranks (nice 0), which are what the machine is for. */
#define ZT_HTTP_NICE 10
/* Series responses kept for repeated queries (see series_cache_get): slots, and the largest
 * body kept, so the cache stays under 8 MiB. */
#define ZT_CACHE_SLOTS 32
#define ZT_CACHE_MAX_BODY ((size_t)256 * 1024)

typedef struct zt_sse zt_sse;

typedef struct {
    char *query;              /* "<job id>\n<since_step>\n<max_points>\n<key>,<key>..." */
    int64_t n_records;        /* the job's record count the body was computed at (or after) */
    char *body;
    size_t len;
    uint64_t used;            /* when last hit, for eviction */
} series_cache_slot;

struct zt_http_server {
    struct MHD_Daemon *daemon;
    zt_jobs *jm;
    char *token;
    char *web_dir;
    char *chartjs_dir;
    size_t max_body;
    int port;
    pthread_mutex_t mu;       /* guards streams and stopping */
    zt_sse *streams;          /* live event streams, so that stop can end them */
    bool stopping;
    pthread_mutex_t cache_mu; /* guards the cache */
    series_cache_slot cache[ZT_CACHE_SLOTS];
    uint64_t cache_clock;
};

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- responses --------------------------------------------------------------------------- */

static void add_cors(struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
}

/* Queues r (CORS added) and drops our reference: MHD keeps the response until it is sent. */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned code, struct MHD_Response *r) {
    if (!r)
        return MHD_NO;
    add_cors(r);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* Sends the buffer's text (which it takes over) with the given type. */
static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, zt_jbuf *b,
                                 const char *type) {
    size_t n;
    char *p = zt_jbuf_take(b, &n);
    if (!p)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, p, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(p);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    return queue(c, code, r);
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, zt_jbuf *b) {
    return send_text(c, code, b, "application/json");
}

/* {"error": "..."} with the given status, and one more header when hname is not NULL. */
static enum MHD_Result send_error_h(struct MHD_Connection *c, unsigned code, const char *hname,
                                    const char *hvalue, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_error(&b, msg);
    size_t n;
    char *p = zt_jbuf_take(&b, &n);
    if (!p)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, p, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(p);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (hname)
        MHD_add_response_header(r, hname, hvalue);
    return queue(c, code, r);
}

#define send_error(c, code, ...) send_error_h((c), (code), NULL, NULL, __VA_ARGS__)

/* The HTTP status of a job manager failure, with its message. */
static enum MHD_Result send_status(struct MHD_Connection *c, zt_status s, const char *id) {
    const char *msg = zt_last_error();
    switch ((int)s) {
    case ZT_ERR_NOT_FOUND:
        return send_error(c, MHD_HTTP_NOT_FOUND, "%s", *msg ? msg : "no such job");
    case ZT_ERR_INVALID:
        return send_error(c, MHD_HTTP_BAD_REQUEST, "%s", msg);
    case ZT_ERR_LIMIT:
        return send_error(c, MHD_HTTP_TOO_MANY_REQUESTS, "%s", msg);
    default:
        return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "job %s: %s", id ? id : "-", msg);
    }
}

/* ---- query arguments --------------------------------------------------------------------- */

static const char *arg(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

/* Reads the integer argument `name` into *out (left as it is when absent). On a malformed or
 * out-of-range value it answers 400 naming the argument, sets *ret and returns false. */
static bool arg_int(struct MHD_Connection *c, const char *name, int64_t lo, int64_t hi,
                    int64_t *out, enum MHD_Result *ret) {
    const char *v = arg(c, name);
    if (!v)
        return true;
    char *end = NULL;
    errno = 0;
    long long x = *v && !isspace((unsigned char)*v) ? strtoll(v, &end, 10) : 0;
    if (!end || end == v || *end || errno || x < lo || x > hi) {
        if (hi == INT64_MAX)
            *ret = send_error(c, MHD_HTTP_BAD_REQUEST,
                              "%s: expected an integer >= %" PRId64 ", got '%.64s'", name, lo, v);
        else
            *ret = send_error(c, MHD_HTTP_BAD_REQUEST,
                              "%s: expected an integer from %" PRId64 " to %" PRId64
                              ", got '%.64s'", name, lo, hi, v);
        return false;
    }
    *out = x;
    return true;
}

static bool arg_bool(struct MHD_Connection *c, const char *name, bool *out,
                     enum MHD_Result *ret) {
    const char *v = arg(c, name);
    if (!v)
        return true;
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !*v) {
        *out = true;
    } else if (!strcmp(v, "0") || !strcasecmp(v, "false")) {
        *out = false;
    } else {
        *ret = send_error(c, MHD_HTTP_BAD_REQUEST, "%s: expected 0, 1, true or false, got '%.64s'",
                          name, v);
        return false;
    }
    return true;
}

/* Job ids are short and plain ("job-000042"); anything else cannot name a job, and checking
 * here keeps odd bytes out of the manager and the messages. */
static bool valid_job_id(const char *id, size_t n) {
    if (n == 0 || n >= sizeof(((zt_job_info *)0)->id))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && id[i] != '-' && id[i] != '_' && id[i] != '.')
            return false;
    return true;
}

/* ---- checkpoints ------------------------------------------------------------------------- */

static int64_t tag_step(const char *tag) {
    size_t n = strlen(tag), i = n;
    while (i > 0 && isdigit((unsigned char)tag[i - 1]))
        i--;
    if (i == n || n - i > 18)
        return -1;
    return strtoll(tag + i, NULL, 10);
}

static int ckpt_cmp(const void *a, const void *b) {
    const zt_ckpt_entry *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->tag, y->tag);
}

static char *read_latest(int dfd) {
    int fd = openat(dfd, "latest", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    while (n > 0 && isspace((unsigned char)buf[n - 1]))
        n--;
    buf[n] = '\0';
    return n ? strdup(buf) : NULL;
}

/* The subdirectories of a job's checkpoint_dir, oldest step first. Directories whose name
 * starts with '.' are checkpoints being written (checkpoint.c renames them into place). */
static void list_checkpoints(const char *dir, zt_ckpt_list *out) {
    memset(out, 0, sizeof *out);
    DIR *d = dir && *dir ? opendir(dir) : NULL;
    if (!d)
        return;
    int dfd = dirfd(d);
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && out->n < 10000) {
        struct stat st;
        if (e->d_name[0] == '.' || fstatat(dfd, e->d_name, &st, 0) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (out->n == cap) {
            int ncap = cap ? cap * 2 : 8;
            zt_ckpt_entry *p = realloc(out->items, sizeof *p * (size_t)ncap);
            if (!p)
                break;
            out->items = p;
            cap = ncap;
        }
        char done[NAME_MAX + 8];
        snprintf(done, sizeof done, "%s/DONE", e->d_name);
        zt_ckpt_entry *c = &out->items[out->n];
        c->tag = strdup(e->d_name);
        if (!c->tag)
            break;
        c->step = tag_step(e->d_name);
        c->complete = faccessat(dfd, done, F_OK, 0) == 0;
        out->n++;
    }
    out->latest = read_latest(dfd);
    closedir(d);
    if (out->n > 1)
        qsort(out->items, (size_t)out->n, sizeof *out->items, ckpt_cmp);
}

static enum MHD_Result send_job(struct MHD_Connection *c, const zt_job_info *j) {
    zt_ckpt_list ck;
    list_checkpoints(j->checkpoint_dir, &ck);
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_job(&b, j, wall_ms(), &ck);
    zt_ckpt_list_free(&ck);
    return send_json(c, MHD_HTTP_OK, &b);
}

/* ---- JSON API ---------------------------------------------------------------------------- */

static enum MHD_Result api_healthz(zt_http_server *s, struct MHD_Connection *c) {
    zt_job_info *jobs = NULL;
    int n = 0;
    zt_status st = zt_jobs_all(s->jm, &jobs, &n);
    if (st != ZT_OK)
        return send_status(c, st, NULL);
    int running = 0, queued = 0;
    for (int i = 0; i < n; i++) {
        zt_job_state js = jobs[i].state;
        running += js == ZT_JOB_STARTING || js == ZT_JOB_RUNNING || js == ZT_JOB_STOPPING;
        queued += js == ZT_JOB_QUEUED;
        zt_job_info_free(&jobs[i]);
    }
    free(jobs);
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_open(&b, '{');
    zt_json_key(&b, "status");
    zt_json_str(&b, "ok");
    zt_json_key(&b, "jobs");
    zt_json_int(&b, n);
    zt_json_key(&b, "running");
    zt_json_int(&b, running);
    zt_json_key(&b, "queued");
    zt_json_int(&b, queued);
    zt_json_close(&b, '}');
    return send_json(c, MHD_HTTP_OK, &b);
}

/* List items leave out "checkpoints" and "latest": listing a directory per job would make the
 * jobs page cost disk reads; GET /api/v1/jobs/{id} has them. */
static enum MHD_Result api_list(zt_http_server *s, struct MHD_Connection *c) {
    enum MHD_Result ret;
    int64_t limit = 50;
    if (!arg_int(c, "limit", 1, ZT_MAX_LIST_LIMIT, &limit, &ret))
        return ret;
    zt_job_state state = 0;
    const char *sv = arg(c, "state");
    if (sv && *sv && !(state = zt_job_state_parse(sv)))
        return send_error(c, MHD_HTTP_BAD_REQUEST, "state: unknown job state '%.64s'", sv);
    const char *after = arg(c, "after");
    if (after && *after && !valid_job_id(after, strlen(after)))
        return send_error(c, MHD_HTTP_BAD_REQUEST, "after: '%.64s' is not a job id", after);
    zt_job_info *jobs = NULL;
    int n = 0;
    bool more = false;
    zt_status st = zt_jobs_list(s->jm, state, after, (int)limit, &jobs, &n, &more);
    if ((st == ZT_ERR_NOT_FOUND || st == ZT_ERR_INVALID) && after && *after)
        return send_error(c, MHD_HTTP_BAD_REQUEST, "after: %s", zt_last_error());
    if (st != ZT_OK)
        return send_status(c, st, NULL);
    int64_t now = wall_ms();
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_json_open(&b, '{');
    zt_json_key(&b, "jobs");
    zt_json_open(&b, '[');
    for (int i = 0; i < n; i++)
        zt_json_job(&b, &jobs[i], now, NULL);
    zt_json_close(&b, ']');
    zt_json_key(&b, "next_after");
    zt_json_str(&b, more && n > 0 ? jobs[n - 1].id : NULL);
    zt_json_close(&b, '}');
    for (int i = 0; i < n; i++)
        zt_job_info_free(&jobs[i]);
    free(jobs);
    return send_json(c, MHD_HTTP_OK, &b);
}

static enum MHD_Result api_job(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    zt_job_info info;
    zt_status st = zt_jobs_get(s->jm, id, &info);
    if (st != ZT_OK)
        return send_status(c, st, id);
    enum MHD_Result ret = send_job(c, &info);
    zt_job_info_free(&info);
    return ret;
}

/* One metric's history as copied out of the manager: the copy is all that happens under its
 * lock; the encoding happens afterwards. */
typedef struct {
    char *key;
    int64_t *steps;
    double *values;
    int n;
} series_copy;

typedef struct {
    series_copy *v;
    int n, cap;
    bool oom;
} series_set;

static void series_collect(void *ctx, const char *key, const int64_t *steps,
                           const double *values, int n) {
    series_set *set = ctx;
    if (set->oom)
        return;
    if (set->n == set->cap) {
        int ncap = set->cap ? set->cap * 2 : 8;
        series_copy *p = realloc(set->v, sizeof *p * (size_t)ncap);
        if (!p) {
            set->oom = true;
            return;
        }
        set->v = p;
        set->cap = ncap;
    }
    size_t m = n > 0 ? (size_t)n : 0;
    series_copy *sc = &set->v[set->n];
    sc->key = strdup(key);
    sc->steps = malloc(sizeof *steps * (m ? m : 1));
    sc->values = malloc(sizeof *values * (m ? m : 1));
    sc->n = (int)m;
    set->n++;
    if (!sc->key || !sc->steps || !sc->values) {
        set->oom = true;
        return;
    }
    memcpy(sc->steps, steps, sizeof *steps * m);
    memcpy(sc->values, values, sizeof *values * m);
}

static void series_set_free(series_set *set) {
    for (int i = 0; i < set->n; i++) {
        free(set->v[i].key);
        free(set->v[i].steps);
        free(set->v[i].values);
    }
    free(set->v);
}

/* Splits "a,b,,c" in place into at most ZT_MAX_KEYS distinct non-empty keys; -1 when there are
 * more. */
static int split_keys(char *list, const char **keys) {
    int n = 0;
    for (char *save = NULL, *k = strtok_r(list, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        bool dup = false;
        for (int i = 0; i < n && !dup; i++)
            dup = strcmp(keys[i], k) == 0;
        if (dup)
            continue;
        if (n == ZT_MAX_KEYS)
            return -1;
        keys[n++] = k;
    }
    return n;
}

static const series_copy *find_series(const series_set *set, const char *key) {
    for (int i = 0; i < set->n; i++)
        if (strcmp(set->v[i].key, key) == 0)
            return &set->v[i];
    return NULL;
}

/* Series come back in the order the keys were asked for, an empty one for a key the job never
 * reported, so a client can index them; without keys, in the manager's first-seen order. */
static void encode_series(zt_jbuf *b, const char *id, const series_set *set, const char **keys,
                          int n_keys) {
    zt_json_open(b, '{');
    zt_json_key(b, "job_id");
    zt_json_str(b, id);
    zt_json_key(b, "series");
    zt_json_open(b, '[');
    if (n_keys == 0) {
        for (int i = 0; i < set->n; i++)
            zt_json_series(b, set->v[i].key, set->v[i].steps, set->v[i].values, set->v[i].n);
    }
    for (int i = 0; i < n_keys; i++) {
        const series_copy *sc = find_series(set, keys[i]);
        if (sc)
            zt_json_series(b, keys[i], sc->steps, sc->values, sc->n);
        else
            zt_json_series(b, keys[i], NULL, NULL, 0);
    }
    zt_json_close(b, ']');
    zt_json_close(b, '}');
}

/* The series cache. A dashboard polls the same query again and again, and computing it walks
 * the job's whole history under the job manager's lock, which is also what the supervisor
 * needs to take each new record from the ranks. A job's records are only ever appended, so a
 * response stays exact for as long as the job's record count is unchanged: a hit costs a
 * zt_jobs_get (a short copy under the lock) instead of the walk. */
static char *series_cache_get(zt_http_server *s, const char *query, int64_t n_records,
                              size_t *len) {
    char *body = NULL;
    pthread_mutex_lock(&s->cache_mu);
    for (int i = 0; i < ZT_CACHE_SLOTS; i++) {
        series_cache_slot *e = &s->cache[i];
        if (e->query && e->n_records == n_records && strcmp(e->query, query) == 0) {
            body = malloc(e->len + 1);
            if (body) {
                memcpy(body, e->body, e->len);
                body[e->len] = '\0';
                *len = e->len;
                e->used = ++s->cache_clock;
            }
            break;
        }
    }
    pthread_mutex_unlock(&s->cache_mu);
    return body;
}

/* Keeps a copy of body for query, replacing that query's older entry or the least recently
 * used one. */
static void series_cache_put(zt_http_server *s, const char *query, int64_t n_records,
                             const char *body, size_t len) {
    if (len > ZT_CACHE_MAX_BODY)
        return;
    char *q = strdup(query), *copy = malloc(len ? len : 1);
    if (!q || !copy) {
        free(q);
        free(copy);
        return;
    }
    memcpy(copy, body, len);
    pthread_mutex_lock(&s->cache_mu);
    series_cache_slot *victim = &s->cache[0];
    for (int i = 0; i < ZT_CACHE_SLOTS; i++) {
        series_cache_slot *e = &s->cache[i];
        if (e->query && strcmp(e->query, query) == 0) {
            victim = e;
            break;
        }
        if (!e->query || (victim->query && e->used < victim->used))
            victim = e;
    }
    free(victim->query);
    free(victim->body);
    *victim = (series_cache_slot){.query = q, .n_records = n_records, .body = copy, .len = len,
                                  .used = ++s->cache_clock};
    pthread_mutex_unlock(&s->cache_mu);
}

static void series_cache_free(zt_http_server *s) {
    for (int i = 0; i < ZT_CACHE_SLOTS; i++) {
        free(s->cache[i].query);
        free(s->cache[i].body);
    }
}

/* Sends a NUL-terminated body of len bytes (taken over) as JSON. */
static enum MHD_Result send_json_body(struct MHD_Connection *c, char *body, size_t len) {
    zt_jbuf b = {.data = body, .len = len, .cap = len + 1};
    return send_json(c, MHD_HTTP_OK, &b);
}

/* The series of the query, computed (the manager's walk, then the encoding outside its lock). */
static enum MHD_Result compute_series(zt_http_server *s, struct MHD_Connection *c,
                                      const char *id, const char **keys, int n_keys,
                                      int64_t since, int max_points, const char *query,
                                      int64_t n_records) {
    series_set set = {0};
    zt_status st = zt_jobs_metric_series(s->jm, id, keys, n_keys, since, max_points,
                                         series_collect, &set);
    enum MHD_Result ret = MHD_NO;
    if (st == ZT_OK && !set.oom) {
        zt_jbuf b;
        zt_jbuf_init(&b);
        encode_series(&b, id, &set, keys, n_keys);
        if (!b.oom)
            series_cache_put(s, query, n_records, b.data, b.len);
        ret = send_json(c, MHD_HTTP_OK, &b);
    } else if (st != ZT_OK) {
        ret = send_status(c, st, id);
    }
    series_set_free(&set);
    return ret;
}

static enum MHD_Result api_metrics(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    enum MHD_Result ret;
    int64_t since = 0, max_points = 0;
    if (!arg_int(c, "since_step", 0, INT64_MAX, &since, &ret) ||
        !arg_int(c, "max_points", 0, INT32_MAX, &max_points, &ret))
        return ret;
    const char *kv = arg(c, "keys");
    char *list = strdup(kv ? kv : "");
    if (!list)
        return MHD_NO;
    const char *keys[ZT_MAX_KEYS];
    int n_keys = split_keys(list, keys);
    if (n_keys < 0) {
        free(list);
        return send_error(c, MHD_HTTP_BAD_REQUEST, "keys: at most %d keys", ZT_MAX_KEYS);
    }
    zt_job_info info;
    zt_status st = zt_jobs_get(s->jm, id, &info);
    if (st != ZT_OK) {
        free(list);
        return send_status(c, st, id);
    }
    int64_t n_records = info.n_records;
    zt_job_info_free(&info);
    zt_jbuf q;
    zt_jbuf_init(&q);
    /* Keys cannot hold a comma (it separates them), nor the id and numbers a line break. */
    zt_jbuf_printf(&q, "%s\n%" PRId64 "\n%" PRId64 "\n", id, since, max_points);
    for (int i = 0; i < n_keys; i++)
        zt_jbuf_printf(&q, "%s%s", i ? "," : "", keys[i]);
    size_t len;
    char *body = q.oom ? NULL : series_cache_get(s, q.data, n_records, &len);
    if (body)
        ret = send_json_body(c, body, len);
    else if (!q.oom)
        ret = compute_series(s, c, id, keys, n_keys, since, (int)max_points, q.data, n_records);
    else
        ret = MHD_NO;
    zt_jbuf_free(&q);
    free(list);
    return ret;
}

static void record_encode(void *ctx, const zt_metric_record *r) {
    zt_json_record(ctx, r);
}

static void log_encode(void *ctx, const zt_log_line *l) {
    zt_json_log_line(ctx, l);
}

static void begin_job_array(zt_jbuf *b, const char *id, const char *name) {
    zt_json_open(b, '{');
    zt_json_key(b, "job_id");
    zt_json_str(b, id);
    zt_json_key(b, name);
    zt_json_open(b, '[');
}

static enum MHD_Result api_records(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    enum MHD_Result ret;
    int64_t since = 0;
    if (!arg_int(c, "since_step", 0, INT64_MAX, &since, &ret))
        return ret;
    zt_jbuf b;
    zt_jbuf_init(&b);
    begin_job_array(&b, id, "records");
    zt_status st = zt_jobs_metric_records(s->jm, id, since, record_encode, &b);
    if (st != ZT_OK) {
        zt_jbuf_free(&b);
        return send_status(c, st, id);
    }
    zt_json_close(&b, ']');
    zt_json_close(&b, '}');
    return send_json(c, MHD_HTTP_OK, &b);
}

static enum MHD_Result api_logs(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    enum MHD_Result ret;
    int64_t tail = 100;
    if (!arg_int(c, "tail", 0, ZT_MAX_LOG_TAIL, &tail, &ret))
        return ret;
    zt_jbuf b;
    zt_jbuf_init(&b);
    begin_job_array(&b, id, "lines");
    zt_status st = zt_jobs_logs(s->jm, id, tail ? (int)tail : 100, log_encode, &b);
    if (st != ZT_OK) {
        zt_jbuf_free(&b);
        return send_status(c, st, id);
    }
    zt_json_close(&b, ']');
    zt_json_close(&b, '}');
    return send_json(c, MHD_HTTP_OK, &b);
}

/* The optional body {"force": false, "grace_seconds": 30}. */
static bool parse_cancel_body(const zt_jbuf *body, bool *force, double *grace, char *err,
                              size_t errsz) {
    if (!body || body->len == 0)
        return true;
    cJSON *o = cJSON_ParseWithLength(body->data, body->len);
    bool ok = false;
    if (!o || !cJSON_IsObject(o)) {
        snprintf(err, errsz, "the body must be a JSON object");
        goto out;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "force");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "grace_seconds");
    if (f && !cJSON_IsBool(f) && !cJSON_IsNull(f)) {
        snprintf(err, errsz, "force: expected true or false");
        goto out;
    }
    if (g && !cJSON_IsNull(g) && (!cJSON_IsNumber(g) || !isfinite(g->valuedouble) ||
                                  g->valuedouble < 0)) {
        snprintf(err, errsz, "grace_seconds: expected a number >= 0");
        goto out;
    }
    *force = cJSON_IsTrue(f);
    *grace = cJSON_IsNumber(g) ? g->valuedouble : 0;
    ok = true;
out:
    cJSON_Delete(o);
    return ok;
}

static enum MHD_Result api_cancel(zt_http_server *s, struct MHD_Connection *c, const char *id,
                                  const zt_jbuf *body) {
    bool force = false;
    double grace = 0;
    char err[128];
    if (!parse_cancel_body(body, &force, &grace, err, sizeof err))
        return send_error(c, MHD_HTTP_BAD_REQUEST, "%s", err);
    zt_job_info info;
    zt_status st = zt_jobs_cancel(s->jm, id, force, grace, &info);
    if (st != ZT_OK)
        return send_status(c, st, id);
    enum MHD_Result ret = send_job(c, &info);
    zt_job_info_free(&info);
    return ret;
}

/* ---- Prometheus /metrics ----------------------------------------------------------------- */

/* The record keys /metrics reports beyond what zt_job_info carries: the last value of each. */
enum { K_LR, K_STEP_MS, K_TFLOPS, K_GRAD_NORM, K_SKIPPED, K_COUNT };
static const char *const prom_keys[K_COUNT] = {
    "train/learning_rate", "perf/step_time_ms", "perf/tflops", "train/grad_norm",
    "train/skipped_steps",
};

typedef struct {
    double v[K_COUNT];
} prom_last;

static void prom_collect(void *ctx, const char *key, const int64_t *steps, const double *values,
                         int n) {
    prom_last *l = ctx;
    for (int k = 0; k < K_COUNT; k++)
        if (n > 0 && strcmp(key, prom_keys[k]) == 0)
            l->v[k] = values[n - 1];
}

static double pv_world_size(const zt_job_info *j, const prom_last *l) { return j->world_size; }
static double pv_step(const zt_job_info *j, const prom_last *l) { return (double)j->step; }
static double pv_loss(const zt_job_info *j, const prom_last *l) { return j->loss; }
static double pv_tps(const zt_job_info *j, const prom_last *l) { return j->tokens_per_second; }
static double pv_lr(const zt_job_info *j, const prom_last *l) { return l->v[K_LR]; }
static double pv_step_s(const zt_job_info *j, const prom_last *l) { return l->v[K_STEP_MS] / 1e3; }
static double pv_tflops(const zt_job_info *j, const prom_last *l) { return l->v[K_TFLOPS]; }
static double pv_gnorm(const zt_job_info *j, const prom_last *l) { return l->v[K_GRAD_NORM]; }
static double pv_skipped(const zt_job_info *j, const prom_last *l) { return l->v[K_SKIPPED]; }

static const struct {
    const char *name, *type, *help;
    double (*value)(const zt_job_info *, const prom_last *);
} prom_job_families[] = {
    {"ztrain_job_world_size", "gauge", "Ranks the job runs on.", pv_world_size},
    {"ztrain_job_step", "gauge", "Last train/global_step the job reported.", pv_step},
    {"ztrain_job_loss", "gauge", "Last training loss (train/loss).", pv_loss},
    {"ztrain_job_tokens_per_second", "gauge", "Last training throughput in tokens per second.",
     pv_tps},
    {"ztrain_job_learning_rate", "gauge", "Last learning rate (train/learning_rate).", pv_lr},
    {"ztrain_job_step_time_seconds", "gauge", "Duration of the last logged step in seconds.",
     pv_step_s},
    {"ztrain_job_tflops", "gauge", "Last achieved model TFLOPS (perf/tflops).", pv_tflops},
    {"ztrain_job_grad_norm", "gauge", "Last global gradient norm (train/grad_norm).", pv_gnorm},
    {"ztrain_job_skipped_steps_total", "counter",
     "Optimizer steps skipped because of gradient overflow.", pv_skipped},
};
#define N_PROM_JOB_FAMILIES (sizeof prom_job_families / sizeof prom_job_families[0])

static void prom_family(zt_jbuf *b, const char *name, const char *type, const char *help) {
    zt_jbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value in the exposition format: backslash, double quote and newline escaped. */
static void prom_label_value(zt_jbuf *b, const char *v) {
    const char *run = v;
    for (const char *p = v; *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        if (!esc)
            continue;
        zt_jbuf_text(b, run, (size_t)(p - run));
        zt_jbuf_puts(b, esc);
        run = p + 1;
    }
    zt_jbuf_puts(b, run);
}

static void prom_job_labels(zt_jbuf *b, const zt_job_info *j) {
    zt_jbuf_puts(b, "{job_id=\"");
    prom_label_value(b, j->id);
    zt_jbuf_puts(b, "\",job_name=\"");
    prom_label_value(b, j->name ? j->name : "");
    zt_jbuf_puts(b, "\"");
}

/* A sample value: JSON's number syntax is also valid exposition text. */
static void prom_value(zt_jbuf *b, double v) {
    zt_jbuf_puts(b, "} ");
    zt_json_num(b, v);
    zt_jbuf_puts(b, "\n");
}

static void prom_write(zt_jbuf *b, const zt_job_info *jobs, const prom_last *last, int n) {
    prom_family(b, "ztrain_up", "gauge", "1 while ztraind answers.");
    zt_jbuf_puts(b, "ztrain_up 1\n");
    prom_family(b, "ztrain_jobs", "gauge", "Jobs known to ztraind, by state.");
    for (zt_job_state st = ZT_JOB_QUEUED; st <= ZT_JOB_CANCELLED; st++) {
        int count = 0;
        for (int i = 0; i < n; i++)
            count += jobs[i].state == st;
        zt_jbuf_printf(b, "ztrain_jobs{state=\"%s\"} %d\n", zt_job_state_name(st), count);
    }
    prom_family(b, "ztrain_job_state", "gauge", "1 for the job's current state.");
    for (int i = 0; i < n; i++) {
        zt_jbuf_puts(b, "ztrain_job_state");
        prom_job_labels(b, &jobs[i]);
        zt_jbuf_printf(b, ",state=\"%s\"", zt_job_state_name(jobs[i].state));
        prom_value(b, 1);
    }
    for (size_t f = 0; f < N_PROM_JOB_FAMILIES; f++) {
        prom_family(b, prom_job_families[f].name, prom_job_families[f].type,
                    prom_job_families[f].help);
        for (int i = 0; i < n; i++) {
            double v = prom_job_families[f].value(&jobs[i], &last[i]);
            if (isnan(v))
                continue;
            zt_jbuf_puts(b, prom_job_families[f].name);
            prom_job_labels(b, &jobs[i]);
            prom_value(b, v);
        }
    }
}

static enum MHD_Result api_prometheus(zt_http_server *s, struct MHD_Connection *c) {
    zt_job_info *jobs = NULL;
    int n = 0;
    zt_status st = zt_jobs_all(s->jm, &jobs, &n);
    if (st != ZT_OK)
        return send_status(c, st, NULL);
    prom_last *last = malloc(sizeof *last * (size_t)(n > 0 ? n : 1));
    enum MHD_Result ret = MHD_NO;
    if (last) {
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < K_COUNT; k++)
                last[i].v[k] = NAN;
            /* Only the records of the last step: the last value of each key, without walking
             * the job's whole history under the manager's lock. */
            if (jobs[i].n_records > 0)
                zt_jobs_metric_series(s->jm, jobs[i].id, prom_keys, K_COUNT, jobs[i].step, 1,
                                      prom_collect, &last[i]);
        }
        zt_jbuf b;
        zt_jbuf_init(&b);
        prom_write(&b, jobs, last, n);
        ret = send_text(c, MHD_HTTP_OK, &b, "text/plain; version=0.0.4; charset=utf-8");
    }
    free(last);
    for (int i = 0; i < n; i++)
        zt_job_info_free(&jobs[i]);
    free(jobs);
    return ret;
}

/* ---- live event stream (Server-Sent Events) ---------------------------------------------- */

/* One formatted event waiting to be sent. A job event is encoded under the manager's lock
 * without its checkpoints (listing them reads the disk): `ckpt_dir` is set, and the reader
 * finishes the event outside any lock. */
typedef struct sse_chunk {
    struct sse_chunk *next;
    char *data;
    size_t len;
    char *ckpt_dir;
} sse_chunk;

struct zt_sse {
    zt_http_server *srv;
    zt_sse *prev, *next;      /* in srv->streams, under srv->mu */
    zt_job_watch *watch;
    int fd;                   /* the client's socket, to notice that it went away */
    pthread_mutex_t mu;       /* guards the fields up to `stop` */
    pthread_cond_t cv;
    sse_chunk *head, *tail;
    size_t queued;
    bool ended;               /* the terminal job event is queued: nothing follows */
    bool overflow;
    bool stop;                /* the server is stopping */
    /* Owned by the content reader (one MHD thread). */
    char *out;
    size_t out_len, out_off;
    int64_t last_send_ms;
};

static void chunk_free(sse_chunk *ch) {
    free(ch->data);
    free(ch->ckpt_dir);
    free(ch);
}

/* The watch callback: runs under the job manager's lock, on the supervisor's thread or ours.
 * It only formats and queues; the content reader does the rest. */
static void sse_on_event(void *ctx, const zt_job_event *ev) {
    zt_sse *st = ctx;
    zt_jbuf b;
    zt_jbuf_init(&b);
    char *ckpt_dir = NULL;
    bool terminal = false;
    size_t data_at;
    if (ev->kind == ZT_EVENT_STATE) {
        zt_jbuf_puts(&b, "event: job\ndata: ");
        data_at = b.len;
        zt_json_job_open(&b, ev->job, wall_ms());
        ckpt_dir = strdup(ev->job->checkpoint_dir ? ev->job->checkpoint_dir : "");
        terminal = zt_job_state_terminal(ev->job->state);
    } else if (ev->kind == ZT_EVENT_METRICS) {
        /* The step as the event id: a reconnecting EventSource sends it back as
         * Last-Event-ID and continues after it. */
        zt_jbuf_printf(&b, "event: metrics\nid: %" PRId64 "\ndata: ", ev->record->step);
        data_at = b.len;
        zt_json_record(&b, ev->record);
    } else {
        zt_jbuf_puts(&b, "event: log\ndata: ");
        data_at = b.len;
        zt_json_log_line(&b, ev->log);
    }
    /* A raw line break would end the data field; in JSON one can only be whitespace between
     * tokens (the spliced spec or record text), where a space means the same. */
    for (size_t i = data_at; !b.oom && i < b.len; i++)
        if (b.data[i] == '\n' || b.data[i] == '\r')
            b.data[i] = ' ';
    if (!ckpt_dir)
        zt_jbuf_puts(&b, "\n\n");
    sse_chunk *ch = calloc(1, sizeof *ch);
    size_t len = 0;
    char *data = zt_jbuf_take(&b, &len);
    pthread_mutex_lock(&st->mu);
    if (!ch || !data || (ev->kind == ZT_EVENT_STATE && !ckpt_dir) ||
        st->queued + len > ZT_SSE_MAX_QUEUED) {
        st->overflow = true;
        free(ch);
        free(data);
        free(ckpt_dir);
    } else {
        ch->data = data;
        ch->len = len;
        ch->ckpt_dir = ckpt_dir;
        if (st->tail)
            st->tail->next = ch;
        else
            st->head = ch;
        st->tail = ch;
        st->queued += len;
        st->ended |= terminal;
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

/* Turns a dequeued chunk into the bytes to send; job events get their checkpoints here. */
static void sse_take_chunk(zt_sse *st, sse_chunk *ch) {
    if (ch->ckpt_dir) {
        zt_ckpt_list ck;
        list_checkpoints(ch->ckpt_dir, &ck);
        zt_jbuf b = {.data = ch->data, .len = ch->len, .cap = ch->len + 1, .comma = true};
        ch->data = NULL;
        zt_json_job_close(&b, &ck);
        zt_jbuf_puts(&b, "\n\n");
        zt_ckpt_list_free(&ck);
        st->out = zt_jbuf_take(&b, &st->out_len);
    } else {
        st->out = ch->data;
        st->out_len = ch->len;
        ch->data = NULL;
    }
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
            pthread_mutex_unlock(&st->mu);
            sse_take_chunk(st, ch);
            return true;
        }
        if (st->ended) {
            *result = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        int64_t now = mono_ms();
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
    st->last_send_ms = mono_ms();
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
    if (st->watch)
        zt_jobs_unwatch(st->srv->jm, st->watch);
    while (st->head) {
        sse_chunk *ch = st->head;
        st->head = ch->next;
        chunk_free(ch);
    }
    free(st->out);
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
    pthread_mutex_init(&st->mu, NULL);
    st->srv = s;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    st->last_send_ms = mono_ms();
    return st;
}

/* Registers the stream so that zt_http_stop can end it; false when the server is stopping. */
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
static bool sse_token_ok(const zt_http_server *s, struct MHD_Connection *c) {
    const char *t = arg(c, "access_token");
    if (!s->token || !t)
        return false;
    size_t n = strlen(t);
    char *h = malloc(n + 8);
    if (!h)
        return false;
    memcpy(h, "Bearer ", 7);
    memcpy(h + 7, t, n + 1);
    bool ok = zt_auth_bearer_ok(s->token, h);
    free(h);
    return ok;
}

/* GET /api/v1/jobs/{id}/events?since_step=&logs=&tail=: the job, its records from since_step
 * and (logs=1) its last `tail` log lines (0: none), then live events until a terminal state.
 * A reconnecting EventSource's Last-Event-ID (the last record's step) moves since_step past
 * what it already has. */
static enum MHD_Result api_events(zt_http_server *s, struct MHD_Connection *c, const char *id) {
    enum MHD_Result ret;
    int64_t since = 0, tail = 100, last_id = -1;
    bool logs = false;
    if (!arg_int(c, "since_step", 0, INT64_MAX, &since, &ret) ||
        !arg_int(c, "tail", 0, ZT_MAX_LOG_TAIL, &tail, &ret) || !arg_bool(c, "logs", &logs, &ret))
        return ret;
    const char *lei = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (lei && sscanf(lei, "%" SCNd64, &last_id) == 1 && last_id >= since &&
        last_id < INT64_MAX)
        since = last_id + 1;
    zt_sse *st = sse_create(s, c);
    if (!st)
        return MHD_NO;
    if (!sse_register(s, st)) {
        sse_free(st);
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "ztraind is stopping");
    }
    int what = ZT_WATCH_STATE | ZT_WATCH_METRICS | (logs ? ZT_WATCH_LOGS : 0);
    zt_status zs = zt_jobs_watch(s->jm, id, what, since, (int)tail, sse_on_event, st, &st->watch);
    if (zs != ZT_OK) {
        st->watch = NULL;
        sse_free(st);
        return send_status(c, zs, id);
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, sse_read, st, sse_free);
    if (!r) {
        sse_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return queue(c, MHD_HTTP_OK, r);
}

/* ---- static files ------------------------------------------------------------------------ */

/* A relative path of plain names: [A-Za-z0-9._-] segments separated by single slashes, none
 * starting with '.', so neither ".." nor hidden files can be reached. */
static bool safe_rel_path(const char *p) {
    size_t n = strlen(p);
    if (n == 0 || n > 200)
        return false;
    bool seg_start = true;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '/') {
            if (seg_start)
                return false;
            seg_start = true;
            continue;
        }
        if (seg_start && ch == '.')
            return false;
        if (!isalnum((unsigned char)ch) && ch != '.' && ch != '_' && ch != '-')
            return false;
        seg_start = false;
    }
    return !seg_start;
}

static const char *content_type(const char *path) {
    static const struct { const char *ext, *type; } types[] = {
        {".html", "text/html; charset=utf-8"},   {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".json", "application/json"},           {".map", "application/json"},
        {".svg", "image/svg+xml"},               {".png", "image/png"},
        {".ico", "image/x-icon"},                {".txt", "text/plain; charset=utf-8"},
        {".woff2", "font/woff2"},
    };
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i].ext) == 0)
            return types[i].type;
    return "application/octet-stream";
}

static enum MHD_Result serve_file(struct MHD_Connection *c, const char *dir, const char *rel,
                                  const char *cache) {
    char path[PATH_MAX];
    if (!dir || !safe_rel_path(rel) ||
        snprintf(path, sizeof path, "%s/%s", dir, rel) >= (int)sizeof path)
        return send_error(c, MHD_HTTP_NOT_FOUND, "no such file");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0)
            close(fd);
        return send_error(c, MHD_HTTP_NOT_FOUND, "no such file: %s", rel);
    }
    /* MHD owns the descriptor from here, and closes it. */
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)sb.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type(rel));
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, cache);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    return queue(c, MHD_HTTP_OK, r);
}

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

static enum MHD_Result method_not_allowed(struct MHD_Connection *c, const char *method,
                                          const char *url, const char *allow) {
    return send_error_h(c, MHD_HTTP_METHOD_NOT_ALLOWED, MHD_HTTP_HEADER_ALLOW, allow,
                        "%s is not allowed on %s (%s)", method, url, allow);
}

/* /api/v1/jobs/{id}[/{sub}] once the method and token have been checked by route(). */
static enum MHD_Result route_job(zt_http_server *s, struct MHD_Connection *c, const char *method,
                                 const char *url, const char *rest, const http_req *req) {
    const char *slash = strchr(rest, '/');
    size_t id_len = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *sub = slash ? slash + 1 : "";
    char id[sizeof(((zt_job_info *)0)->id)];
    static const char *const subs[] = {"", "metrics", "records", "logs", "events", "cancel"};
    int which = -1;
    for (int i = 0; i < (int)(sizeof subs / sizeof subs[0]); i++)
        if (strcmp(sub, subs[i]) == 0)
            which = i;
    if (which < 0)
        return send_error(c, MHD_HTTP_NOT_FOUND, "no route %s %s", method, url);
    if (!valid_job_id(rest, id_len))
        return send_error(c, MHD_HTTP_NOT_FOUND, "no job '%.*s'", (int)(id_len > 64 ? 64 : id_len),
                          rest);
    memcpy(id, rest, id_len);
    id[id_len] = '\0';
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (which == 5) {
        if (strcmp(method, "POST") != 0)
            return method_not_allowed(c, method, url, "POST, OPTIONS");
        return api_cancel(s, c, id, req ? &req->body : NULL);
    }
    /* An event stream has no HEAD: its headers would promise a body that never ends. */
    if (which == 4 && strcmp(method, "GET") != 0)
        return method_not_allowed(c, method, url, "GET, OPTIONS");
    if (!get)
        return method_not_allowed(c, method, url, "GET, HEAD, OPTIONS");
    switch (which) {
    case 0: return api_job(s, c, id);
    case 1: return api_metrics(s, c, id);
    case 2: return api_records(s, c, id);
    case 3: return api_logs(s, c, id);
    default: return api_events(s, c, id);
    }
}

static bool authorized(const zt_http_server *s, struct MHD_Connection *c) {
    if (!s->token)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return zt_auth_bearer_ok(s->token, h);
}

static bool is_events_url(const char *url) {
    size_t n = strlen(url);
    return starts_with(url, "/api/v1/jobs/") && n > 7 && strcmp(url + n - 7, "/events") == 0;
}

static enum MHD_Result preflight(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    return queue(c, MHD_HTTP_NO_CONTENT, r);
}

static enum MHD_Result route(zt_http_server *s, struct MHD_Connection *c, const char *url,
                             const char *method, const http_req *req) {
    if (!strcmp(method, "OPTIONS"))
        return preflight(c);
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool api = starts_with(url, "/api/");
    if (api || !strcmp(url, "/metrics")) {
        if (!authorized(s, c) && !(is_events_url(url) && sse_token_ok(s, c)))
            return send_error_h(c, MHD_HTTP_UNAUTHORIZED, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                "Bearer", "missing or invalid bearer token");
        if (!api)
            return get ? api_prometheus(s, c) : method_not_allowed(c, method, url, "GET, HEAD, OPTIONS");
        if (!strcmp(url, "/api/v1/jobs"))
            return get ? api_list(s, c) : method_not_allowed(c, method, url, "GET, HEAD, OPTIONS");
        if (starts_with(url, "/api/v1/jobs/"))
            return route_job(s, c, method, url, url + strlen("/api/v1/jobs/"), req);
        return send_error(c, MHD_HTTP_NOT_FOUND, "no route %s %s", method, url);
    }
    const char *file_dir = NULL, *rel = NULL, *cache = "no-cache";
    if (!strcmp(url, "/healthz")) {
        return get ? api_healthz(s, c) : method_not_allowed(c, method, url, "GET, HEAD, OPTIONS");
    } else if (!strcmp(url, "/")) {
        file_dir = s->web_dir, rel = "index.html";
    } else if (starts_with(url, "/static/")) {
        file_dir = s->web_dir, rel = url + strlen("/static/");
    } else if (starts_with(url, "/vendor/chart.js/")) {
        /* A Debian package's file changes only with the package. */
        file_dir = s->chartjs_dir, rel = url + strlen("/vendor/chart.js/"), cache = "max-age=86400";
    } else {
        return send_error(c, MHD_HTTP_NOT_FOUND, "no route %s %s", method, url);
    }
    if (!get)
        return method_not_allowed(c, method, url, "GET, HEAD, OPTIONS");
    return serve_file(c, file_dir, rel, cache);
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
        /* First call, headers only. A body announced as too large is refused before it is
         * read; MHD then closes the connection. */
        *req_cls = &no_body;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->max_body)
            return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "request body over %zu bytes",
                              s->max_body);
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
        if (req->body.len + *upload_size > s->max_body)
            return MHD_NO;
        zt_jbuf_text(&req->body, upload_data, *upload_size);
        *upload_size = 0;
        return req->body.oom ? MHD_NO : MHD_YES;
    }
    return route(s, c, url, method, req);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
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
    int64_t now = mono_ms();
    pthread_mutex_lock(&mu);
    if (now - window_start >= 60000) {
        if (dropped)
            fprintf(stderr, "ztraind: http: %d more messages were not logged\n", dropped);
        window_start = now;
        in_window = dropped = 0;
    }
    bool show = in_window++ < ZT_HTTP_LOG_BURST;
    dropped += !show;
    if (show) {
        fputs("ztraind: http: ", stderr);
        vfprintf(stderr, fmt, ap);
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
        return zt_error(ZT_ERR_IO, "HTTP %s:%d: %s", host, port, strerror(e));
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
    series_cache_free(s);
    pthread_mutex_destroy(&s->cache_mu);
    free(s->token);
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
    zt_http_server *s = calloc(1, sizeof *s);
    if (!s)
        return ZT_ERR_NOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->cache_mu, NULL);
    s->jm = jm;
    s->token = cfg->token && *cfg->token ? strdup(cfg->token) : NULL;
    s->web_dir = dup_or_null(cfg->web_dir);
    s->chartjs_dir = dup_or_null(cfg->chartjs_dir);
    s->max_body = cfg->max_request_bytes ? cfg->max_request_bytes : 64 * 1024;
    if ((cfg->token && *cfg->token && !s->token) || (cfg->web_dir && !s->web_dir) ||
        (cfg->chartjs_dir && !s->chartjs_dir)) {
        server_free(s);
        return ZT_ERR_NOMEM;
    }
    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    int fd = -1;
    zt_status st = open_listener(host, cfg->port, &fd);
    if (st != ZT_OK) {
        server_free(s);
        return st;
    }
    s->port = bound_port(fd);
    unsigned max_conn = cfg->max_connections ? cfg->max_connections : 256;
    /* On loopback every client shares one address; the per-address cap matters when serving
     * a network, where one host should not take every slot. */
    unsigned per_ip = max_conn > 16 ? max_conn / 2 : max_conn;
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ITC | MHD_USE_ERROR_LOG,
        0, NULL, NULL, on_request, s,
        /* First, so that MHD's own messages about the options below go through it too. */
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ZT_HTTP_TIMEOUT_S,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)ZT_HTTP_MEMORY_LIMIT,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
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
    /* Streams block in their readers; wake and end them, or MHD would wait on their threads
     * forever. Streams that start from now on are refused (sse_register). */
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    for (zt_sse *st = s->streams; st; st = st->next) {
        pthread_mutex_lock(&st->mu);
        st->stop = true;
        pthread_cond_signal(&st->cv);
        pthread_mutex_unlock(&st->mu);
    }
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(s->daemon);
    server_free(s);
}
