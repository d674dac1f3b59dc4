/* Tensor parallelism inside a model (tp_layers.h): shards of whole tensors, the activation
 * all-reduce of Megatron's row-parallel layers, and the vocabulary-parallel cross-entropy. */
#include <stdlib.h>
#include <string.h>

#include "tp_layers.h"
#include "ztrain/comm.h"

/* ---- Shards of whole tensors ---------------------------------------------------------------- */

size_t zt_tensor_full_numel(const zt_tensor_info *t) {
    return (size_t)t->full_shape[0] * (t->ndim == 2 ? (size_t)t->full_shape[1] : 1);
}

/* A shard as runs of contiguous elements of the whole tensor: `outer` times (along dim 0 once,
 * along dim 1 once a row), one run of `len` elements from each of the tp_groups groups, run
 * (o, g) starting at run_at(o, g) in the whole tensor; the shard holds the runs in that order. */
typedef struct {
    size_t cols, group, piece, outer, unit, len;
} shard_runs;

static shard_runs runs_of(const zt_tensor_info *t) {
    const size_t rows = (size_t)t->full_shape[0];
    const size_t cols = t->ndim == 2 ? (size_t)t->full_shape[1] : 1;
    /* Along dim 0 a run is whole rows; along dim 1 it is a piece of one row. */
    const size_t extent = t->tp_dim == 0 ? rows : cols;
    shard_runs r = {.cols = cols, .group = extent / (size_t)t->tp_groups};
    r.piece = r.group / (size_t)t->tp_pieces;
    r.outer = t->tp_dim == 0 ? 1 : rows;
    r.unit = t->tp_dim == 0 ? cols : 1;
    r.len = r.piece * r.unit;
    return r;
}

static size_t run_at(const zt_tensor_info *t, const shard_runs *r, size_t o, size_t g) {
    return o * r->cols + (g * r->group + (size_t)t->tp_piece * r->piece) * r->unit;
}

/* Copies the shard's runs out of the whole tensor, or back into it. */
static void each_run(const zt_tensor_info *t, float *whole, float *shard, bool to_full) {
    if (t->tp_dim < 0) {
        if (to_full)
            memcpy(whole, shard, t->numel * sizeof *shard);
        else
            memcpy(shard, whole, t->numel * sizeof *shard);
        return;
    }
    const shard_runs r = runs_of(t);
    size_t mine = 0;
    for (size_t o = 0; o < r.outer; o++) {
        for (size_t g = 0; g < (size_t)t->tp_groups; g++) {
            size_t at = run_at(t, &r, o, g);
            if (to_full)
                memcpy(whole + at, shard + mine, r.len * sizeof *shard);
            else
                memcpy(shard + mine, whole + at, r.len * sizeof *shard);
            mine += r.len;
        }
    }
    ZT_ASSERT(mine == t->numel);
}

size_t zt_tensor_shard_index(const zt_tensor_info *t, size_t j) {
    if (t->tp_dim < 0)
        return j;
    const shard_runs r = runs_of(t);
    const size_t run = j / r.len;
    return run_at(t, &r, run / (size_t)t->tp_groups, run % (size_t)t->tp_groups) + j % r.len;
}

void zt_tensor_shard_from_full(const zt_tensor_info *t, const float *full, float *shard) {
    each_run(t, (float *)full, shard, false);
}

void zt_tensor_shard_to_full(const zt_tensor_info *t, const float *shard, float *full) {
    each_run(t, full, (float *)shard, true);
}

/* ---- The TP group --------------------------------------------------------------------------- */

zt_status zt_model_set_tp_comm(zt_model *m, zt_comm *c) {
    const int tp = zt_model_stage_tp(&m->stage);
    if (tp == 1)
        return ZT_OK;
    if (!c || zt_comm_world_size(c) != tp || zt_comm_rank(c) != m->stage.tp_rank)
        return zt_error(ZT_ERR_INVALID, "%s: tensor-parallel shard %d of %d needs a TP group of "
                        "%d ranks in which it is rank %d", m->spec.type, m->stage.tp_rank, tp, tp,
                        m->stage.tp_rank);
    const zt_ops *op = m->ctx.be->ops;
    if (!op->xent_partial_stats || !op->xent_partial_combine || !op->xent_partial_grad)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: tensor parallelism needs the vocabulary-parallel "
                        "cross-entropy ops, which the %s backend does not have yet",
                        m->spec.type, m->ctx.be->name);
    m->tp_comm = c;
    /* A piece shared by `shared` ranks is held by the consecutive TP ranks
     * [piece · shared, (piece + 1) · shared) (zt_tp_split). */
    int shared = 1;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].tp_dim >= 0 && m->tensors[i].tp_shared > shared)
            shared = m->tensors[i].tp_shared;
    if (shared == 1 || m->tp_share_comm)
        return ZT_OK;
    int members[ZT_MAX_WORLD];
    const int first = m->stage.tp_rank / shared * shared;
    for (int k = 0; k < shared; k++)
        members[k] = first + k;
    ZT_TRY(zt_comm_create_group(&m->tp_share_comm, c, members, shared));
    return zt_comm_attach_backend(m->tp_share_comm, m->ctx.be);
}

zt_status zt_model_tp_status(zt_model *m) {
    zt_status s = m->tp_error;
    m->tp_error = ZT_OK;
    return s;
}

static void note(zt_model *m, zt_status s) {
    if (s != ZT_OK && m->tp_error == ZT_OK)
        m->tp_error = s;
}

/* ---- Whole logits ---------------------------------------------------------------------------- */

zt_status zt_model_logits(zt_model *m, size_t row, size_t rows, float *dst) {
    const int tp = zt_model_stage_tp(&m->stage);
    if (tp == 1) {
        m->ops->logits(m, row, rows, dst);
        return zt_backend_sync(m->ctx.be);
    }
    ZT_TRY(zt_model_tp_status(m));
    const size_t V = (size_t)m->spec.vocab_size, vn = V / (size_t)tp, part = rows * vn;
    /* Shard r's rows side by side at r · part, then each row put together from its slices. */
    if ((size_t)tp * part > m->tp_logits_n) {
        float *grown = realloc(m->tp_logits, (size_t)tp * part * sizeof *grown);
        if (!grown)
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory gathering %zu rows of logits",
                            m->spec.type, rows);
        m->tp_logits = grown;
        m->tp_logits_n = (size_t)tp * part;
    }
    float *all = m->tp_logits;
    m->ops->logits(m, row, rows, all + (size_t)m->stage.tp_rank * part);
    zt_status s = zt_backend_sync(m->ctx.be);
    size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
    for (int i = 0; i < tp; i++) {
        offsets[i] = (size_t)i * part;
        counts[i] = part;
    }
    if (s == ZT_OK)
        s = zt_comm_all_gather(m->tp_comm, all, (size_t)tp * part, offsets, counts, ZT_F32);
    for (size_t n = 0; s == ZT_OK && n < rows; n++)
        for (int i = 0; i < tp; i++)
            memcpy(dst + n * V + (size_t)i * vn, all + (size_t)i * part + n * vn,
                   vn * sizeof *dst);
    return s;
}

/* ---- Activations ---------------------------------------------------------------------------- */

void zt_tp_reduce_act(zt_model *m, void *buf, size_t n) {
    if (!zt_tp_on(m) || m->tp_error != ZT_OK)
        return;
    ZT_ASSERT(m->tp_comm);
    /* The CPU holds 16-bit activations as fp32 values rounded to 16 bits: they are summed as
     * fp32 and rounded once, as a backend with 16-bit storage sums them (comm.h). */
    const size_t es = zt_backend_act_size(m->ctx.be, m->ctx.act);
    const zt_dtype wire = es == sizeof(float) ? ZT_F32 : m->ctx.act;
    note(m, zt_comm_dev_all_reduce(m->tp_comm, buf, n, wire, ZT_REDUCE_SUM));
    if (wire == ZT_F32 && m->ctx.act != ZT_F32)
        m->ctx.be->ops->round_to(&m->ctx, buf, n, m->ctx.act);
}

/* The 16-bit gradients of g[0, n) where the backward writes those instead (ops.h zt_grad16,
 * backend.h writes_grad16); NULL where it writes g. */
static uint16_t *shared_grad16(const zt_model *m, const float *g, size_t n) {
    return m->ctx.be->writes_grad16 ? zt_grad16_of(&m->ctx, g, n) : NULL;
}

void zt_tp_shared_grad_begin(zt_model *m, float *g, float *saved, size_t n) {
    if (!m->tp_share_comm)
        return;
    uint16_t *h = shared_grad16(m, g, n);
    void *at = h ? (void *)h : (void *)g;
    const size_t bytes = n * (h ? sizeof *h : sizeof *g);
    zt_backend_copy(m->ctx.be, saved, at, bytes, ZT_COPY_D2D, ZT_STREAM_COMPUTE);
    zt_backend_zero(m->ctx.be, at, bytes, ZT_STREAM_COMPUTE);
}

void zt_tp_shared_grad_end(zt_model *m, float *g, const float *saved, size_t n) {
    if (!m->tp_share_comm)
        return;
    /* In 16 bits the shares are summed in their type and the earlier micro-batches' gradients
     * added back with one rounding (the add op in the activations' type). */
    uint16_t *h = shared_grad16(m, g, n);
    const zt_ctx x = {.be = m->ctx.be, .act = h ? m->ctx.act : ZT_F32};
    void *at = h ? (void *)h : (void *)g;
    if (m->tp_error == ZT_OK)
        note(m, zt_comm_dev_all_reduce(m->tp_share_comm, at, n, x.act, ZT_REDUCE_SUM));
    m->ctx.be->ops->add(&x, at, at, saved, n);
}

void zt_tp_vocab_range(const zt_model *m, int V, int *v0, int *vn) {
    const int tp = zt_model_stage_tp(&m->stage);
    *vn = V / tp;
    *v0 = tp == 1 ? 0 : m->stage.tp_rank * *vn;
}

void zt_tp_local_tokens(const int32_t *tokens, int n, int v0, int vn, bool targets, int32_t *dst) {
    for (int i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (targets && t < 0)
            dst[i] = ZT_XENT_IGNORED;
        else
            dst[i] = t >= v0 && t < v0 + vn ? t - v0 : -1;
    }
}

/* ---- Vocabulary-parallel cross-entropy ---------------------------------------------------- */

zt_status zt_tp_xent_init(zt_tp_xent *x, zt_model *m, size_t max_rows) {
    const int tp = zt_model_stage_tp(&m->stage);
    *x = (zt_tp_xent){.max_rows = max_rows, .tp = tp};
    if (tp == 1)
        return ZT_OK;
    x->stats = zt_backend_alloc(m->ctx.be, ZT_MEM_DEVICE,
                                3 * (size_t)tp * max_rows * sizeof(float));
    x->logz = zt_backend_alloc(m->ctx.be, ZT_MEM_DEVICE, max_rows * sizeof(float));
    x->local = malloc(max_rows * sizeof(int32_t));
    if (!x->stats || !x->logz || !x->local)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the vocabulary-parallel loss of %zu "
                        "rows", m->spec.type, max_rows);
    return ZT_OK;
}

void zt_tp_xent_free(zt_tp_xent *x, zt_backend *be) {
    if (x->stats)
        zt_backend_free(be, ZT_MEM_DEVICE, x->stats, 3 * (size_t)x->tp * x->max_rows *
                        sizeof(float));
    if (x->logz)
        zt_backend_free(be, ZT_MEM_DEVICE, x->logz, x->max_rows * sizeof(float));
    free(x->local);
    memset(x, 0, sizeof *x);
}

void zt_tp_softmax_xent(zt_model *m, zt_tp_xent *x, float *losses, void *logits,
                        const int32_t *targets, int N, int v0, int vn, float grad_scale) {
    const zt_ops *op = m->ctx.be->ops;
    const int tp = zt_model_stage_tp(&m->stage), r = m->stage.tp_rank;
    const size_t rows = (size_t)N, part = 3 * rows;
    ZT_ASSERT(rows <= x->max_rows && tp == x->tp);
    zt_tp_local_tokens(targets, N, v0, vn, true, x->local);
    /* Every rank's stats side by side, the same on every rank, so every rank combines them in
     * the same order to the same log-partition. */
    op->xent_partial_stats(&m->ctx, x->stats + (size_t)r * part, logits, x->local, N, vn);
    size_t offsets[ZT_MAX_WORLD], counts[ZT_MAX_WORLD];
    for (int i = 0; i < tp; i++) {
        offsets[i] = (size_t)i * part;
        counts[i] = part;
    }
    if (m->tp_error == ZT_OK)
        note(m, zt_comm_dev_all_gather(m->tp_comm, x->stats, (size_t)tp * part, offsets, counts,
                                       ZT_F32));
    op->xent_partial_combine(&m->ctx, x->logz, losses, x->stats, x->local, N, tp);
    if (grad_scale != 0.0f)
        op->xent_partial_grad(&m->ctx, logits, x->logz, x->local, N, vn, grad_scale);
}
