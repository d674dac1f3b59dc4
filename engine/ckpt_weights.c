/* A checkpoint's weights read a piece at a time (zt_ckpt_weights in ztrain/checkpoint.h), for
 * export: the file is mapped, each piece copied out, and the pages handed back, so the process
 * never holds more than a piece of the model. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ztrain/checkpoint.h"
#include "ztrain/safetensors.h"

struct zt_ckpt_weights {
    zt_st_file file; /* the tag's model.safetensors */
};

zt_status zt_ckpt_weights_open(zt_ckpt_weights **out, const char *dir, const char *tag,
                               zt_model_spec *spec) {
    *out = NULL;
    ZT_TRY(zt_ckpt_read_model_spec(dir, tag, spec));
    zt_ckpt_weights *w = calloc(1, sizeof *w);
    zt_status s = w ? zt_st_open(&w->file, spec->init_from)
                    : zt_error(ZT_ERR_NOMEM, "%s: out of memory", dir);
    free(spec->init_from);
    spec->init_from = NULL;
    if (s != ZT_OK) {
        free(w);
        return s;
    }
    *out = w;
    return ZT_OK;
}

/* Gives the whole pages of [p, p + bytes) back: they were read once and will not be again. */
static void drop_pages(const void *p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + bytes) / page * page;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

zt_status zt_ckpt_weights_read(zt_ckpt_weights *w, const char *name, size_t numel, size_t first,
                               float *dst, size_t n) {
    const zt_st_file *f = &w->file;
    const zt_st_tensor *t = zt_st_find(f, name);
    if (!t)
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is missing", f->path, name);
    if (t->dtype != ZT_ST_F32 || (size_t)zt_st_numel(t) != numel)
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is %s with %lld elements; the model's "
                        "has %zu fp32 elements", f->path, name, t->dtype_name,
                        (long long)zt_st_numel(t), numel);
    ZT_ASSERT(first <= numel && n <= numel - first);
    const char *src = (const char *)zt_st_data(f, t) + first * sizeof(float);
    memcpy(dst, src, n * sizeof(float));
    drop_pages(src, n * sizeof(float));
    return ZT_OK;
}

void zt_ckpt_weights_close(zt_ckpt_weights *w) {
    if (!w)
        return;
    zt_st_close(&w->file);
    free(w);
}
