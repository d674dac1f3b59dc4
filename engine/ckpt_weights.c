/* A checkpoint's weights read tensor by tensor (zt_ckpt_weights in ztrain/checkpoint.h) from
 * the tag's model.safetensors, which every checkpoint written by this tree holds: the file is
 * mapped, each piece copied out and its pages handed back, so a reader never holds more than a
 * piece of the model. (Checkpoints whose ZeRO-3 weights live only in per-rank shards are read
 * by the same calls where that layout exists.) */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ztrain/checkpoint.h"
#include "ztrain/model.h"
#include "ztrain/safetensors.h"

struct zt_ckpt_weights {
    zt_st_file file;         /* the tag's model.safetensors */
    int n;
    zt_ckpt_tensor *tensors; /* the model's, names owned by `names` */
    char (*names)[64];
};

/* The model's tensor table, from a model built for it alone: its buffers are device memory
 * that is never written, which on the CPU backend takes no pages. */
static zt_status tensor_table(zt_ckpt_weights *w, const zt_model_spec *spec) {
    zt_backend *be = NULL;
    zt_model *m = NULL;
    zt_status s = zt_backend_create(&be, ZT_DEVICE_CPU, NULL);
    if (s == ZT_OK)
        s = zt_model_create(&m, spec, be, ZT_F32, 1, 1);
    if (s == ZT_OK) {
        w->tensors = calloc((size_t)m->n_tensors + 1, sizeof *w->tensors);
        w->names = calloc((size_t)m->n_tensors + 1, sizeof *w->names);
        if (!w->tensors || !w->names)
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", w->file.path);
    }
    for (int i = 0; s == ZT_OK && i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        memcpy(w->names[i], t->name, sizeof w->names[i]);
        w->tensors[i] = (zt_ckpt_tensor){w->names[i], t->ndim, {t->shape[0], t->shape[1]},
                                         t->numel};
        w->n++;
    }
    zt_model_destroy(m);
    zt_backend_destroy(be);
    return s;
}

/* Every tensor of the model is in the file, in fp32, with its shape. */
static zt_status check_file(const zt_ckpt_weights *w) {
    const zt_st_file *f = &w->file;
    for (int i = 0; i < w->n; i++) {
        const zt_ckpt_tensor *t = &w->tensors[i];
        const zt_st_tensor *st = zt_st_find(f, t->name);
        if (!st)
            return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is missing", f->path, t->name);
        bool same = st->dtype == ZT_ST_F32 && st->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = st->shape[d] == t->shape[d];
        if (!same)
            return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is %s of another shape than the "
                            "model's fp32 [%lld, %lld]", f->path, t->name, st->dtype_name,
                            (long long)t->shape[0], (long long)t->shape[1]);
    }
    return ZT_OK;
}

zt_status zt_ckpt_weights_open(zt_ckpt_weights **out, const char *dir, const char *tag,
                               zt_model_spec *spec) {
    *out = NULL;
    ZT_TRY(zt_ckpt_read_model_spec(dir, tag, spec));
    zt_ckpt_weights *w = calloc(1, sizeof *w);
    zt_status s = w ? zt_st_open(&w->file, spec->init_from)
                    : zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    free(spec->init_from);
    spec->init_from = NULL;
    if (s == ZT_OK)
        s = tensor_table(w, spec);
    if (s == ZT_OK)
        s = check_file(w);
    if (s != ZT_OK) {
        zt_ckpt_weights_close(w);
        return s;
    }
    *out = w;
    return ZT_OK;
}

int zt_ckpt_weights_count(const zt_ckpt_weights *w) { return w->n; }

const zt_ckpt_tensor *zt_ckpt_weights_tensor(const zt_ckpt_weights *w, int i) {
    ZT_ASSERT(i >= 0 && i < w->n);
    return &w->tensors[i];
}

/* Gives the whole pages of [p, p + bytes) back: they were read once and will not be again. */
static void drop_pages(const void *p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + bytes) / page * page;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

zt_status zt_ckpt_weights_read(zt_ckpt_weights *w, int i, size_t first, float *dst, size_t n) {
    const zt_ckpt_tensor *t = zt_ckpt_weights_tensor(w, i);
    ZT_ASSERT(first <= t->numel && n <= t->numel - first);
    const zt_st_tensor *st = zt_st_find(&w->file, t->name);
    const char *src = (const char *)zt_st_data(&w->file, st) + first * sizeof(float);
    memcpy(dst, src, n * sizeof(float));
    drop_pages(src, n * sizeof(float));
    return ZT_OK;
}

void zt_ckpt_weights_close(zt_ckpt_weights *w) {
    if (!w)
        return;
    zt_st_close(&w->file);
    free(w->tensors);
    free(w->names);
    free(w);
}
