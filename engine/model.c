/* Architecture dispatch and the weight formats every architecture shares (safetensors with
 * Hugging Face names). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/model.h"
#include "ztrain/safetensors.h"

zt_status zt_model_create(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                          int max_batch, size_t pad_to) {
    if (strcmp(spec->type, "gpt2") == 0)
        return zt_gpt2_create(out, spec, be, max_batch, pad_to ? pad_to : 1);
    return zt_error(ZT_ERR_INVALID, "model.type '%s' is not known (available: gpt2)", spec->type);
}

static size_t flat_bytes(const zt_model *m) { return m->n_padded * sizeof(float); }

zt_status zt_model_alloc_flat(zt_model *m, size_t pad_to) {
    m->n_padded = (m->n_params + pad_to - 1) / pad_to * pad_to;
    m->params = zt_backend_alloc(m->ctx.be, ZT_MEM_DEVICE, flat_bytes(m));
    m->grads = zt_backend_alloc(m->ctx.be, ZT_MEM_DEVICE, flat_bytes(m));
    if (!m->params || !m->grads)
        return zt_error(ZT_ERR_NOMEM, "%s: cannot allocate %zu parameters on %s", m->spec.type,
                        m->n_padded, m->ctx.be->name);
    return ZT_OK;
}

void zt_model_free_flat(zt_model *m) {
    zt_backend_free(m->ctx.be, ZT_MEM_DEVICE, m->params, flat_bytes(m));
    zt_backend_free(m->ctx.be, ZT_MEM_DEVICE, m->grads, flat_bytes(m));
    m->params = m->grads = NULL;
}

void zt_model_set_params(zt_model *m, size_t at, const float *src, size_t n) {
    zt_backend_copy(m->ctx.be, m->params + at, src, n * sizeof(float), ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
}

void zt_model_destroy(zt_model *m) {
    if (m)
        m->ops->destroy(m);
}

const zt_tensor_info *zt_model_find_tensor(const zt_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

static const char *strip_prefix(const char *name) {
    return strncmp(name, "transformer.", 12) == 0 ? name + 12 : name;
}

/* Tensors a Hugging Face GPT-2 file may carry that are not parameters here: the causal-mask
 * buffers. (The LM head is checked separately: it must equal wte, to which it is tied.) */
static int is_ignored_tensor(const char *name) {
    size_t n = strlen(name);
    return (n > 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
           (n > 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0);
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld",
                                 (long long)shape[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* GPT-2's LM head is the token embedding. A file that carries a separate lm_head.weight must hold
 * the same values (as Hugging Face's tied checkpoints do); a different head cannot be represented
 * and is refused rather than dropped. */
static zt_status check_tied_head(const zt_model *m, const zt_st_file *f, const char *path) {
    const zt_st_tensor *head = zt_st_find(f, "lm_head.weight");
    const zt_tensor_info *wte = zt_model_find_tensor(m, "wte.weight");
    if (!head || !wte)
        return ZT_OK;
    if (head->ndim != 2 || head->shape[0] != wte->shape[0] || head->shape[1] != wte->shape[1])
        return zt_error(ZT_ERR_FORMAT, "%s: lm_head.weight does not have wte.weight's shape", path);
    size_t bytes = wte->numel * sizeof(float);
    float *file = malloc(bytes), *model = malloc(bytes);
    zt_status s = file && model ? zt_st_read_f32(f, head, file, wte->numel)
                                : zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    if (s == ZT_OK) {
        zt_backend_copy(m->ctx.be, model, m->params + wte->offset, bytes, ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
        if (memcmp(file, model, bytes) != 0)
            s = zt_error(ZT_ERR_FORMAT,
                         "%s: lm_head.weight differs from wte.weight, but GPT-2 here ties the LM "
                         "head to the token embedding",
                         path);
    }
    free(file);
    free(model);
    return s;
}

/* Reads one tensor (st, already checked against t; rows beyond t's are left out) into the
 * parameters through host staging of t's size. */
static zt_status read_param(zt_model *m, const zt_st_file *f, const zt_st_tensor *st,
                            const zt_tensor_info *t, float *staging) {
    zt_st_tensor head = *st;
    if (st->shape[0] > t->shape[0]) {
        head.shape[0] = t->shape[0];
        head.nbytes = st->nbytes / (size_t)st->shape[0] * (size_t)t->shape[0];
    }
    ZT_TRY(zt_st_read_f32(f, &head, staging, t->numel));
    zt_model_set_params(m, t->offset, staging, t->numel);
    return ZT_OK;
}

static size_t largest_tensor(const zt_model *m) {
    size_t n = 1;
    for (int i = 0; i < m->n_tensors; i++)
        n = m->tensors[i].numel > n ? m->tensors[i].numel : n;
    return n;
}

zt_status zt_model_load_safetensors(zt_model *m, const char *path) {
    zt_st_file f;
    ZT_TRY(zt_st_open(&f, path));
    zt_status s = ZT_OK;
    size_t staging_bytes = largest_tensor(m) * sizeof(float);
    char *seen = calloc((size_t)m->n_tensors, 1);
    float *staging = zt_backend_alloc(m->ctx.be, ZT_MEM_PINNED, staging_bytes);
    if (!seen || !staging) {
        free(seen);
        zt_backend_free(m->ctx.be, ZT_MEM_PINNED, staging, staging_bytes);
        zt_st_close(&f);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < f.n_tensors && s == ZT_OK; i++) {
        const zt_st_tensor *st = &f.tensors[i];
        const char *name = strip_prefix(st->name);
        if (is_ignored_tensor(name) || strcmp(name, "lm_head.weight") == 0)
            continue;
        const zt_tensor_info *t = zt_model_find_tensor(m, name);
        if (!t) {
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is not a parameter of this %s model",
                         path, st->name, m->spec.type);
            break;
        }
        if (seen[t - m->tensors]) {
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' appears twice (with and without the "
                         "'transformer.' prefix)", path, name);
            break;
        }
        char want[64], got[64];
        format_shape(want, sizeof want, t->ndim, t->shape);
        format_shape(got, sizeof got, st->ndim, st->shape);
        /* A longer position table (e.g. GPT-2's 1024 positions for a shorter block_size) is
         * cropped to the model's block_size, as nanoGPT does. */
        int crop = strcmp(name, "wpe.weight") == 0 && st->ndim == 2 && st->shape[1] == t->shape[1] &&
                   st->shape[0] > t->shape[0];
        int same = st->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = st->shape[d] == t->shape[d];
        if (!same && !crop) {
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has shape %s but the model needs %s",
                         path, st->name, got, want);
            break;
        }
        s = read_param(m, &f, st, t, staging);
        seen[t - m->tensors] = 1;
    }
    for (int i = 0; i < m->n_tensors && s == ZT_OK; i++) {
        if (!seen[i])
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is missing", path, m->tensors[i].name);
    }
    if (s == ZT_OK)
        s = check_tied_head(m, &f, path);
    free(seen);
    zt_backend_free(m->ctx.be, ZT_MEM_PINNED, staging, staging_bytes);
    zt_st_close(&f);
    return s;
}

/* The writer asks for a tensor's values piece by piece; they come from the device. */
typedef struct {
    const zt_model *m;
    size_t offset;
} param_reader;

static zt_status read_params(void *ctx, size_t first, float *dst, size_t n) {
    const param_reader *r = ctx;
    zt_backend_copy(r->m->ctx.be, dst, r->m->params + r->offset + first, n * sizeof(float),
                    ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    return ZT_OK;
}

zt_status zt_model_save_safetensors(const zt_model *m, const char *path) {
    zt_st_entry *e = calloc((size_t)m->n_tensors, sizeof *e);
    zt_st_source *src = calloc((size_t)m->n_tensors, sizeof *src);
    param_reader *readers = calloc((size_t)m->n_tensors, sizeof *readers);
    if (!e || !src || !readers) {
        free(e);
        free(src);
        free(readers);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        e[i].name = t->name;
        e[i].ndim = t->ndim;
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
        readers[i] = (param_reader){m, t->offset};
        src[i] = (zt_st_source){read_params, &readers[i]};
    }
    char dims[5][32];
    snprintf(dims[0], sizeof dims[0], "%d", m->spec.n_layer);
    snprintf(dims[1], sizeof dims[1], "%d", m->spec.n_head);
    snprintf(dims[2], sizeof dims[2], "%d", m->spec.n_embd);
    snprintf(dims[3], sizeof dims[3], "%d", m->spec.vocab_size);
    snprintf(dims[4], sizeof dims[4], "%d", m->spec.block_size);
    const char *keys[] = {"format", "model_type", "n_layer", "n_head", "n_embd", "vocab_size",
                          "block_size"};
    const char *values[] = {"pt", m->spec.type, dims[0], dims[1], dims[2], dims[3], dims[4]};
    zt_status s = zt_st_write_sources(path, e, src, m->n_tensors, keys, values, 7);
    free(e);
    free(src);
    free(readers);
    return s;
}
