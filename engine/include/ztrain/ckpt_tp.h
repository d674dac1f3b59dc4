/* A tensor-parallel job's checkpoint directory (Megatron's mp_rank folders, in ztrain's form):
 *
 *     DIR/tp.json   {"format": "ztrain-tensor-parallel", "tp": T,
 *                    "tensors": [[name, dim, groups, [whole shape]] or
 *                                [name, dim, groups, [whole shape], pieces], ...]}
 *     DIR/tp_<tt>/  for each TP rank t < T, an ordinary checkpoint directory (checkpoint.h) that
 *                   shard t's data-parallel replicas save and load as a job of their own: its
 *                   model.safetensors holds the shard's tensors under their Hugging Face names
 *                   at the shard's shapes, its optimizer partitions the shard's state.
 *
 * tp.json is the layout: tensor `name` of the whole model has the whole shape given; dim -1 means
 * every shard holds it whole, otherwise its dimension `dim` is cut into `groups` equal groups and
 * each group into T equal pieces, shard t holding piece t of every group (zt_tensor_info's tp_
 * fields); with `pieces` (fewer than T, dividing it: Llama's kv heads when there are fewer than
 * TP ranks) into that many, shard t holding piece t / (T / pieces). From it a checkpoint is read at any other TP size (zt_ckpt_tp_load reshards), and as
 * one whole model by zt_ckpt_weights (hence `ztrain export` and zero-to-fp32).
 *
 * tp.json describes the newest save. Each tag keeps the layout its shards were saved in, in shard
 * 0's meta.json ("tensor_parallel", the same keys), and readers of a tag go by that one, so that a
 * tag saved at tp 2 stays readable (exported, resumed) after a resume saved at tp 1 rewrote
 * tp.json; only tags saved before meta.json kept it are read by tp.json, and a tag saved at
 * another TP size than tp.json's is then refused naming both sizes.
 *
 * A directory without tp.json holding an ordinary checkpoint (a job saved without tensor
 * parallelism) loads at any TP size too, as the one shard of a layout of whole tensors. */
#ifndef ZTRAIN_CKPT_TP_H
#define ZTRAIN_CKPT_TP_H

#include <stddef.h>

#include "ztrain/engine.h"
#include "ztrain/model.h"
#include "ztrain/status.h"

/* T of the tensor-parallel checkpoint directory dir, or 0 when dir is not one. */
int zt_ckpt_tp_size(const char *dir);

/* The TP size `tag` of the tensor-parallel checkpoint directory dir was saved at: what its
 * shard 0's meta.json keeps ("tensor_parallel"), or tp.json's for a tag older than that; 0 when
 * dir is not one. A later save at another size rewrites tp.json, never an older tag's. */
int zt_ckpt_tag_tp_size(const char *dir, const char *tag);

/* dir/tp_<tt> into out[size]. */
void zt_ckpt_tp_shard_dir(char *out, size_t size, const char *dir, int tp_rank);

/* Writes dir/tp.json (dir made when missing) with the layout of m, a shard of a model of
 * m->stage.tp_size shards (any shard's table gives the same layout). */
zt_status zt_ckpt_write_tp(const char *dir, const zt_model *m);

/* The layout of m as a JSON object {"tp": T, "tensors": [...]} (tp.json's keys without its
 * "format"), which each shard's meta.json keeps under "tensor_parallel" (zt_ckpt_save_tp_shard);
 * the caller deletes it. */
struct cJSON *zt_ckpt_tp_layout_json(const zt_model *m);

/* Restores the engine (a shard of any TP size, 1 included) from the tensor-parallel checkpoint
 * dir at tag: with the TP size it was saved at, from its own shard directory as zt_ckpt_load
 * does; at another, each of its tensors (parameters and optimizer state alike) is put together
 * whole from the saved shards by the layout and its own shard taken, the rest (counters,
 * schedule, data position) from shard 0's meta.json. */
zt_status zt_ckpt_tp_load(zt_engine *e, const char *dir, const char *tag);

#endif
