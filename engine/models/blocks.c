/* The blocks of a model run as a pipeline stage, with activation sets per micro-batch and
 * activation checkpointing (blocks.h): the part of the forward and backward that every family
 * shares, and the shared creation helpers (tensor tables, stage-aware initialisation). */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "blocks.h"
#include "model_init.h"
#include "ztrain/size_math.h"

void zt_blocks_checkpointing(const zt_model_spec *spec, zt_blocks_shape *s) {
    s->interval = spec->checkpoint_interval > 0 ? (uint64_t)spec->checkpoint_interval : 0;
    s->cpu = s->interval > 0 && spec->checkpoint_cpu;
}

static uint64_t groups_of(const zt_blocks_shape *s) {
    if (!s->interval || s->layers == 0)
        return 1;
    return (s->layers + s->interval - 1) / s->interval;
}

static uint64_t slots_of(const zt_blocks_shape *s) {
    if (!s->interval)
        return s->buffers * s->layers;
    return s->interval < s->layers ? s->interval : s->layers;
}

void zt_blocks_carve(zt_blocks *k, const zt_blocks_shape *s, const zt_block_ops *ops,
                     const void *dims, zt_carver *dev, zt_carver *host) {
    bool *ov = &dev->overflow;
    const uint64_t BT = zt_u64_mul(s->B, s->T, ov), BTC = zt_u64_mul(BT, s->C, ov);
    const uint64_t F32 = sizeof(float), groups = groups_of(s), slots = slots_of(s);
    if (k) {
        for (uint64_t i = 0; i < slots; i++)
            ops->carve(dev, dims, k->acts + i * ops->acts_size);
    } else if (slots > 0) {
        /* Every slot carves the same sizes, each rounded whole, so one walk times the count is
         * the sum; a spec of a billion layers is sized at once. */
        _Alignas(64) unsigned char scratch[512];
        ZT_ASSERT(ops->acts_size <= sizeof scratch);
        uint64_t before = dev->off;
        ops->carve(dev, dims, scratch);
        dev->off = zt_u64_add(before, zt_u64_mul(dev->off - before, slots, ov), ov);
    }
    /* A group's kept input: device memory, or pinned host memory and one device copy in use. */
    zt_carver *keep = s->cpu ? host : dev;
    const uint64_t kept = zt_u64_mul(s->buffers, groups, ov);
    if (k) {
        for (uint64_t i = 0; i < kept; i++)
            k->inputs[i] = zt_carve(keep, BTC, s->es);
    } else {
        uint64_t before = keep->off;
        zt_carve(keep, BTC, s->es);
        keep->off = zt_u64_add(before, zt_u64_mul(keep->off - before, kept, &keep->overflow),
                               &keep->overflow);
    }
    void *work = s->cpu ? zt_carve(dev, BTC, s->es) : NULL;
    if (k)
        k->work_in = work;
    for (uint64_t b = 0; s->head && b < s->buffers; b++) {
        zt_head_acts none, *h = k ? &k->head[b] : &none;
        h->lnf = zt_carve(dev, BTC, s->es);
        h->lnf_mean = s->norm_mean ? zt_carve(dev, BT, F32) : NULL;
        h->lnf_rstd = zt_carve(dev, BT, F32);
        h->logits = zt_carve(dev, zt_u64_mul(BT, s->V, ov), s->es);
        h->losses = zt_carve(dev, BT, F32);
    }
    void *dres = zt_carve(dev, BTC, s->es);
    if (k)
        k->dres = dres;
}

zt_status zt_blocks_init(zt_blocks *k, const zt_blocks_shape *s, const zt_block_ops *ops,
                         const char *type) {
    *k = (zt_blocks){.ops = ops, .shape = *s, .groups = groups_of(s), .slots = slots_of(s)};
    const size_t nb = (size_t)s->buffers, tokens = (size_t)(s->B * s->T);
    k->acts = calloc(k->slots ? (size_t)k->slots : 1, ops->acts_size);
    k->inputs = calloc(nb * (size_t)k->groups, sizeof *k->inputs);
    k->head = calloc(nb, sizeof *k->head);
    k->B = calloc(nb, sizeof *k->B);
    k->T = calloc(nb, sizeof *k->T);
    k->has_grad = calloc(nb, sizeof *k->has_grad);
    k->tokens = calloc(nb * tokens, sizeof *k->tokens);
    k->host_losses = calloc(tokens, sizeof *k->host_losses);
    if (!k->acts || !k->inputs || !k->head || !k->B || !k->T || !k->has_grad || !k->tokens ||
        !k->host_losses)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the tables of %llu activation sets",
                        type, (unsigned long long)s->buffers);
    return ZT_OK;
}

zt_status zt_blocks_init_tp(zt_blocks *k, zt_model *m) {
    if (!zt_tp_on(m))
        return ZT_OK;
    const size_t rows = (size_t)(k->shape.B * k->shape.T);
    k->tp_tokens = calloc(rows, sizeof *k->tp_tokens);
    if (!k->tp_tokens)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", m->spec.type);
    return k->shape.head ? zt_tp_xent_init(&k->xent, m, rows) : ZT_OK;
}

void zt_blocks_model_setup(zt_model *m, const zt_model_ops *ops, zt_blocks *k,
                           const zt_model_spec *spec, zt_backend *be, zt_dtype act,
                           int max_batch, const zt_model_stage *stage) {
    m->ops = ops;
    m->blocks = k;
    m->ctx = (zt_ctx){.be = be, .act = act};
    m->spec = *spec;
    m->max_batch = max_batch;
    m->n_layer = spec->n_layer;
    m->stage = *stage;
}

zt_status zt_blocks_model_alloc(zt_model *m, size_t pad_to, size_t pinned, size_t act_bytes) {
    zt_blocks *k = m->blocks;
    zt_backend *be = m->ctx.be;
    const char *type = m->spec.type;
    ZT_TRY(zt_model_alloc_flat(m, pad_to));
    if (pinned) {
        if (!(k->pinned = zt_backend_alloc(be, ZT_MEM_PINNED, pinned)))
            return zt_error(ZT_ERR_NOMEM, "%s: cannot allocate %zu bytes of pinned host memory "
                            "for the checkpointed activations (cpu_checkpointing)", type, pinned);
        k->pinned_bytes = pinned;
    }
    k->act_bytes = act_bytes ? act_bytes : 1;
    if (!(k->act_memory = zt_backend_alloc(be, ZT_MEM_DEVICE, k->act_bytes))) {
        k->act_bytes = 0;
        return zt_error(ZT_ERR_NOMEM, "%s: cannot allocate %zu parameters and %zu bytes of "
                        "activations", type, m->n_params, act_bytes);
    }
    zt_backend_zero(be, k->act_memory, k->act_bytes, ZT_STREAM_COMPUTE);
    return ZT_OK;
}

void zt_blocks_model_free(zt_model *m) {
    zt_model_free_flat(m);
    free(m->tensors);
    m->tensors = NULL;
    if (m->blocks)
        zt_blocks_free(m->blocks, m->ctx.be);
}

void zt_blocks_free(zt_blocks *k, zt_backend *be) {
    if (k->pinned)
        zt_backend_free(be, ZT_MEM_PINNED, k->pinned, k->pinned_bytes);
    zt_backend_free(be, ZT_MEM_DEVICE, k->act_memory, k->act_bytes);
    free(k->acts);
    free(k->inputs);
    free(k->head);
    free(k->B);
    free(k->T);
    free(k->has_grad);
    free(k->tokens);
    free(k->host_losses);
    free(k->tp_tokens);
    zt_tp_xent_free(&k->xent, be);
    memset(k, 0, sizeof *k);
}

/* ---- Forward and backward ------------------------------------------------------------------ */

static void *slot(const zt_blocks *k, int buffer, uint64_t i) {
    uint64_t at = k->shape.interval ? i % k->shape.interval : buffer * k->shape.layers + i;
    return k->acts + at * k->ops->acts_size;
}

/* Where group g's input is read from on the device. */
static void *group_input(const zt_blocks *k, int buffer, uint64_t g) {
    return k->shape.cpu ? k->work_in : k->inputs[buffer * k->groups + g];
}

static void copy_act(zt_model *m, void *dst, const void *src, size_t bytes, zt_copy_kind kind) {
    zt_backend_copy(m->ctx.be, dst, src, bytes, kind, ZT_STREAM_COMPUTE);
}

/* Group g's input comes back from host memory into the device copy (cpu checkpointing). */
static void restore_input(zt_model *m, const zt_blocks *k, int buffer, uint64_t g, size_t bytes) {
    if (k->shape.cpu)
        copy_act(m, k->work_in, k->inputs[buffer * k->groups + g], bytes, ZT_COPY_H2D);
}

float zt_blocks_forward(zt_model *m, zt_blocks *k, int buffer, const int32_t *tokens,
                        const void *in_act, const int32_t *targets, void *out_act, int B, int T,
                        float grad_scale) {
    const zt_model_stage *st = &m->stage;
    const zt_block_ops *ops = k->ops;
    const zt_model_hooks *h = &m->hooks;
    const uint64_t every = k->shape.interval;
    ZT_ASSERT(buffer >= 0 && (uint64_t)buffer < k->shape.buffers);
    ZT_ASSERT(B >= 1 && (uint64_t)B <= k->shape.B && T >= 1 && (uint64_t)T <= k->shape.T);
    ZT_ASSERT(st->embed ? tokens != NULL : in_act != NULL);
    ZT_ASSERT(st->head || out_act != NULL);
    const size_t BT = (size_t)B * T, bytes = BT * (size_t)k->shape.C * (size_t)k->shape.es;
    k->B[buffer] = B;
    k->T[buffer] = T;
    int32_t *kept_tokens = k->tokens + (size_t)buffer * k->shape.B * k->shape.T;
    if (st->embed)
        memcpy(kept_tokens, tokens, BT * sizeof *tokens);

    if ((st->embed || st->head) && h->fetch)
        h->fetch(h->ctx, -1, false);
    void *in = group_input(k, buffer, 0);
    if (st->embed)
        ops->embed_forward(m, in, kept_tokens, B, T);
    else
        copy_act(m, in, in_act, bytes, ZT_COPY_D2D);
    if (k->shape.cpu)
        copy_act(m, k->inputs[buffer * k->groups], in, bytes, ZT_COPY_D2H);
    const void *res = in;
    for (uint64_t i = 0; i < k->shape.layers; i++) {
        const int l = st->first_layer + (int)i;
        if (every && i > 0 && i % every == 0) {
            void *keep = group_input(k, buffer, i / every);
            if (keep != res)
                copy_act(m, keep, res, bytes, ZT_COPY_D2D);
            if (k->shape.cpu)
                copy_act(m, k->inputs[buffer * k->groups + i / every], keep, bytes, ZT_COPY_D2H);
            res = keep;
        }
        if (h->fetch)
            h->fetch(h->ctx, l, false);
        res = ops->forward(m, slot(k, buffer, i), res, l, B, T);
        if (h->release)
            h->release(h->ctx, l);
    }
    if (!st->head) {
        copy_act(m, out_act, res, bytes, ZT_COPY_D2D);
        k->has_grad[buffer] = true;
        return 0.0f;
    }
    zt_head_acts *ha = &k->head[buffer];
    ops->head_forward(m, ha, res, B, T);
    k->has_grad[buffer] = targets && grad_scale != 0.0f;
    if (!k->has_grad[buffer] && h->release)
        h->release(h->ctx, -1);
    if (!targets)
        return 0.0f;
    if (zt_tp_on(m)) {
        /* The head's shard holds the columns [v0, v0 + V) of the vocabulary. */
        int v0, vn;
        zt_tp_vocab_range(m, (int)k->shape.V * m->stage.tp_size, &v0, &vn);
        zt_tp_softmax_xent(m, &k->xent, ha->losses, ha->logits, targets, (int)BT, v0, vn,
                           grad_scale);
    } else {
        m->ctx.be->ops->softmax_xent(&m->ctx, ha->losses, ha->logits, targets, (int)BT,
                                     (int)k->shape.V, grad_scale);
    }
    if (m->loss_out) {
        m->ctx.be->ops->sum_to(&m->ctx, m->loss_out, ha->losses, BT, ZT_F32, false);
        return NAN;
    }
    zt_backend_copy(m->ctx.be, k->host_losses, ha->losses, BT * sizeof(float), ZT_COPY_D2H,
                    ZT_STREAM_COMPUTE);
    double sum = 0.0;
    int counted = 0;
    for (size_t i = 0; i < BT; i++) {
        if (targets[i] >= 0) {
            sum += k->host_losses[i];
            counted++;
        }
    }
    return counted ? (float)(sum / counted) : 0.0f;
}

/* Recomputes blocks [lo, hi) of a checkpoint group from its kept input. Their parameters are
 * fetched for the backward (and not released: the backward that follows uses them), in
 * ascending order, so ZeRO's prefetch brings the block before the group in meanwhile. */
static void recompute(zt_model *m, zt_blocks *k, int buffer, uint64_t g, uint64_t lo,
                      uint64_t hi, size_t bytes) {
    const zt_model_hooks *h = &m->hooks;
    const int B = k->B[buffer], T = k->T[buffer];
    restore_input(m, k, buffer, g, bytes);
    const void *res = group_input(k, buffer, g);
    for (uint64_t i = lo; i < hi; i++) {
        const int l = m->stage.first_layer + (int)i;
        if (h->fetch)
            h->fetch(h->ctx, l, true);
        res = k->ops->forward(m, slot(k, buffer, i), res, l, B, T);
    }
}

void zt_blocks_backward(zt_model *m, zt_blocks *k, int buffer, const void *dout, void *din) {
    const zt_model_stage *st = &m->stage;
    const zt_block_ops *ops = k->ops;
    const zt_model_hooks *h = &m->hooks;
    ZT_ASSERT(buffer >= 0 && (uint64_t)buffer < k->shape.buffers && k->has_grad[buffer]);
    ZT_ASSERT(st->head || dout != NULL);
    ZT_ASSERT(st->embed || din != NULL);
    k->has_grad[buffer] = false;
    if ((st->embed || st->head) && h->grads_write)
        h->grads_write(h->ctx, -1);
    /* With ZeRO's hooks, ZeRO commits each layer's gradients before its backward writes them;
     * without (a tool's or a test's model) nothing does, so the first backward commits them
     * whole. Should that fail (no device memory left), the writes into the uncommitted memory
     * are the device error the caller's next sync returns. */
    if (!h->fetch && !k->grads_live)
        k->grads_live = zt_backend_commit(m->ctx.be, m->grads, 0, m->n_padded * sizeof(float)) ==
                        ZT_OK;
    const int B = k->B[buffer], T = k->T[buffer];
    const uint64_t L = k->shape.layers, every = k->shape.interval ? k->shape.interval : L;
    const size_t bytes = (size_t)B * T * (size_t)k->shape.C * (size_t)k->shape.es;
    bool started = false;
    for (uint64_t g = k->groups; g-- > 0;) {
        const uint64_t lo = g * every, hi = lo + every < L ? lo + every : L;
        if (k->shape.interval && lo < hi)
            recompute(m, k, buffer, g, lo, hi, bytes);
        if (!started) {
            /* The gradient of the stage's output: from the loss, or from the next stage. */
            if (st->head) {
                const void *last;
                if (L > 0) {
                    last = ops->output(slot(k, buffer, L - 1));
                } else {
                    restore_input(m, k, buffer, 0, bytes);
                    last = group_input(k, buffer, 0);
                }
                ops->head_backward(m, &k->head[buffer], last, B, T);
            } else {
                copy_act(m, k->dres, dout, bytes, ZT_COPY_D2D);
            }
            started = true;
        }
        for (uint64_t i = hi; i-- > lo;) {
            const int l = st->first_layer + (int)i;
            const void *in = i == lo ? group_input(k, buffer, g) : ops->output(slot(k, buffer, i - 1));
            if (h->fetch)
                h->fetch(h->ctx, l, true);
            ops->backward(m, slot(k, buffer, i), in, l, B, T);
            if (h->grads_ready)
                h->grads_ready(h->ctx, l);
            if (h->release)
                h->release(h->ctx, l);
        }
    }
    if (st->embed)
        ops->embed_backward(m, k->tokens + (size_t)buffer * k->shape.B * k->shape.T, B, T);
    else
        copy_act(m, din, k->dres, bytes, ZT_COPY_D2D);
    if (st->embed || st->head) {
        if (h->grads_ready)
            h->grads_ready(h->ctx, -1);
        if (h->release)
            h->release(h->ctx, -1);
    }
}

/* ---- Creation helpers ---------------------------------------------------------------------- */

void zt_blocks_add_tensor(zt_tensor_info *table, int *n, const char *name, size_t *offset,
                          int ndim, int64_t d0, int64_t d1, int layer) {
    zt_tensor_info *t = &table[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *offset;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->numel = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1);
    t->layer = layer;
    t->tied_copy = false;
    t->tp_dim = -1;
    t->tp_groups = t->tp_pieces = t->tp_shared = 1;
    t->tp_piece = 0;
    t->full_shape[0] = t->shape[0];
    t->full_shape[1] = t->shape[1];
    *offset += t->numel;
}

zt_tp_split zt_tp_whole(const zt_model_stage *st) {
    return (zt_tp_split){-1, 1, 1, 0, zt_model_stage_tp(st)};
}

zt_tp_split zt_tp_even(const zt_model_stage *st, int dim, int groups) {
    if (zt_model_stage_tp(st) == 1)
        return zt_tp_whole(st);
    return (zt_tp_split){dim, groups, st->tp_size, st->tp_rank, 1};
}

void zt_blocks_add_shard(zt_tensor_info *table, int *n, const char *name, size_t *offset,
                         int ndim, int64_t d0, int64_t d1, int layer, zt_tp_split split) {
    int64_t d[2] = {d0, d1};
    if (split.dim >= 0) {
        ZT_ASSERT(split.dim < ndim && d[split.dim] % ((int64_t)split.groups * split.pieces) == 0);
        d[split.dim] /= split.pieces;
    }
    zt_blocks_add_tensor(table, n, name, offset, ndim, d[0], d[1], layer);
    zt_tensor_info *t = &table[*n - 1];
    t->full_shape[0] = d0;
    t->full_shape[1] = ndim == 2 ? d1 : 0;
    t->tp_dim = split.dim;
    t->tp_groups = split.groups;
    t->tp_pieces = split.pieces;
    t->tp_piece = split.piece;
    t->tp_shared = split.shared;
}

/* Draws this rank's copy of tensor t (`mine`: the whole tensor, or its TP shard) in pieces of up
 * to `piece` elements through host (each piece's draws made in parallel) and writes them; a
 * shard's elements only, each the draw its place in the whole tensor has (the stream is a
 * counter), so the shards together hold the whole tensor's numbers. The stream s then moves on
 * past the whole tensor. */
static zt_status init_tensor(zt_model *m, const zt_tensor_info *t, const zt_tensor_info *mine,
                             double std, uint64_t *s, float *host, size_t piece) {
    const uint64_t s0 = *s;
    for (size_t at = 0; at < mine->numel; at += piece) {
        size_t n = mine->numel - at < piece ? mine->numel - at : piece;
#pragma omp parallel for schedule(static) if (n >= 16384)
        for (size_t j = 0; j < n; j++)
            host[j] = std > 0.0 ? zt_init_normal_at(s0, zt_tensor_shard_index(mine, at + j), std)
                                : 1.0f;
        ZT_TRY(zt_model_set_params(m, mine->offset + at, host, n));
    }
    if (std > 0.0)
        zt_init_skip_normal(t->numel, s);
    return ZT_OK;
}

zt_status zt_blocks_init_weights(zt_model *m, uint64_t seed, const zt_tensor_info *full,
                                 int n_full, double (*std_of)(const zt_model *m, const char *name)) {
    /* One host buffer for every whole tensor, of up to 1M elements (4 MiB), allocated once. */
    size_t piece = 1;
    for (int i = 0; i < n_full; i++)
        piece = full[i].numel > piece ? full[i].numel : piece;
    piece = piece < ((size_t)1 << 20) ? piece : (size_t)1 << 20;
    float *host = malloc(piece * sizeof *host);
    if (!host)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory drawing the initial weights",
                        m->spec.type);
    uint64_t s = seed;
    zt_status st = ZT_OK;
    zt_backend_zero(m->ctx.be, m->params, m->n_params * sizeof(float), ZT_STREAM_COMPUTE);
    for (int i = 0; i < n_full && st == ZT_OK; i++) {
        const zt_tensor_info *t = &full[i];
        const zt_tensor_info *mine = zt_model_find_tensor(m, t->name);
        double std = std_of(m, t->name);
        if (std == 0.0)
            continue; /* zeros, as cleared above */
        if (!mine) { /* another stage's: its draws are passed over, not made */
            if (std > 0.0)
                zt_init_skip_normal(t->numel, &s);
            continue;
        }
        st = init_tensor(m, t, mine, std, &s, host, piece);
    }
    free(host);
    return st;
}

float zt_blocks_model_stage_forward(zt_model *m, int buffer, const int32_t *tokens,
                                    const void *in_act, const int32_t *targets, void *out_act,
                                    int B, int T, float grad_scale) {
    return zt_blocks_forward(m, m->blocks, buffer, tokens, in_act, targets, out_act, B, T,
                             grad_scale);
}

void zt_blocks_model_stage_backward(zt_model *m, int buffer, const void *dout, void *din) {
    zt_blocks_backward(m, m->blocks, buffer, dout, din);
}

float zt_blocks_model_forward(zt_model *m, const int32_t *inputs, const int32_t *targets, int B,
                              int T, float grad_scale) {
    ZT_ASSERT(m->stage.embed && m->stage.head);
    return zt_blocks_forward(m, m->blocks, 0, inputs, NULL, targets, NULL, B, T, grad_scale);
}

void zt_blocks_model_backward(zt_model *m) { zt_blocks_backward(m, m->blocks, 0, NULL, NULL); }

/* Sampling reads logits as fp32: it runs with fp32 activations. */
void zt_blocks_model_logits(const zt_model *m, size_t row, size_t rows, float *dst) {
    ZT_ASSERT(m->stage.head);
    zt_model_copy_logits(m, m->blocks->head[0].logits, row, rows, dst);
}
