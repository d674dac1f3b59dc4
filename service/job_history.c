/* A job's metric records and log tail in memory (job_history.h). */
#include "job_history.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS 1024   /* distinct metric keys per job; more are not indexed for series */

typedef struct {
    int64_t step, time_ms;
    char *json;
    int n;
    uint16_t *keys;     /* indices into zt_job_history.keys */
    double *values;
} record;

struct zt_job_history {
    record *records;
    int64_t n_records, cap_records;
    char *keys[MAX_KEYS];
    int n_keys;
    zt_log_line *logs;  /* ring; texts owned, streams static */
    int log_ring, log_head, log_count;
    int64_t next_seq;
};

zt_job_history *zt_history_create(int log_ring) {
    zt_job_history *h = calloc(1, sizeof *h);
    ZT_ASSERT(h);
    h->log_ring = log_ring > 0 ? log_ring : 1;
    h->logs = calloc((size_t)h->log_ring, sizeof *h->logs);
    ZT_ASSERT(h->logs);
    h->next_seq = 1;
    return h;
}

void zt_history_destroy(zt_job_history *h) {
    if (!h)
        return;
    for (int64_t i = 0; i < h->n_records; i++) {
        free(h->records[i].json);
        free(h->records[i].keys);
        free(h->records[i].values);
    }
    free(h->records);
    for (int i = 0; i < h->n_keys; i++)
        free(h->keys[i]);
    for (int i = 0; i < h->log_ring; i++)
        free((char *)h->logs[i].text);
    free(h->logs);
    free(h);
}

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    ZT_ASSERT(d);
    return d;
}

static int find_key(const zt_job_history *h, const char *key) {
    for (int i = 0; i < h->n_keys; i++)
        if (strcmp(h->keys[i], key) == 0)
            return i;
    return -1;
}

static int intern_key(zt_job_history *h, const char *key) {
    int k = find_key(h, key);
    if (k >= 0 || h->n_keys == MAX_KEYS)
        return k;
    h->keys[h->n_keys] = xstrdup(key);
    return h->n_keys++;
}

void zt_history_add_record(zt_job_history *h, const cJSON *obj, const char *text,
                           int64_t time_ms, int64_t default_step, zt_metric_record *out) {
    int n = cJSON_GetArraySize(obj);
    record r = {.step = default_step, .time_ms = time_ms, .json = xstrdup(text)};
    r.keys = malloc((size_t)(n ? n : 1) * sizeof *r.keys);
    r.values = malloc((size_t)(n ? n : 1) * sizeof *r.values);
    ZT_ASSERT(r.keys && r.values);
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (!cJSON_IsNumber(it) || !it->string)
            continue;
        int k = intern_key(h, it->string);
        if (k < 0)
            continue;
        r.keys[r.n] = (uint16_t)k;
        r.values[r.n++] = it->valuedouble;
        if (strcmp(it->string, "train/global_step") == 0)
            r.step = (int64_t)it->valuedouble;
    }
    if (h->n_records == h->cap_records) {
        h->cap_records = h->cap_records ? 2 * h->cap_records : 256;
        h->records = realloc(h->records, (size_t)h->cap_records * sizeof *h->records);
        ZT_ASSERT(h->records);
    }
    h->records[h->n_records++] = r;
    if (out)
        *out = (zt_metric_record){.step = r.step, .time_ms = r.time_ms, .json = r.json};
}

int64_t zt_history_n_records(const zt_job_history *h) {
    return h->n_records;
}

/* The first record with step >= since_step. Steps never decrease within a job (rank 0 reports
 * them in order, evaluations repeat the step they follow), so a binary search finds it: series,
 * records and watches from a late step do not walk the whole history. */
static int64_t first_at(const zt_job_history *h, int64_t since_step) {
    int64_t lo = 0, hi = h->n_records;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (h->records[mid].step < since_step)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The k-th of at most max_points indices of n points, evenly spaced, first and last kept. */
static int64_t thin(int64_t n, int max_points, int64_t k) {
    if (max_points <= 0 || n <= max_points)
        return k;
    if (max_points == 1)
        return n - 1;
    return k * (n - 1) / (max_points - 1);
}

void zt_history_series(const zt_job_history *h, const char *const *keys, int n_keys,
                       int64_t since_step, int max_points, zt_series_fn emit, void *ctx) {
    int64_t first = first_at(h, since_step);
    int64_t span = h->n_records - first;
    int64_t *steps = malloc((size_t)(span ? span : 1) * sizeof *steps);
    double *values = malloc((size_t)(span ? span : 1) * sizeof *values);
    ZT_ASSERT(steps && values);
    int n_out = n_keys > 0 ? n_keys : h->n_keys;
    for (int q = 0; q < n_out; q++) {
        const char *key = n_keys > 0 ? keys[q] : h->keys[q];
        int k = find_key(h, key);
        int64_t m = 0;
        for (int64_t r = first; k >= 0 && r < h->n_records; r++) {
            const record *rec = &h->records[r];
            for (int v = 0; v < rec->n; v++)
                if (rec->keys[v] == k && isfinite(rec->values[v])) {
                    steps[m] = rec->step;
                    values[m++] = rec->values[v];
                    break;
                }
        }
        int64_t kept = max_points > 0 && m > max_points ? max_points : m;
        for (int64_t i = 0; i < kept; i++) {
            int64_t src = thin(m, max_points, i);
            steps[i] = steps[src];
            values[i] = values[src];
        }
        emit(ctx, key, steps, values, (int)kept);
    }
    free(steps);
    free(values);
}

void zt_history_records(const zt_job_history *h, int64_t since_step, zt_record_fn emit,
                        void *ctx) {
    for (int64_t i = first_at(h, since_step); i < h->n_records; i++) {
        const record *rec = &h->records[i];
        zt_metric_record r = {.step = rec->step, .time_ms = rec->time_ms, .json = rec->json};
        emit(ctx, &r);
    }
}

/* Static copies of the stream names, so log lines need not own them. */
static const char *intern_stream(const char *s) {
    if (strcmp(s, "stdout") == 0)
        return "stdout";
    if (strcmp(s, "stderr") == 0)
        return "stderr";
    return "ztraind";
}

void zt_history_add_log(zt_job_history *h, const zt_log_line *l) {
    int slot = (h->log_head + h->log_count) % h->log_ring;
    if (h->log_count == h->log_ring) {
        slot = h->log_head;
        h->log_head = (h->log_head + 1) % h->log_ring;
        h->log_count--;
    }
    zt_log_line *e = &h->logs[slot];
    free((char *)e->text);
    *e = *l;
    e->stream = intern_stream(l->stream);
    e->text = xstrdup(l->text);
    h->log_count++;
    if (l->seq >= h->next_seq)
        h->next_seq = l->seq + 1;
}

int64_t zt_history_next_seq(const zt_job_history *h) {
    return h->next_seq;
}

int zt_history_log_count(const zt_job_history *h, int64_t *first_seq) {
    *first_seq = h->log_count ? h->logs[h->log_head].seq : 0;
    return h->log_count;
}

void zt_history_logs(const zt_job_history *h, int tail, zt_log_fn emit, void *ctx) {
    int from = tail >= 0 && tail < h->log_count ? h->log_count - tail : 0;
    for (int i = from; i < h->log_count; i++)
        emit(ctx, &h->logs[(h->log_head + i) % h->log_ring]);
}
