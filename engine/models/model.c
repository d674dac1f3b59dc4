/* What every model family shares: creation through the registry, the flat parameter buffers,
 * and safetensors import/export with Hugging Face names, driven by the family's zt_hf_map. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/comm.h"
#include "ztrain/size_math.h"
#include "ztrain/model.h"
#include "ztrain/safetensors.h"

zt_model_stage zt_model_full_stage(int n_layer) {
    return (zt_model_stage){0, n_layer, true, true, 1, 1, 0};
}

zt_status zt_model_create(zt_model **out, const zt_model_spec *spec, zt_backend *be, zt_dtype act,
                          int max_batch, size_t pad_to) {
    zt_model_stage full = zt_model_full_stage(spec->n_layer);
    return zt_model_create_stage(out, spec, be, act, max_batch, pad_to, &full);
}

zt_status zt_model_create_stage(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                                zt_dtype act, int max_batch, size_t pad_to,
                                const zt_model_stage *stage) {
    const zt_model_family *fam = zt_model_family_find(spec->type);
    if (fam) {
        const zt_model_stage *st = stage;
        if (st->first_layer < 0 || st->last_layer < st->first_layer ||
            st->last_layer > spec->n_layer || st->buffers < 1 ||
            (st->first_layer == st->last_layer && !st->embed && !st->head))
            return zt_error(ZT_ERR_INVALID, "%s: pipeline stage of layers [%d, %d)%s%s with %d "
                            "buffers is not a part of a model of %d layers", spec->type,
                            st->first_layer, st->last_layer, st->embed ? " + embedding" : "",
                            st->head ? " + head" : "", st->buffers, spec->n_layer);
        if (st->tp_size < 0 || (st->tp_size > 1 && (st->tp_rank < 0 || st->tp_rank >= st->tp_size)))
            return zt_error(ZT_ERR_INVALID, "%s: tensor-parallel shard %d of %d does not exist",
                            spec->type, st->tp_rank, st->tp_size);
        return fam->create(out, spec, be, act, max_batch, pad_to ? pad_to : 1, stage);
    }
    char known[256];
    zt_model_family_names(known, sizeof known);
    return zt_error(ZT_ERR_INVALID, "model.type '%s' is not known (available: %s)", spec->type,
                    known);
}

static size_t flat_bytes(const zt_model *m) { return m->n_padded * sizeof(float); }

zt_status zt_model_alloc_flat(zt_model *m, size_t pad_to) {
    bool overflow = false;
    uint64_t padded = zt_u64_round_up(m->n_params, pad_to, &overflow);
    if (overflow || zt_u64_mul(padded, sizeof(float), &overflow) > SIZE_MAX || overflow)
        return zt_error(ZT_ERR_NOMEM, "%s: %zu parameters do not fit this machine's address space",
                        m->spec.type, m->n_params);
    m->n_padded = (size_t)padded;
    m->params = zt_backend_alloc(m->ctx.be, ZT_MEM_DEVICE, flat_bytes(m));
    /* Reserved, holding nothing: ZeRO commits what of them a rank writes (all of them at stages
     * 0-1 in fp32; per layer in mixed precision and at stages 2-3, where the whole buffer is
     * never held), so the model's making does not hold 8 bytes a parameter at once. In mixed
     * precision on a backend whose ops write 16-bit gradients (writes_grad16) a step never
     * writes them at all: they are only the addresses the ops map to ZeRO's 16-bit buffer
     * (ops.h, zt_grad16), so they are reserved at any size (zt_backend_reserve), where a small
     * released allocation would hold all of its bytes. */
    const bool unwritten = m->ctx.act != ZT_F32 && m->ctx.be->writes_grad16;
    m->grads = unwritten ? zt_backend_reserve(m->ctx.be, flat_bytes(m))
                         : zt_backend_alloc_released(m->ctx.be, flat_bytes(m));
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

zt_status zt_model_set_params(zt_model *m, size_t at, const float *src, size_t n) {
    ZT_TRY(zt_backend_commit(m->ctx.be, m->params, at * sizeof(float), (at + n) * sizeof(float)));
    zt_backend_copy(m->ctx.be, m->params + at, src, n * sizeof(float), ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
    return ZT_OK;
}

zt_status zt_model_check_create(const zt_model_spec *spec, zt_backend *be, zt_dtype act,
                                int max_batch, zt_model_estimate *out) {
    if (max_batch < 1)
        return zt_error(ZT_ERR_INVALID, "%s: batch size %d must be positive", spec->type,
                        max_batch);
    zt_model_estimate_args args = {.micro_batch = max_batch,
                                   .act_size = zt_backend_act_size(be, act),
                                   .attn_lse = be->attn_lse};
    ZT_TRY(zt_model_estimate_spec(spec, &args, "model", out));
    if (out->activation_bytes > SIZE_MAX)
        return zt_error(ZT_ERR_NOMEM, "%s: %llu bytes of activations do not fit this machine's "
                        "address space", spec->type, (unsigned long long)out->activation_bytes);
    return ZT_OK;
}

void zt_model_copy_logits(const zt_model *m, const float *logits, size_t row, size_t rows,
                          float *dst) {
    ZT_ASSERT(zt_backend_act_size(m->ctx.be, m->ctx.act) == sizeof(float));
    size_t V = (size_t)(m->spec.vocab_size / zt_model_stage_tp(&m->stage));
    zt_backend_copy(m->ctx.be, dst, logits + row * V, rows * V * sizeof(float), ZT_COPY_D2H,
                    ZT_STREAM_COMPUTE);
}

void zt_model_destroy(zt_model *m) {
    if (!m)
        return;
    zt_comm_destroy(m->tp_share_comm);
    free(m->tp_logits);
    m->ops->destroy(m);
}

const zt_tensor_info *zt_model_find_tensor(const zt_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

/* The family's map for this model. */
static const zt_hf_map *hf_map(const zt_model *m) {
    const zt_model_family *fam = zt_model_family_find(m->spec.type);
    ZT_ASSERT(fam);
    return &fam->hf;
}

static const char *strip_prefix(const zt_hf_map *map, const char *name) {
    size_t n = map->strip_prefix ? strlen(map->strip_prefix) : 0;
    return n && strncmp(name, map->strip_prefix, n) == 0 ? name + n : name;
}

static bool is_ignored(const zt_hf_map *map, const char *name) {
    size_t n = strlen(name);
    for (const char *const *s = map->ignore_suffixes; s && *s; s++) {
        size_t ns = strlen(*s);
        if (n > ns && strcmp(name + n - ns, *s) == 0)
            return true;
    }
    return false;
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld",
                                 (long long)shape[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* The one place a file's tensor data enters the parameters: read into host memory, then copied
 * to the backend. A whole tensor read into a tensor-parallel shard (`whole`) is read whole into
 * host memory first and the shard's piece taken from it. */
static zt_status read_param(zt_model *m, const zt_st_file *f, const zt_st_tensor *st,
                            const zt_tensor_info *t, bool whole) {
    size_t bytes = t->numel * sizeof(float);
    const size_t n = whole ? zt_tensor_full_numel(t) : t->numel;
    float *staging = zt_backend_alloc(m->ctx.be, ZT_MEM_PINNED, bytes);
    float *read = whole ? malloc(n * sizeof *read) : staging;
    zt_status s = staging && read ? ZT_OK
                                  : zt_error(ZT_ERR_NOMEM, "%s: out of memory reading '%s'",
                                             f->path, t->name);
    if (s == ZT_OK)
        s = zt_st_read_f32(f, st, read, n);
    if (s == ZT_OK)
        s = zt_st_check_finite(f, st, read, 0, n);
    if (s == ZT_OK && whole)
        zt_tensor_shard_from_full(t, read, staging);
    if (s == ZT_OK)
        s = zt_model_set_params(m, t->offset, staging, t->numel);
    if (whole)
        free(read);
    if (staging)
        zt_backend_free(m->ctx.be, ZT_MEM_PINNED, staging, bytes);
    return s;
}

static bool has_shape(const zt_st_tensor *st, int ndim, const int64_t *shape) {
    bool same = st->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = st->shape[d] == shape[d];
    return same;
}

/* Whether two tensors hold the same values once read as fp32. Tensors of one dtype compare as
 * raw bytes (every conversion to fp32 is exact, so equal values are equal bytes), which needs no
 * memory however large they are. */
static zt_status same_values(const zt_st_ref *a, const zt_st_ref *b, size_t n, bool *same) {
    if (a->tensor->dtype == b->tensor->dtype && a->tensor->nbytes == b->tensor->nbytes) {
        *same = memcmp(zt_st_data(a->file, a->tensor), zt_st_data(b->file, b->tensor),
                       a->tensor->nbytes) == 0;
        return ZT_OK;
    }
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    zt_status s = x && y ? ZT_OK : zt_error(ZT_ERR_NOMEM, "%s: out of memory", a->file->path);
    if (s == ZT_OK)
        s = zt_st_read_f32(a->file, a->tensor, x, n);
    if (s == ZT_OK)
        s = zt_st_read_f32(b->file, b->tensor, y, n);
    if (s == ZT_OK)
        *same = memcmp(x, y, n * sizeof(float)) == 0;
    free(x);
    free(y);
    return s;
}

/* A tied tensor the file carries (GPT-2's lm_head.weight) must be the tensor it is tied to: the
 * model keeps only that one, so a different head cannot be represented and is refused rather
 * than dropped. It is compared with the file's tensor that was loaded into map->tied_to (src
 * maps each parameter to its file tensor). */
static zt_status check_tied(const zt_model *m, const zt_st_ref *tied, const zt_st_ref *src) {
    const zt_hf_map *map = hf_map(m);
    const zt_tensor_info *t = zt_model_find_tensor(m, map->tied_to);
    ZT_ASSERT(t && src[t - m->tensors].tensor);
    const zt_st_ref *to = &src[t - m->tensors];
    const char *path = tied->file->path;
    /* The file's two tensors are compared, whole, also where this rank holds a shard. */
    bool same = has_shape(tied->tensor, to->tensor->ndim, to->tensor->shape);
    if (!same)
        return zt_error(ZT_ERR_FORMAT, "%s: %s does not have %s's shape", path, map->tied,
                        map->tied_to);
    ZT_TRY(same_values(tied, to, (size_t)zt_st_numel(to->tensor), &same));
    if (!same) {
        const zt_model_family *fam = zt_model_family_find(m->spec.type);
        return zt_error(ZT_ERR_FORMAT, "%s: %s differs from %s, but %s here ties them (the model "
                        "has only %s)", path, map->tied, map->tied_to, fam->title,
                        map->tied_to);
    }
    return ZT_OK;
}

/* Loads one tensor of the file into the parameter t, cropping it along dim 0 when the map
 * allows (a longer position table than block_size keeps its first rows, as nanoGPT does). */
static zt_status load_tensor(zt_model *m, const zt_st_file *f, const zt_st_tensor *st,
                             const zt_tensor_info *t) {
    const zt_hf_map *map = hf_map(m);
    if (has_shape(st, t->ndim, t->shape))
        return read_param(m, f, st, t, false);
    /* A tensor-parallel shard of a model loaded from whole tensors (model.init_from): its piece
     * of the whole tensor, as a checkpoint's shard would have saved it. */
    if (t->tp_dim >= 0 && has_shape(st, t->ndim, t->full_shape))
        return read_param(m, f, st, t, true);
    bool crop = map->croppable && strcmp(t->name, map->croppable) == 0 && st->ndim == t->ndim &&
                st->shape[0] > t->shape[0];
    for (int d = 1; crop && d < t->ndim; d++)
        crop = st->shape[d] == t->shape[d];
    if (!crop) {
        char want[64], got[64];
        format_shape(want, sizeof want, t->ndim, t->full_shape);
        format_shape(got, sizeof got, st->ndim, st->shape);
        return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has shape %s but the model needs %s",
                        f->path, st->name, got, want);
    }
    zt_st_tensor head = *st;
    head.shape[0] = t->shape[0];
    head.nbytes = st->nbytes / (size_t)st->shape[0] * (size_t)t->shape[0];
    return read_param(m, f, &head, t, false);
}

zt_status zt_model_load_safetensors(zt_model *m, const char *path) {
    const zt_hf_map *map = hf_map(m);
    zt_st_set set;
    ZT_TRY(zt_st_set_open(&set, path));
    zt_status s = ZT_OK;
    /* For every parameter, the file tensor it was loaded from. */
    zt_st_ref *src = calloc((size_t)m->n_tensors + 1, sizeof *src);
    if (!src) {
        zt_st_set_close(&set);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    zt_st_ref tied = {0};
    const bool whole = m->stage.embed && m->stage.head && m->stage.first_layer == 0 &&
                       m->stage.last_layer == m->n_layer;
    for (int i = 0; i < set.n_tensors && s == ZT_OK; i++) {
        const zt_st_ref *ref = &set.tensors[i];
        const zt_st_tensor *st = ref->tensor;
        const char *name = strip_prefix(map, st->name);
        if (is_ignored(map, name))
            continue;
        const zt_tensor_info *t = zt_model_find_tensor(m, name);
        /* Only a stage with the head reads the tie (a first stage of an untied model does not
         * hold the head the file's tensor is). */
        bool is_tied = !t && map->tied && strcmp(name, map->tied) == 0 && m->stage.head;
        if (!t && !is_tied && !whole)
            continue; /* another pipeline stage's tensor */
        if (!t && !is_tied) {
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is not a parameter of this %s model",
                         ref->file->path, st->name, m->spec.type);
        } else if (is_tied ? tied.tensor != NULL : src[t - m->tensors].tensor != NULL) {
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' appears twice (with and without the "
                         "'%s' prefix)", ref->file->path, name,
                         map->strip_prefix ? map->strip_prefix : "");
        } else if (is_tied) {
            tied = *ref;
        } else {
            s = load_tensor(m, ref->file, st, t);
            src[t - m->tensors] = *ref;
        }
    }
    for (int i = 0; i < m->n_tensors && s == ZT_OK; i++) {
        if (!src[i].tensor)
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is missing", set.path,
                         m->tensors[i].name);
    }
    /* A stage without the tensor the head is tied to cannot compare them; the stage that holds
     * it does. */
    if (s == ZT_OK && tied.tensor && zt_model_find_tensor(m, map->tied_to))
        s = check_tied(m, &tied, src);
    free(src);
    zt_st_set_close(&set);
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

/* The metadata: the format, the type, then the architecture fields of the family's table, which
 * is what a reader needs to rebuild the model. */
int zt_model_st_metadata_of(const zt_model_spec *spec, zt_model_st_metadata *out) {
    const zt_model_family *fam = zt_model_family_find(spec->type);
    ZT_ASSERT(fam);
    out->keys[0] = "format";
    out->values[0] = "pt";
    out->keys[1] = "model_type";
    out->values[1] = spec->type;
    int n = 2;
    for (const zt_model_field *fld = fam->fields; fld->key; fld++) {
        if (fld->kind == ZT_FIELD_PATH)
            continue;
        ZT_ASSERT(n < ZT_MODEL_MAX_FIELDS + 2);
        zt_model_field_format(fld, spec, out->text[n - 2], sizeof out->text[n - 2]);
        out->keys[n] = fld->key;
        out->values[n] = out->text[n - 2];
        n++;
    }
    return n;
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
    zt_model_st_metadata meta;
    int n = zt_model_st_metadata_of(&m->spec, &meta);
    const char *const *keys = meta.keys, *const *values = meta.values;
    zt_status s = zt_st_write_sources(path, e, src, m->n_tensors, keys, values, n);
    free(e);
    free(src);
    free(readers);
    return s;
}
