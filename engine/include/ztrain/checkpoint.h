/* Checkpoints: DIR/latest names the newest tag; DIR/<tag>/ holds
 *   model.safetensors              fp32 weights with Hugging Face names (loads in the Python world)
 *   optim_rank_<r>.safetensors     rank r's optimizer state (Adam exp_avg/exp_avg_sq, or SGD's
 *                                  momentum_buffer) over its slice of the flat parameters, the
 *                                  same whether the state lived in memory or in offload files
 *   meta.json                      counters, data position, schedule, seed, world size, model
 *                                  spec and DeepSpeed config
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

#include "ztrain/engine.h"
#include "ztrain/job_spec.h"
#include "ztrain/status.h"

/* Saves the engine's complete training state under dir/tag (tag NULL: "global_step<N>") and
 * points dir/latest at it. `job` supplies the model spec and DeepSpeed config recorded in
 * meta.json. */
zt_status zt_ckpt_save(zt_engine *e, const zt_job_spec *job, const char *dir, const char *tag);

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
 *    between complete tags without step numbers, and an unreadable `latest` is ZT_ERR_IO. */
zt_status zt_ckpt_find_resume(const char *dir, char *tag, size_t size, char *note,
                              size_t note_size);

/* The tokenizer.json the job named (data.tokenizer), as meta.json records it: a heap string the
 * caller frees, or NULL when the job named none (for `ztrain sample`). */
zt_status zt_ckpt_read_tokenizer(const char *dir, const char *tag, char **path);

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
