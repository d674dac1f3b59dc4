/* A job's newest metric records, the last values of its keys, and its log tail in memory
 * (job_history.h). */
#include "job_history.h"

#include "ztrain/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS 1024   /* distinct metric keys per job whose last value is kept */

typedef struct {
    int64_t seq, step, time_ms;
    char *json;
} cached;

struct zt_job_history {
    int64_t n_records;
    cached *ring;       /* the newest records, oldest at ring_head */
    int ring_cap, ring_head, ring_count;
    /* The value each key had in the newest record that has it. NaN: that record had null,
     * which is how the ranks write a value that was not finite. */
    char **keys;
    double *last_value;
    int n_keys, cap_keys;
    zt_log_line *logs;  /* ring; texts owned, streams static */
    int log_ring, log_head, log_count;
    int64_t next_seq;
};

zt_job_history *zt_history_create(int log_ring, int record_cache) {
    zt_job_history *h = calloc(1, sizeof *h);
    ZT_ASSERT(h);
    h->log_ring = log_ring > 0 ? log_ring : 1;
    h->logs = calloc((size_t)h->log_ring, sizeof *h->logs);
    ZT_ASSERT(h->logs);
    h->ring_cap = record_cache > 0 ? record_cache : 1;
    h->next_seq = 1;
    return h;
}

void zt_history_drop_records(zt_job_history *h) {
    for (int i = 0; i < h->ring_count; i++)
        free(h->ring[(h->ring_head + i) % h->ring_cap].json);
    free(h->ring);
    h->ring = NULL;
    h->ring_head = h->ring_count = 0;
}

void zt_history_destroy(zt_job_history *h) {
    if (!h)
        return;
    zt_history_drop_records(h);
    for (int i = 0; i < h->n_keys; i++)
        free(h->keys[i]);
    free(h->keys);
    free(h->last_value);
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
    if (h->n_keys == h->cap_keys) {
        h->cap_keys = h->cap_keys ? 2 * h->cap_keys : 16;
        h->keys = realloc(h->keys, (size_t)h->cap_keys * sizeof *h->keys);
        h->last_value = realloc(h->last_value, (size_t)h->cap_keys * sizeof *h->last_value);
        ZT_ASSERT(h->keys && h->last_value);
    }
    h->keys[h->n_keys] = xstrdup(key);
    return h->n_keys++;
}

/* The record's step (train/global_step, else default_step), and its numbers as the last values
 * of their keys; a null (a value that was not finite) as NaN. */
static int64_t note_values(zt_job_history *h, const cJSON *obj, int64_t default_step) {
    const cJSON *gs = cJSON_GetObjectItemCaseSensitive(obj, "train/global_step");
    int64_t step = cJSON_IsNumber(gs) ? (int64_t)gs->valuedouble : default_step;
    for (const cJSON *it = obj->child; it; it = it->next) {
        double value;
        if (!it->string || !zt_metrics_value_of(it, &value))
            continue;
        int k = intern_key(h, it->string);
        if (k >= 0)
            h->last_value[k] = value;
    }
    return step;
}

void zt_history_add_record(zt_job_history *h, const cJSON *obj, const char *text,
                           int64_t time_ms, int64_t default_step, zt_metric_record *out) {
    cached r = {.seq = ++h->n_records, .step = note_values(h, obj, default_step),
                .time_ms = time_ms, .json = xstrdup(text)};
    if (!h->ring) {
        h->ring = calloc((size_t)h->ring_cap, sizeof *h->ring);
        ZT_ASSERT(h->ring);
    }
    if (h->ring_count == h->ring_cap) {
        free(h->ring[h->ring_head].json);
        h->ring_head = (h->ring_head + 1) % h->ring_cap;
        h->ring_count--;
    }
    h->ring[(h->ring_head + h->ring_count++) % h->ring_cap] = r;
    if (out)
        *out = (zt_metric_record){.seq = r.seq, .step = r.step, .time_ms = r.time_ms,
                                  .json = r.json};
}

void zt_history_restore_record(zt_job_history *h, const cJSON *obj, int64_t seq, int64_t step) {
    note_values(h, obj, step);
    if (seq > h->n_records)
        h->n_records = seq;
}

int64_t zt_history_n_records(const zt_job_history *h) {
    return h->n_records;
}

int64_t zt_history_first_cached(const zt_job_history *h) {
    return h->ring_count ? h->ring[h->ring_head].seq : h->n_records + 1;
}

void zt_history_cached_records(const zt_job_history *h, int64_t since_step, int64_t after_seq,
                               zt_record_fn emit, void *ctx) {
    for (int i = 0; i < h->ring_count; i++) {
        const cached *c = &h->ring[(h->ring_head + i) % h->ring_cap];
        if (c->step < since_step || c->seq <= after_seq)
            continue;
        zt_metric_record r = {.seq = c->seq, .step = c->step, .time_ms = c->time_ms,
                              .json = c->json};
        emit(ctx, &r);
    }
}

bool zt_history_last_value(const zt_job_history *h, const char *key, double *value) {
    int k = find_key(h, key);
    bool found = k >= 0;
    *value = found ? h->last_value[k] : NAN;
    return found;
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
