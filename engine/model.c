/* Architecture dispatch and the weight formats every architecture shares (safetensors with
 * Hugging Face names). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/model.h"
#include "ztrain/safetensors.h"

zt_status zt_model_create(zt_model **out, const zt_model_spec *spec, const zt_kernels *k,
                          int max_batch) {
    if (strcmp(spec->type, "gpt2") == 0)
        return zt_gpt2_create(out, spec, k, max_batch);
    return zt_error(ZT_ERR_INVALID, "model.type '%s' is not known (available: gpt2)", spec->type);
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
 * buffers and the LM head, which is tied to wte. */
static int is_ignored_tensor(const char *name) {
    size_t n = strlen(name);
    return strcmp(name, "lm_head.weight") == 0 ||
           (n > 9 && strcmp(name + n - 9, ".attn.bias") == 0) ||
           (n > 16 && strcmp(name + n - 16, ".attn.masked_bias") == 0);
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld",
                                 (long long)shape[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

zt_status zt_model_load_safetensors(zt_model *m, const char *path) {
    zt_st_file f;
    ZT_TRY(zt_st_open(&f, path));
    zt_status s = ZT_OK;
    char *seen = calloc((size_t)m->n_tensors, 1);
    if (!seen) {
        zt_st_close(&f);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < f.n_tensors && s == ZT_OK; i++) {
        const zt_st_tensor *st = &f.tensors[i];
        const char *name = strip_prefix(st->name);
        if (is_ignored_tensor(name))
            continue;
        const zt_tensor_info *t = zt_model_find_tensor(m, name);
        if (!t) {
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is not a parameter of this %s model",
                         path, st->name, m->spec.type);
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
        if (crop) {
            zt_st_tensor head = *st;
            head.shape[0] = t->shape[0];
            head.nbytes = st->nbytes / (size_t)st->shape[0] * (size_t)t->shape[0];
            s = zt_st_read_f32(&f, &head, m->params + t->offset, t->numel);
        } else {
            s = zt_st_read_f32(&f, st, m->params + t->offset, t->numel);
        }
        seen[t - m->tensors] = 1;
    }
    for (int i = 0; i < m->n_tensors && s == ZT_OK; i++) {
        if (!seen[i])
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is missing", path, m->tensors[i].name);
    }
    free(seen);
    zt_st_close(&f);
    return s;
}

zt_status zt_model_save_safetensors(const zt_model *m, const char *path) {
    zt_st_entry *e = calloc((size_t)m->n_tensors, sizeof *e);
    if (!e)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        e[i].name = t->name;
        e[i].data = m->params + t->offset;
        e[i].ndim = t->ndim;
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
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
    zt_status s = zt_st_write(path, e, m->n_tensors, keys, values, 7);
    free(e);
    return s;
}
