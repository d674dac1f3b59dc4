/* The Llama family's decoder (Llama 2/3, Mistral, Qwen2): token embedding, pre-RMSNorm blocks of
 * rotary grouped-query causal attention and a SwiGLU MLP, a final RMSNorm and an LM head that is
 * the embedding or its own matrix.
 *
 * Tensors use Hugging Face's names and torch.nn.Linear layouts ([out, in]), one layer's tensors
 * contiguous in the flat buffer, so import/export is a copy and a layer is one slice. Every
 * operation goes through the backend's op table, and every buffer is the backend's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc_pos.h"
#include "llama.h"

typedef struct {
    float *w[LLAMA_N_LAYER_TENSORS]; /* NULL for a bias the spec does not have */
} layer_views;

typedef struct {
    zt_model base;
    int L, C, NH, KV, HD, I, V, maxT; /* L: the whole model's layers */
    int Q, QKV;                 /* n_head·head_dim, and the packed q | k | v row */
    /* Under tensor parallelism NH, KV, I, V, Q and QKV are this rank's shard's (whole without):
     * its heads, kv heads, MLP width and the vocabulary rows from v0. */
    int v0;
    bool lead;                  /* TP rank 0, which adds o_proj's bias and the residuals */
    float eps;
    int window;
    float *embed, *norm, *head; /* head is embed (or a last stage's copy of it) when tied */
    float *dembed, *dnorm, *dhead;
    layer_views *lw, *lg;       /* parameter and gradient views per layer of the stage */
    size_t act_size;            /* bytes per activation element on this backend */
    zt_blocks blk;              /* activation sets, checkpointing, dres */
    llama_outer_acts o;
    /* Packed documents: their positions, and the rotary tables gathered by position for each
     * token of the micro-batch ([max_batch·maxT, HD/2], device, with pinned staging copies in
     * the slots of docs: tok_host holds docs.slots pairs of them), made on the first set with
     * documents from the host tables [maxT, HD/2]. */
    zt_doc_pos docs;
    float *tok_cos, *tok_sin, *tok_host, *table_host;
    /* kv heads shared by several TP ranks (m->tp_share_comm): the k and v gradients (weights,
     * then biases) that earlier micro-batches accumulated, set aside during a layer's backward
     * (zt_tp_shared_grad_begin). NULL otherwise. */
    float *kv_saved;
    size_t kv_w, kv_b; /* elements of k and v's weights, and of their biases */
} llama;

uint64_t zt_llama_host_bytes(const llama_dims *d, uint64_t micro_batch) {
    return sizeof(llama) + (d->L + 1) * (2 * sizeof(layer_views) + sizeof(llama_layer_acts)) +
           micro_batch * d->T * (sizeof(float) + sizeof(int32_t));
}

/* ---- Initialisation ----------------------------------------------------------------------- */

/* Hugging Face's LlamaPreTrainedModel._init_weights: normal(0, initializer_range = 0.02) for
 * linear and embedding weights, zero biases, and ones for the RMSNorm weights (their own
 * initialisation). */
static double init_std(const zt_model *m, const char *name) {
    (void)m;
    const char *dot = strrchr(name, '.');
    if (dot && strcmp(dot, ".bias") == 0)
        return 0.0;
    if (strstr(name, "norm.weight"))
        return -1.0;
    return 0.02;
}

/* Tensors are drawn in the whole model's flat-buffer order from one stream, so a pipeline stage
 * starts from the same values as the whole model. */
static zt_status llama_init_weights(zt_model *m, uint64_t seed) {
    const llama_dims d = zt_llama_dims(&m->spec);
    const zt_model_stage full = zt_model_full_stage(m->spec.n_layer);
    zt_tensor_info *t = calloc((size_t)zt_llama_stage_tensors(&d, &full), sizeof *t);
    if (!t)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the initialisation's tensor table",
                        m->spec.type);
    int n;
    zt_llama_lay_out(t, &n, &d, &full);
    zt_status s = zt_blocks_init_weights(m, seed ^ 0x6c6c616d61000000ull, t, n, init_std);
    free(t);
    return s;
}

/* ---- The blocks, the embedding and the head (blocks.h calls them) ------------------------- */

static zt_attn_shape attn_shape(const llama *g, int B, int T) {
    return (zt_attn_shape){B, T, g->NH, g->KV, g->HD, true, g->window, zt_doc_pos_dev(&g->docs)};
}

/* Rotates q and k of the packed rows in place (the backward rotates their gradients back). */
static void rope(const llama *g, const zt_ctx *x, void *qkv, int B, int T, bool backward) {
    const zt_ops *op = x->be->ops;
    void (*f)(const zt_ctx *, void *, const float *, const float *, int, int, int, int, size_t) =
        backward ? op->rope_backward : op->rope_forward;
    const float *cos = g->o.rope_cos, *sin = g->o.rope_sin;
    /* With packed documents each token has its own table row: the rows are one sequence of
     * B·T tokens to the op. */
    if (g->docs.on)
        cos = g->tok_cos, sin = g->tok_sin, T *= B, B = 1;
    /* k's heads follow q's in the packed row and turn by the same angles, so one pass (one
     * parallel region) rotates both. */
    f(x, qkv, cos, sin, B, T, g->NH + g->KV, g->HD, (size_t)g->QKV);
}

static const void *block_forward(zt_model *m, void *acts, const void *residual, int l, int B,
                                 int T) {
    llama *g = (llama *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, I = g->I, BT = B * T;
    const zt_attn_shape attn = attn_shape(g, B, T);
    llama_layer_acts *a = acts;
    float **w = g->lw[l - m->stage.first_layer].w;
    op->rmsnorm_forward(x, a->ln1, a->ln1_rstd, residual, w[LLAMA_IN_NORM], g->eps, BT, C);
    op->linear_forward(x, a->qkv, a->ln1, w[LLAMA_Q_W], w[LLAMA_Q_B], NULL, BT, C, g->QKV,
                       ZT_W_OUT_IN);
    rope(g, x, a->qkv, B, T, false);
    op->attention_forward(x, &attn, a->atty, a->att, a->qkv, NULL, NULL);
    /* o_proj and down_proj are row-parallel under TP: partial sums over this rank's heads (or
     * MLP columns) that the all-reduce completes, the bias and residual added once. */
    op->linear_forward(x, a->res2, a->atty, w[LLAMA_O_W], g->lead ? w[LLAMA_O_B] : NULL,
                       g->lead ? residual : NULL, BT, g->Q, C, ZT_W_OUT_IN);
    zt_tp_reduce_act(m, a->res2, (size_t)BT * C);
    op->rmsnorm_forward(x, a->ln2, a->ln2_rstd, a->res2, w[LLAMA_POST_NORM], g->eps, BT, C);
    op->linear_forward(x, a->gate, a->ln2, w[LLAMA_GATE_W], NULL, NULL, BT, C, I, ZT_W_OUT_IN);
    op->linear_forward(x, a->up, a->ln2, w[LLAMA_UP_W], NULL, NULL, BT, C, I, ZT_W_OUT_IN);
    op->silu_mul_forward(x, a->hmul, a->gate, a->up, (size_t)BT * I);
    op->linear_forward(x, a->res3, a->hmul, w[LLAMA_DOWN_W], NULL, g->lead ? a->res2 : NULL, BT,
                       I, C, ZT_W_OUT_IN);
    zt_tp_reduce_act(m, a->res3, (size_t)BT * C);
    return a->res3;
}

static const void *block_output(const void *acts) {
    return ((const llama_layer_acts *)acts)->res3;
}

static void block_backward(zt_model *m, void *acts, const void *residual, int l, int B, int T) {
    llama *g = (llama *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, I = g->I, BT = B * T;
    const zt_attn_shape attn = attn_shape(g, B, T);
    llama_outer_acts *o = &g->o;
    llama_layer_acts *a = acts;
    float **w = g->lw[l - m->stage.first_layer].w, **dw = g->lg[l - m->stage.first_layer].w;
    void *dres = g->blk.dres;
    /* dres holds the gradient of this layer's output; the MLP branch adds into it. */
    op->linear_backward(x, o->dh, dw[LLAMA_DOWN_W], NULL, dres, a->hmul, w[LLAMA_DOWN_W], BT, I,
                        C, ZT_W_OUT_IN, false);
    op->silu_mul_backward(x, o->dh, o->dup, o->dh, a->gate, a->up, (size_t)BT * I);
    op->linear_backward(x, o->dln, dw[LLAMA_GATE_W], NULL, o->dh, a->ln2, w[LLAMA_GATE_W], BT, C,
                        I, ZT_W_OUT_IN, false);
    op->linear_backward(x, o->dln, dw[LLAMA_UP_W], NULL, o->dup, a->ln2, w[LLAMA_UP_W], BT, C, I,
                        ZT_W_OUT_IN, true);
    zt_tp_reduce_act(m, o->dln, (size_t)BT * C);
    op->rmsnorm_backward(x, dres, dw[LLAMA_POST_NORM], o->dln, a->res2, w[LLAMA_POST_NORM],
                         a->ln2_rstd, BT, C);
    /* dres now holds the gradient of res2; the attention branch adds into it. */
    op->linear_backward(x, o->datty, dw[LLAMA_O_W], dw[LLAMA_O_B], dres, a->atty, w[LLAMA_O_W],
                        BT, g->Q, C, ZT_W_OUT_IN, false);
    op->attention_backward(x, &attn, o->dqkv, NULL, NULL, o->datt, o->datty, a->atty, a->qkv,
                           NULL, NULL, a->att);
    rope(g, x, o->dqkv, B, T, true);
    /* A kv head shared by several TP ranks gets from each only its query heads' share: the
     * shares are summed over those ranks. The input gradient needs no such sum: the TP
     * all-reduce below adds every rank's share of it once. */
    if (g->kv_saved) {
        zt_tp_shared_grad_begin(m, dw[LLAMA_K_W], g->kv_saved, g->kv_w);
        if (g->kv_b)
            zt_tp_shared_grad_begin(m, dw[LLAMA_K_B], g->kv_saved + g->kv_w, g->kv_b);
    }
    op->linear_backward(x, o->dln, dw[LLAMA_Q_W], dw[LLAMA_Q_B], o->dqkv, a->ln1, w[LLAMA_Q_W],
                        BT, C, g->QKV, ZT_W_OUT_IN, false);
    if (g->kv_saved) {
        zt_tp_shared_grad_end(m, dw[LLAMA_K_W], g->kv_saved, g->kv_w);
        if (g->kv_b)
            zt_tp_shared_grad_end(m, dw[LLAMA_K_B], g->kv_saved + g->kv_w, g->kv_b);
    }
    zt_tp_reduce_act(m, o->dln, (size_t)BT * C);
    op->rmsnorm_backward(x, dres, dw[LLAMA_IN_NORM], o->dln, residual, w[LLAMA_IN_NORM],
                         a->ln1_rstd, BT, C);
}

/* Vocabulary-parallel under TP: each rank looks up the tokens its rows hold (zero rows for the
 * others) and the all-reduce completes every row. */
static void embed_forward(zt_model *m, void *out, const int32_t *tokens, int B, int T) {
    llama *g = (llama *)m;
    if (zt_tp_on(m)) {
        zt_tp_local_tokens(tokens, B * T, g->v0, g->V, false, g->blk.tp_tokens);
        tokens = g->blk.tp_tokens;
    }
    m->ctx.be->ops->embedding_forward(&m->ctx, out, tokens, g->embed, NULL, B, T, g->C);
    zt_tp_reduce_act(m, out, (size_t)B * T * g->C);
}

static void embed_backward(zt_model *m, const int32_t *tokens, int B, int T) {
    llama *g = (llama *)m;
    if (zt_tp_on(m)) {
        zt_tp_local_tokens(tokens, B * T, g->v0, g->V, false, g->blk.tp_tokens);
        tokens = g->blk.tp_tokens;
    }
    m->ctx.be->ops->embedding_backward(&m->ctx, g->dembed, NULL, g->blk.dres, tokens, B, T,
                                       g->C);
}

static void head_forward(zt_model *m, zt_head_acts *h, const void *last, int B, int T) {
    llama *g = (llama *)m;
    const zt_ops *op = m->ctx.be->ops;
    const int BT = B * T;
    op->rmsnorm_forward(&m->ctx, h->lnf, h->lnf_rstd, last, g->norm, g->eps, BT, g->C);
    op->linear_forward(&m->ctx, h->logits, h->lnf, g->head, NULL, NULL, BT, g->C, g->V,
                       ZT_W_OUT_IN);
}

static void head_backward(zt_model *m, zt_head_acts *h, const void *last, int B, int T) {
    llama *g = (llama *)m;
    const zt_ops *op = m->ctx.be->ops;
    const int BT = B * T, C = g->C;
    op->linear_backward(&m->ctx, g->o.dln, g->dhead, NULL, h->logits, h->lnf, g->head, BT, C,
                        g->V, ZT_W_OUT_IN, false);
    zt_tp_reduce_act(m, g->o.dln, (size_t)BT * C);
    zt_backend_zero(m->ctx.be, g->blk.dres, g->act_size * (size_t)BT * C, ZT_STREAM_COMPUTE);
    op->rmsnorm_backward(&m->ctx, g->blk.dres, g->dnorm, g->o.dln, last, g->norm, h->lnf_rstd,
                         BT, C);
}

const zt_block_ops zt_llama_block_ops = {
    .acts_size = sizeof(llama_layer_acts),
    .carve = zt_llama_carve_layer,
    .forward = block_forward,
    .output = block_output,
    .backward = block_backward,
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .head_forward = head_forward,
    .head_backward = head_backward,
};

/* As GPT-2's count (DeepSpeedExamples'): 2 FLOPs per parameter and token for the dense layers
 * and 2·2 per layer, query width and position for attention's two T×T products, whose width is
 * n_head·head_dim here (which need not be n_embd), times 3 for forward and backward, or 4 with
 * activation checkpointing. Every parameter the model (or stage) holds counts, an untied head
 * and the embedding both. */
static double llama_flops_per_token(const zt_model *m) {
    const llama *g = (const llama *)m;
    const double passes = g->blk.shape.interval ? 4.0 : 3.0;
    return passes * (2.0 * (double)m->n_params +
                     4.0 * (double)g->blk.shape.layers * (double)g->Q * g->maxT);
}

static void free_doc_tables(llama *g) {
    zt_backend *be = g->base.ctx.be;
    const size_t tok = (size_t)g->base.max_batch * g->maxT * (g->HD / 2) * sizeof(float);
    zt_backend_free(be, ZT_MEM_DEVICE, g->tok_cos, tok);
    zt_backend_free(be, ZT_MEM_DEVICE, g->tok_sin, tok);
    zt_backend_free(be, ZT_MEM_PINNED, g->tok_host, 2 * tok * (size_t)g->docs.slots);
    free(g->table_host);
    zt_doc_pos_free(&g->docs, be);
}

/* The documents of the next forward: their positions for the attention, and each token's
 * rotary angle from its position in its document, gathered from the tables on the host. */
static zt_status llama_set_doc_pos(zt_model *m, const int32_t *pos, int B, int T) {
    llama *g = (llama *)m;
    const size_t cap = (size_t)m->max_batch * g->maxT, half = (size_t)g->HD / 2;
    ZT_TRY(zt_doc_pos_set(&g->docs, m->ctx.be, cap, m->upload_slots, pos, B, T));
    if (!pos)
        return ZT_OK;
    if (!g->table_host) {
        const size_t tok = cap * half * sizeof(float);
        g->table_host = malloc(2 * (size_t)g->maxT * half * sizeof(float));
        g->tok_host = zt_backend_alloc(m->ctx.be, ZT_MEM_PINNED, 2 * tok * (size_t)g->docs.slots);
        g->tok_cos = zt_backend_alloc(m->ctx.be, ZT_MEM_DEVICE, tok);
        g->tok_sin = zt_backend_alloc(m->ctx.be, ZT_MEM_DEVICE, tok);
        zt_status s = g->table_host && g->tok_host && g->tok_cos && g->tok_sin
                          ? zt_llama_rope_tables(&m->spec, g->HD, g->maxT, g->table_host,
                                                 g->table_host + (size_t)g->maxT * half)
                          : zt_error(ZT_ERR_NOMEM, "%s: out of memory for the rotary tables of "
                                     "packed documents", m->spec.type);
        if (s != ZT_OK) {
            free_doc_tables(g);
            return s;
        }
    }
    const size_t n = (size_t)B * T;
    const float *tcos = g->table_host, *tsin = g->table_host + (size_t)g->maxT * half;
    /* This micro-batch's slot: the device may still copy from the others. */
    float *hcos = g->tok_host + 2 * cap * half * (size_t)g->docs.slot, *hsin = hcos + cap * half;
    for (size_t i = 0; i < n; i++) {
        memcpy(hcos + i * half, tcos + (size_t)g->docs.host[i] * half, half * sizeof(float));
        memcpy(hsin + i * half, tsin + (size_t)g->docs.host[i] * half, half * sizeof(float));
    }
    zt_backend_copy(m->ctx.be, g->tok_cos, hcos, n * half * sizeof(float), ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
    zt_backend_copy(m->ctx.be, g->tok_sin, hsin, n * half * sizeof(float), ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
    return ZT_OK;
}

static void llama_destroy(zt_model *m) {
    llama *g = (llama *)m;
    free_doc_tables(g);
    free(g->lw);
    free(g->lg);
    zt_blocks_model_free(m);
    zt_backend_free(m->ctx.be, ZT_MEM_DEVICE, g->kv_saved,
                    (g->kv_w + g->kv_b) * sizeof(float));
    free(g);
}

static const zt_model_ops llama_ops = {
    .init_weights = llama_init_weights,
    .forward = zt_blocks_model_forward,
    .backward = zt_blocks_model_backward,
    .logits = zt_blocks_model_logits,
    .flops_per_token = llama_flops_per_token,
    .destroy = llama_destroy,
    .stage_forward = zt_blocks_model_stage_forward,
    .stage_backward = zt_blocks_model_stage_backward,
    .set_doc_pos = llama_set_doc_pos,
};

/* ---- Creation ------------------------------------------------------------------------------- */

int zt_llama_stage_tensors(const llama_dims *d, const zt_model_stage *st) {
    int per_layer = 0;
    for (int i = 0; i < LLAMA_N_LAYER_TENSORS; i++)
        per_layer += zt_llama_layer_numel(d, i) > 0;
    return (st->last_layer - st->first_layer) * per_layer + (st->embed ? 1 : 0) +
           (st->head ? 1 + (!d->tied || !st->embed ? 1 : 0) : 0);
}

/* Megatron's cut of a layer ([out, in] layouts): q, k, v, gate and up column-parallel (their
 * output rows split, q, k and v by head), o_proj and down_proj row-parallel (their input columns
 * split; o_proj's bias whole, added once after the sum), the norms whole. With fewer kv heads
 * (kv) than TP ranks, k and v are cut into kv pieces, one head each, and TP rank t holds piece
 * t / (tp / kv): the kv head its query heads attend with. */
static zt_tp_split layer_split(int i, const zt_model_stage *st, int kv) {
    const int tp = zt_model_stage_tp(st);
    switch (i) {
    case LLAMA_K_W: case LLAMA_V_W: case LLAMA_K_B: case LLAMA_V_B:
        if (kv < tp)
            return (zt_tp_split){0, 1, kv, st->tp_rank / (tp / kv), tp / kv};
        return zt_tp_even(st, 0, 1);
    case LLAMA_Q_W: case LLAMA_Q_B: case LLAMA_GATE_W: case LLAMA_UP_W:
        return zt_tp_even(st, 0, 1);
    case LLAMA_O_W: case LLAMA_DOWN_W:
        return zt_tp_even(st, 1, 1);
    default:
        return zt_tp_whole(st);
    }
}

size_t zt_llama_lay_out(zt_tensor_info *t, int *n, const llama_dims *d, const zt_model_stage *st) {
    size_t off = 0;
    const int64_t V = (int64_t)d->V, C = (int64_t)d->C;
    const zt_tp_split rows = zt_tp_even(st, 0, 1), whole = zt_tp_whole(st);
    *n = 0;
    if (st->embed)
        zt_blocks_add_shard(t, n, "model.embed_tokens.weight", &off, 2, V, C, -1, rows);
    for (int l = st->first_layer; l < st->last_layer; l++) {
        for (int i = 0; i < LLAMA_N_LAYER_TENSORS; i++) {
            int64_t shape[2];
            int ndim = zt_llama_layer_shape(d, i, shape);
            if (shape[0] == 0)
                continue;
            char name[64];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, zt_llama_layer_names[i]);
            zt_blocks_add_shard(t, n, name, &off, ndim, shape[0], shape[1], l,
                                layer_split(i, st, (int)d->KV));
        }
    }
    if (st->head) {
        zt_blocks_add_shard(t, n, "model.norm.weight", &off, 1, C, 0, -1, whole);
        if (!d->tied) {
            zt_blocks_add_shard(t, n, "lm_head.weight", &off, 2, V, C, -1, rows);
        } else if (!st->embed) {
            zt_blocks_add_shard(t, n, "model.embed_tokens.weight", &off, 2, V, C, -1, rows);
            t[*n - 1].tied_copy = true;
        }
    }
    return off;
}

/* The backend must have every op the model calls (ops.h: a missing one is NULL). */
static zt_status check_ops(const zt_backend *be, const char *type) {
    const zt_ops *op = be->ops;
    const struct {
        const void *fn;
        const char *name;
    } need[] = {
        {(const void *)op->embedding_forward, "embedding_forward"},
        {(const void *)op->embedding_backward, "embedding_backward"},
        {(const void *)op->rmsnorm_forward, "rmsnorm_forward"},
        {(const void *)op->rmsnorm_backward, "rmsnorm_backward"},
        {(const void *)op->rope_forward, "rope_forward"},
        {(const void *)op->rope_backward, "rope_backward"},
        {(const void *)op->linear_forward, "linear_forward"},
        {(const void *)op->linear_backward, "linear_backward"},
        {(const void *)op->attention_forward, "attention_forward"},
        {(const void *)op->attention_backward, "attention_backward"},
        {(const void *)op->silu_mul_forward, "silu_mul_forward"},
        {(const void *)op->silu_mul_backward, "silu_mul_backward"},
        {(const void *)op->softmax_xent, "softmax_xent"},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i].fn)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: the %s backend has no %s op", type, be->name,
                            need[i].name);
    return ZT_OK;
}

/* Points the views at the flat buffers, tensor by tensor in zt_llama_lay_out's order. */
static void set_views(llama *g, const llama_dims *d) {
    zt_model *m = &g->base;
    const zt_model_stage *st = &m->stage;
    const zt_tensor_info *t = m->tensors;
    if (st->embed) {
        g->embed = m->params + t->offset;
        g->dembed = m->grads + t->offset;
        t++;
    }
    for (int l = 0; l < st->last_layer - st->first_layer; l++) {
        for (int i = 0; i < LLAMA_N_LAYER_TENSORS; i++) {
            if (zt_llama_layer_numel(d, i) == 0)
                continue;
            g->lw[l].w[i] = m->params + t->offset;
            g->lg[l].w[i] = m->grads + t->offset;
            t++;
        }
    }
    if (!st->head)
        return;
    g->norm = m->params + t->offset;
    g->dnorm = m->grads + t->offset;
    t++;
    const bool shared = d->tied && st->embed;
    g->head = shared ? g->embed : m->params + t->offset;
    g->dhead = shared ? g->dembed : m->grads + t->offset;
}

/* Computes the rotary tables on the host and copies them into their device buffers. */
static zt_status write_rope_tables(llama *g) {
    zt_model *m = &g->base;
    const size_t n = (size_t)g->maxT * (size_t)(g->HD / 2);
    float *host = malloc(2 * n * sizeof(float));
    if (!host)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the rotary tables", m->spec.type);
    zt_status s = zt_llama_rope_tables(&m->spec, g->HD, g->maxT, host, host + n);
    if (s == ZT_OK) {
        zt_backend_copy(m->ctx.be, g->o.rope_cos, host, n * sizeof(float), ZT_COPY_H2D,
                        ZT_STREAM_COMPUTE);
        zt_backend_copy(m->ctx.be, g->o.rope_sin, host + n, n * sizeof(float), ZT_COPY_H2D,
                        ZT_STREAM_COMPUTE);
    }
    free(host);
    return s;
}

zt_status zt_llama_create(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                          zt_dtype act, int max_batch, size_t pad_to,
                          const zt_model_stage *stage) {
    ZT_TRY(check_ops(be, spec->type));
    /* The estimate is the check that every size of the whole model fits: nothing is computed in
     * a type it could overflow once it has passed. A stage's activations are counted again
     * below, since its buffers can outnumber the whole model's blocks. */
    zt_model_estimate est;
    ZT_TRY(zt_model_check_create(spec, be, act, max_batch, &est));
    const size_t act_size = zt_backend_act_size(be, act);
    const llama_dims d = zt_llama_dims(spec);
    const int tp = zt_model_stage_tp(stage);
    /* Megatron splits kv heads between TP ranks, or replicates each over tp / n_kv_head ranks
     * when there are fewer than ranks. */
    const uint64_t t64 = (uint64_t)tp;
    if (tp > 1 && (d.NH % t64 || (d.KV % t64 && t64 % d.KV) || d.I % t64 || d.V % t64))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: tensor parallelism of %d needs model.n_head "
                        "(%llu), model.intermediate_size (%llu) and model.vocab_size (%llu) "
                        "divisible by it, and model.n_kv_head (%llu) divisible by it or "
                        "dividing it", spec->type, tp, (unsigned long long)d.NH,
                        (unsigned long long)d.I, (unsigned long long)d.V,
                        (unsigned long long)d.KV);
    const llama_dims dl = zt_llama_shard_dims(&d, tp);
    zt_blocks_shape shape = zt_llama_blocks_shape(spec, stage, (uint64_t)max_batch, act_size);
    shape.attn_lse = be->attn_lse;
    bool overflow = false;
    uint64_t pinned = 0;
    const uint64_t act_bytes = zt_llama_carve(&dl, &shape, NULL, NULL, NULL, NULL, &pinned,
                                              &overflow);
    if (overflow || act_bytes > SIZE_MAX || pinned > SIZE_MAX)
        return zt_error(ZT_ERR_NOMEM, "%s: the activations of %d buffers of a micro-batch of %d "
                        "do not fit this machine's address space", spec->type, stage->buffers,
                        max_batch);
    llama *g = calloc(1, sizeof *g);
    if (!g)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", spec->type);
    zt_model *m = &g->base;
    zt_blocks_model_setup(m, &llama_ops, &g->blk, spec, be, act, max_batch, stage);
    g->act_size = act_size;
    g->L = (int)d.L;
    g->C = (int)d.C;
    g->NH = (int)dl.NH;
    g->KV = (int)dl.KV;
    g->HD = (int)dl.HD;
    g->I = (int)dl.I;
    g->V = (int)dl.V;
    g->maxT = (int)dl.T;
    g->Q = (int)dl.Q;
    g->QKV = (int)dl.QKV;
    g->v0 = tp > 1 ? stage->tp_rank * g->V : 0;
    g->lead = tp == 1 || stage->tp_rank == 0;
    g->eps = (float)spec->rms_norm_eps;
    g->window = spec->sliding_window;
    const int layers = stage->last_layer - stage->first_layer;

    m->tensors = calloc((size_t)zt_llama_stage_tensors(&d, stage), sizeof *m->tensors);
    g->lw = calloc((size_t)layers + 1, sizeof *g->lw);
    g->lg = calloc((size_t)layers + 1, sizeof *g->lg);
    zt_status s = zt_blocks_init(&g->blk, &shape, &zt_llama_block_ops, spec->type);
    if (s == ZT_OK)
        s = zt_blocks_init_tp(&g->blk, m);
    if (s != ZT_OK || !m->tensors || !g->lw || !g->lg) {
        llama_destroy(m);
        return s != ZT_OK ? s
                          : zt_error(ZT_ERR_NOMEM, "%s: out of memory for the tables of %d "
                                     "layers", spec->type, layers);
    }
    m->n_params = zt_llama_lay_out(m->tensors, &m->n_tensors, &d, stage);
    ZT_ASSERT(m->n_tensors == zt_llama_stage_tensors(&d, stage));
    const bool whole = layers == g->L && stage->embed && stage->head && stage->buffers == 1 &&
                       tp == 1;
    ZT_ASSERT(!whole || (m->n_params == est.params && (uint64_t)m->n_tensors == est.n_tensors &&
                         act_bytes == est.activation_bytes));

    s = zt_blocks_model_alloc(m, pad_to, (size_t)pinned, (size_t)act_bytes);
    if (s != ZT_OK) {
        llama_destroy(m);
        return s;
    }
    uint64_t pinned_again = 0;
    ZT_ASSERT(zt_llama_carve(&dl, &shape, g->blk.act_memory, g->blk.pinned, &g->blk, &g->o,
                             &pinned_again, &overflow) == act_bytes &&
              pinned_again == pinned && !overflow);
    set_views(g, &dl);
    if (tp > (int)d.KV) {
        g->kv_w = 2 * (size_t)dl.KVD * (size_t)dl.C;
        g->kv_b = d.qkv_bias ? 2 * (size_t)dl.KVD : 0;
        g->kv_saved = zt_backend_alloc(be, ZT_MEM_DEVICE, (g->kv_w + g->kv_b) * sizeof(float));
        if (!g->kv_saved) {
            llama_destroy(m);
            return zt_error(ZT_ERR_NOMEM, "%s: cannot allocate the shared kv heads' gradient "
                            "buffer", spec->type);
        }
    }
    s = write_rope_tables(g);
    if (s != ZT_OK) {
        llama_destroy(m);
        return s;
    }
    *out = m;
    return ZT_OK;
}
