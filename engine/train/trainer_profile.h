/* The trainer's side of `--profile` (internal to libztrain): per-op timings of every step
 * (ztrain/op_profile.h) written by rank 0 as they come to <out_dir>/profile.jsonl, one line a
 * step, and summed over the timed steps (those after train.warmup_steps) into
 * <out_dir>/profile.json and a table printed at the end of the run. docs/profiling.md describes
 * both files. Other ranks time their ops too (a collective's wait shows in the step time, not in
 * any op) but write nothing. */
#ifndef ZTRAIN_TRAINER_PROFILE_H
#define ZTRAIN_TRAINER_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ztrain/backend.h"
#include "ztrain/job_spec.h"
#include "ztrain/op_profile.h"

typedef struct {
    zt_op_profile *prof;
    zt_backend *be;
    int rank;
    char path[4200];       /* rank 0: profile.json; "" elsewhere or without out_dir */
    FILE *file;            /* rank 0: profile.jsonl; NULL elsewhere */
    char header[1024];     /* the JSON members that say what was profiled */
    zt_op_time last[ZT_OP_COUNT];
    zt_op_time sum[ZT_OP_COUNT]; /* over the timed steps */
    double sum_step_ms;
    long timed_steps, steps;
} zt_trainer_profile;

/* Starts profiling be's ops for the job (zt_op_profile_create); rank 0 opens its files in
 * out_dir (may be NULL: no files). Free with zt_trainer_profile_free. */
zt_status zt_trainer_profile_init(zt_trainer_profile *tp, const zt_job_spec *job, zt_backend *be,
                                  int rank, const char *out_dir);
void zt_trainer_profile_free(zt_trainer_profile *tp);

static inline void zt_trainer_profile_begin(zt_trainer_profile *tp) {
    zt_op_profile_begin_step(tp->prof);
}
/* Waits for the device to finish the step's work, so that the step time the trainer measures
 * next covers every op timed in it. */
zt_status zt_trainer_profile_wait(zt_trainer_profile *tp);
/* Reads the step's op times; step_ms is the trainer's step time, timed whether the step is
 * past warmup. Rank 0 appends the step's line and rewrites profile.json. */
zt_status zt_trainer_profile_end(zt_trainer_profile *tp, int64_t step, double step_ms, bool timed);
/* Rank 0: the summary table of the timed steps (of all steps when none was timed). */
void zt_trainer_profile_print(const zt_trainer_profile *tp, FILE *out);

#endif
