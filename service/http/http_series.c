/* GET /api/v1/jobs/{id}/metrics?keys=&since_step=&max_points= (http_internal.h): the history of
 * a job's metric keys, thinned for charts, and the cache that lets a polling dashboard ask for
 * the same series again without walking the job's history again. The limits on keys and points
 * are the job manager's (ZT_METRICS_* in job_manager.h), the same as GetMetrics'. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"

/* Responses kept for repeated queries: slots, and the largest body kept, so the cache stays
 * under 8 MiB. */
#define ZT_CACHE_SLOTS 32
#define ZT_CACHE_MAX_BODY ((size_t)256 * 1024)

/* ---- the manager's series, copied out ---------------------------------------------------- */

/* One metric's history as the manager gives it; the encoding happens afterwards. */
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

/* Splits "a,b,,c" in place into at most ZT_METRICS_MAX_KEYS distinct non-empty keys; -1 when
 * there are more. */
static int split_keys(char *list, const char **keys) {
    int n = 0;
    for (char *save = NULL, *k = strtok_r(list, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        bool dup = false;
        for (int i = 0; i < n && !dup; i++)
            dup = strcmp(keys[i], k) == 0;
        if (dup)
            continue;
        if (n == ZT_METRICS_MAX_KEYS)
            return -1;
        keys[n++] = k;
    }
    return n;
}

/* MHD's walk over the query's arguments: every keys= value, joined with commas into ctx. */
static enum MHD_Result join_keys(void *ctx, enum MHD_ValueKind kind, const char *name,
                                 const char *value) {
    (void)kind;
    zt_jbuf *all = ctx;
    if (strcmp(name, "keys") == 0 && value) {
        zt_jbuf_text(all, ",", all->buf.len > 0);
        zt_jbuf_puts(all, value);
    }
    return MHD_YES;
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
    (void)id;
    zt_json_open(b, '{');
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

/* ---- the cache --------------------------------------------------------------------------- */

/* A dashboard polls the same query again and again, and computing it walks the job's history
 * (parsing each record, reading the older ones from the store). A job's records are only ever
 * appended, so a response stays exact for as long as the job's record count is unchanged: a
 * hit costs one look at that count instead of the walk. */
typedef struct {
    char *query;              /* "<job id>\n<since_step>\n<max_points>\n<key>,<key>..." */
    int64_t n_records;        /* the job's record count the body was computed at (or after) */
    char *body;
    size_t len;
    uint64_t used;            /* when last hit, for eviction */
} series_cache_slot;

struct zt_series_cache {
    pthread_mutex_t mu;       /* guards the slots and the clock */
    series_cache_slot slots[ZT_CACHE_SLOTS];
    uint64_t clock;
};

zt_series_cache *zt_series_cache_create(void) {
    zt_series_cache *cache = calloc(1, sizeof *cache);
    if (cache)
        pthread_mutex_init(&cache->mu, NULL);
    return cache;
}

void zt_series_cache_destroy(zt_series_cache *cache) {
    if (!cache)
        return;
    for (int i = 0; i < ZT_CACHE_SLOTS; i++) {
        free(cache->slots[i].query);
        free(cache->slots[i].body);
    }
    pthread_mutex_destroy(&cache->mu);
    free(cache);
}

/* A copy of the body kept for query at n_records (NUL-terminated, the caller frees it), or
 * NULL. */
static char *series_cache_get(zt_series_cache *cache, const char *query, int64_t n_records,
                              size_t *len) {
    char *body = NULL;
    pthread_mutex_lock(&cache->mu);
    for (int i = 0; i < ZT_CACHE_SLOTS; i++) {
        series_cache_slot *e = &cache->slots[i];
        if (e->query && e->n_records == n_records && strcmp(e->query, query) == 0) {
            body = malloc(e->len + 1);
            if (body) {
                memcpy(body, e->body, e->len);
                body[e->len] = '\0';
                *len = e->len;
                e->used = ++cache->clock;
            }
            break;
        }
    }
    pthread_mutex_unlock(&cache->mu);
    return body;
}

/* Keeps a copy of body for query, replacing that query's older entry or the least recently
 * used one. */
static void series_cache_put(zt_series_cache *cache, const char *query, int64_t n_records,
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
    pthread_mutex_lock(&cache->mu);
    series_cache_slot *victim = &cache->slots[0];
    for (int i = 0; i < ZT_CACHE_SLOTS; i++) {
        series_cache_slot *e = &cache->slots[i];
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
                                  .used = ++cache->clock};
    pthread_mutex_unlock(&cache->mu);
}

/* ---- the route --------------------------------------------------------------------------- */

/* Sends a NUL-terminated body of len bytes (taken over) as JSON. */
static enum MHD_Result send_json_body(struct MHD_Connection *c, char *body, size_t len) {
    zt_jbuf b = {.buf = {.data = body, .len = len, .cap = len + 1}};
    return zt_http_send_json(c, MHD_HTTP_OK, &b);
}

/* The series of the query, computed (the manager's walk, then the encoding) and kept in the
 * cache. */
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
        if (!b.buf.oom)
            series_cache_put(s->cache, query, n_records, b.buf.data, b.buf.len);
        ret = zt_http_send_json(c, MHD_HTTP_OK, &b);
    } else if (st != ZT_OK) {
        ret = zt_http_send_status(c, st, id);
    }
    series_set_free(&set);
    return ret;
}

enum MHD_Result zt_http_job_metrics(zt_http_server *s, struct MHD_Connection *c,
                                    const char *id) {
    enum MHD_Result ret;
    int64_t since = 0, max_points = 0;
    if (!zt_http_arg_int(c, "since_step", 0, INT64_MAX, &since, &ret) ||
        !zt_http_arg_int(c, "max_points", 0, INT32_MAX, &max_points, &ret))
        return ret;
    /* keys=a,b and keys=a&keys=b (and any mix) ask for the same keys, the limit counted over
     * all of them. */
    zt_jbuf all;
    zt_jbuf_init(&all);
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, join_keys, &all);
    char *list = zt_jbuf_take(&all, NULL);
    if (!list)
        return MHD_NO;
    const char *keys[ZT_METRICS_MAX_KEYS];
    int n_keys = split_keys(list, keys);
    if (n_keys < 0) {
        free(list);
        return zt_http_send_error(c, MHD_HTTP_BAD_REQUEST, "keys: at most %d keys",
                                  ZT_METRICS_MAX_KEYS);
    }
    int64_t n_records;
    zt_status st = zt_jobs_record_count(s->jm, id, &n_records);
    if (st != ZT_OK) {
        free(list);
        return zt_http_send_status(c, st, id);
    }
    zt_jbuf q;
    zt_jbuf_init(&q);
    /* Keys cannot hold a comma (it separates them), nor the id and numbers a line break. */
    zt_jbuf_printf(&q, "%s\n%" PRId64 "\n%" PRId64 "\n", id, since, max_points);
    for (int i = 0; i < n_keys; i++)
        zt_jbuf_printf(&q, "%s%s", i ? "," : "", keys[i]);
    size_t len;
    char *body = q.buf.oom ? NULL : series_cache_get(s->cache, q.buf.data, n_records, &len);
    if (body)
        ret = send_json_body(c, body, len);
    else if (!q.buf.oom)
        ret = compute_series(s, c, id, keys, n_keys, since, (int)max_points, q.buf.data, n_records);
    else
        ret = MHD_NO;
    zt_jbuf_free(&q);
    free(list);
    return ret;
}
