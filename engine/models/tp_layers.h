/* Tensor parallelism inside a model (internal to libztrain): what Megatron's sharded layers need
 * besides the ops — the activation all-reduce that ends a row-parallel layer (and the backward of
 * a column-parallel one), the vocabulary range of a rank's embedding and head shard, and the
 * vocabulary-parallel cross-entropy, which exchanges three numbers per row instead of gathering
 * the logits. A failed collective is recorded in the model (zt_model_tp_status). */
#ifndef ZTRAIN_MODELS_TP_LAYERS_H
#define ZTRAIN_MODELS_TP_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "ztrain/model.h"
#include "ztrain/size_math.h"

/* Whether m is a shard of a tensor-parallel model. */
static inline bool zt_tp_on(const zt_model *m) { return zt_model_stage_tp(&m->stage) > 1; }

/* Sums buf[n] (an activation or activation gradient at m->ctx.act, device memory) over the TP
 * group in rank order, the result held at the activation precision. No-op without TP. */
void zt_tp_reduce_act(zt_model *m, void *buf, size_t n);

/* The gradient g[n] (fp32, device memory) of a piece the ranks of m->tp_share_comm hold alike
 * (Llama's kv heads when there are fewer than TP ranks). Each rank's backward adds only its own
 * query heads' share, so this backward's shares are summed over those ranks; what earlier
 * micro-batches accumulated is already that sum, so it is set aside in saved[n] (device memory)
 * before the backward adds into g (begin zeroes g) and added back after the sum (end). Where the
 * backward writes g's 16-bit gradients instead (ops.h zt_grad16), those. No-op without a share
 * group. */
void zt_tp_shared_grad_begin(zt_model *m, float *g, float *saved, size_t n);
void zt_tp_shared_grad_end(zt_model *m, float *g, const float *saved, size_t n);

/* The rows [*v0, *v0 + V / tp) of a vocabulary of V that this rank's embedding and head hold. */
void zt_tp_vocab_range(const zt_model *m, int V, int *v0, int *vn);

/* dst[i] = tokens[i] - v0 where it falls in [v0, v0 + vn), else -1 (the ops' "not here"); with
 * `targets`, a negative tokens[i] (no target) becomes ZT_XENT_IGNORED. */
void zt_tp_local_tokens(const int32_t *tokens, int n, int v0, int vn, bool targets, int32_t *dst);

/* The vocabulary-parallel cross-entropy's buffers for rows of at most max_rows. The stats of
 * the shards travel and combine in device memory, so a step's loss waits for nothing. */
typedef struct {
    float *stats;         /* device: [tp · 3 · max_rows] every shard's stats side by side */
    float *logz;          /* device: [max_rows] the rows' log-partitions */
    int32_t *local;       /* host: [max_rows] local targets */
    size_t max_rows;
    int tp;
} zt_tp_xent;

/* Host bytes zt_blocks_init_tp takes for a shard of tp ranks with rows tokens a micro-batch
 * (the local tokens, and with the head the loss's local targets): the estimate's share (0
 * without TP). */
static inline uint64_t zt_tp_host_bytes(int tp, uint64_t rows) {
    return tp > 1 ? rows * sizeof(int32_t) * 2 : 0;
}

/* Device bytes of the loss's buffers (zt_tp_xent: 3 · tp + 1 floats a row), which the
 * activations' estimate adds (0 without TP); *ov is set when the product overflows. */
static inline uint64_t zt_tp_device_bytes(int tp, uint64_t rows, bool *ov) {
    return tp > 1 ? zt_u64_mul(rows, (3 * (uint64_t)tp + 1) * sizeof(float), ov) : 0;
}

/* Takes nothing without TP. The model's ctx, spec and stage must be set. */
zt_status zt_tp_xent_init(zt_tp_xent *x, zt_model *m, size_t max_rows);
void zt_tp_xent_free(zt_tp_xent *x, zt_backend *be);

/* softmax_xent (ops.h) over the TP group: logits[N, vn] is this rank's shard of the columns
 * [v0, v0 + vn) of the vocabulary; targets are global ids (host memory). Writes every row's
 * loss into losses[N] (fp32 device memory; the same on every TP rank) and, with grad_scale !=
 * 0, overwrites the shard with its gradient. The shards' statistics are all-gathered and
 * combined on the device (op xent_partial_combine), in stream order: nothing waits for the
 * device here (a transport that reduces in host memory stages the gather, comm.h). */
void zt_tp_softmax_xent(zt_model *m, zt_tp_xent *x, float *losses, void *logits,
                        const int32_t *targets, int N, int v0, int vn, float grad_scale);

#endif
