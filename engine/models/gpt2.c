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

#include "model_init.h"
#include "carve.h"
#include "size_math.h"
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

/* Activations saved by the forward for the backward, per layer unless noted. `void *` ones are
 * activations, stored as the backend stores them (zt_backend_act_size); `float *` ones are fp32
 * statistics (ops.h). */
typedef struct {
    void *encoded;             /* [B,T,C] the residual stream entering layer 0 */
    void *ln1;
    float *ln1_mean, *ln1_rstd;
    void *qkv;                 /* [B,T,3C] */
    void *atty;                /* [B,T,C] attention output before the projection */
    float *att;                /* [B,NH,T,T] softmax probabilities */
    void *res2;                /* [B,T,C] residual after attention */
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *fch, *fch_gelu;      /* [B,T,4C] */
    void *res3;                /* [B,T,C] residual after the MLP (the layer's output) */
} layer_acts;

typedef struct {
    zt_model base;
    int L, C, NH, V, maxT;
    float *wte, *wpe, *lnf_w, *lnf_b;
    float *dwte, *dwpe, *dlnf_w, *dlnf_b;
    layer_views *lw, *lg;      /* parameter and gradient views per layer */
    unsigned char *act_memory; /* device memory of act_bytes, carved into the buffers below */
    size_t act_bytes;
    size_t act_size;           /* bytes per activation element on this backend */
    float *host_losses;        /* [max_batch · block_size] the losses, read back to the host */
    layer_acts *la;
    void *lnf;                          /* [B,T,C] */
    float *lnf_mean, *lnf_rstd;         /* [B,T] */
    void *logits;                       /* [B,T,V], the gradient in place after a training forward */
    float *losses;                      /* [B,T] */
    /* backward scratch, reused across layers (datt is fp32 work space) */
    void *dres, *dln, *datty, *dqkv, *dfch;
    float *datt;
    /* shape of the last forward */
    const int32_t *inputs;
    int B, T;
    int has_grad;
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

static void add_tensor(zt_model *m, const char *name, size_t *offset, int ndim, int64_t d0,
                       int64_t d1, int layer) {
    zt_tensor_info *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *offset;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->numel = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1);
    t->layer = layer;
    *offset += t->numel;
}

/* What a tensor starts as: GPT-2's normal(0, 0.02), the residual projections' 0.02/sqrt(2L),
 * ones for norm weights, zeros for biases. */
static double init_std(const gpt2 *g, const char *name) {
    const char *dot = strrchr(name, '.');
    if (dot && strcmp(dot, ".bias") == 0)
        return 0.0;
    if (strstr(name, "ln_"))
        return -1.0;
    if (strstr(name, "c_proj.weight"))
        return 0.02 / sqrt(2.0 * g->L);
    return 0.02;
}

/* Tensors are drawn in flat-buffer order from one stream (wte, wpe, then each layer's weights),
 * into a small host buffer a piece at a time, and copied to the device. */
static zt_status gpt2_init_weights(zt_model *m, uint64_t seed) {
    gpt2 *g = (gpt2 *)m;
    enum { PIECE = 4096 };
    float host[PIECE];
    uint64_t s = seed ^ 0x6770743200000000ull;
    zt_backend_zero(m->ctx.be, m->params, m->n_params * sizeof(float), ZT_STREAM_COMPUTE);
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        double std = init_std(g, t->name);
        for (size_t at = 0; std != 0.0 && at < t->numel; at += PIECE) {
            size_t n = t->numel - at < PIECE ? t->numel - at : PIECE;
            if (std > 0.0)
                zt_init_fill_normal(host, n, std, &s);
            else
                for (size_t j = 0; j < n; j++)
                    host[j] = 1.0f;
            zt_model_set_params(m, t->offset + at, host, n);
        }
    }
    return ZT_OK;
}

static float gpt2_forward(zt_model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                          float grad_scale) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, NH = g->NH, V = g->V, BT = B * T;
    ZT_ASSERT(B >= 1 && B <= m->max_batch && T >= 1 && T <= g->maxT);
    g->inputs = inputs;
    g->B = B;
    g->T = T;
    const zt_attn_shape attn = {B, T, NH, NH, C / NH, true, 0};

    const zt_model_hooks *h = &m->hooks;
    if (h->fetch)
        h->fetch(h->ctx, -1, false);
    op->embedding_forward(x, g->la[0].encoded, inputs, g->wte, g->wpe, B, T, C);
    const void *residual = g->la[0].encoded;
    for (int l = 0; l < g->L; l++) {
        layer_acts *a = &g->la[l];
        float **w = g->lw[l].w;
        if (h->fetch)
            h->fetch(h->ctx, l, false);
        op->layernorm_forward(x, a->ln1, a->ln1_mean, a->ln1_rstd, residual, w[LN1_W], w[LN1_B],
                              BT, C);
        op->linear_forward(x, a->qkv, a->ln1, w[QKV_W], w[QKV_B], NULL, BT, C, 3 * C, ZT_W_IN_OUT);
        op->attention_forward(x, &attn, a->atty, a->att, a->qkv, NULL, NULL);
        op->linear_forward(x, a->res2, a->atty, w[PROJ_W], w[PROJ_B], residual, BT, C, C,
                           ZT_W_IN_OUT);
        op->layernorm_forward(x, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[LN2_W], w[LN2_B],
                              BT, C);
        op->linear_forward(x, a->fch, a->ln2, w[FC_W], w[FC_B], NULL, BT, C, 4 * C, ZT_W_IN_OUT);
        op->gelu_forward(x, a->fch_gelu, a->fch, (size_t)BT * 4 * C);
        op->linear_forward(x, a->res3, a->fch_gelu, w[FCPROJ_W], w[FCPROJ_B], a->res2, BT, 4 * C,
                           C, ZT_W_IN_OUT);
        residual = a->res3;
        if (h->release)
            h->release(h->ctx, l);
    }
    op->layernorm_forward(x, g->lnf, g->lnf_mean, g->lnf_rstd, residual, g->lnf_w, g->lnf_b, BT, C);
    op->linear_forward(x, g->logits, g->lnf, g->wte, NULL, NULL, BT, C, V, ZT_W_OUT_IN);

    g->has_grad = targets && grad_scale != 0.0f;
    if (!g->has_grad && h->release)
        h->release(h->ctx, -1);
    if (!targets)
        return 0.0f;
    op->softmax_xent(x, g->losses, g->logits, targets, BT, V, grad_scale);
    zt_backend_copy(m->ctx.be, g->host_losses, g->losses, (size_t)BT * sizeof(float), ZT_COPY_D2H,
                    ZT_STREAM_COMPUTE);
    double sum = 0.0;
    int counted = 0;
    for (int i = 0; i < BT; i++) {
        if (targets[i] >= 0) {
            sum += g->host_losses[i];
            counted++;
        }
    }
    return counted ? (float)(sum / counted) : 0.0f;
}

static void gpt2_backward(zt_model *m) {
    gpt2 *g = (gpt2 *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, NH = g->NH, V = g->V, B = g->B, T = g->T, BT = B * T;
    ZT_ASSERT(g->has_grad);
    g->has_grad = 0;
    const zt_attn_shape attn = {B, T, NH, NH, C / NH, true, 0};

    const void *last = g->L > 0 ? g->la[g->L - 1].res3 : g->la[0].encoded;
    op->linear_backward(x, g->dln, g->dwte, NULL, g->logits, g->lnf, g->wte, BT, C, V,
                        ZT_W_OUT_IN, false);
    zt_backend_zero(m->ctx.be, g->dres, g->act_size * (size_t)BT * C, ZT_STREAM_COMPUTE);
    op->layernorm_backward(x, g->dres, g->dlnf_w, g->dlnf_b, g->dln, last, g->lnf_w, g->lnf_mean,
                           g->lnf_rstd, BT, C);
    const zt_model_hooks *h = &m->hooks;
    for (int l = g->L - 1; l >= 0; l--) {
        layer_acts *a = &g->la[l];
        float **w = g->lw[l].w, **dw = g->lg[l].w;
        const void *residual = l == 0 ? g->la[0].encoded : g->la[l - 1].res3;
        if (h->fetch)
            h->fetch(h->ctx, l, true);
        /* dres holds the gradient of this layer's output; the MLP branch adds into it. */
        op->linear_backward(x, g->dfch, dw[FCPROJ_W], dw[FCPROJ_B], g->dres, a->fch_gelu,
                            w[FCPROJ_W], BT, 4 * C, C, ZT_W_IN_OUT, false);
        op->gelu_backward(x, g->dfch, a->fch, g->dfch, (size_t)BT * 4 * C);
        op->linear_backward(x, g->dln, dw[FC_W], dw[FC_B], g->dfch, a->ln2, w[FC_W], BT, C, 4 * C,
                            ZT_W_IN_OUT, false);
        op->layernorm_backward(x, g->dres, dw[LN2_W], dw[LN2_B], g->dln, a->res2, w[LN2_W],
                               a->ln2_mean, a->ln2_rstd, BT, C);
        /* dres now holds the gradient of res2; the attention branch adds into it. */
        op->linear_backward(x, g->datty, dw[PROJ_W], dw[PROJ_B], g->dres, a->atty, w[PROJ_W], BT,
                            C, C, ZT_W_IN_OUT, false);
        op->attention_backward(x, &attn, g->dqkv, NULL, NULL, g->datt, g->datty, a->qkv, NULL,
                               NULL, a->att);
        op->linear_backward(x, g->dln, dw[QKV_W], dw[QKV_B], g->dqkv, a->ln1, w[QKV_W], BT, C,
                            3 * C, ZT_W_IN_OUT, false);
        op->layernorm_backward(x, g->dres, dw[LN1_W], dw[LN1_B], g->dln, residual, w[LN1_W],
                               a->ln1_mean, a->ln1_rstd, BT, C);
        if (h->grads_ready)
            h->grads_ready(h->ctx, l);
        if (h->release)
            h->release(h->ctx, l);
    }
    op->embedding_backward(x, g->dwte, g->dwpe, g->dres, g->inputs, B, T, C);
    if (h->grads_ready)
        h->grads_ready(h->ctx, -1);
    if (h->release)
        h->release(h->ctx, -1);
}

/* Sampling reads logits as fp32: it runs with fp32 activations. */
static void gpt2_logits(const zt_model *m, size_t row, size_t rows, float *dst) {
    zt_model_copy_logits(m, ((const gpt2 *)m)->logits, row, rows, dst);
}

/* DeepSpeedExamples' count without activation checkpointing (coefficient 3): per token,
 * 2·3·params for the dense layers and 2·2·3·layers·hidden·seq for attention's two T×T products. */
static double gpt2_flops_per_token(const zt_model *m) {
    const gpt2 *g = (const gpt2 *)m;
    return 6.0 * (double)m->n_params + 12.0 * g->L * (double)g->C * g->maxT;
}

static void gpt2_destroy(zt_model *m) {
    gpt2 *g = (gpt2 *)m;
    zt_model_free_flat(m);
    free(m->tensors);
    free(g->lw);
    free(g->lg);
    free(g->la);
    zt_backend_free(m->ctx.be, ZT_MEM_DEVICE, g->act_memory, g->act_bytes);
    free(g->host_losses);
    free(g);
}

static const zt_model_ops gpt2_ops = {
    .init_weights = gpt2_init_weights,
    .forward = gpt2_forward,
    .backward = gpt2_backward,
    .logits = gpt2_logits,
    .flops_per_token = gpt2_flops_per_token,
    .destroy = gpt2_destroy,
};

/* The dimensions activations are carved for: B sequences of T tokens, activation elements of es
 * bytes, statistics of 4. */
typedef struct {
    uint64_t B, T, C, NH, V, L, es;
} act_dims;

static void carve_layer(zt_carver *c, const act_dims *d, layer_acts *a) {
    const uint64_t BT = d->B * d->T, C = d->C, es = d->es, F32 = sizeof(float);
    bool *ov = &c->overflow;
    const uint64_t att = zt_u64_mul(zt_u64_mul(d->B, d->NH, ov), zt_u64_mul(d->T, d->T, ov), ov);
    a->ln1 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
    a->ln1_mean = zt_carve(c, BT, F32);
    a->ln1_rstd = zt_carve(c, BT, F32);
    a->qkv = zt_carve(c, zt_u64_mul(BT, 3 * C, ov), es);
    a->atty = zt_carve(c, zt_u64_mul(BT, C, ov), es);
    a->att = zt_carve(c, att, F32);
    a->res2 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
    a->ln2 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
    a->ln2_mean = zt_carve(c, BT, F32);
    a->ln2_rstd = zt_carve(c, BT, F32);
    a->fch = zt_carve(c, zt_u64_mul(BT, 4 * C, ov), es);
    a->fch_gelu = zt_carve(c, zt_u64_mul(BT, 4 * C, ov), es);
    a->res3 = zt_carve(c, zt_u64_mul(BT, C, ov), es);
}

/* Carves g's buffers out of base (its layer_acts included), or with base NULL and g NULL counts
 * the bytes: the one function that both sizes and lays out the activations, so the estimate is
 * the allocation. A count walks one layer and multiplies, so a spec of a billion layers is sized
 * at once. Returns the bytes, or UINT64_MAX with *overflow set. */
static uint64_t carve_activations(const act_dims *d, gpt2 *g, unsigned char *base, bool *overflow) {
    zt_carver c = {.base = base};
    bool *ov = &c.overflow;
    /* B·T fits an int (gpt2_estimate checks), so BT times a 64-bit C is the first product that
     * can overflow, and zt_carve() checks it. */
    const uint64_t BT = d->B * d->T, C = d->C, NH = d->NH, es = d->es, F32 = sizeof(float);
    const uint64_t BTC = zt_u64_mul(BT, C, ov);
    const uint64_t att = zt_u64_mul(zt_u64_mul(d->B, NH, ov), zt_u64_mul(d->T, d->T, ov), ov);
    layer_acts scratch;
    void *encoded = zt_carve(&c, BTC, es);
    if (base) {
        for (uint64_t l = 0; l < d->L; l++) {
            carve_layer(&c, d, &g->la[l]);
            g->la[l].encoded = encoded;
        }
        if (d->L == 0)
            g->la[0].encoded = encoded;
    } else if (d->L > 0) {
        uint64_t before = c.off;
        carve_layer(&c, d, &scratch);
        c.off = zt_u64_add(before, zt_u64_mul(c.off - before, d->L, ov), ov);
    }
    /* A count writes the final buffers' (NULL) pointers into a throwaway. */
    gpt2 none;
    gpt2 *o = base ? g : &none;
    o->lnf = zt_carve(&c, BTC, es);
    o->lnf_mean = zt_carve(&c, BT, F32);
    o->lnf_rstd = zt_carve(&c, BT, F32);
    o->logits = zt_carve(&c, zt_u64_mul(BT, d->V, ov), es);
    o->losses = zt_carve(&c, BT, F32);
    o->dres = zt_carve(&c, BTC, es);
    o->dln = zt_carve(&c, BTC, es);
    o->datty = zt_carve(&c, BTC, es);
    o->dqkv = zt_carve(&c, zt_u64_mul(BT, 3 * C, ov), es);
    o->dfch = zt_carve(&c, zt_u64_mul(BT, 4 * C, ov), es);
    o->datt = zt_carve(&c, att, F32);
    *overflow |= c.overflow;
    return c.off;
}

static act_dims dims_of(const zt_model_spec *s, int micro_batch, size_t act_size) {
    return (act_dims){(uint64_t)micro_batch, (uint64_t)s->block_size, (uint64_t)s->n_embd,
                      (uint64_t)s->n_head, (uint64_t)s->vocab_size, (uint64_t)s->n_layer,
                      (uint64_t)act_size};
}

static zt_status gpt2_create(zt_model **out, const zt_model_spec *spec, zt_backend *be,
                             zt_dtype act, int max_batch, size_t pad_to,
                             const zt_model_stage *stage) {
    /* The estimate is the check that every size below fits: nothing is computed in a type it
     * could overflow once it has passed. */
    zt_model_estimate est;
    ZT_TRY(zt_model_check_create(spec, be, act, max_batch, &est));
    const size_t act_size = zt_backend_act_size(be, act);
    gpt2 *g = calloc(1, sizeof *g);
    if (!g)
        return zt_error(ZT_ERR_NOMEM, "gpt2: out of memory");
    zt_model *m = &g->base;
    m->ops = &gpt2_ops;
    m->ctx = (zt_ctx){be, act};
    g->act_size = act_size;
    m->spec = *spec;
    m->max_batch = max_batch;
    m->n_layer = spec->n_layer;
    m->stage = *stage;
    ZT_ASSERT(stage->first_layer == 0 && stage->last_layer == spec->n_layer && stage->embed &&
              stage->head && stage->buffers == 1);
    g->L = spec->n_layer;
    g->C = spec->n_embd;
    g->NH = spec->n_head;
    g->V = spec->vocab_size;
    g->maxT = spec->block_size;
    const int C = g->C;

    m->tensors = calloc(est.n_tensors, sizeof *m->tensors);
    g->lw = calloc((size_t)g->L + 1, sizeof *g->lw);
    g->lg = calloc((size_t)g->L + 1, sizeof *g->lg);
    g->la = calloc((size_t)g->L + 1, sizeof *g->la);
    if (!m->tensors || !g->lw || !g->lg || !g->la) {
        gpt2_destroy(m);
        return zt_error(ZT_ERR_NOMEM, "gpt2: out of memory for the tables of %d layers", g->L);
    }
    size_t off = 0;
    add_tensor(m, "wte.weight", &off, 2, g->V, C, -1);
    add_tensor(m, "wpe.weight", &off, 2, g->maxT, C, -1);
    for (int l = 0; l < g->L; l++) {
        for (int i = 0; i < N_LAYER_TENSORS; i++) {
            char name[64];
            int ndim;
            int64_t shape[2];
            snprintf(name, sizeof name, "h.%d.%s", l, layer_tensor_names[i]);
            layer_tensor_shape(i, C, &ndim, shape);
            add_tensor(m, name, &off, ndim, shape[0], shape[1], l);
        }
    }
    add_tensor(m, "ln_f.weight", &off, 1, C, 0, -1);
    add_tensor(m, "ln_f.bias", &off, 1, C, 0, -1);
    m->n_params = off;
    ZT_ASSERT(m->n_params == est.params && (uint64_t)m->n_tensors == est.n_tensors);

    zt_status s = zt_model_alloc_flat(m, pad_to);
    if (s != ZT_OK) {
        gpt2_destroy(m);
        return s;
    }
    g->act_bytes = est.activation_bytes ? (size_t)est.activation_bytes : 1;
    g->act_memory = zt_backend_alloc(be, ZT_MEM_DEVICE, g->act_bytes);
    g->host_losses = malloc((size_t)max_batch * g->maxT * sizeof(float));
    if (!g->act_memory || !g->host_losses) {
        gpt2_destroy(m);
        return zt_error(ZT_ERR_NOMEM,
                        "gpt2: cannot allocate %zu parameters and %llu bytes of activations",
                        m->n_params, (unsigned long long)est.activation_bytes);
    }
    /* Written once now, so the activations' memory is taken at creation: a batch that does not
     * fit fails here rather than in the first forward. */
    zt_backend_zero(be, g->act_memory, g->act_bytes, ZT_STREAM_COMPUTE);
    act_dims dims = dims_of(spec, max_batch, act_size);
    bool overflow = false;
    ZT_ASSERT(carve_activations(&dims, g, g->act_memory, &overflow) == est.activation_bytes &&
              !overflow);

    const zt_tensor_info *t = m->tensors;
    g->wte = m->params + t[0].offset;
    g->dwte = m->grads + t[0].offset;
    g->wpe = m->params + t[1].offset;
    g->dwpe = m->grads + t[1].offset;
    for (int l = 0; l < g->L; l++) {
        for (int i = 0; i < N_LAYER_TENSORS; i++) {
            size_t o = t[2 + l * N_LAYER_TENSORS + i].offset;
            g->lw[l].w[i] = m->params + o;
            g->lg[l].w[i] = m->grads + o;
        }
    }
    size_t lnf = t[m->n_tensors - 2].offset, lnfb = t[m->n_tensors - 1].offset;
    g->lnf_w = m->params + lnf;
    g->lnf_b = m->params + lnfb;
    g->dlnf_w = m->grads + lnf;
    g->dlnf_b = m->grads + lnfb;
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
    const uint64_t L = (uint64_t)s->n_layer, C = (uint64_t)s->n_embd;
    const uint64_t outer[] = {(uint64_t)s->vocab_size * C, (uint64_t)s->block_size * C, C, C};
    bool ov = false;
    uint64_t layer = 0, layer_small = 0, outer_n = 0, outer_small = 0;
    /* Products of two ints and sums of a few: they fit 64 bits without a check. */
    for (int i = 0; i < N_LAYER_TENSORS; i++) {
        uint64_t n = layer_tensor_numel(i, C);
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
    act_dims d = dims_of(s, a->micro_batch, a->act_size);
    uint64_t act = carve_activations(&d, NULL, NULL, &ov);
    if (ov)
        return zt_error(ZT_ERR_INVALID, "%s: the activations of a micro-batch of %d sequences of "
                        "model.block_size %d (model.n_embd %d, model.n_head %d, model.n_layer %d, "
                        "model.vocab_size %d) are more than a 64-bit size can hold", source,
                        a->micro_batch, s->block_size, s->n_embd, s->n_head, s->n_layer,
                        s->vocab_size);
    const uint64_t n_tensors = L * N_LAYER_TENSORS + 4;
    *out = (zt_model_estimate){
        .params = params,
        .layer_params = layer,
        .outer_params = outer_n,
        .persistent_params = outer_small + L * layer_small,
        .n_tensors = n_tensors,
        .n_layer = s->n_layer,
        .activation_bytes = act,
        .host_bytes = sizeof(gpt2) + n_tensors * sizeof(zt_tensor_info) +
                      (L + 1) * (2 * sizeof(layer_views) + sizeof(layer_acts)) +
                      tokens * sizeof(float),
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
