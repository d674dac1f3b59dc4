/* Tensor-parallel checkpoints inside engine/ckpt (internal): the layout of tp.json and the whole
 * tensors put together from the shards, for the resharding load (ckpt_tp.c, ckpt_tp_load.c) and
 * the weights reader (ckpt_weights.c). */
#ifndef ZTRAIN_CKPT_TP_WEIGHTS_H
#define ZTRAIN_CKPT_TP_WEIGHTS_H

#include <cjson/cJSON.h>

#include "ztrain/model.h"

/* tp.json: T and, per tensor of the whole model, its name, ndim, full_shape, tp_dim,
 * tp_groups, tp_pieces (T, or fewer for a piece several shards hold) and tp_shared (T /
 * tp_pieces; T for a whole tensor); the other fields unset. */
typedef struct {
    int tp, n;
    zt_tensor_info *t;
} zt_ckpt_tp_layout;

zt_status zt_ckpt_tp_layout_read(const char *dir, zt_ckpt_tp_layout *out);
/* The same from a parsed layout object ({"tp": T, "tensors": [...]}); messages name path. */
zt_status zt_ckpt_tp_layout_parse(const cJSON *root, const char *path, zt_ckpt_tp_layout *out);
/* The layout the tensor-parallel checkpoint dir's shards were saved in at tag (NULL: latest,
 * shard 0's): the "tensor_parallel" object of shard 0's meta.json for that tag, or for a tag
 * saved before meta.json recorded it, tp.json (checkpoint.c). */
zt_status zt_ckpt_tp_layout_at(const char *dir, const char *tag, zt_ckpt_tp_layout *out);
void zt_ckpt_tp_layout_free(zt_ckpt_tp_layout *l);

/* Piece `piece` of the layout's tensor `whole` (shape, numel and tp_piece set). */
zt_tensor_info zt_ckpt_tp_piece(const zt_tensor_info *whole, int piece);

/* Reads shard `piece`'s values of layout tensor i, n elements, into dst. */
typedef zt_status (*zt_ckpt_tp_read)(void *ctx, int piece, int i, size_t n, float *dst);

/* Layout tensor i whole (zt_tensor_full_numel elements) into `whole`, from every shard (or from
 * shard 0 for a tensor every shard holds whole, and from the first shard holding each piece of
 * one several shards share). */
zt_status zt_ckpt_tp_assemble(const zt_ckpt_tp_layout *l, int i, zt_ckpt_tp_read read,
                              void *ctx, float *whole);

#endif
