/* Queries over a job's metric history (zt_jobs_metric_series and zt_jobs_metric_records in
 * job_manager.h): the job's newest records are copied under the manager's lock, the older ones
 * are read from the job store page by page, and the answer is computed with no lock held, its
 * size bounded by the ZT_METRICS_ and ZT_RECORDS_ limits whatever the job's length. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "job_manager_internal.h"
#include "ztrain/metrics.h"

/* Records read from the store at a time: the reader's mutex is released between pages. */
#define STORE_PAGE 256
/* Points a series query keeps in memory while it walks the history once. A query over more
 * walks it twice instead: once to count each key's points, once to keep the chosen ones. */
#define COLLECT_BUDGET ((int64_t)1 << 20)

/* ---- the history as one query sees it ------------------------------------------------------ */

/* The records numbered below first_cached are read from the store; the newer ones are copies
 * taken under the lock at the same moment, so nothing is missed or seen twice. */
typedef struct {
    zt_jobs *jm;
    char id[32];
    int64_t first_cached;
    zt_metric_record *recent;   /* json owned */
    int n_recent, cap_recent;
} snapshot;

static void copy_recent(void *ctx, const zt_metric_record *r) {
    snapshot *s = ctx;
    if (s->n_recent == s->cap_recent) {
        s->cap_recent = s->cap_recent ? 2 * s->cap_recent : 64;
        s->recent = realloc(s->recent, (size_t)s->cap_recent * sizeof *s->recent);
        ZT_ASSERT(s->recent);
    }
    zt_metric_record *c = &s->recent[s->n_recent++];
    *c = *r;
    c->json = zt_jm_strdup(r->json);
}

/* Copies what the query needs of the job: O(ZT_JOBS_RECORD_CACHE) under the lock. */
static zt_status snapshot_take(zt_jobs *jm, const char *id, int64_t since_step, snapshot *s) {
    *s = (snapshot){.jm = jm};
    pthread_mutex_lock(&jm->mu);
    job *j = zt_jm_find_job(jm, id);
    if (j) {
        snprintf(s->id, sizeof s->id, "%s", j->info.id);
        s->first_cached = zt_history_first_cached(j->history);
        zt_history_cached_records(j->history, since_step, 0, copy_recent, s);
    }
    pthread_mutex_unlock(&jm->mu);
    return j ? ZT_OK : zt_jm_not_found(id);
}

static void snapshot_free(snapshot *s) {
    for (int i = 0; i < s->n_recent; i++)
        free((char *)s->recent[i].json);
    free(s->recent);
}

typedef struct {
    zt_jm_walk_fn fn;
    void *ctx;
    bool stopped;
    int64_t *after;
} page_ctx;

static void page_record(void *ctx, const zt_metric_record *r) {
    page_ctx *p = ctx;
    if (p->stopped)
        return;
    *p->after = r->seq;
    p->stopped = !p->fn(p->ctx, r);
}

zt_status zt_jm_read_stored(zt_jobs *jm, const char *id, int64_t since, int64_t *after,
                            int64_t before, zt_jm_walk_fn fn, void *ctx, bool *stopped) {
    page_ctx p = {.fn = fn, .ctx = ctx, .after = after};
    int n = STORE_PAGE;
    while (n == STORE_PAGE && !p.stopped && *after < before - 1)
        ZT_TRY(zt_store_read_records(jm->store, id, since, *after, before, STORE_PAGE,
                                     page_record, &p, &n));
    if (stopped)
        *stopped = p.stopped;
    return ZT_OK;
}

/* Every record of the snapshot with step >= since_step and seq > after_seq, in the order they
 * came, until fn says stop. */
static zt_status snapshot_walk(const snapshot *s, int64_t since_step, int64_t after_seq,
                               zt_jm_walk_fn fn, void *ctx) {
    int64_t after = after_seq;
    bool stopped = false;
    ZT_TRY(zt_jm_read_stored(s->jm, s->id, since_step, &after, s->first_cached, fn, ctx,
                             &stopped));
    for (int i = 0; i < s->n_recent && !stopped; i++)
        if (s->recent[i].seq > after_seq)
            stopped = !fn(ctx, &s->recent[i]);
    return ZT_OK;
}

/* ---- series ----------------------------------------------------------------------------- */

typedef struct {
    const char *key;       /* the caller's, or owned when found in the records */
    bool owned;
    int64_t count;         /* points of the key in the range (the counting walk) */
    int64_t seen;          /* points met so far in the keeping walk */
    int64_t *steps;
    double *values;
    int64_t n, cap;        /* points kept */
} sink;

/* The first walk keeps every point while they fit COLLECT_BUDGET (and then only counts them);
 * a second walk, when needed, keeps the points chosen from the counts. */
typedef enum { WALK_COLLECT, WALK_COUNT, WALK_KEEP } walk_phase;

typedef struct {
    sink v[ZT_METRICS_MAX_KEYS];
    int n;
    bool all_keys;         /* no keys were asked for: every key found becomes a series */
    bool too_many_keys;
    walk_phase phase;
    int64_t kept;          /* points kept by all sinks while collecting */
    int limit;             /* points per series, for WALK_KEEP */
} series_query;

static void sink_push(sink *k, int64_t step, double value) {
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 64;
        k->steps = realloc(k->steps, (size_t)k->cap * sizeof *k->steps);
        k->values = realloc(k->values, (size_t)k->cap * sizeof *k->values);
        ZT_ASSERT(k->steps && k->values);
    }
    k->steps[k->n] = step;
    k->values[k->n++] = value;
}

static void sink_clear(sink *k) {
    free(k->steps);
    free(k->values);
    k->steps = NULL;
    k->values = NULL;
    k->n = k->cap = 0;
}

/* The k-th of at most `limit` indices of n points, evenly spaced, the first and last kept. */
static int64_t thin(int64_t n, int limit, int64_t k) {
    if (n <= limit)
        return k;
    if (limit == 1)
        return n - 1;
    return k * (n - 1) / (limit - 1);
}

static sink *find_sink(series_query *q, const char *key) {
    for (int i = 0; i < q->n; i++)
        if (strcmp(q->v[i].key, key) == 0)
            return &q->v[i];
    return NULL;
}

/* One point of one key, in either walk. */
static void take_point(series_query *q, sink *k, int64_t step, double value) {
    if (q->phase == WALK_COUNT) {
        k->count++;
    } else if (q->phase == WALK_COLLECT) {
        k->count++;
        sink_push(k, step, value);
        if (++q->kept > COLLECT_BUDGET) {
            q->phase = WALK_COUNT;
            for (int i = 0; i < q->n; i++)
                sink_clear(&q->v[i]);
        }
    } else if (k->n < q->limit && k->seen++ == thin(k->count, q->limit, k->n)) {
        sink_push(k, step, value);
    }
}

static bool series_record(void *ctx, const zt_metric_record *r) {
    series_query *q = ctx;
    cJSON *obj = cJSON_Parse(r->json);
    if (!cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        return true;
    }
    if (!q->all_keys) {
        for (int i = 0; i < q->n; i++) {
            /* The record's own time, asked for by name: a chart drawn from a thinned history
             * places it on a wall-time axis without reading the records. */
            if (strcmp(q->v[i].key, ZT_METRICS_TIME_KEY) == 0) {
                take_point(q, &q->v[i], r->step, (double)r->time_ms);
                continue;
            }
            const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, q->v[i].key);
            double value;
            if (zt_metrics_value_of(it, &value))
                take_point(q, &q->v[i], r->step, value);
        }
    } else {
        for (const cJSON *it = obj->child; it && !q->too_many_keys; it = it->next) {
            double value;
            if (!it->string || !zt_metrics_value_of(it, &value))
                continue;
            sink *k = find_sink(q, it->string);
            if (!k && q->n == ZT_METRICS_MAX_KEYS) {
                q->too_many_keys = true;
                break;
            }
            if (!k) {
                k = &q->v[q->n++];
                *k = (sink){.key = zt_jm_strdup(it->string), .owned = true};
            }
            take_point(q, k, r->step, value);
        }
    }
    cJSON_Delete(obj);
    return !q->too_many_keys;
}

/* The asked keys, repeats dropped, checked against the limits. */
static zt_status series_keys(series_query *q, const char *const *keys, int n_keys) {
    for (int i = 0; i < n_keys; i++) {
        const char *key = keys[i] ? keys[i] : "";
        /* No metric has an empty name: an empty key asks for nothing, as HTTP's "?keys=a,,b"
         * has none between its commas, and keys of nothing but empty ones ask for all. */
        if (!*key)
            continue;
        size_t len = strnlen(key, ZT_METRICS_MAX_KEY_BYTES + 1);
        if (len > ZT_METRICS_MAX_KEY_BYTES)
            return zt_error(ZT_ERR_INVALID, "keys: key %d is longer than %d bytes", i + 1,
                            ZT_METRICS_MAX_KEY_BYTES);
        if (find_sink(q, key))
            continue;
        if (q->n == ZT_METRICS_MAX_KEYS)
            return zt_error(ZT_ERR_INVALID, "keys: more than %d distinct keys (the limit of "
                            "one query)", ZT_METRICS_MAX_KEYS);
        q->v[q->n++] = (sink){.key = key};
    }
    return ZT_OK;
}

static void series_query_free(series_query *q) {
    for (int i = 0; i < q->n; i++) {
        sink_clear(&q->v[i]);
        if (q->v[i].owned)
            free((char *)q->v[i].key);
    }
}

/* Points per series: max_points within the caps (at least one). */
static int series_limit(int max_points, int n_series) {
    int limit = max_points > 0 && max_points < ZT_METRICS_MAX_POINTS ? max_points
                                                                    : ZT_METRICS_MAX_POINTS;
    int share = ZT_METRICS_MAX_ANSWER_POINTS / (n_series > 0 ? n_series : 1);
    if (limit > share)
        limit = share;
    return limit > 0 ? limit : 1;
}

/* Thins the points the first walk kept, in place. */
static void thin_kept(sink *k, int limit) {
    if (k->n <= limit)
        return;
    for (int64_t i = 0; i < limit; i++) {
        int64_t src = thin(k->n, limit, i);
        k->steps[i] = k->steps[src];
        k->values[i] = k->values[src];
    }
    k->n = limit;
}

zt_status zt_jobs_metric_series(zt_jobs *jm, const char *id, const char *const *keys, int n_keys,
                                int64_t since_step, int max_points, zt_series_fn emit,
                                void *ctx) {
    series_query *q = calloc(1, sizeof *q);
    if (!q)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    zt_status s = series_keys(q, keys, n_keys > 0 ? n_keys : 0);
    q->all_keys = q->n == 0;
    snapshot snap = {0};
    if (s == ZT_OK)
        s = snapshot_take(jm, id, since_step, &snap);
    if (s == ZT_OK)
        s = snapshot_walk(&snap, since_step, 0, series_record, q);
    if (s == ZT_OK && q->too_many_keys)
        s = zt_error(ZT_ERR_INVALID, "keys: the job's records have more than %d keys (the "
                     "limit of one query): name the ones wanted", ZT_METRICS_MAX_KEYS);
    if (s == ZT_OK) {
        q->limit = series_limit(max_points, q->n);
        if (q->phase == WALK_COLLECT) {
            for (int i = 0; i < q->n; i++)
                thin_kept(&q->v[i], q->limit);
        } else {
            q->phase = WALK_KEEP;
            s = snapshot_walk(&snap, since_step, 0, series_record, q);
        }
    }
    static const int64_t no_steps[1];
    static const double no_values[1];
    for (int i = 0; s == ZT_OK && i < q->n; i++) {
        const sink *k = &q->v[i];
        emit(ctx, k->key, k->n ? k->steps : no_steps, k->n ? k->values : no_values, (int)k->n);
    }
    snapshot_free(&snap);
    series_query_free(q);
    free(q);
    return s;
}

/* ---- records ------------------------------------------------------------------------------ */

typedef struct {
    zt_metric_record *v;   /* json owned */
    int n, cap;
} record_page;

static bool page_take(void *ctx, const zt_metric_record *r) {
    record_page *p = ctx;
    p->v[p->n] = *r;
    p->v[p->n].json = zt_jm_strdup(r->json);
    return ++p->n < p->cap;
}

zt_status zt_jobs_metric_records(zt_jobs *jm, const char *id, int64_t since_step,
                                 int64_t after_seq, int limit, zt_record_fn emit, void *ctx,
                                 int64_t *next_after_seq) {
    *next_after_seq = -1;
    if (limit <= 0 || limit > ZT_RECORDS_MAX_PAGE)
        limit = ZT_RECORDS_MAX_PAGE;
    /* One record more than the page, to know whether the history goes on. */
    record_page page = {.cap = limit + 1};
    page.v = malloc((size_t)page.cap * sizeof *page.v);
    if (!page.v)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    snapshot snap;
    zt_status s = snapshot_take(jm, id, since_step, &snap);
    if (s == ZT_OK)
        s = snapshot_walk(&snap, since_step, after_seq, page_take, &page);
    int n = page.n < limit ? page.n : limit;
    /* A record's seq names its place in the history, whatever its step: the next page starts
     * after the last record of this one, even in the middle of a step. */
    if (s == ZT_OK && page.n > limit)
        *next_after_seq = page.v[limit - 1].seq;
    for (int i = 0; s == ZT_OK && i < n; i++)
        emit(ctx, &page.v[i]);
    for (int i = 0; i < page.n; i++)
        free((char *)page.v[i].json);
    free(page.v);
    snapshot_free(&snap);
    return s;
}
