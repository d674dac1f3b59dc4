/* Loading Hugging Face safetensors into a model through its family's name map
 * (zt_model_load_safetensors with GPT-2's zt_hf_map): the "transformer." prefix dropped, the
 * attention-mask buffers skipped, a tied lm_head.weight compared with wte.weight (in the same
 * dtype and in another one), a longer wpe.weight cropped to block_size, and one refusal per
 * defect with its message. The files are built here by a small writer of this test's own (F32
 * and BF16), and the loaded parameters are checked against the values written. */
#define _XOPEN_SOURCE 700 /* mkdtemp and realpath, for check.h; before any header */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/model.h"

enum { L = 1, NH = 2, C = 4, V = 5, T = 3, MAX_T = 64 };

/* One tensor of a file to write: F32, or BF16 when bf16 is set (values must be exact in BF16). */
typedef struct {
    char name[96];
    bool bf16;
    int ndim;
    int64_t shape[4];
    float *data;
} file_tensor;

typedef struct {
    file_tensor t[MAX_T];
    int n;
} file_spec;

static size_t numel(const file_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

/* Writes the safetensors layout: 8-byte little-endian header length, JSON header, data. */
static void write_st(const char *path, const file_spec *fs) {
    char header[16384];
    size_t used = (size_t)snprintf(header, sizeof header, "{");
    size_t off = 0;
    for (int i = 0; i < fs->n; i++) {
        const file_tensor *t = &fs->t[i];
        size_t bytes = numel(t) * (t->bf16 ? 2 : 4);
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name,
                                 t->bf16 ? "BF16" : "F32");
        for (int d = 0; d < t->ndim; d++)
            used += (size_t)snprintf(header + used, sizeof header - used, "%s%lld", d ? "," : "",
                                     (long long)t->shape[d]);
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    ZT_ASSERT(used < sizeof header);
    unsigned char *buf = malloc(8 + used + off);
    uint64_t hl = used;
    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)(hl >> (8 * b));
    memcpy(buf + 8, header, used);
    unsigned char *p = buf + 8 + used;
    for (int i = 0; i < fs->n; i++) {
        const file_tensor *t = &fs->t[i];
        for (size_t j = 0; j < numel(t); j++) {
            uint32_t bits;
            memcpy(&bits, &t->data[j], 4);
            if (t->bf16) {
                ZT_ASSERT((bits & 0xffff) == 0);
                *p++ = (unsigned char)(bits >> 16);
                *p++ = (unsigned char)(bits >> 24);
            } else {
                for (int b = 0; b < 4; b++)
                    *p++ = (unsigned char)(bits >> (8 * b));
            }
        }
    }
    check_write_file(path, buf, 8 + used + off);
    free(buf);
}

/* Values that BF16 holds exactly (multiples of 1/8 in [-4, 4)), different from tensor to tensor
 * and along each tensor. */
static float value(int tensor, size_t j) { return (float)((tensor * 31 + (int)j * 7) % 64) / 8.0f - 4.0f; }

static file_tensor *add(file_spec *fs, const char *name, int ndim, int64_t d0, int64_t d1,
                        int seed) {
    ZT_ASSERT(fs->n < MAX_T);
    file_tensor *t = &fs->t[fs->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->bf16 = false;
    t->ndim = ndim;
    /* Dimensions past the second are the caller's to set; until then they count as 1. */
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = t->shape[3] = 1;
    t->data = malloc((numel(t) ? numel(t) : 1) * sizeof(float));
    for (size_t j = 0; j < numel(t); j++)
        t->data[j] = value(seed, j);
    return t;
}

static file_tensor *find(file_spec *fs, const char *name) {
    for (int i = 0; i < fs->n; i++)
        if (strcmp(fs->t[i].name, name) == 0)
            return &fs->t[i];
    return NULL;
}

static void drop(file_spec *fs, const char *name) {
    file_tensor *t = find(fs, name);
    ZT_ASSERT(t);
    free(t->data);
    *t = fs->t[--fs->n];
}

static void release(file_spec *fs) {
    for (int i = 0; i < fs->n; i++)
        free(fs->t[i].data);
    fs->n = 0;
}

/* A file holding every parameter of m (each with value(i, .) for its index i), named with
 * `prefix`, plus Hugging Face's mask buffers for every layer. */
static void hf_file(file_spec *fs, const zt_model *m, const char *prefix) {
    fs->n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        add(fs, name, t->ndim, t->shape[0], t->shape[1], i);
    }
    for (int l = 0; l < L; l++) {
        char name[96];
        snprintf(name, sizeof name, "%sh.%d.attn.bias", prefix, l);
        file_tensor *b = add(fs, name, 4, 1, 1, 0);
        b->shape[2] = b->shape[3] = T;
        free(b->data);
        b->data = calloc(T * T, sizeof(float));
        snprintf(name, sizeof name, "%sh.%d.attn.masked_bias", prefix, l);
        add(fs, name, 0, 0, 0, 0);
    }
}

/* Every parameter holds what hf_file wrote for it (wpe: its first T rows). */
static void check_loaded(const zt_model *m, const char *what) {
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        size_t bad = t->numel;
        for (size_t j = 0; j < t->numel && bad == t->numel; j++)
            if (m->params[t->offset + j] != value(i, j))
                bad = j;
        CHECK(bad == t->numel, "%s: %s[%zu] is %g, want %g", what, t->name, bad,
              bad < t->numel ? m->params[t->offset + bad] : 0.0, value(i, bad));
    }
}

/* The CPU backend, whose device memory the test reads directly. */
static zt_backend *cpu_backend(void) {
    static zt_backend *be;
    if (!be && zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        fprintf(stderr, "cannot create the CPU backend: %s\n", zt_last_error());
        exit(2);
    }
    return be;
}

static zt_model *new_model(void) {
    zt_model_spec spec = {.type = "gpt2", .n_layer = L, .n_head = NH, .n_embd = C,
                          .vocab_size = V, .block_size = T};
    zt_model *m = NULL;
    zt_status s = zt_model_create(&m, &spec, cpu_backend(), ZT_F32, 1, 1);
    if (s != ZT_OK) {
        fprintf(stderr, "cannot create the model: %s\n", zt_last_error());
        exit(2);
    }
    return m;
}

static void test_loads(void) {
    zt_model *m = new_model();
    const char *path = check_tmp_path("hf.safetensors");
    file_spec fs;

    /* Prefixed names, mask buffers, a 2-row-longer position table and a tied head in BF16
     * beside an F32 wte (compared once both are read as fp32). */
    hf_file(&fs, m, "transformer.");
    file_tensor *wpe = find(&fs, "transformer.wpe.weight");
    free(wpe->data);
    wpe->shape[0] = T + 2;
    wpe->data = malloc((T + 2) * C * sizeof(float));
    int wpe_index = (int)(zt_model_find_tensor(m, "wpe.weight") - m->tensors);
    for (size_t j = 0; j < (T + 2) * C; j++)
        wpe->data[j] = j < T * C ? value(wpe_index, j) : 99.0f;
    int wte_index = (int)(zt_model_find_tensor(m, "wte.weight") - m->tensors);
    file_tensor *head = add(&fs, "lm_head.weight", 2, V, C, wte_index);
    head->bf16 = true;
    write_st(path, &fs);
    zt_status s = zt_model_load_safetensors(m, path);
    CHECK(s == ZT_OK, "prefixed HF file: %s", zt_last_error());
    check_loaded(m, "prefixed HF file");
    release(&fs);

    /* Plain names, no buffers, a tied head of the same dtype (compared as bytes). */
    memset(m->params, 0, m->n_params * sizeof(float));
    hf_file(&fs, m, "");
    drop(&fs, "h.0.attn.bias");
    drop(&fs, "h.0.attn.masked_bias");
    add(&fs, "lm_head.weight", 2, V, C, wte_index);
    write_st(path, &fs);
    s = zt_model_load_safetensors(m, path);
    CHECK(s == ZT_OK, "plain file: %s", zt_last_error());
    check_loaded(m, "plain file");
    release(&fs);
    zt_model_destroy(m);
}

/* Loading the file built by `change` must fail with exactly "<path>: <msg>". */
static void refused_at(int line, const char *what, void (*change)(file_spec *, const zt_model *),
                       const char *msg) {
    zt_model *m = new_model();
    file_spec fs;
    hf_file(&fs, m, "transformer.");
    change(&fs, m);
    const char *path = check_tmp_path("bad.safetensors");
    write_st(path, &fs);
    release(&fs);
    char want[4096];
    snprintf(want, sizeof want, "%s: %s", path, msg);
    check_error_is(__FILE__, line, "file", what, zt_model_load_safetensors(m, path),
                   ZT_ERR_FORMAT, want, false);
    zt_model_destroy(m);
}
#define REFUSED(change, msg) refused_at(__LINE__, #change, change, msg)

static int index_of(const zt_model *m, const char *name) {
    return (int)(zt_model_find_tensor(m, name) - m->tensors);
}

static void head_differs(file_spec *fs, const zt_model *m) {
    file_tensor *h = add(fs, "lm_head.weight", 2, V, C, index_of(m, "wte.weight"));
    h->data[7] += 0.5f;
}

static void head_differs_bf16(file_spec *fs, const zt_model *m) {
    head_differs(fs, m);
    fs->t[fs->n - 1].bf16 = true;
}

static void head_shape(file_spec *fs, const zt_model *m) {
    add(fs, "lm_head.weight", 2, V + 1, C, index_of(m, "wte.weight"));
}

static void unknown(file_spec *fs, const zt_model *m) {
    add(fs, "transformer.h.0.attn.rotary.inv_freq", 1, 2, 0, 0);
}

static void missing(file_spec *fs, const zt_model *m) { drop(fs, "transformer.ln_f.bias"); }

static void transposed(file_spec *fs, const zt_model *m) {
    file_tensor *t = find(fs, "transformer.h.0.attn.c_attn.weight");
    int64_t d0 = t->shape[0];
    t->shape[0] = t->shape[1];
    t->shape[1] = d0;
}

static void wpe_short(file_spec *fs, const zt_model *m) {
    find(fs, "transformer.wpe.weight")->shape[0] = T - 1;
}

/* Only wpe may be longer: a longer wte is not cropped. */
static void wte_long(file_spec *fs, const zt_model *m) {
    file_tensor *t = find(fs, "transformer.wte.weight");
    free(t->data);
    t->shape[0] = V + 1;
    t->data = calloc((V + 1) * C, sizeof(float));
}

static void twice(file_spec *fs, const zt_model *m) { add(fs, "wte.weight", 2, V, C, 3); }

static void test_refusals(void) {
    REFUSED(head_differs, "lm_head.weight differs from wte.weight, but GPT-2 here ties them (the "
                          "model has only wte.weight)");
    REFUSED(head_differs_bf16, "lm_head.weight differs from wte.weight, but GPT-2 here ties them "
                               "(the model has only wte.weight)");
    REFUSED(head_shape, "lm_head.weight does not have wte.weight's shape");
    REFUSED(unknown, "tensor 'transformer.h.0.attn.rotary.inv_freq' is not a parameter of this "
                     "gpt2 model");
    REFUSED(missing, "tensor 'ln_f.bias' is missing");
    REFUSED(transposed, "tensor 'transformer.h.0.attn.c_attn.weight' has shape [12, 4] but the "
                        "model needs [4, 12]");
    REFUSED(wpe_short, "tensor 'transformer.wpe.weight' has shape [2, 4] but the model needs [3, 4]");
    REFUSED(wte_long, "tensor 'transformer.wte.weight' has shape [6, 4] but the model needs [5, 4]");
    REFUSED(twice, "tensor 'wte.weight' appears twice (with and without the 'transformer.' prefix)");
}

int main(void) {
    check_tmpdir_create("zt_model_hf");
    test_loads();
    test_refusals();
    check_tmpdir_remove();
    return check_summary("test_model_hf");
}
