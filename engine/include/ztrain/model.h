/* The model interface: one implementation per architecture under engine/models/.
 *
 * A model owns one flat fp32 buffer of parameters and one of gradients in its backend's device
 * memory; its tensors are views at fixed offsets, listed in `tensors` with their Hugging Face names
 * and shapes, so checkpoints, safetensors import/export and ZeRO partitions are plain offset
 * arithmetic. Activations are sized at creation for at most max_batch sequences of block_size
 * tokens; nothing is allocated after. Model code reaches that memory only through the backend
 * (backend.h) and computes only through its op table (ops.h). */
#ifndef ZTRAIN_MODEL_H
#define ZTRAIN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/job_spec.h"
#include "ztrain/backend.h"
#include "ztrain/status.h"

typedef struct {
    char name[64];     /* Hugging Face name, e.g. "h.0.attn.c_attn.weight" */
    size_t offset;     /* in elements, into params and grads */
    size_t numel;
    int ndim;
    int64_t shape[2];
    int layer;         /* transformer block index, or -1 for embeddings and the final norm */
} zt_tensor_info;

typedef struct zt_model zt_model;

/* Called by the model around its use of parameters and as gradients become final, so ZeRO can
 * gather partitioned parameters just in time (stage 3) and reduce gradients while the backward
 * runs (stages 2 and 3). `layer` is a transformer block, or -1 for the outer tensors (embeddings
 * and final norm), which stay fetched from the start of a forward to the end of its backward (or
 * of the forward, without gradients). Every callback may be NULL. */
typedef struct {
    void *ctx;
    /* `backward`: the pass runs from the last layer to the first (so the next one to prefetch
     * is layer - 1 rather than layer + 1). */
    void (*fetch)(void *ctx, int layer, bool backward);
    void (*release)(void *ctx, int layer);
    void (*grads_ready)(void *ctx, int layer);
} zt_model_hooks;

typedef struct {
    /* Initialises the weights from a seed, as the architecture's reference does (GPT-2: normal
     * std 0.02, residual projections scaled by 1/sqrt(2 n_layer), zero biases, unit norms). */
    zt_status (*init_weights)(zt_model *m, uint64_t seed);
    /* Runs the forward over B ≤ max_batch sequences of T ≤ block_size tokens. With targets,
     * returns the mean cross-entropy over targets ≥ 0 and, when grad_scale != 0, prepares the
     * backward of grad_scale · Σ losses (the caller passes 1/(tokens · accumulation steps)).
     * Without targets it returns 0 and leaves the logits readable through logits(). */
    float (*forward)(zt_model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float grad_scale);
    /* Accumulates the parameter gradients of the last forward into m->grads. */
    void (*backward)(zt_model *m);
    /* Copies rows [row, row + rows) of the logits [B·T, vocab] of the last forward without
     * targets into host memory dst[rows · vocab]. */
    void (*logits)(const zt_model *m, size_t row, size_t rows, float *dst);
    /* Forward+backward FLOPs per token, the figure TFLOPS metrics use. */
    double (*flops_per_token)(const zt_model *m);
    void (*destroy)(zt_model *m);
} zt_model_ops;

struct zt_model {
    const zt_model_ops *ops;
    /* The backend the model computes on, and the precision its activations are held at: in mixed
     * precision activations and their gradients are held at 16 bits (ops.h says how the CPU does
     * it); ZT_F32 otherwise. The caller may change ctx.act before the first forward. */
    zt_ctx ctx;
    zt_model_spec spec;   /* a copy; spec.init_from is not owned */
    int max_batch;
    int n_layer;
    size_t n_params;
    size_t n_padded;      /* n_params rounded up to the pad_to given at creation */
    float *params;        /* [n_padded] device memory, owned; the padding is 0 */
    float *grads;         /* [n_padded], likewise */
    zt_model_hooks hooks;
    int n_tensors;
    zt_tensor_info *tensors;
};

/* Creates the model that spec->type names on backend be (which must outlive it), with zeroed
 * parameters and gradients whose flat buffers are padded to a multiple of pad_to elements (ZeRO
 * splits them into equal slices). Ranges a rank does not hold can be released through the backend
 * (zt_backend_release) and read as zeros afterwards. */
zt_status zt_model_create(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                          int max_batch, size_t pad_to);
void zt_model_destroy(zt_model *m);

/* The tensor with this Hugging Face name, or NULL. */
const zt_tensor_info *zt_model_find_tensor(const zt_model *m, const char *name);

/* Loads weights from a safetensors file with Hugging Face GPT-2 names and layouts. Accepts an
 * optional "transformer." prefix and ignores tensors that are not parameters (attention mask
 * buffers, the tied lm_head). A missing tensor, a shape mismatch or an unexpected tensor is an
 * error naming the file, the tensor, and both shapes. */
zt_status zt_model_load_safetensors(zt_model *m, const char *path);

/* Writes the parameters as fp32 safetensors with Hugging Face GPT-2 names and layouts, with the
 * model dimensions in the metadata. */
zt_status zt_model_save_safetensors(const zt_model *m, const char *path);

/* Architecture constructors (engine/models/<arch>.c). */
zt_status zt_gpt2_create(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                         int max_batch, size_t pad_to);

/* For architectures: allocates m->params and m->grads in device memory for m->n_params rounded
 * up to pad_to (m->ctx.be must be set), and frees them. */
zt_status zt_model_alloc_flat(zt_model *m, size_t pad_to);
void zt_model_free_flat(zt_model *m);

/* For architectures: copies n host floats into the parameters at element offset `at`. */
void zt_model_set_params(zt_model *m, size_t at, const float *src, size_t n);

#endif
