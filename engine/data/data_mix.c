/* Datasets of several files: a glob of shards read as one sequence of samples, and a weighted
 * mixture of such sources sampled deterministically from the seed (see ztrain/data.h). */
#define _GNU_SOURCE /* strdup, realpath */
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "ztrain/fsutil.h"
#include "ztrain/job_spec.h"
#include "ztrain/loss_mask.h"

static const char *kind_name(zt_data_kind k) {
    return k == ZT_DATA_TOKENS16 ? "uint16 tokens" : k == ZT_DATA_TOKENS32 ? "uint32 tokens"
                                                                           : "bytes";
}

bool zt_data_is_glob(const char *path) {
    return strpbrk(path, "*?[") && !zt_path_exists(path);
}

/* Parts must share one token width: different widths (or text among shards) mean different
 * tokenizers, whose ids would be mixed silently. */
static zt_status same_kind(const zt_dataset *d, const zt_dataset *a, const zt_dataset *b) {
    if (a->kind == b->kind)
        return ZT_OK;
    return zt_error(ZT_ERR_FORMAT,
                    "%s: %s holds %s but %s holds %s: shards of different tokenizers (or text "
                    "among token files) cannot be read together",
                    d->path, a->path, kind_name(a->kind), b->path, kind_name(b->kind));
}

zt_status zt_data_open_glob(zt_dataset *d, int vocab_size) {
    glob_t g;
    int rc = glob(d->path, 0, NULL, &g);
    zt_status s = ZT_OK;
    if (rc == GLOB_NOMATCH)
        s = zt_error(ZT_ERR_IO, "%s: no file matches the pattern", d->path);
    else if (rc != 0)
        s = zt_error(ZT_ERR_IO, "%s: cannot expand the pattern", d->path);
    else if (!(d->parts = calloc(g.gl_pathc, sizeof *d->parts)))
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", d->path);
    for (size_t i = 0; s == ZT_OK && i < g.gl_pathc; i++) {
        s = zt_dataset_open(&d->parts[i], g.gl_pathv[i], vocab_size);
        if (s == ZT_OK) {
            d->n_parts++;
            d->n_tokens += d->parts[i].n_tokens;
            d->kind = d->parts[0].kind;
            s = same_kind(d, &d->parts[0], &d->parts[i]);
        }
    }
    if (rc == 0)
        globfree(&g);
    if (s != ZT_OK)
        zt_dataset_close(d);
    return s;
}

zt_status zt_dataset_open_files(zt_dataset *d, const char *pattern, char *const *files, int n,
                                int vocab_size) {
    memset(d, 0, sizeof *d);
    d->path = strdup(pattern ? pattern : "data files");
    d->parts = n > 0 ? calloc((size_t)n, sizeof *d->parts) : NULL;
    if (!d->path || !d->parts) {
        zt_dataset_close(d);
        return n > 0 ? zt_error(ZT_ERR_NOMEM, "out of memory")
                     : zt_error(ZT_ERR_INVALID, "%s: no files", pattern);
    }
    zt_status s = ZT_OK;
    for (int i = 0; s == ZT_OK && i < n; i++) {
        /* The list was resolved when the job was checked; a path that resolves elsewhere now
         * was changed since (a symlink put in its place, or on its way). */
        char real[PATH_MAX];
        if (!realpath(files[i], real))
            s = zt_error(ZT_ERR_IO, "%s: %s: %s (it was there when the job was checked)",
                         d->path, files[i], strerror(errno));
        else if (strcmp(real, files[i]) != 0)
            s = zt_error(ZT_ERR_INVALID, "%s: %s now leads to %s: it changed since the job was "
                         "checked, and is not read", d->path, files[i], real);
        if (s == ZT_OK)
            s = zt_dataset_open(&d->parts[i], files[i], vocab_size);
        if (s == ZT_OK) {
            d->n_parts++;
            d->n_tokens += d->parts[i].n_tokens;
            d->kind = d->parts[0].kind;
            s = same_kind(d, &d->parts[0], &d->parts[i]);
        }
    }
    if (s != ZT_OK)
        zt_dataset_close(d);
    return s;
}

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
            s = same_kind(d, &d->parts[0], &d->parts[i]);
        }
    }
    if (s != ZT_OK)
        zt_dataset_close(d);
    return s;
}

/* data.format "masked": every file's loss mask, mapped beside it. */
static zt_status with_masks(zt_dataset *d, const zt_data_spec *spec, zt_status opened) {
    if (opened != ZT_OK || spec->format != ZT_DATA_FORMAT_MASKED)
        return opened;
    zt_status s = zt_loss_mask_attach(d);
    if (s == ZT_OK && spec->packing == ZT_DATA_PADDED)
        s = zt_dataset_set_padded(d);
    if (s != ZT_OK)
        zt_dataset_close(d);
    return s;
}

static zt_status open_train(zt_dataset *d, const zt_data_spec *spec, int vocab_size);

zt_status zt_dataset_open_train(zt_dataset *d, const zt_data_spec *spec, int vocab_size) {
    return with_masks(d, spec, open_train(d, spec, vocab_size));
}

/* The checked list of files (train_files/val_files, expanded once when the job was admitted)
 * when there is one, else the path as it is. */
zt_status zt_dataset_open_val(zt_dataset *d, const zt_data_spec *spec, int vocab_size) {
    return with_masks(d, spec,
                      spec->val_files ? zt_dataset_open_files(d, spec->val, spec->val_files,
                                                              spec->n_val_files, vocab_size)
                                      : zt_dataset_open(d, spec->val, vocab_size));
}

static zt_status open_train(zt_dataset *d, const zt_data_spec *spec, int vocab_size) {
    if (!spec->train_mix && spec->train_files)
        return zt_dataset_open_files(d, spec->train, spec->train_files, spec->n_train_files,
                                     vocab_size);
    if (!spec->train_mix)
        return zt_dataset_open(d, spec->train, vocab_size);
    const char *paths[ZT_MAX_MIX_SOURCES];
    double weights[ZT_MAX_MIX_SOURCES];
    memset(d, 0, sizeof *d);
    if (spec->n_train_mix > ZT_MAX_MIX_SOURCES)
        return zt_error(ZT_ERR_INVALID, "data.train: %d mixture sources, at most %d",
                        spec->n_train_mix, ZT_MAX_MIX_SOURCES);
    for (int i = 0; i < spec->n_train_mix; i++) {
        paths[i] = spec->train_mix[i].path;
        weights[i] = spec->train_mix[i].weight;
    }
    return zt_dataset_open_mixture(d, paths, weights, spec->n_train_mix, vocab_size);
}

/* ---- a glob's samples --------------------------------------------------------------------- */

zt_status zt_data_glob_samples(zt_loader *l) {
    const zt_dataset *ds = l->ds;
    l->part_first = malloc(((size_t)ds->n_parts + 1) * sizeof *l->part_first);
    if (!l->part_first)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", ds->path);
    int64_t n = 0;
    for (int i = 0; i < ds->n_parts; i++) {
        l->part_first[i] = n;
        size_t toks = ds->parts[i].n_tokens;
        n += ds->parts[i].padded ? (int64_t)ds->parts[i].n_docs
             : toks > (size_t)l->T ? (int64_t)((toks - 1) / (size_t)l->T) : 0;
    }
    l->part_first[ds->n_parts] = n;
    l->n_samples = n;
    if (n == 0) {
        free(l->part_first);
        l->part_first = NULL;
        return zt_error(ZT_ERR_INVALID, "%s: no file holds one sample of T+1 = %d tokens",
                        ds->path, l->T + 1);
    }
    return ZT_OK;
}

int zt_data_glob_part(const zt_loader *l, int64_t s) {
    int lo = 0, hi = l->ds->n_parts - 1;
    /* The last file whose first sample is <= s (files too short for a sample share their
     * successor's start and are skipped by taking the last). */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->part_first[mid] <= s)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---- a mixture's draws -------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The source of this rank's sample number `k`: a pure function of (seed, k, rank), so that a
 * resume replays the same draws. */
static int choose_source(const zt_loader *l, int64_t k) {
    uint64_t h = mix64(l->seed ^ mix64((uint64_t)k * (uint64_t)l->world_size + (uint64_t)l->rank));
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
        zt_status s = zt_loader_init(&l->subs[i], &ds->parts[i], 1, l->T, l->rank,
                                     l->world_size, l->shuffle, false,
                                     l->seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL);
        if (s != ZT_OK) {
            for (int k = 0; k < i; k++)
                zt_loader_free(&l->subs[k]);
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
        zt_loader_next_docs(&l->subs[src], inputs + b * T, targets + b * T,
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
        zt_loader_seek(&l->subs[i], count[i] / l->subs[i].per_rank, count[i] % l->subs[i].per_rank);
    l->drawn = drawn;
    l->epoch = drawn / l->per_rank;
    l->pos = drawn % l->per_rank;
}
