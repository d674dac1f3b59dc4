/* Checkpoints: DIR/latest names the newest tag; DIR/<tag>/ holds
 *   model.safetensors              fp32 weights with Hugging Face names (loads in the Python world)
 *   optim_rank_<r>.safetensors     rank r's optimizer state (Adam exp_avg/exp_avg_sq, or SGD's
 *                                  momentum_buffer) over its slice of the flat parameters, the
 *                                  same whether the state lived in memory or in offload files
 *   meta.json                      counters, data position, schedule, seed, world size, model
 *                                  spec and DeepSpeed config
 *   DONE                           written last: a tag without it is never loaded
 * The default tag is "global_step<N>", as DeepSpeed's. A tag directory is written under a
 * temporary name and renamed into place, and `latest` is replaced atomically, so a crash at any
 * point leaves the previous checkpoint loadable. */
#ifndef ZTRAIN_CHECKPOINT_H
#define ZTRAIN_CHECKPOINT_H

#include <stdint.h>
#include <stdbool.h>

#include "ztrain/engine.h"
#include "ztrain/job_spec.h"
#include "ztrain/status.h"

/* Saves the engine's complete training state under dir/tag (tag NULL: "global_step<N>") and
 * points dir/latest at it. `job` supplies the model spec and DeepSpeed config recorded in
 * meta.json. */
zt_status zt_ckpt_save(zt_engine *e, const zt_job_spec *job, const char *dir, const char *tag);

/* Reads dir/latest into tag[size]. Returns ZT_ERR_IO when there is no latest file. */
zt_status zt_ckpt_latest(const char *dir, char *tag, size_t size);

/* One checkpoint directory under dir, as zt_ckpt_list_dir finds it. */
typedef struct {
    char *tag;          /* "global_step100" */
    int64_t step;       /* from the tag's trailing digits; -1 when it has none */
    bool complete;      /* the DONE marker exists, so it can be loaded */
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
 * counters and data position. Refuses a tag without DONE, a different model shape, or a different
 * world size, with a message naming the checkpoint and the mismatch. */
zt_status zt_ckpt_load(zt_engine *e, const char *dir, const char *tag);

/* Reads the model spec recorded in a checkpoint (for `ztrain sample` and `ztrain export`).
 * spec->init_from is set to the checkpoint's model.safetensors (heap-owned; free it). */
zt_status zt_ckpt_read_model_spec(const char *dir, const char *tag, zt_model_spec *spec);

#endif
