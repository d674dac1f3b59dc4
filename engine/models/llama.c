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

#include "llama.h"
#include "model_init.h"

typedef struct {
    float *w[LLAMA_N_LAYER_TENSORS]; /* NULL for a bias the spec does not have */
} layer_views;

typedef struct {
    zt_model base;
    int L, C, NH, KV, HD, I, V, maxT;
    int Q, QKV;                 /* n_head·head_dim, and the packed q | k | v row */
    float eps;
    int window;
    float *embed, *norm, *head; /* head is embed when tied */
    float *dembed, *dnorm, *dhead;
    layer_views *lw, *lg;       /* parameter and gradient views per layer */
    unsigned char *act_memory;  /* device memory of act_bytes, carved into la and o */
    size_t act_bytes;
    size_t act_size;            /* bytes per activation element on this backend */
    float *host_losses;         /* [max_batch · block_size] the losses, read back to the host */
    llama_layer_acts *la;
    llama_outer_acts o;
    /* shape of the last forward */
    const int32_t *inputs;
    int B, T;
    int has_grad;
} llama;

uint64_t zt_llama_host_bytes(const llama_dims *d, uint64_t micro_batch) {
    return sizeof(llama) + (d->L + 1) * (2 * sizeof(layer_views) + sizeof(llama_layer_acts)) +
           micro_batch * d->T * sizeof(float);
}

/* The element `n` activations past p. */
static void *act_at(const llama *g, void *p, size_t n) {
    return (unsigned char *)p + n * g->act_size;
}

/* ---- Initialisation ----------------------------------------------------------------------- */

/* Hugging Face's LlamaPreTrainedModel._init_weights: normal(0, initializer_range = 0.02) for
 * linear and embedding weights, zero biases, and ones for the RMSNorm weights (their own
 * initialisation). */
static double init_std(const char *name) {
    const char *dot = strrchr(name, '.');
    if (dot && strcmp(dot, ".bias") == 0)
        return 0.0;
    if (strstr(name, "norm.weight"))
        return -1.0;
    return 0.02;
}

/* Tensors are drawn in flat-buffer order from one stream, a piece at a time through a small
 * host buffer. */
static zt_status llama_init_weights(zt_model *m, uint64_t seed) {
    enum { PIECE = 4096 };
    float host[PIECE];
    uint64_t s = seed ^ 0x6c6c616d61000000ull;
    zt_backend_zero(m->ctx.be, m->params, m->n_params * sizeof(float), ZT_STREAM_COMPUTE);
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        double std = init_std(t->name);
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

/* ---- Forward and backward ----------------------------------------------------------------- */

static zt_attn_shape attn_shape(const llama *g, int B, int T) {
    return (zt_attn_shape){B, T, g->NH, g->KV, g->HD, true, g->window};
}

/* Rotates q and k of the packed rows in place (the backward rotates their gradients back). */
static void rope(const llama *g, const zt_ctx *x, void *qkv, int B, int T, bool backward) {
    const zt_ops *op = x->be->ops;
    void (*f)(const zt_ctx *, void *, const float *, const float *, int, int, int, int, size_t) =
        backward ? op->rope_backward : op->rope_forward;
    f(x, qkv, g->o.rope_cos, g->o.rope_sin, B, T, g->NH, g->HD, (size_t)g->QKV);
    f(x, act_at(g, qkv, (size_t)g->Q), g->o.rope_cos, g->o.rope_sin, B, T, g->KV, g->HD,
      (size_t)g->QKV);
}

static float llama_forward(zt_model *m, const int32_t *inputs, const int32_t *targets, int B,
                           int T, float grad_scale) {
    llama *g = (llama *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, I = g->I, V = g->V, BT = B * T;
    ZT_ASSERT(B >= 1 && B <= m->max_batch && T >= 1 && T <= g->maxT);
    g->inputs = inputs;
    g->B = B;
    g->T = T;
    const zt_attn_shape attn = attn_shape(g, B, T);

    const zt_model_hooks *h = &m->hooks;
    if (h->fetch)
        h->fetch(h->ctx, -1, false);
    op->embedding_forward(x, g->o.encoded, inputs, g->embed, NULL, B, T, C);
    const void *residual = g->o.encoded;
    for (int l = 0; l < g->L; l++) {
        llama_layer_acts *a = &g->la[l];
        float **w = g->lw[l].w;
        if (h->fetch)
            h->fetch(h->ctx, l, false);
        op->rmsnorm_forward(x, a->ln1, a->ln1_rstd, residual, w[LLAMA_IN_NORM], g->eps, BT, C);
        op->linear_forward(x, a->qkv, a->ln1, w[LLAMA_Q_W], w[LLAMA_Q_B], NULL, BT, C, g->QKV,
                           ZT_W_OUT_IN);
        rope(g, x, a->qkv, B, T, false);
        op->attention_forward(x, &attn, a->atty, a->att, a->qkv, NULL, NULL);
        op->linear_forward(x, a->res2, a->atty, w[LLAMA_O_W], w[LLAMA_O_B], residual, BT, g->Q,
                           C, ZT_W_OUT_IN);
        op->rmsnorm_forward(x, a->ln2, a->ln2_rstd, a->res2, w[LLAMA_POST_NORM], g->eps, BT, C);
        op->linear_forward(x, a->gate, a->ln2, w[LLAMA_GATE_W], NULL, NULL, BT, C, I,
                           ZT_W_OUT_IN);
        op->linear_forward(x, a->up, a->ln2, w[LLAMA_UP_W], NULL, NULL, BT, C, I, ZT_W_OUT_IN);
        op->silu_mul_forward(x, a->hmul, a->gate, a->up, (size_t)BT * I);
        op->linear_forward(x, a->res3, a->hmul, w[LLAMA_DOWN_W], NULL, a->res2, BT, I, C,
                           ZT_W_OUT_IN);
        residual = a->res3;
        if (h->release)
            h->release(h->ctx, l);
    }
    op->rmsnorm_forward(x, g->o.lnf, g->o.lnf_rstd, residual, g->norm, g->eps, BT, C);
    op->linear_forward(x, g->o.logits, g->o.lnf, g->head, NULL, NULL, BT, C, V, ZT_W_OUT_IN);

    g->has_grad = targets && grad_scale != 0.0f;
    if (!g->has_grad && h->release)
        h->release(h->ctx, -1);
    if (!targets)
        return 0.0f;
    op->softmax_xent(x, g->o.losses, g->o.logits, targets, BT, V, grad_scale);
    zt_backend_copy(m->ctx.be, g->host_losses, g->o.losses, (size_t)BT * sizeof(float),
                    ZT_COPY_D2H, ZT_STREAM_COMPUTE);
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

static void llama_backward(zt_model *m) {
    llama *g = (llama *)m;
    const zt_ops *op = m->ctx.be->ops;
    const zt_ctx *x = &m->ctx;
    const int C = g->C, I = g->I, V = g->V, B = g->B, T = g->T, BT = B * T;
    ZT_ASSERT(g->has_grad);
    g->has_grad = 0;
    const zt_attn_shape attn = attn_shape(g, B, T);
    llama_outer_acts *o = &g->o;

    const void *last = g->L > 0 ? g->la[g->L - 1].res3 : o->encoded;
    op->linear_backward(x, o->dln, g->dhead, NULL, o->logits, o->lnf, g->head, BT, C, V,
                        ZT_W_OUT_IN, false);
    zt_backend_zero(m->ctx.be, o->dres, g->act_size * (size_t)BT * C, ZT_STREAM_COMPUTE);
    op->rmsnorm_backward(x, o->dres, g->dnorm, o->dln, last, g->norm, o->lnf_rstd, BT, C);
    const zt_model_hooks *h = &m->hooks;
    for (int l = g->L - 1; l >= 0; l--) {
        llama_layer_acts *a = &g->la[l];
        float **w = g->lw[l].w, **dw = g->lg[l].w;
        const void *residual = l == 0 ? o->encoded : g->la[l - 1].res3;
        if (h->fetch)
            h->fetch(h->ctx, l, true);
        /* dres holds the gradient of this layer's output; the MLP branch adds into it. */
        op->linear_backward(x, o->dh, dw[LLAMA_DOWN_W], NULL, o->dres, a->hmul, w[LLAMA_DOWN_W],
                            BT, I, C, ZT_W_OUT_IN, false);
        op->silu_mul_backward(x, o->dh, o->dup, o->dh, a->gate, a->up, (size_t)BT * I);
        op->linear_backward(x, o->dln, dw[LLAMA_GATE_W], NULL, o->dh, a->ln2, w[LLAMA_GATE_W],
                            BT, C, I, ZT_W_OUT_IN, false);
        op->linear_backward(x, o->dln, dw[LLAMA_UP_W], NULL, o->dup, a->ln2, w[LLAMA_UP_W], BT, C,
                            I, ZT_W_OUT_IN, true);
        op->rmsnorm_backward(x, o->dres, dw[LLAMA_POST_NORM], o->dln, a->res2,
                             w[LLAMA_POST_NORM], a->ln2_rstd, BT, C);
        /* dres now holds the gradient of res2; the attention branch adds into it. */
        op->linear_backward(x, o->datty, dw[LLAMA_O_W], dw[LLAMA_O_B], o->dres, a->atty,
                            w[LLAMA_O_W], BT, g->Q, C, ZT_W_OUT_IN, false);
        op->attention_backward(x, &attn, o->dqkv, NULL, NULL, o->datt, o->datty, a->qkv, NULL,
                               NULL, a->att);
        rope(g, x, o->dqkv, B, T, true);
        op->linear_backward(x, o->dln, dw[LLAMA_Q_W], dw[LLAMA_Q_B], o->dqkv, a->ln1,
                            w[LLAMA_Q_W], BT, C, g->QKV, ZT_W_OUT_IN, false);
        op->rmsnorm_backward(x, o->dres, dw[LLAMA_IN_NORM], o->dln, residual, w[LLAMA_IN_NORM],
                             a->ln1_rstd, BT, C);
        if (h->grads_ready)
            h->grads_ready(h->ctx, l);
        if (h->release)
            h->release(h->ctx, l);
    }
    op->embedding_backward(x, g->dembed, NULL, o->dres, g->inputs, B, T, C);
    if (h->grads_ready)
        h->grads_ready(h->ctx, -1);
    if (h->release)
        h->release(h->ctx, -1);
}

/* Sampling reads logits as fp32: it runs with fp32 activations. */
static void llama_logits(const zt_model *m, size_t row, size_t rows, float *dst) {
    zt_model_copy_logits(m, ((const llama *)m)->o.logits, row, rows, dst);
}

/* As GPT-2's count (DeepSpeedExamples' without activation checkpointing): 2·3 FLOPs per
 * parameter and token for the dense layers, and 2·2·3 per layer, query width and position for
 * attention's two T×T products, whose width is n_head·head_dim here (which need not be n_embd).
 * Every parameter counts, an untied head and the embedding both. */
static double llama_flops_per_token(const zt_model *m) {
    const llama *g = (const llama *)m;
    return 6.0 * (double)m->n_params + 12.0 * g->L * (double)g->Q * g->maxT;
}

static void llama_destroy(zt_model *m) {
    llama *g = (llama *)m;
    zt_model_free_flat(m);
    free(m->tensors);
    free(g->lw);
    free(g->lg);
    free(g->la);
    zt_backend_free(m->ctx.be, ZT_MEM_DEVICE, g->act_memory, g->act_bytes);
    free(g->host_losses);
    free(g);
}

static const zt_model_ops llama_ops = {
    .init_weights = llama_init_weights,
    .forward = llama_forward,
    .backward = llama_backward,
    .logits = llama_logits,
    .flops_per_token = llama_flops_per_token,
    .destroy = llama_destroy,
};

/* ---- Creation ------------------------------------------------------------------------------- */

static void add_tensor(zt_model *m, const char *name, size_t *offset, int ndim,
                       const int64_t shape[2], int layer) {
    zt_tensor_info *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *offset;
    t->ndim = ndim;
    t->shape[0] = shape[0];
    t->shape[1] = ndim == 2 ? shape[1] : 0;
    t->numel = (size_t)shape[0] * (ndim == 2 ? (size_t)shape[1] : 1);
    t->layer = layer;
    *offset += t->numel;
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

/* Lays out the tensors in flat-buffer order: the embedding, each layer, the final norm, then an
 * untied head. */
static void lay_out_tensors(zt_model *m, const llama_dims *d) {
    size_t off = 0;
    const int64_t table[2] = {(int64_t)d->V, (int64_t)d->C}, norm[2] = {(int64_t)d->C, 0};
    add_tensor(m, "model.embed_tokens.weight", &off, 2, table, -1);
    for (int l = 0; l < (int)d->L; l++) {
        for (int i = 0; i < LLAMA_N_LAYER_TENSORS; i++) {
            int64_t shape[2];
            int ndim = zt_llama_layer_shape(d, i, shape);
            if (shape[0] == 0)
                continue;
            char name[64];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, zt_llama_layer_names[i]);
            add_tensor(m, name, &off, ndim, shape, l);
        }
    }
    add_tensor(m, "model.norm.weight", &off, 1, norm, -1);
    if (!d->tied)
        add_tensor(m, "lm_head.weight", &off, 2, table, -1);
    m->n_params = off;
}

/* Points the views at the flat buffers, tensor by tensor in lay_out_tensors' order. */
static void set_views(llama *g, const llama_dims *d) {
    zt_model *m = &g->base;
    const zt_tensor_info *t = m->tensors;
    g->embed = m->params + t->offset;
    g->dembed = m->grads + t->offset;
    t++;
    for (int l = 0; l < g->L; l++) {
        for (int i = 0; i < LLAMA_N_LAYER_TENSORS; i++) {
            if (zt_llama_layer_numel(d, i) == 0)
                continue;
            g->lw[l].w[i] = m->params + t->offset;
            g->lg[l].w[i] = m->grads + t->offset;
            t++;
        }
    }
    g->norm = m->params + t->offset;
    g->dnorm = m->grads + t->offset;
    t++;
    g->head = d->tied ? g->embed : m->params + t->offset;
    g->dhead = d->tied ? g->dembed : m->grads + t->offset;
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
    /* The estimate is the check that every size below fits: nothing is computed in a type it
     * could overflow once it has passed. */
    zt_model_estimate est;
    ZT_TRY(zt_model_check_create(spec, be, act, max_batch, &est));
    const size_t act_size = zt_backend_act_size(be, act);
    const llama_dims d = zt_llama_dims(spec);
    llama *g = calloc(1, sizeof *g);
    if (!g)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", spec->type);
    zt_model *m = &g->base;
    m->ops = &llama_ops;
    m->ctx = (zt_ctx){be, act};
    g->act_size = act_size;
    m->spec = *spec;
    m->max_batch = max_batch;
    m->n_layer = spec->n_layer;
    m->stage = *stage;
    ZT_ASSERT(stage->first_layer == 0 && stage->last_layer == spec->n_layer && stage->embed &&
              stage->head && stage->buffers == 1);
    g->L = (int)d.L;
    g->C = (int)d.C;
    g->NH = (int)d.NH;
    g->KV = (int)d.KV;
    g->HD = (int)d.HD;
    g->I = (int)d.I;
    g->V = (int)d.V;
    g->maxT = (int)d.T;
    g->Q = (int)d.Q;
    g->QKV = (int)d.QKV;
    g->eps = (float)spec->rms_norm_eps;
    g->window = spec->sliding_window;

    m->tensors = calloc(est.n_tensors, sizeof *m->tensors);
    g->lw = calloc((size_t)g->L + 1, sizeof *g->lw);
    g->lg = calloc((size_t)g->L + 1, sizeof *g->lg);
    g->la = calloc((size_t)g->L + 1, sizeof *g->la);
    if (!m->tensors || !g->lw || !g->lg || !g->la) {
        llama_destroy(m);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the tables of %d layers", spec->type,
                        g->L);
    }
    lay_out_tensors(m, &d);
    ZT_ASSERT(m->n_params == est.params && (uint64_t)m->n_tensors == est.n_tensors);

    zt_status s = zt_model_alloc_flat(m, pad_to);
    if (s != ZT_OK) {
        llama_destroy(m);
        return s;
    }
    g->act_bytes = est.activation_bytes ? (size_t)est.activation_bytes : 1;
    g->act_memory = zt_backend_alloc(be, ZT_MEM_DEVICE, g->act_bytes);
    g->host_losses = malloc((size_t)max_batch * g->maxT * sizeof(float));
    if (!g->act_memory || !g->host_losses) {
        llama_destroy(m);
        return zt_error(ZT_ERR_NOMEM,
                        "%s: cannot allocate %zu parameters and %llu bytes of activations",
                        spec->type, m->n_params, (unsigned long long)est.activation_bytes);
    }
    /* Written once now, so the activations' memory is taken at creation: a batch that does not
     * fit fails here rather than in the first forward. */
    zt_backend_zero(be, g->act_memory, g->act_bytes, ZT_STREAM_COMPUTE);
    bool overflow = false;
    ZT_ASSERT(zt_llama_carve(&d, (uint64_t)max_batch, act_size, g->act_memory, g->la, &g->o,
                             &overflow) == est.activation_bytes &&
              !overflow);
    set_views(g, &d);
    s = write_rope_tables(g);
    if (s != ZT_OK) {
        llama_destroy(m);
        return s;
    }
    *out = m;
    return ZT_OK;
}
