/* Checkpoints: DIR/latest names the newest tag; DIR/<tag>/ holds
 *   model.safetensors              the working weights with Hugging Face names (loads in the
 *                                  Python world): fp32 (in mixed precision the 16-bit weights
 *                                  widened); at ZeRO stage 3 only with zero_optimization.
 *                                  stage3_gather_16bit_weights_on_model_save (or its other
 *                                  spellings), then in the training's precision (bf16/fp16, fp32
 *                                  without mixed precision), gathered and written a layer at a time
 *   model_rank_<r>.safetensors     stage 3: rank r's slice of the flat parameters ("params", fp32,
 *                                  metadata partition_offset and n_params), saved by each rank
 *                                  without any gathering, as DeepSpeed's zero_pp_rank files
 *   optim_rank_<r>.safetensors     rank r's optimizer state (Adam exp_avg/exp_avg_sq, or SGD's
 *                                  momentum_buffer, and in mixed precision the fp32 masters
 *                                  "fp32_master") over its slice of the flat parameters
 *                                  (metadata partition_offset and n_params), the same whether
 *                                  the state lived in memory or in offload files
 *   meta.json                      counters, data position, schedule, the data it trained on
 *                                  (data.train, seed, shuffle), precision, world size, model
 *                                  spec and DeepSpeed config; "job_id", the ztraind job that
 *                                  wrote it (none under `ztrain run`); "params", the flat layout
 *                                  [[name, offset, [shape]], ...] that consolidates the slices
 *                                  (older checkpoints: at stage 3 only; before that, the order
 *                                  of model.safetensors back to back); at stage 3 also
 *                                  "model_shards" (the number of model_rank files)
 *   DONE                           written last: a tag without it is never loaded
 * The default tag is "global_step<N>", as DeepSpeed's. A tag directory is written under a
 * temporary name (DIR/.<tag>.tmp), synced, and renamed into place, then `latest` is replaced
 * atomically, so a crash at any point leaves the previous checkpoint loadable. A tag saved again
 * (a stop right after an interval checkpoint of the same step) is swapped in with one atomic
 * exchange, or where the filesystem has none by moving the old copy aside (DIR/.<tag>.old)
 * first, and loading then finds whichever complete copy there is: `latest` never leads to
 * nothing. The next save finishes or undoes what a killed save left and removes the
 * temporary directories. */
#ifndef ZTRAIN_CHECKPOINT_H
#define ZTRAIN_CHECKPOINT_H

#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

#include "ztrain/engine.h"
#include "ztrain/job_spec.h"
#include "ztrain/status.h"

/* Saves the engine's complete training state under dir/tag (tag NULL: "global_step<N>") and
 * points dir/latest at it (collective: every rank calls it). `job` supplies the model spec and
 * DeepSpeed config recorded in meta.json. At ZeRO stage 3 no rank gathers the model: each writes
 * its own slice, and the consolidated model (when the config asks for it) is gathered and
 * written a layer at a time. */
zt_status zt_ckpt_save(zt_engine *e, const zt_job_spec *job, const char *dir, const char *tag);

/* zt_ckpt_save (default tag) of one shard of a tensor-parallel checkpoint directory (ckpt_tp.h;
 * dir is its tp_<tt>): meta.json also keeps "tensor_parallel", the layout the tag's shards are
 * saved in, which readers of the tag go by rather than tp.json (the newest save's). */
zt_status zt_ckpt_save_tp_shard(zt_engine *e, const zt_job_spec *job, const char *dir);

/* Reads dir/latest into tag[size]. Returns ZT_ERR_IO when there is no latest file, ZT_ERR_FORMAT
 * when it is empty or does not hold a tag. */
zt_status zt_ckpt_latest(const char *dir, char *tag, size_t size);

/* What a run with "resume": true starts from, into tag[size] ("" for step 0), and a one-line
 * notice for the user into note[note_size] ("" when there is nothing to say). Reads only.
 *  - dir/latest names a complete checkpoint: that tag, no notice.
 *  - dir does not exist, or has neither `latest` (or an empty one) nor a complete checkpoint:
 *    "" (start from step 0), with a notice saying so and naming dir — the first run of a
 *    resumable job, or a checkpoint_dir with a typo.
 *  - `latest` is missing, empty, or names a tag that does not exist or has no DONE, while
 *    complete checkpoints exist: the newest of them by the step number in its tag, with a
 *    notice saying what was wrong with `latest`.
 *  - `latest` names a tag and no complete checkpoint exists: ZT_ERR_FORMAT naming dir, the tag
 *    and the tags found (starting over would hide that the checkpoint is gone); so is a choice
 *    between complete tags without step numbers, and an unreadable `latest` is ZT_ERR_IO.
 *  - dir is a file: ZT_ERR_IO, "<dir>: exists and is not a directory" (the error its first
 *    save would give), and no notice.
 *  - dir holds a checkpoint in parts (a pipeline's stages, a tensor-parallel job's shards, each
 *    with its own `latest`): the first part's choice by the rules above, if every part has a
 *    complete copy of it; else (a save that did not finish on every part) the newest tag that
 *    every part has, with a notice naming the part that lacks the other, or ZT_ERR_FORMAT
 *    naming it when there is none. A pipeline.json or tp.json that cannot be read is an error
 *    naming it (the parts would pass for tags without DONE). */
zt_status zt_ckpt_find_resume(const char *dir, char *tag, size_t size, char *note,
                              size_t note_size);

/* The tag a reader of the checkpoint (`ztrain export`, `sample`, `zero-to-fp32`) takes when none
 * is named: zt_ckpt_find_resume's choice by the same rules, so a checkpoint in parts whose last
 * save did not finish on every part is read at the newest tag all parts have. The note names
 * reader ("export: ...: reading the newest ...") where resume's would say "resume: ...: resuming
 * from ...". Where a resume would start from step 0 (no checkpoint in dir, or no dir) it is
 * ZT_ERR_IO naming dir instead, with no note. */
zt_status zt_ckpt_find_default(const char *dir, const char *reader, char *tag, size_t size,
                               char *note, size_t note_size);

/* Whether tag is a plain name of an entry in the checkpoint directory: not empty, no '/', and
 * neither "." nor "..", so that dir/tag stays inside dir. */
bool zt_ckpt_tag_is_name(const char *tag);

/* The tokenizer.json the job named (data.tokenizer), as meta.json records it: a heap string the
 * caller frees, or NULL when the job named none (for `ztrain sample`). In a pipeline's or a
 * tensor-parallel job's directory (ckpt_pipeline.h, ckpt_tp.h) it is read from the first
 * stage's, or shard 0's, meta.json. An unreadable meta.json is an error naming the file. */
zt_status zt_ckpt_read_tokenizer(const char *dir, const char *tag, char **path);

/* The Hugging Face model directory the job started from (model.init_from naming a directory), as
 * meta.json records it, read as zt_ckpt_read_tokenizer reads the tokenizer: NULL when the job
 * started from a file, from scratch, or before meta.json recorded it. `ztrain export --hf` keeps
 * its config.json's token ids and its generation_config.json, as save_pretrained keeps them. */
zt_status zt_ckpt_read_hf_source(const char *dir, const char *tag, char **path);

/* One checkpoint directory under dir, as zt_ckpt_list_dir finds it. */
typedef struct {
    char *tag;          /* "global_step100" */
    int64_t step;       /* from the tag's trailing digits; -1 when it has none */
    bool complete;      /* the DONE marker exists, so it can be loaded */
    char *job_id;       /* the ztraind job that wrote it, as its meta.json records it (the
                         * worker's zt_job_spec.service_job_id); NULL when it records none */
} zt_ckpt_entry;

typedef struct {
    zt_ckpt_entry *items;   /* sorted by step, then tag */
    int n;
    char *latest;           /* the tag dir/latest names, or NULL */
} zt_ckpt_list;

/* The checkpoints in dir (at most 10,000; checkpoints still being written, whose temporary
 * directories start with '.', are left out). A missing or unreadable dir gives an empty list.
 * Release with zt_ckpt_list_free. */
void zt_ckpt_list_dir(const char *dir, zt_ckpt_list *out);
void zt_ckpt_list_free(zt_ckpt_list *c);

/* Restores the engine from dir/tag (tag NULL: latest): weights, optimizer state, schedule,
 * counters, data position and the loss scaler's state (into a dynamic fp16 scaler, and only
 * from a run that had one: zt_ckpt_warn_changes), on any number of ranks (each reads the
 * ranges of the saved partitions it needs; from a stage-3 checkpoint's shards only what it
 * keeps). Refuses a tag without DONE or a different model shape, with a message naming the
 * checkpoint and the mismatch. */
zt_status zt_ckpt_load(zt_engine *e, const char *dir, const char *tag);

/* For a job resuming from dir/tag (tag NULL: latest): one line on f, "ztrain: warning: resume:
 * KEY changed from OLD (checkpoint TAGDIR) to NEW: ...", for each of data.train, train.seed,
 * data.shuffle and the precision (fp32, fp16, bf16) that the job changes from the run that wrote
 * the checkpoint (its meta.json). Such a resume is legitimate, continued training on other data
 * or in another precision, but does not continue bit-exactly. An fp16 job with a dynamic loss
 * scale resuming a checkpoint without one (fp32, bf16, a static fp16 scale) starts at
 * 2^initial_scale_power, as a fresh run (zt_ckpt_load takes no scale from it), which the line
 * says. Another data-parallel size that cannot split the samples the checkpoint's ranks drew of
 * the epoch (data.global_position) gets a line too: zt_ckpt_load rounds each rank's position
 * down, and the samples past the last full round are drawn again. A checkpoint older than a key
 * is not compared on it; one whose meta.json cannot be read gives no lines (zt_ckpt_load
 * reports it). */
void zt_ckpt_warn_changes(const char *dir, const char *tag, const zt_job_spec *job, FILE *f);

/* zt_ckpt_load with the parameters and the optimizer state written by fill (which must also call
 * zt_engine_params_loaded and set the optimizer's step count to optimizer_step) instead of read
 * from dir/tag: how a tensor-parallel checkpoint is resharded (ckpt_tp.h). The spec check, the
 * counters, the schedule, the loss scaler and the data position are dir/tag's. */
typedef zt_status (*zt_ckpt_state_filler)(void *ctx, zt_engine *e, int64_t optimizer_step);
zt_status zt_ckpt_load_filled(zt_engine *e, const char *dir, const char *tag,
                              zt_ckpt_state_filler fill, void *ctx);

/* Reads the model spec recorded in a checkpoint (for `ztrain sample` and `ztrain export`).
 * spec->init_from is set to the checkpoint's model.safetensors (heap-owned; free it); a stage-3
 * checkpoint may have none: read its weights with zt_ckpt_weights. */
zt_status zt_ckpt_read_model_spec(const char *dir, const char *tag, zt_model_spec *spec);

/* A checkpoint's weights, read tensor by tensor whatever wrote them (any ZeRO stage and rank
 * count, a pipeline's stages, a tensor-parallel job's shards), so that no reader needs the whole
 * model in memory. The files are mapped, and only the pages of the ranges read are touched. */
typedef struct zt_ckpt_weights zt_ckpt_weights;

/* Which of a checkpoint's weights a reader gives. */
typedef enum {
    /* The weights training computed with: model.safetensors, or a ZeRO-3 checkpoint's
     * model_rank shards; in bf16/fp16 training the 16-bit weights, widened. What a load gives
     * the model (zt_ckpt_tp_load) and what `ztrain sample` runs. */
    ZT_CKPT_WORKING,
    /* The fp32 master weights: the optimizer files' fp32_master slices put together through the
     * flat layout, as DeepSpeed's zero_to_fp32 rebuilds the state dict from the fp32
     * partitions. A checkpoint without them gives its working weights, which then are the
     * masters (fp32 training; bf16 masters with bf16.bf16_master_weights_and_grads) or all it
     * holds (a run without an optimizer). */
    ZT_CKPT_MASTER,
} zt_ckpt_values;

typedef struct {
    const char *name;             /* Hugging Face name, e.g. "h.0.attn.c_attn.weight" */
    int ndim;
    int64_t shape[2];
    size_t numel;
} zt_ckpt_tensor;

/* Opens dir/tag (tag NULL: latest) to read `values`. *spec receives the model spec
 * (spec->init_from NULL). Close with zt_ckpt_weights_close. */
zt_status zt_ckpt_weights_open(zt_ckpt_weights **out, const char *dir, const char *tag,
                               zt_ckpt_values values, zt_model_spec *spec);
/* The model's tensors, in the model's order (valid until close). */
int zt_ckpt_weights_count(const zt_ckpt_weights *w);
const zt_ckpt_tensor *zt_ckpt_weights_tensor(const zt_ckpt_weights *w, int i);
/* Elements [first, first + n) of tensor i, as fp32, into dst. */
zt_status zt_ckpt_weights_read(zt_ckpt_weights *w, int i, size_t first, float *dst, size_t n);
void zt_ckpt_weights_close(zt_ckpt_weights *w);

/* `ztrain export --out` / `zero-to-fp32`: the checkpoint's fp32 master weights (ZT_CKPT_MASTER)
 * as one fp32 safetensors file with Hugging Face names (the metadata of
 * zt_model_save_safetensors), streamed tensor by tensor. */
zt_status zt_ckpt_export_fp32(const char *dir, const char *tag, const char *out);

#endif
