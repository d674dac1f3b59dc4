/* A dataset named by a path: one file (dataset.c), or a glob of shards read as one sequence of
 * samples that never crosses from one file into the next; and the sample table a loader keeps
 * for a glob (see ztrain/data.h). */
#define _GNU_SOURCE /* strdup, realpath */
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "ztrain/fsutil.h"

static bool is_glob(const char *path) {
    return strpbrk(path, "*?[") && !zt_path_exists(path);
}

/* Opens the matches of d->path (set by the caller) as d's parts; closes d on failure. */
static zt_status open_glob(zt_dataset *d, int vocab_size) {
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
            s = zt_data_same_kind(d, &d->parts[0], &d->parts[i]);
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
            s = zt_data_same_kind(d, &d->parts[0], &d->parts[i]);
        }
    }
    if (s != ZT_OK)
        zt_dataset_close(d);
    return s;
}

zt_status zt_dataset_open(zt_dataset *d, const char *path, int vocab_size) {
    memset(d, 0, sizeof *d);
    if (!path)
        return zt_error(ZT_ERR_INVALID, "no data path (a mixture opens with zt_dataset_open_train)");
    if (vocab_size <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: vocab_size %d must be positive", path, vocab_size);
    d->path = strdup(path);
    if (!d->path)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    if (is_glob(path))
        return open_glob(d, vocab_size);
    return zt_data_open_file(d, vocab_size);
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
