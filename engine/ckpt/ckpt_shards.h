/* ZeRO-3 checkpoints without gathering (internal to libztrain; layout in ztrain/checkpoint.h):
 * each rank's own slice of the parameters in model_rank_<r>.safetensors, the consolidated model
 * written a layer at a time when the config asks for it, loading by the ranges a rank keeps, and
 * the shards, or the optimizer files' fp32 masters, read as one flat buffer (ckpt_shards.c;
 * ckpt_weights.c reads a checkpoint's weights tensor by tensor through it, checkpoint.h's
 * zt_ckpt_weights). */
#ifndef ZTRAIN_CKPT_SHARDS_H
#define ZTRAIN_CKPT_SHARDS_H

#include <cjson/cJSON.h>

#include "ztrain/checkpoint.h"
#include "ztrain/safetensors.h"

/* A whole number stored as a string in a safetensors file's metadata ("partition_offset",
 * "n_params") into *out; false when absent or not one. */
bool zt_ckpt_st_meta_size(const zt_st_file *f, const char *key, size_t *out);

/* Every rank: writes its slice of the parameters (fp32, clipped to the real parameters) to
 * path, with "partition_offset" and "n_params" metadata as the optimizer files have. */
zt_status zt_ckpt_save_param_shard(zt_engine *e, const char *path);

/* Collective: every rank gathers one layer at a time, in the order of the model's tensors, and
 * rank 0 writes it to path in the training's precision (bf16/fp16, else fp32) before the layer
 * is let go; no rank ever holds more than one gathered layer. */
zt_status zt_ckpt_save_gathered_model(zt_engine *e, const char *path);

/* Rank 0: what meta.json says about the flat parameters: "params", their layout
 * [[name, offset, [shape]], ...] that a reader consolidates the model shards and the optimizer
 * partitions with (DeepSpeed's param_shapes), and of a sharded checkpoint "model_shards" (the
 * number of model_rank files) and "model_file" (the consolidated model, when written). */
void zt_ckpt_shards_meta(zt_engine *e, cJSON *meta, bool sharded, bool gathered);

/* Whether meta.json describes a sharded checkpoint, and its number of shard files. */
int zt_ckpt_meta_shards(const cJSON *meta);

/* The model_rank files of a checkpoint, mapped, as one flat buffer of n_params values. */
typedef struct {
    zt_st_file f;
    const zt_st_tensor *t;
    size_t lo, n; /* the flat elements [lo, lo + n) it holds */
} zt_ckpt_shard;

typedef struct {
    zt_ckpt_shard *s;
    int n;
    size_t n_params;
} zt_ckpt_shard_set;

/* Opens the n_shards model_rank files of tagdir, each checked to be a slice of n_params (0: of
 * what the first one says); messages name the file at fault. */
zt_status zt_ckpt_shards_open(zt_ckpt_shard_set *set, const char *tagdir, int n_shards,
                              size_t n_params);
/* The fp32 master weights of a mixed-precision checkpoint as one flat buffer: the
 * "fp32_master" tensors of tagdir's n_files optim_rank files (each a slice, with the same
 * metadata), checked as zt_ckpt_shards_open checks. A set of no files (set->n 0) when the
 * checkpoint has none: fp32 training, whose weights are the masters; bf16 masters
 * (bf16_master_weights_and_grads), which the 16-bit weights are; no optimizer. */
zt_status zt_ckpt_masters_open(zt_ckpt_shard_set *set, const char *tagdir, int n_files,
                               size_t n_params);
/* Flat elements [lo, lo + n) as fp32 from the shards that hold them; every one must be held. */
zt_status zt_ckpt_shards_read(const zt_ckpt_shard_set *set, size_t lo, float *dst, size_t n);
void zt_ckpt_shards_close(zt_ckpt_shard_set *set);

/* Fills the engine's parameters from the shards, reading only the ranges this rank keeps. */
zt_status zt_ckpt_load_param_shards(zt_engine *e, const char *tagdir, int n_shards);

/* checkpoint.c: opens the complete copy of dir/tag (tag NULL: latest) and its meta.json; reads
 * the model spec meta.json records (spec->init_from NULL). */
zt_status zt_ckpt_open_meta(const char *dir, const char *tag, char *tagdir, size_t size,
                            cJSON **meta);
zt_status zt_ckpt_meta_spec(const cJSON *meta, const char *tagdir, zt_model_spec *spec);

#endif
