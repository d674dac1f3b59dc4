/* The Llama family's shared pieces (internal to libztrain): the dimensions a spec resolves to and
 * the layout of the parameters and activations (llama_shape.c), which both the model (llama.c)
 * and the family's estimate (llama_family.c) walk, and the rotary tables (llama_rope.c). */
#ifndef ZTRAIN_MODELS_LLAMA_H
#define ZTRAIN_MODELS_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "blocks.h"
#include "ztrain/model.h"

/* Per-layer tensors in flat-buffer order. q, k and v weights are adjacent, so together they are
 * one [(n_head + 2·n_kv_head)·head_dim, n_embd] linear whose output is the packed q | k | v the
 * attention op reads; their biases are adjacent for the same reason. */
enum {
    LLAMA_IN_NORM, LLAMA_Q_W, LLAMA_K_W, LLAMA_V_W, LLAMA_Q_B, LLAMA_K_B, LLAMA_V_B, LLAMA_O_W,
    LLAMA_O_B, LLAMA_POST_NORM, LLAMA_GATE_W, LLAMA_UP_W, LLAMA_DOWN_W, LLAMA_N_LAYER_TENSORS
};

/* A spec's dimensions once its defaults are resolved, all in 64 bits so that sizes computed from
 * them cannot wrap unnoticed. */
typedef struct {
    uint64_t L, C, NH, KV, HD, I, V, T; /* T: block_size */
    uint64_t Q, KVD, QKV;               /* n_head·head_dim, n_kv_head·head_dim, Q + 2·KVD */
    bool qkv_bias, o_bias, tied;
} llama_dims;

llama_dims zt_llama_dims(const zt_model_spec *s);

/* The dimensions of a tensor-parallel shard of tp ranks: its heads, kv heads, MLP width and
 * vocabulary rows are the whole model's over tp (the width C and head_dim stay), but for kv heads
 * fewer than tp, of which it holds one (shared with tp / n_kv_head ranks, Megatron's replicated
 * kv heads). d itself for tp 1. */
llama_dims zt_llama_shard_dims(const llama_dims *d, int tp);

/* Elements of layer tensor i (0 for a bias the spec does not have) and its shape. */
uint64_t zt_llama_layer_numel(const llama_dims *d, int i);
/* The tensor's Hugging Face name suffix after "model.layers.N.". */
extern const char *const zt_llama_layer_names[LLAMA_N_LAYER_TENSORS];
/* 1-D tensors (norms and biases) are shape[0] only; matrices are [out, in]. */
int zt_llama_layer_shape(const llama_dims *d, int i, int64_t shape[2]);

/* Activations saved by the forward for the backward, per layer. `void *` ones are activations,
 * stored as the backend stores them (zt_backend_act_size); `float *` ones are fp32 (ops.h). */
typedef struct {
    void *ln1;         /* [B,T,C] input_layernorm's output */
    float *ln1_rstd;   /* [B,T] */
    void *qkv;         /* [B,T,QKV] q | k | v, q and k rotated in place */
    void *atty;        /* [B,T,Q] attention output before o_proj */
    float *att;        /* [B,NH,T,T] softmax probabilities */
    void *res2;        /* [B,T,C] residual after attention */
    void *ln2;         /* [B,T,C] post_attention_layernorm's output */
    float *ln2_rstd;   /* [B,T] */
    void *gate, *up;   /* [B,T,I] the two projections of the MLP's input */
    void *hmul;        /* [B,T,I] silu(gate)·up */
    void *res3;        /* [B,T,C] residual after the MLP (the layer's output) */
} llama_layer_acts;

/* The buffers outside the blocks (blocks.h keeps the stage's inputs, the head's activations and
 * dres): the rotary tables and the backward's scratch shared by all blocks. */
typedef struct {
    float *rope_cos, *rope_sin; /* [block_size, head_dim/2] rotary tables */
    /* Backward scratch; dh, the gradient of silu(gate)·up, becomes the gate's in place. */
    void *dln, *datty, *dqkv, *dh, *dup;
    float *datt;             /* [B,NH,T,T] fp32 work space */
} llama_outer_acts;

/* What a block's activations are carved for: the dimensions, `batch` sequences of block_size
 * tokens, es bytes per activation element. */
typedef struct {
    const llama_dims *d;
    uint64_t batch, es;
    bool attn_lse; /* zt_blocks_shape.attn_lse */
} llama_carve_dims;

/* Carves one block's activations (zt_block_ops.carve). */
void zt_llama_carve_layer(zt_carver *c, const void *dims, void *acts);

/* The blocks' shape of a stage of the model for micro-batches of `batch`. */
zt_blocks_shape zt_llama_blocks_shape(const zt_model_spec *s, const zt_model_stage *st,
                                      uint64_t batch, uint64_t es);

/* The family's block computations (llama.c); their carve is zt_llama_carve_layer. */
extern const zt_block_ops zt_llama_block_ops;

/* Carves the activations of shape s out of base (and pinned host memory for cpu checkpointing),
 * filling k and o, or with k NULL only counts. The one function that both sizes and lays out the
 * activations, so the estimate is the allocation. Returns the device bytes (*pinned_bytes the
 * host ones), with *overflow set when a count passed 64 bits. */
uint64_t zt_llama_carve(const llama_dims *d, const zt_blocks_shape *s, unsigned char *base,
                        unsigned char *pinned, zt_blocks *k, llama_outer_acts *o,
                        uint64_t *pinned_bytes, bool *overflow);

/* Fills cos and sin [T, head_dim/2] (host memory) with Hugging Face's rotary tables for the
 * spec's rope_theta and rope_scaling: position t, frequency j. ZT_ERR_NOMEM when its scratch
 * cannot be had. */
zt_status zt_llama_rope_tables(const zt_model_spec *s, int head_dim, int T, float *cos_t,
                               float *sin_t);

/* The inverse frequencies [head_dim/2] after rope_scaling, as Hugging Face computes them. */
void zt_llama_rope_inv_freq(const zt_model_spec *s, int head_dim, double *inv_freq);

/* Host memory a model keeps besides its buffers, but for its tensor table: the model struct,
 * per-layer views and the per-token losses read back from a forward. */
uint64_t zt_llama_host_bytes(const llama_dims *d, uint64_t micro_batch);

/* The stage's tensor count and layout into t (returns the elements): the embedding, the blocks,
 * the final norm and, untied, lm_head; a last stage's own copy of the tied embedding last. */
int zt_llama_stage_tensors(const llama_dims *d, const zt_model_stage *st);
size_t zt_llama_lay_out(zt_tensor_info *t, int *n, const llama_dims *d, const zt_model_stage *st);
/* d holds the whole model's dimensions; a stage with tp_size > 1 lays out its shards of them. */

zt_status zt_llama_create(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                          zt_dtype act, int max_batch, size_t pad_to,
                          const zt_model_stage *stage);

#endif
