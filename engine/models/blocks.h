/* A model's transformer blocks run as a pipeline stage (internal to libztrain): the activation sets
 * of a stage's micro-batches, activation checkpointing, and the forward and backward over the
 * blocks, which every family shares. A family supplies its per-block computations (zt_block_ops)
 * and carves its own backward scratch; which activations are kept, where, and when they are
 * recomputed is decided here only.
 *
 * Without checkpointing each activation set (buffer) holds every block's saved activations and
 * the stage's input. With checkpoint interval k the blocks form groups of k (the last may be
 * shorter); a set keeps only each group's input (in device memory, or pinned host memory with
 * `cpu`), and k blocks' worth of activations are shared by all sets: the backward of a group first
 * recomputes its forward from the kept input, with the same ops on the same inputs, so the
 * results are bit-identical to keeping everything. */
#ifndef ZTRAIN_MODELS_BLOCKS_H
#define ZTRAIN_MODELS_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include "carve.h"
#include "tp_layers.h"
#include "ztrain/model.h"

/* The final norm and LM head's saved activations, one set per buffer on a stage with the head. */
typedef struct {
    void *lnf;                  /* [B,T,C] the final norm's output */
    float *lnf_mean, *lnf_rstd; /* [B,T]; lnf_mean NULL for an RMSNorm */
    void *logits;               /* [B,T,V], the gradient in place after a training forward */
    float *losses;              /* [B,T] */
} zt_head_acts;

/* What the blocks' activations are carved for. */
typedef struct {
    uint64_t B, T, C, V; /* at most B sequences of T tokens, width C, vocabulary V */
    uint64_t es;         /* bytes per activation element (statistics are fp32) */
    uint64_t layers;     /* the stage's blocks */
    uint64_t buffers;    /* activation sets */
    uint64_t interval;   /* checkpoint interval k; 0: no checkpointing */
    bool cpu;            /* kept group inputs in pinned host memory */
    bool head;           /* the stage holds the final norm and head */
    bool norm_mean;      /* the final norm keeps a mean (LayerNorm) besides its rstd */
    bool attn_lse;       /* attention keeps row statistics, not T×T (zt_backend.attn_lse) */
} zt_blocks_shape;

typedef struct {
    size_t acts_size; /* bytes of the family's per-block activation struct */
    /* Carves one block's saved activations into acts (with c->base NULL: counts only). */
    void (*carve)(zt_carver *c, const void *dims, void *acts);
    /* Block l's forward from the residual `in`, saving what its backward needs into acts;
     * returns its output (which lives in acts). */
    const void *(*forward)(zt_model *m, void *acts, const void *in, int l, int B, int T);
    /* The output the last forward into acts returned. */
    const void *(*output)(const void *acts);
    /* Block l's backward: the blocks' dres holds the gradient of its output on entry and of its
     * input `in` on return; parameter gradients accumulate. */
    void (*backward)(zt_model *m, void *acts, const void *in, int l, int B, int T);
    void (*embed_forward)(zt_model *m, void *out, const int32_t *tokens, int B, int T);
    /* Accumulates the embedding's gradients from dres. */
    void (*embed_backward)(zt_model *m, const int32_t *tokens, int B, int T);
    /* The final norm and the logits of `last`, the last block's output. */
    void (*head_forward)(zt_model *m, zt_head_acts *h, const void *last, int B, int T);
    /* From the logits' gradient (in place in h->logits): accumulates the head's and the final
     * norm's gradients and overwrites dres with the gradient of `last`. */
    void (*head_backward)(zt_model *m, zt_head_acts *h, const void *last, int B, int T);
} zt_block_ops;

typedef struct zt_blocks {
    const zt_block_ops *ops;
    zt_blocks_shape shape;
    uint64_t groups;         /* checkpoint groups (1 without checkpointing) */
    unsigned char *acts;     /* per-block activation structs: slots of ops->acts_size */
    uint64_t slots;          /* buffers · layers, or min(k, layers) with checkpointing */
    void **inputs;           /* [buffers · groups] each group's input, [B,T,C] */
    void *work_in;           /* with cpu: the device copy of the group input in use */
    zt_head_acts *head;      /* [buffers] with the head */
    void *dres;              /* [B,T,C] the backward's running gradient of the residual stream */
    unsigned char *pinned;   /* the host memory of the kept inputs with cpu, pinned_bytes */
    size_t pinned_bytes;
    unsigned char *act_memory; /* device memory of act_bytes, carved into the buffers */
    size_t act_bytes;
    /* Per buffer: the shape of its forward, its tokens (first stage) and whether it awaits a
     * backward. */
    int *B, *T;
    bool *has_grad;
    /* The model's gradients, which start released (zt_model_alloc_flat), were committed whole by
     * a backward without ZeRO's hooks. */
    bool grads_live;
    int32_t *tokens;         /* [buffers · B · T] host */
    float *host_losses;      /* [B·T] host */
    /* Tensor parallelism: the vocabulary-parallel loss's buffers (zt_blocks_init_tp) and the
     * embedding's local token ids [B·T] host. */
    zt_tp_xent xent;
    int32_t *tp_tokens;
} zt_blocks;

/* The checkpoint interval and placement a model built from spec uses for its blocks. */
void zt_blocks_checkpointing(const zt_model_spec *spec, zt_blocks_shape *s);

/* Carves the blocks' buffers: the device ones from dev, the pinned host ones (cpu) from host.
 * With k NULL (and the carvers' bases NULL) only counts, walking one block and multiplying. */
void zt_blocks_carve(zt_blocks *k, const zt_blocks_shape *s, const zt_block_ops *ops,
                     const void *dims, zt_carver *dev, zt_carver *host);

/* Takes the host tables (and records the shape and ops) before the carving pass that lays out
 * the buffers; zt_blocks_free releases them and the pinned memory. */
zt_status zt_blocks_init(zt_blocks *k, const zt_blocks_shape *s, const zt_block_ops *ops,
                         const char *type);
void zt_blocks_free(zt_blocks *k, zt_backend *be);

/* With tensor parallelism (m->stage.tp_size > 1), after zt_blocks_init: the buffers of the
 * vocabulary-parallel loss. Nothing without. */
zt_status zt_blocks_init_tp(zt_blocks *k, zt_model *m);

/* ---- a model family built on the blocks (GPT-2, the Llama family) ----------------------------
 * Its create sets the base fields (zt_blocks_model_setup), counts its buffers with a carving
 * pass over NULL bases, takes its tables (zt_blocks_init, zt_blocks_init_tp, its tensor table and
 * views), lays out its tensors, allocates (zt_blocks_model_alloc) and carves again over the
 * memory; its destroy frees its own tables and then calls zt_blocks_model_free. */

/* m's fields every block model sets alike; m->blocks = k. */
void zt_blocks_model_setup(zt_model *m, const zt_model_ops *ops, zt_blocks *k,
                           const zt_model_spec *spec, zt_backend *be, zt_dtype act,
                           int max_batch, const zt_model_stage *stage);

/* The memory of a laid-out model: its flat buffers (zt_model_alloc_flat, padded to pad_to), the
 * pinned host memory of the kept inputs (`pinned` bytes, from the counting pass; with
 * cpu_checkpointing) and act_bytes of device memory for the activations (k->act_memory), zeroed
 * now so that a micro-batch that does not fit fails at creation rather than in the first
 * forward. ZT_ERR_NOMEM naming the model type and the sizes; what was taken is freed by
 * zt_blocks_model_free. */
zt_status zt_blocks_model_alloc(zt_model *m, size_t pad_to, size_t pinned, size_t act_bytes);

/* Frees what zt_blocks_model_setup's model took in common: the flat buffers, the tensor table
 * and the blocks (their tables, pinned and device memory). Not m itself. */
void zt_blocks_model_free(zt_model *m);

/* The stage_forward and stage_backward ops (ztrain/model.h) over the blocks of m->stage. */
float zt_blocks_forward(zt_model *m, zt_blocks *k, int buffer, const int32_t *tokens,
                        const void *in_act, const int32_t *targets, void *out_act, int B, int T,
                        float grad_scale);
void zt_blocks_backward(zt_model *m, zt_blocks *k, int buffer, const void *dout, void *din);

/* The zt_model_ops entries of a family whose model runs m->blocks: stage_forward and
 * stage_backward as above, forward and backward as the one stage of a whole model (buffer 0),
 * and logits of buffer 0's head. */
float zt_blocks_model_stage_forward(zt_model *m, int buffer, const int32_t *tokens,
                                    const void *in_act, const int32_t *targets, void *out_act,
                                    int B, int T, float grad_scale);
void zt_blocks_model_stage_backward(zt_model *m, int buffer, const void *dout, void *din);
float zt_blocks_model_forward(zt_model *m, const int32_t *inputs, const int32_t *targets, int B,
                              int T, float grad_scale);
void zt_blocks_model_backward(zt_model *m);
void zt_blocks_model_logits(const zt_model *m, size_t row, size_t rows, float *dst);

/* Initialises a model's (or stage's) tensors as the whole model's would be: drawn in the whole
 * model's order (`full`, n_full entries) from one normal stream, each tensor the model holds
 * written (a TP shard takes its slice of the whole tensor's draws), the others' draws skipped; std(name) > 0 draws normal(0, std), 0 writes zeros and a
 * negative value ones. */
zt_status zt_blocks_init_weights(zt_model *m, uint64_t seed, const zt_tensor_info *full,
                                 int n_full, double (*std)(const zt_model *m, const char *name));

/* Appends a tensor to a table at *offset elements (advanced by its size). */
void zt_blocks_add_tensor(zt_tensor_info *table, int *n, const char *name, size_t *offset,
                          int ndim, int64_t d0, int64_t d1, int layer);

/* How a tensor of the whole model is cut for tensor parallelism (zt_tensor_info's tp_ fields). */
typedef struct {
    int dim;    /* -1: whole */
    int groups; /* equal groups along dim (GPT-2's packed q|k|v: 3) */
    int pieces; /* equal pieces per group */
    int piece;  /* the one this rank holds */
    int shared; /* TP ranks holding the same piece */
} zt_tp_split;

/* The whole tensor on every TP rank of st (replicated), and piece tp_rank of tp_size along dim
 * in each of `groups` groups (a proper split). */
zt_tp_split zt_tp_whole(const zt_model_stage *st);
zt_tp_split zt_tp_even(const zt_model_stage *st, int dim, int groups);

/* zt_blocks_add_tensor for a tensor of whole shape [d0, d1] cut by `split`: the table holds the
 * shard's shape and size, and the whole shape in full_shape. */
void zt_blocks_add_shard(zt_tensor_info *table, int *n, const char *name, size_t *offset,
                         int ndim, int64_t d0, int64_t d1, int layer, zt_tp_split split);

#endif
