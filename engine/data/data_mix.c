/* A weighted mixture of sources (each a file or a glob): the dataset, and its loader, which
 * draws each sample's source from a hash of (seed, the rank's sample count, rank) and takes the
 * sample from that source's own loader (source_loader.c) (see ztrain/data.h). */
#define _GNU_SOURCE /* strdup */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"

zt_status zt_dataset_open_mixture(zt_dataset *d, const char *const *paths, const double *weights,
                                  int n, int vocab_size) {
    memset(d, 0, sizeof *d);
    if (n < 1)
        return zt_error(ZT_ERR_INVALID, "data mixture: no sources");
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!(weights[i] > 0) || !isfinite(weights[i]))
            return zt_error(ZT_ERR_INVALID,
                            "data mixture: source %d (%s) has weight %g; weights must be > 0", i,
                            paths[i], weights[i]);
        sum += weights[i];
    }
    d->path = strdup("data mixture");
    d->parts = calloc((size_t)n, sizeof *d->parts);
    d->weights = malloc((size_t)n * sizeof *d->weights);
    if (!d->path || !d->parts || !d->weights) {
        zt_dataset_close(d);
        return zt_error(ZT_ERR_NOMEM, "data mixture: out of memory");
    }
    zt_status s = ZT_OK;
    for (int i = 0; i < n && s == ZT_OK; i++) {
        s = zt_dataset_open(&d->parts[i], paths[i], vocab_size);
        if (s == ZT_OK) {
            d->n_parts++;
            d->weights[i] = weights[i] / sum;
            d->n_tokens += d->parts[i].n_tokens;
            d->kind = d->parts[0].kind;
            s = zt_data_same_kind(d, &d->parts[0], &d->parts[i]);
        }
    }
    if (s != ZT_OK)
        zt_dataset_close(d);
    return s;
}

/* ---- a mixture's draws -------------------------------------------------------------------- */

/* The source of this rank's sample number `k`: a pure function of (seed, k, rank), so that a
 * resume replays the same draws. */
static int choose_source(const zt_loader *l, int64_t k) {
    uint64_t draw = (uint64_t)k * (uint64_t)l->world_size + (uint64_t)l->rank;
    uint64_t h = zt_data_mix64(l->seed ^ zt_data_mix64(draw));
    double u = (double)(h >> 11) * 0x1.0p-53, acc = 0;
    int n = l->ds->n_parts;
    for (int i = 0; i < n - 1; i++) {
        acc += l->ds->weights[i];
        if (u < acc)
            return i;
    }
    return n - 1;
}

zt_status zt_data_mix_init(zt_loader *l) {
    const zt_dataset *ds = l->ds;
    l->subs = calloc((size_t)ds->n_parts, sizeof *l->subs);
    l->order = calloc((size_t)ds->n_parts, sizeof *l->order);
    if (!l->subs || !l->order) {
        free(l->subs);
        free(l->order);
        memset(l, 0, sizeof *l);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", ds->path);
    }
    for (int i = 0; i < ds->n_parts; i++) {
        /* Each source has its own order: the same seed would shuffle equal-sized sources
         * alike. */
        zt_status s = zt_source_loader_init(&l->subs[i], &ds->parts[i], 1, l->T, l->rank,
                                     l->world_size, l->shuffle, false,
                                     l->seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL);
        if (s != ZT_OK) {
            for (int k = 0; k < i; k++)
                zt_source_loader_free(&l->subs[k]);
            free(l->subs);
            free(l->order);
            memset(l, 0, sizeof *l);
            return zt_error_prefix(s, "data mixture source %d: ", i);
        }
        l->n_samples += l->subs[i].n_samples;
        l->per_rank += l->subs[i].per_rank;
    }
    l->drawn = 0;
    return ZT_OK;
}

int zt_data_mix_next(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos) {
    size_t T = (size_t)l->T;
    for (int b = 0; b < l->B; b++) {
        int src = choose_source(l, l->drawn++);
        zt_source_loader_next(&l->subs[src], inputs + b * T, targets + b * T,
                            doc_pos ? doc_pos + b * T : NULL);
    }
    l->epoch = l->drawn / l->per_rank;
    l->pos = l->drawn % l->per_rank;
    return l->B;
}

void zt_data_mix_seek(zt_loader *l, int64_t drawn) {
    int n = l->ds->n_parts;
    int64_t *count = l->order;
    memset(count, 0, (size_t)n * sizeof *count);
    for (int64_t k = 0; k < drawn; k++)
        count[choose_source(l, k)]++;
    for (int i = 0; i < n; i++)
        zt_source_loader_seek(&l->subs[i], count[i] / l->subs[i].per_rank, count[i] % l->subs[i].per_rank);
    l->drawn = drawn;
    l->epoch = drawn / l->per_rank;
    l->pos = drawn % l->per_rank;
}

void zt_data_mix_free(zt_loader *l) {
    for (int i = 0; l->subs && i < l->ds->n_parts; i++)
        zt_source_loader_free(&l->subs[i]);
    free(l->subs);
    free(l->order);
}
