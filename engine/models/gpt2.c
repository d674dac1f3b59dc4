/* GPT-2: token + position embeddings, pre-LayerNorm blocks of causal self-attention and a
 * tanh-GELU MLP, a final LayerNorm, and an LM head tied to the token embedding.
 *
 * Tensors use Hugging Face's names and Conv1D layouts ([in, out]), one layer's tensors contiguous
 * in the flat buffer, so import/export is a copy and a layer is one slice. Every operation goes
 * through the backend's op table, and every buffer is the backend's. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc_pos.h"
#include "blocks.h"
#include "ztrain/size_math.h"
#include "ztrain/model.h"

/* Per-layer tensors in flat-buffer order. */
enum { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B,
       N_LAYER_TENSORS };

static const char *const layer_tensor_names[N_LAYER_TENSORS] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
};

typedef struct {
    float *w[N_LAYER_TENSORS];
} layer_views;

/* Activations a block saves for its backward. `void *` ones are activations, stored as the
 * backend stores them (zt_backend_act_size); `float *` ones are fp32 statistics (ops.h). */
typedef struct {
    void *ln1;
    float *ln1_mean, *ln1_rstd;
    void *qkv;                 /* [B,T,3C] */
    void *atty;                /* [B,T,C] attention output before the projection */
    float *att;                /* [B,NH,T,T] softmax probabilities */
    void *res2;                /* [B,T,C] residual after attention */
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *fch, *fch_gelu;      /* [B,T,4C] */
    void *res3;                /* [B,T,C] residual after the MLP (the block's output) */
} layer_acts;

typedef struct {
    zt_model base;
    int L, C, NH, V, maxT;     /* L: the whole model's blocks */
    /* This rank's shard (tensor parallelism; the whole model without): its heads, the width of
     * its q, k and v (NHl · head_dim), of its MLP (4C / tp) and of its vocabulary rows from v0. */
    int NHl, A, F, Vl, v0;
    bool lead;                 /* TP rank 0, which adds the row-parallel biases and residuals */
    float *wte, *wpe, *lnf_w, *lnf_b, *head; /* head: wte, or the last stage's copy of it */
    float *dwte, *dwpe, *dlnf_w, *dlnf_b, *dhead;
    layer_views *lw, *lg;      /* parameter and gradient views per block of the stage */
    size_t act_size;           /* bytes per activation element on this backend */
    zt_blocks blk;             /* activation sets, checkpointing, dres */
    /* backward scratch, reused across blocks (datt is fp32 work space) */
    void *dln, *datty, *dqkv, *dfch;
    float *datt;
    zt_doc_pos docs;           /* packed documents: positions restart at each one */
} gpt2;

/* Sizes in 64 bits: with n_embd at most INT_MAX / 4 (gpt2_validate), no single tensor can
 * overflow; sums over layers are checked in gpt2_estimate. */
static uint64_t layer_tensor_numel(int i, uint64_t C) {
    switch (i) {
    case QKV_W: return C * 3 * C;
    case QKV_B: return 3 * C;
    case PROJ_W: return C * C;
    case FC_W: return C * 4 * C;
    case FC_B: return 4 * C;
    case FCPROJ_W: return 4 * C * C;
    default: return C;
    }
}

static void layer_tensor_shape(int i, int C, int *ndim, int64_t shape[2]) {
    uint64_t n = layer_tensor_numel(i, (uint64_t)C);
    if (i == QKV_W || i == PROJ_W || i == FC_W || i == FCPROJ_W) {
        *ndim = 2;
        shape[0] = i == FCPROJ_W ? 4 * (int64_t)C : C;
        shape[1] = (int64_t)(n / (uint64_t)shape[0]);
    } else {
        *ndim = 1;
        shape[0] = (int64_t)n;
    }
}

/* Megatron's cut of a block (Conv1D layouts are [in, out]): c_attn and c_fc column-parallel
 * (their output columns split, c_attn's by head in each of q, k and v), the projections
 * row-parallel (their input rows split; their biases whole, added once after the sum), the
 * norms whole. */
static zt_tp_split layer_tensor_split(int i, const zt_model_stage *st) {
    switch (i) {
    case QKV_W: return zt_tp_even(st, 1, 3);
    case QKV_B: return zt_tp_even(st, 0, 3);
    case FC_W: return zt_tp_even(st, 1, 1);
    case FC_B: return zt_tp_even(st, 0, 1);
    case PROJ_W:
    case FCPROJ_W: return zt_tp_even(st, 0, 1);
    default: return zt_tp_whole(st);
    }
}

/* The stage's tensors in flat-buffer order: wte and wpe with the embedding, the blocks, ln_f with
 * the head, and a last stage's own copy of wte (the tied head) at the end. */
static size_t lay_out_tensors(zt_tensor_info *t, int *n, const zt_model_spec *s,
                              const zt_model_stage *st) {
    const int C = s->n_embd;
    size_t off = 0;
    *n = 0;
    const zt_tp_split whole = zt_tp_whole(st), rows = zt_tp_even(st, 0, 1);
    if (st->embed) {
        zt_blocks_add_shard(t, n, "wte.weight", &off, 2, s->vocab_size, C, -1, rows);
        zt_blocks_add_shard(t, n, "wpe.weight", &off, 2, s->block_size, C, -1, whole);
    }
    for (int l = st->first_layer; l < st->last_layer; l++) {
        for (int i = 0; i < N_LAYER_TENSORS; i++) {
            char name[64];
            int ndim;
            int64_t shape[2] = {0, 0};
            snprintf(name, sizeof name, "h.%d.%s", l, layer_tensor_names[i]);
            layer_tensor_shape(i, C, &ndim, shape);
            zt_blocks_add_shard(t, n, name, &off, ndim, shape[0], shape[1], l,
                                layer_tensor_split(i, st));
        }
    }
    if (st->head) {
        zt_blocks_add_shard(t, n, "ln_f.weight", &off, 1, C, 0, -1, whole);
        zt_blocks_add_shard(t, n, "ln_f.bias", &off, 1, C, 0, -1, whole);
        if (!st->embed) {
            zt_blocks_add_shard(t, n, "wte.weight", &off, 2, s->vocab_size, C, -1, rows);
            t[*n - 1].tied_copy = true;
        }
    }
    return off;
}

static int stage_tensors(const zt_model_stage *st) {
    return (st->last_layer - st->first_layer) * N_LAYER_TENSORS + (st->embed ? 2 : 0) +
           (st->head ? (st->embed ? 2 : 3) : 0);
}

/* What a tensor starts as: GPT-2's normal(0, 0.02), the residual projections' 0.02/sqrt(2L),
 * ones for norm weights, zeros for biases. */
static double init_std(const zt_model *m, const char *name) {
    const char *dot = strrchr(name, '.');
    if (dot && strcmp(dot, ".bias") == 0)
        return 0.0;
    if (strstr(name, "ln_"))
        return -1.0;
    if (strstr(name, "c_proj.weight"))
        return 0.02 / sqrt(2.0 * m->spec.n_layer);
    return 0.02;
}

/* Tensors are drawn in the whole model's flat-buffer order from one stream (wte, wpe, then each
 * layer's weights), so a pipeline stage starts from the same values as the whole model. */
static zt_status gpt2_init_weights(zt_model *m, uint64_t seed) {
    const zt_model_stage full = zt_model_full_stage(m->spec.n_layer);
    zt_tensor_info *t = calloc((size_t)stage_tensors(&full), sizeof *t);
    if (!t)
        return zt_error(ZT_ERR_NOMEM, "gpt2: out of memory for the initialisation's tensor table");
    int n;
    lay_out_tensors(t, &n, &m->spec, &full);
    zt_status s = zt_blocks_init_weights(m, seed ^ 0x6770743200000000ull, t, n, init_std);
    free(t);
    return s;
}

/* ---- The blocks, the embedding and the head (blocks.h calls them) ------------------------- */

static const void *block_forward(zt_model *m, void *acts, const void *residual, int l, int B,
                                 int T) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, A = g->A, F = g->F, BT = B * T;
    const zt_attn_shape attn = {B, T, g->NHl, g->NHl, C / g->NH, true, 0,
                               zt_doc_pos_dev(&g->docs)};
    layer_acts *a = acts;
    float **w = g->lw[l - m->stage.first_layer].w;
    op->layernorm_forward(x, a->ln1, a->ln1_mean, a->ln1_rstd, residual, w[LN1_W], w[LN1_B], BT,
                          C);
    op->linear_forward(x, a->qkv, a->ln1, w[QKV_W], w[QKV_B], NULL, BT, C, 3 * A, ZT_W_IN_OUT);
    op->attention_forward(x, &attn, a->atty, a->att, a->qkv, NULL, NULL);
    /* Row-parallel: each TP rank's heads give a partial sum, which the all-reduce completes;
     * the bias and the residual enter once, on the lead rank. */
    op->linear_forward(x, a->res2, a->atty, w[PROJ_W], g->lead ? w[PROJ_B] : NULL,
                       g->lead ? residual : NULL, BT, A, C, ZT_W_IN_OUT);
    zt_tp_reduce_act(m, a->res2, (size_t)BT * C);
    op->layernorm_forward(x, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[LN2_W], w[LN2_B], BT,
                          C);
    /* The GELU rides in the product's epilogue where the backend has one (cuBLASLt), which
     * keeps the pre-activation fch for the backward. */
    op->linear_gelu_forward(x, a->fch_gelu, a->fch, a->ln2, w[FC_W], w[FC_B], BT, C, F,
                            ZT_W_IN_OUT);
    op->linear_forward(x, a->res3, a->fch_gelu, w[FCPROJ_W], g->lead ? w[FCPROJ_B] : NULL,
                       g->lead ? a->res2 : NULL, BT, F, C, ZT_W_IN_OUT);
    zt_tp_reduce_act(m, a->res3, (size_t)BT * C);
    return a->res3;
}

static const void *block_output(const void *acts) { return ((const layer_acts *)acts)->res3; }

static void block_backward(zt_model *m, void *acts, const void *residual, int l, int B, int T) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, A = g->A, F = g->F, BT = B * T;
    const zt_attn_shape attn = {B, T, g->NHl, g->NHl, C / g->NH, true, 0,
                               zt_doc_pos_dev(&g->docs)};
    layer_acts *a = acts;
    float **w = g->lw[l - m->stage.first_layer].w, **dw = g->lg[l - m->stage.first_layer].w;
    void *dres = g->blk.dres;
    /* dres holds the gradient of this block's output; the MLP branch adds into it. Under TP
     * dres is whole on every rank, so the row-parallel biases' gradients agree everywhere, and
     * the column-parallel layers' input gradients are partial sums until reduced. */
    op->linear_backward_gelu(x, g->dfch, dw[FCPROJ_W], dw[FCPROJ_B], dres, a->fch_gelu, a->fch,
                             w[FCPROJ_W], BT, F, C, ZT_W_IN_OUT);
    op->linear_backward(x, g->dln, dw[FC_W], dw[FC_B], g->dfch, a->ln2, w[FC_W], BT, C, F,
                        ZT_W_IN_OUT, false);
    zt_tp_reduce_act(m, g->dln, (size_t)BT * C);
    op->layernorm_backward(x, dres, dw[LN2_W], dw[LN2_B], g->dln, a->res2, w[LN2_W], a->ln2_mean,
                           a->ln2_rstd, BT, C);
    /* dres now holds the gradient of res2; the attention branch adds into it. */
    op->linear_backward(x, g->datty, dw[PROJ_W], dw[PROJ_B], dres, a->atty, w[PROJ_W], BT, A, C,
                        ZT_W_IN_OUT, false);
    op->attention_backward(x, &attn, g->dqkv, NULL, NULL, g->datt, g->datty, a->atty, a->qkv,
                           NULL, NULL, a->att);
    op->linear_backward(x, g->dln, dw[QKV_W], dw[QKV_B], g->dqkv, a->ln1, w[QKV_W], BT, C, 3 * A,
                        ZT_W_IN_OUT, false);
    zt_tp_reduce_act(m, g->dln, (size_t)BT * C);
    op->layernorm_backward(x, dres, dw[LN1_W], dw[LN1_B], g->dln, residual, w[LN1_W],
                           a->ln1_mean, a->ln1_rstd, BT, C);
}

/* Vocabulary-parallel under TP: a rank looks up the tokens its rows hold (the others give zero
 * rows), the lead adds the positions, and the all-reduce completes every row. With packed
 * documents the learned positions are looked up by each token's position in its document, as a
 * second embedding whose "tokens" are the positions, added to the first through dln (backward
 * scratch, free during the forward); its backward accumulates into dwpe. */
static void embed_forward(zt_model *m, void *out, const int32_t *tokens, int B, int T) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    if (zt_tp_on(m)) {
        zt_tp_local_tokens(tokens, B * T, g->v0, g->Vl, false, g->blk.tp_tokens);
        tokens = g->blk.tp_tokens;
    }
    if (!g->docs.on) {
        op->embedding_forward(&m->ctx, out, tokens, g->wte, g->lead ? g->wpe : NULL, B, T, g->C);
    } else {
        op->embedding_forward(&m->ctx, out, tokens, g->wte, NULL, B, T, g->C);
        if (g->lead) {
            op->embedding_forward(&m->ctx, g->dln, g->docs.host, g->wpe, NULL, B, T, g->C);
            op->add(&m->ctx, out, out, g->dln, (size_t)B * T * g->C);
        }
    }
    zt_tp_reduce_act(m, out, (size_t)B * T * g->C);
}

/* The positions' gradient is whole on every TP rank (dres is), the rows' only where they are. */
static void embed_backward(zt_model *m, const int32_t *tokens, int B, int T) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    if (zt_tp_on(m)) {
        zt_tp_local_tokens(tokens, B * T, g->v0, g->Vl, false, g->blk.tp_tokens);
        tokens = g->blk.tp_tokens;
    }
    if (!g->docs.on) {
        op->embedding_backward(&m->ctx, g->dwte, g->dwpe, g->blk.dres, tokens, B, T, g->C);
        return;
    }
    op->embedding_backward(&m->ctx, g->dwte, NULL, g->blk.dres, tokens, B, T, g->C);
    op->embedding_backward(&m->ctx, g->dwpe, NULL, g->blk.dres, g->docs.host, B, T, g->C);
}

static zt_status gpt2_set_doc_pos(zt_model *m, const int32_t *pos, int B, int T) {
    gpt2 *g = (gpt2 *)m;
    return zt_doc_pos_set(&g->docs, m->ctx.be, (size_t)m->max_batch * g->maxT, m->upload_slots,
                          pos, B, T);
}

static void head_forward(zt_model *m, zt_head_acts *h, const void *last, int B, int T) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    const int BT = B * T;
    op->layernorm_forward(&m->ctx, h->lnf, h->lnf_mean, h->lnf_rstd, last, g->lnf_w, g->lnf_b,
                          BT, g->C);
    op->linear_forward(&m->ctx, h->logits, h->lnf, g->head, NULL, NULL, BT, g->C, g->Vl,
                       ZT_W_OUT_IN);
}

static void head_backward(zt_model *m, zt_head_acts *h, const void *last, int B, int T) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    const int BT = B * T, C = g->C;
    op->linear_backward(&m->ctx, g->dln, g->dhead, NULL, h->logits, h->lnf, g->head, BT, C,
                        g->Vl, ZT_W_OUT_IN, false);
    zt_tp_reduce_act(m, g->dln, (size_t)BT * C);
    zt_backend_zero(m->ctx.be, g->blk.dres, g->act_size * (size_t)BT * C, ZT_STREAM_COMPUTE);
    op->layernorm_backward(&m->ctx, g->blk.dres, g->dlnf_w, g->dlnf_b, g->dln, last, g->lnf_w,
                           h->lnf_mean, h->lnf_rstd, BT, C);
}

/* The dimensions activations are carved for: B sequences of T tokens, activation elements of es
 * bytes, statistics of 4. */
typedef struct {
    uint64_t B, T, C, NH, V, es;
    uint64_t A, F; /* the shard's attention and MLP widths (C and 4C without TP); NH and V are
                      the shard's too */
    bool attn_lse; /* attention keeps row statistics (zt_backend.attn_lse) */
} act_dims;

static void carve_layer(zt_carver *c, const void *dims, void *acts) {
    const act_dims *d = dims;
    layer_acts *a = acts;
    const uint64_t BT = d->B * d->T, C = d->C, es = d->es, F32 = sizeof(float);
    bool *ov = &c->overflow;
    const uint64_t att = zt_attn_state_floats(d->attn_lse, d->B, d->NH, d->T, ov);
    a->ln1 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
    a->ln1_mean = zt_carve(c, BT, F32);
    a->ln1_rstd = zt_carve(c, BT, F32);
    a->qkv = zt_carve(c, zt_u64_mul(BT, 3 * d->A, ov), es);
    a->atty = zt_carve(c, zt_u64_mul(BT, d->A, ov), es);
    a->att = zt_carve(c, att, F32);
    a->res2 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
    a->ln2 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
    a->ln2_mean = zt_carve(c, BT, F32);
    a->ln2_rstd = zt_carve(c, BT, F32);
    a->fch = zt_carve(c, zt_u64_mul(BT, d->F, ov), es);
    a->fch_gelu = zt_carve(c, zt_u64_mul(BT, d->F, ov), es);
    a->res3 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
}

static const zt_block_ops gpt2_block_ops = {
    .acts_size = sizeof(layer_acts),
    .carve = carve_layer,
    .forward = block_forward,
    .output = block_output,
    .backward = block_backward,
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .head_forward = head_forward,
    .head_backward = head_backward,
};

static act_dims dims_of(const zt_model_spec *s, int micro_batch, size_t act_size, int tp,
                        bool attn_lse) {
    const uint64_t C = (uint64_t)s->n_embd, t = (uint64_t)tp;
    return (act_dims){(uint64_t)micro_batch, (uint64_t)s->block_size, C,
                      (uint64_t)s->n_head / t, (uint64_t)s->vocab_size / t, (uint64_t)act_size,
                      C / t, 4 * C / t, attn_lse};
}

static zt_blocks_shape shape_of(const zt_model_spec *s, const zt_model_stage *st, int micro_batch,
                                size_t act_size) {
    zt_blocks_shape b = {
        .B = (uint64_t)micro_batch, .T = (uint64_t)s->block_size, .C = (uint64_t)s->n_embd,
        .V = (uint64_t)s->vocab_size / (uint64_t)zt_model_stage_tp(st), .es = (uint64_t)act_size,
        .layers = (uint64_t)(st->last_layer - st->first_layer), .buffers = (uint64_t)st->buffers,
        .head = st->head, .norm_mean = true,
    };
    zt_blocks_checkpointing(s, &b);
    return b;
}

/* Carves g's buffers out of base and pinned (the blocks' and the backward's scratch), or with g
 * NULL counts the bytes: the one function that both sizes and lays out the activations, so the
 * estimate is the allocation. Returns the device bytes (*pinned_bytes the host ones), with
 * *overflow set when a count passed 64 bits. */
static uint64_t carve_activations(const act_dims *d, const zt_blocks_shape *s, gpt2 *g,
                                  unsigned char *base, unsigned char *pinned,
                                  uint64_t *pinned_bytes, bool *overflow) {
    zt_carver c = {.base = base}, host = {.base = pinned};
    bool *ov = &c.overflow;
    const uint64_t BT = d->B * d->T, C = d->C, es = d->es;
    const uint64_t BTC = zt_u64_mul(BT, C, ov);
    const uint64_t att = zt_attn_state_floats(d->attn_lse, d->B, d->NH, d->T, ov);
    zt_blocks_carve(g ? &g->blk : NULL, s, &gpt2_block_ops, d, &c, &host);
    /* A count writes the scratch's (NULL) pointers into a throwaway. */
    gpt2 none;
    gpt2 *o = g ? g : &none;
    o->dln = zt_carve(&c, BTC, es);
    o->datty = zt_carve(&c, BTC, es);
    o->dqkv = zt_carve(&c, zt_u64_mul(BT, 3 * d->A, ov), es);
    o->dfch = zt_carve(&c, zt_u64_mul(BT, d->F, ov), es);
    o->datt = zt_carve(&c, att, sizeof(float));
    *overflow |= c.overflow || host.overflow;
    *pinned_bytes = host.off;
    return c.off;
}

/* DeepSpeedExamples' count: per token, 2·params for the dense layers' forward and
 * 2·2·layers·hidden·seq for attention's two T×T products, times 3 for forward and backward, or 4
 * with activation checkpointing (the backward recomputes the forward). A stage counts its own
 * parameters and blocks. */
static double gpt2_flops_per_token(const zt_model *m) {
    const gpt2 *g = (const gpt2 *)m;
    const double passes = g->blk.shape.interval ? 4.0 : 3.0;
    return passes * (2.0 * (double)m->n_params +
                     4.0 * (double)g->blk.shape.layers * (double)g->A * g->maxT);
}

static void gpt2_destroy(zt_model *m) {
    gpt2 *g = (gpt2 *)m;
    zt_doc_pos_free(&g->docs, m->ctx.be);
    free(g->lw);
    free(g->lg);
    zt_blocks_model_free(m);
    free(g);
}

static const zt_model_ops gpt2_ops = {
    .init_weights = gpt2_init_weights,
    .forward = zt_blocks_model_forward,
    .backward = zt_blocks_model_backward,
    .logits = zt_blocks_model_logits,
    .flops_per_token = gpt2_flops_per_token,
    .destroy = gpt2_destroy,
    .stage_forward = zt_blocks_model_stage_forward,
    .stage_backward = zt_blocks_model_stage_backward,
    .set_doc_pos = gpt2_set_doc_pos,
};

/* Points the views at the flat buffers, tensor by tensor in lay_out_tensors' order. */
static void set_views(gpt2 *g) {
    zt_model *m = &g->base;
    const zt_tensor_info *t = m->tensors;
    if (m->stage.embed) {
        g->wte = m->params + t[0].offset;
        g->dwte = m->grads + t[0].offset;
        g->wpe = m->params + t[1].offset;
        g->dwpe = m->grads + t[1].offset;
        t += 2;
    }
    for (int l = 0; l < m->stage.last_layer - m->stage.first_layer; l++) {
        for (int i = 0; i < N_LAYER_TENSORS; i++, t++) {
            g->lw[l].w[i] = m->params + t->offset;
            g->lg[l].w[i] = m->grads + t->offset;
        }
    }
    if (m->stage.head) {
        g->lnf_w = m->params + t[0].offset;
        g->dlnf_w = m->grads + t[0].offset;
        g->lnf_b = m->params + t[1].offset;
        g->dlnf_b = m->grads + t[1].offset;
        g->head = m->stage.embed ? g->wte : m->params + t[2].offset;
        g->dhead = m->stage.embed ? g->dwte : m->grads + t[2].offset;
    }
}

static zt_status gpt2_create(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                             zt_dtype act, int max_batch, size_t pad_to,
                             const zt_model_stage *stage) {
    /* The estimate is the check that every size of the whole model fits: nothing is computed in
     * a type it could overflow once it has passed. A stage's activations are counted again
     * below, since its buffers can outnumber the whole model's blocks. */
    zt_model_estimate est;
    ZT_TRY(zt_model_check_create(spec, be, act, max_batch, &est));
    const int tp = zt_model_stage_tp(stage);
    if (tp > 1 && (spec->n_head % tp != 0 || spec->vocab_size % tp != 0))
        return zt_error(ZT_ERR_INVALID, "gpt2: tensor parallelism of %d needs model.n_head (%d) "
                        "and model.vocab_size (%d) divisible by it (heads and vocabulary rows are "
                        "split evenly)", tp, spec->n_head, spec->vocab_size);
    const size_t act_size = zt_backend_act_size(be, act);
    const act_dims dims = dims_of(spec, max_batch, act_size, tp, be->attn_lse);
    const zt_blocks_shape shape = shape_of(spec, stage, max_batch, act_size);
    bool overflow = false;
    uint64_t pinned = 0;
    const uint64_t act_bytes = carve_activations(&dims, &shape, NULL, NULL, NULL, &pinned,
                                                 &overflow);
    if (overflow || act_bytes > SIZE_MAX || pinned > SIZE_MAX)
        return zt_error(ZT_ERR_NOMEM, "gpt2: the activations of %d buffers of a micro-batch of %d "
                        "do not fit this machine's address space", stage->buffers, max_batch);
    gpt2 *g = calloc(1, sizeof *g);
    if (!g)
        return zt_error(ZT_ERR_NOMEM, "gpt2: out of memory");
    zt_model *m = &g->base;
    zt_blocks_model_setup(m, &gpt2_ops, &g->blk, spec, be, act, max_batch, stage);
    g->act_size = act_size;
    g->L = spec->n_layer;
    g->C = spec->n_embd;
    g->NH = spec->n_head;
    g->V = spec->vocab_size;
    g->maxT = spec->block_size;
    g->NHl = g->NH / tp;
    g->A = g->C / tp;
    g->F = 4 * g->C / tp;
    g->Vl = g->V / tp;
    g->v0 = tp > 1 ? stage->tp_rank * g->Vl : 0;
    g->lead = tp == 1 || stage->tp_rank == 0;
    const int layers = stage->last_layer - stage->first_layer;

    m->tensors = calloc((size_t)stage_tensors(stage), sizeof *m->tensors);
    g->lw = calloc((size_t)layers + 1, sizeof *g->lw);
    g->lg = calloc((size_t)layers + 1, sizeof *g->lg);
    zt_status s = zt_blocks_init(&g->blk, &shape, &gpt2_block_ops, "gpt2");
    if (s == ZT_OK)
        s = zt_blocks_init_tp(&g->blk, m);
    if (s != ZT_OK || !m->tensors || !g->lw || !g->lg) {
        gpt2_destroy(m);
        return s != ZT_OK ? s
                          : zt_error(ZT_ERR_NOMEM, "gpt2: out of memory for the tables of %d "
                                     "layers", layers);
    }
    m->n_params = lay_out_tensors(m->tensors, &m->n_tensors, spec, stage);
    ZT_ASSERT(m->n_tensors == stage_tensors(stage));
    const bool whole = layers == g->L && stage->embed && stage->head && stage->buffers == 1 &&
                       tp == 1;
    ZT_ASSERT(!whole || (m->n_params == est.params && (uint64_t)m->n_tensors == est.n_tensors &&
                         act_bytes == est.activation_bytes));

    s = zt_blocks_model_alloc(m, pad_to, (size_t)pinned, (size_t)act_bytes);
    if (s != ZT_OK) {
        gpt2_destroy(m);
        return s;
    }
    uint64_t pinned_again = 0;
    ZT_ASSERT(carve_activations(&dims, &shape, g, g->blk.act_memory, g->blk.pinned, &pinned_again,
                                &overflow) == act_bytes &&
              pinned_again == pinned && !overflow);
    set_views(g);
    *out = m;
    return ZT_OK;
}

/* ---- The family: spec fields, checks and Hugging Face names ------------------------------- */

static zt_status gpt2_validate(const zt_model_spec *s, const char *source) {
    if (s->n_embd % s->n_head != 0)
        return zt_error(ZT_ERR_INVALID, "%s: model.n_embd (%d) must be divisible by model.n_head (%d)",
                        source, s->n_embd, s->n_head);
    /* The kernels take every dimension as an int, the MLP's 4·n_embd the widest. */
    if (s->n_embd > INT_MAX / 4)
        return zt_error(ZT_ERR_INVALID, "%s: model.n_embd (%d) is too large: the MLP's width "
                        "4·n_embd = %lld is above %d, the largest dimension the kernels take",
                        source, s->n_embd, 4LL * s->n_embd, INT_MAX);
    return ZT_OK;
}

/* Exact sizes from the spec: the tensors gpt2_create lays out and the activations it carves,
 * every sum and product in 64 bits and checked. */
static zt_status gpt2_estimate(const zt_model_spec *s, const zt_model_estimate_args *a,
                               const char *source, zt_model_estimate *out) {
    const uint64_t C = (uint64_t)s->n_embd;
    /* Under TP a shard holds 1/tp of each tensor layer_tensor_split cuts, and of wte. */
    const int tp = a->tp_size > 1 ? a->tp_size : 1;
    zt_model_stage full = a->stage ? *a->stage : zt_model_full_stage(s->n_layer);
    full.tp_size = tp;
    const uint64_t L = (uint64_t)(full.last_layer - full.first_layer);
    /* lay_out_tensors' outer tensors: wte and wpe with the embedding, ln_f with the head and a
     * last stage's own copy of wte. */
    const uint64_t wte = (uint64_t)s->vocab_size / (uint64_t)tp * C;
    const uint64_t outer[] = {full.embed ? wte : 0, full.embed ? (uint64_t)s->block_size * C : 0,
                              full.head ? C : 0, full.head ? C : 0,
                              full.head && !full.embed ? wte : 0};
    bool ov = false;
    uint64_t layer = 0, layer_small = 0, outer_n = 0, outer_small = 0;
    /* Products of two ints and sums of a few: they fit 64 bits without a check. */
    for (int i = 0; i < N_LAYER_TENSORS; i++) {
        uint64_t n = layer_tensor_numel(i, C) /
                     (layer_tensor_split(i, &full).dim >= 0 ? (uint64_t)tp : 1);
        layer += n;
        layer_small += n < a->persistence_threshold ? n : 0;
    }
    for (size_t i = 0; i < sizeof outer / sizeof outer[0]; i++) {
        outer_n += outer[i];
        outer_small += outer[i] < a->persistence_threshold ? outer[i] : 0;
    }
    uint64_t params = zt_u64_add(outer_n, zt_u64_mul(L, layer, &ov), &ov);
    /* The model keeps an fp32 buffer of parameters and one of gradients. */
    zt_u64_mul(params, 2 * sizeof(float), &ov);
    if (ov)
        return zt_error(ZT_ERR_INVALID, "%s: model.n_layer (%d) blocks of %llu parameters each "
                        "(model.n_embd %d) are more than a 64-bit size can hold", source,
                        s->n_layer, (unsigned long long)layer, s->n_embd);
    uint64_t tokens = (uint64_t)a->micro_batch * (uint64_t)s->block_size;
    if (tokens > INT_MAX)
        return zt_error(ZT_ERR_INVALID, "%s: a micro-batch of %d sequences of model.block_size %d "
                        "is %llu tokens, above %d, the most one forward takes", source,
                        a->micro_batch, s->block_size, (unsigned long long)tokens, INT_MAX);
    act_dims d = dims_of(s, a->micro_batch, a->act_size, tp, a->attn_lse);
    const zt_blocks_shape shape = shape_of(s, &full, a->micro_batch, a->act_size);
    uint64_t pinned = 0;
    uint64_t act = carve_activations(&d, &shape, NULL, NULL, NULL, &pinned, &ov);
    act = zt_u64_add(act, zt_tp_device_bytes(tp, tokens, &ov), &ov);
    if (ov)
        return zt_error(ZT_ERR_INVALID, "%s: the activations of a micro-batch of %d sequences of "
                        "model.block_size %d (model.n_embd %d, model.n_head %d, model.n_layer %d, "
                        "model.vocab_size %d) are more than a 64-bit size can hold", source,
                        a->micro_batch, s->block_size, s->n_embd, s->n_head, s->n_layer,
                        s->vocab_size);
    /* stage_tensors' count in 64 bits: an estimate may be asked of any size (admission). */
    const uint64_t n_tensors = L * N_LAYER_TENSORS + (full.embed ? 2 : 0) +
                               (full.head ? (full.embed ? 2 : 3) : 0);
    *out = (zt_model_estimate){
        .params = params,
        .layer_params = layer,
        .outer_params = outer_n,
        .persistent_params = outer_small + L * layer_small,
        .n_tensors = n_tensors,
        .n_layer = (int)L,
        .activation_bytes = act,
        /* a LayerNorm's weight and bias (2 · C), or the FC bias, the widest (4 · C / tp) */
        .channel_sum_floats = 2 * C > 4 * C / (uint64_t)tp ? 2 * C : 4 * C / (uint64_t)tp,
        .norm_sum_floats = 2 * C,
        .host_bytes = sizeof(gpt2) + n_tensors * sizeof(zt_tensor_info) +
                      (L + 1) * (2 * sizeof(layer_views) + sizeof(layer_acts)) +
                      tokens * (sizeof(float) + sizeof(int32_t)) + pinned +
                      zt_tp_host_bytes(tp, tokens),
    };
    return ZT_OK;
}

static const zt_model_field gpt2_fields[] = {
    {ZT_MODEL_FIELD(n_layer), .required = true, .bound = ZT_BOUND_POSITIVE,
     .meaning = "transformer blocks"},
    {ZT_MODEL_FIELD(n_head), .required = true, .bound = ZT_BOUND_POSITIVE,
     .meaning = "attention heads per block"},
    {ZT_MODEL_FIELD(n_embd), .required = true, .bound = ZT_BOUND_POSITIVE,
     .meaning = "width of the residual stream, a multiple of n_head"},
    {ZT_MODEL_FIELD(vocab_size), .required = true, .bound = ZT_BOUND_POSITIVE,
     .meaning = "rows of the token embedding, which is also the LM head"},
    {ZT_MODEL_FIELD(block_size), .required = true, .bound = ZT_BOUND_POSITIVE,
     .meaning = "positions, the longest sequence and the training sequence length"},
    {ZT_MODEL_FIELD(init_from),
     .meaning = "safetensors file with Hugging Face GPT-2 names to start from"},
    {0},
};

/* Hugging Face's GPT2LMHeadModel keeps the causal masks as buffers (attn.bias, and
 * attn.masked_bias in older files) beside the weights. */
static const char *const gpt2_hf_ignored[] = {".attn.bias", ".attn.masked_bias", NULL};

const zt_model_family zt_gpt2_family = {
    .name = "gpt2",
    .title = "GPT-2",
    .fields = gpt2_fields,
    .validate = gpt2_validate,
    .estimate = gpt2_estimate,
    .create = gpt2_create,
    .hf = {
        .strip_prefix = "transformer.",
        .ignore_suffixes = gpt2_hf_ignored,
        .tied = "lm_head.weight",
        .tied_to = "wte.weight",
        .croppable = "wpe.weight",
    },
};
