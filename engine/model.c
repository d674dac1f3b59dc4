/* Architecture dispatch and the weight formats every architecture shares (safetensors with
 * Hugging Face names). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ztrain/model.h"
#include "ztrain/safetensors.h"

zt_status zt_model_create(zt_model **out, const zt_model_spec *spec, const zt_kernels *k,
                          int max_batch, size_t pad_to) {
    if (strcmp(spec->type, "gpt2") == 0)
        return zt_gpt2_create(out, spec, k, max_batch, pad_to ? pad_to : 1);
    return zt_error(ZT_ERR_INVALID, "model.type '%s' is not known (available: gpt2)", spec->type);
}

static float *map_floats(size_t n) {
    void *p = mmap(NULL, (n ? n : 1) * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

zt_status zt_model_alloc_flat(zt_model *m, size_t pad_to) {
    m->n_padded = (m->n_params + pad_to - 1) / pad_to * pad_to;
    m->params = map_floats(m->n_padded);
    m->grads = map_floats(m->n_padded);
    if (!m->params || !m->grads)
        return zt_error(ZT_ERR_NOMEM, "%s: cannot map %zu parameters", m->spec.type, m->n_padded);
    return ZT_OK;
}

void zt_model_free_flat(zt_model *m) {
    size_t bytes = (m->n_padded ? m->n_padded : 1) * sizeof(float);
    if (m->params)
        munmap(m->params, bytes);
    if (m->grads)
        munmap(m->grads, bytes);
    m->params = m->grads = NULL;
}

/* Byte-level versions: x is page-aligned, [lo, hi) are byte offsets. */
static void release_bytes(unsigned char *x, size_t lo, size_t hi) {
    if (hi <= lo)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t first = (lo + page - 1) / page * page, last = hi / page * page;
    if (first >= last) {
        memset(x + lo, 0, hi - lo);
        return;
    }
    memset(x + lo, 0, first - lo);
    memset(x + last, 0, hi - last);
    madvise(x + first, last - first, MADV_DONTNEED);
}

static size_t resident_bytes(const unsigned char *x, size_t lo, size_t hi) {
    if (hi <= lo)
        return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t first = lo / page * page, pages = (hi - first + page - 1) / page;
    unsigned char vec[4096];
    size_t bytes = 0;
    for (size_t p0 = 0; p0 < pages; p0 += sizeof vec) {
        size_t np = pages - p0 < sizeof vec ? pages - p0 : sizeof vec;
        if (mincore((void *)(x + first + p0 * page), np * page, vec) != 0)
            return 0;
        for (size_t i = 0; i < np; i++) {
            if (!(vec[i] & 1))
                continue;
            /* Count only the part of a resident page that lies inside [lo, hi). */
            size_t a = first + (p0 + i) * page, b = a + page;
            a = a < lo ? lo : a;
            b = b > hi ? hi : b;
            bytes += b - a;
        }
    }
    return bytes;
}

void zt_flat_release(float *x, size_t lo, size_t hi) {
    release_bytes((unsigned char *)x, lo * sizeof(float), hi * sizeof(float));
}

size_t zt_flat_resident_bytes(const float *x, size_t lo, size_t hi) {
    return resident_bytes((const unsigned char *)x, lo * sizeof(float), hi * sizeof(float));
}

void zt_half_release(uint16_t *x, size_t lo, size_t hi) {
    release_bytes((unsigned char *)x, lo * 2, hi * 2);
}

size_t zt_half_resident_bytes(const uint16_t *x, size_t lo, size_t hi) {
    return resident_bytes((const unsigned char *)x, lo * 2, hi * 2);
}

uint16_t *zt_half_map(size_t n) {
    void *p = mmap(NULL, (n ? n : 1) * 2, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void zt_half_unmap(uint16_t *x, size_t n) {
    if (x)
        munmap(x, (n ? n : 1) * 2);
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
    float *tmp = malloc(wte->numel * sizeof(float));
    if (!tmp)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    zt_status s = zt_st_read_f32(f, head, tmp, wte->numel);
    if (s == ZT_OK && memcmp(tmp, m->params + wte->offset, wte->numel * sizeof(float)) != 0)
        s = zt_error(ZT_ERR_FORMAT,
                     "%s: lm_head.weight differs from wte.weight, but GPT-2 here ties the LM head "
                     "to the token embedding",
                     path);
    free(tmp);
    return s;
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
    if (s == ZT_OK)
        s = check_tied_head(m, &f, path);
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
