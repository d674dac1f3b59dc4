/* The training loop a job runs: data, engine, evaluation, metrics, checkpoints and progress.
 * `ztrain run` calls it; later the rank processes under ztraind do too. */
#ifndef ZTRAIN_TRAINER_H
#define ZTRAIN_TRAINER_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

#include "ztrain/comm.h"
#include "ztrain/job_spec.h"
#include "ztrain/status.h"

typedef struct {
    const char *out_dir;   /* metrics.jsonl goes here (created if needed) */
    /* progress output; a terminal gets a live bar, anything else lines. Warnings (a resume that
     * changes the data or the precision, zt_ckpt_warn_changes) go to stderr from rank 0. */
    FILE *progress;
    int threads;           /* CPU threads (0: the OpenMP default) */
    /* When it becomes non-zero (e.g. set by ztrain/stop_signals.h on SIGINT/SIGTERM) the loop finishes the
     * current step, writes a checkpoint if the job has a checkpoint_dir, and returns ZT_OK with
     * `stopped` set. May be NULL. */
    volatile sig_atomic_t *stop_requested;
    /* This process's place in the job and its communicator (NULL for a single-rank job run in
     * process). Rank 0 writes metrics.jsonl and shows progress; every rank trains its share. A stop
     * request on any rank stops all of them at the same step. */
    const zt_dist_info *dist;
    zt_comm *comm;
    /* > 0: rank 0 also sends every metric record, and a {"event": "running"} line when the loop
     * starts, to this descriptor (ztraind's pipe; the worker takes it from ZTRAIN_METRICS_FD). */
    int metrics_fd;
    /* Per-op timings of every step (`--profile`, engine/train/trainer_profile.h): rank 0 writes
     * out_dir/profile.jsonl and profile.json and prints a table at the end. Each profiled step
     * waits for the device before its step time is taken. */
    bool profile;
} zt_train_options;

typedef struct {
    long long steps;            /* optimizer steps at the end (global) */
    long long first_step;       /* the global step it started at (a resumed checkpoint's) */
    long long max_steps;        /* the step it trains to: train.max_steps, or the epochs' */
    bool max_steps_from_epochs; /* max_steps counted from train.epochs (train.max_steps 0) */
    double final_loss;          /* train loss of the last step; NaN when no step ran */
    double final_eval_loss;     /* NaN when there was no evaluation */
    double tokens_per_second;   /* mean over the timed steps (after warmup_steps); NaN if none */
    double tflops;              /* likewise */
    bool stopped;               /* ended early on stop_requested */
} zt_train_result;

/* Checks that every rank of comm was started with the same job: one all-gather of a digest of
 * zt_job_spec_agreement_text (ztrain/job_spec.h) and its length. When the ranks differ, every
 * rank learns rank 0's and the first differing rank's texts and fails with ZT_ERR_INVALID
 * naming both ranks and the first key that differs ("the ranks were started with different
 * jobs: rank 1's differs from rank 0's at deepspeed.optimizer.params.lr (rank 0: 0.001, rank
 * 1: 0.05)"), before any collective whose size depends on the job could wait out the timeout.
 * zt_train_run calls it first; it is the first collective on comm. */
zt_status zt_train_check_agreement(const zt_job_spec *job, zt_comm *comm);

zt_status zt_train_run(const zt_job_spec *job, const zt_train_options *opts, zt_train_result *res);

/* Prints the final line of a run that was not stopped: "done: 20 steps, final loss 4.1234, ..."
 * with only the figures that were measured, or, when no step ran because the run started (from
 * a checkpoint) at or past max_steps, "done: nothing to train: the checkpoint is at step 5, at or
 * past train.max_steps 1". That is a success, as for Hugging Face's Trainer, which resumes such a
 * checkpoint into an empty loop: the job asked for its steps and has them, so a restart or a
 * scheduler's rerun of a finished job does no harm. */
void zt_train_result_print(const zt_train_result *res, FILE *f);

#endif
