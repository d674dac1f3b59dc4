/* The per-rank part of the trainer's metric record (internal to the engine): each rank's memory,
 * step breakdown, CPU and GPU figures, gathered to rank 0 at every logged step by one collective,
 * and the step's straggler. The metric names and meanings are in docs/metrics-and-events.md.
 * Sized once for the job's world, so the step loop does not allocate. */
#ifndef ZTRAIN_RANK_STATS_H
#define ZTRAIN_RANK_STATS_H

#include <stdbool.h>
#include <stdio.h>

#include "ztrain/backend.h"
#include "ztrain/comm.h"
#include "ztrain/engine.h"
#include "ztrain/metrics.h"
#include "ztrain/nvml.h"
#include "ztrain/sysmetrics.h"

/* What one rank measured of its last optimizer step, in milliseconds. The parts data + fwd + bwd
 * + step + comm add up to step_time up to the loop's own bookkeeping. */
typedef struct {
    double step_time;  /* the whole step on this rank, to the end of its loss all-reduce */
    double data;       /* waiting for batches (zt_engine_next_batch) */
    double comm;       /* communication of this thread over the step (zt_comm_thread_ms) */
    double device_wait; /* CUDA: the host blocked waiting for the device (zt_cuda_waits.wait_ms);
                         * NaN elsewhere */
    zt_engine_timers engine; /* fwd/bwd/step, communication included (subtracted here) */
} zt_rank_step;

/* What a rank holds at a logged step: memory/rank<r>/params_bytes, grads_bytes, optimizer_bytes,
 * fp32_workspace_bytes (mixed precision), device_allocated_bytes and device_peak_bytes (cuda: the
 * backend's own count, zt_backend_cuda_memory); peak_rss_bytes is sampled here. */
typedef struct {
    zt_engine_memory model;
    zt_cuda_memory device; /* zeros off cuda */
} zt_rank_memory;

typedef struct {
    int rank, world;
    int per_rank;        /* figures per rank: which apply to the job's device and precision */
    int field[32];       /* [per_rank]: the figure of each column (rank_stats.c's order) */
    double *values;      /* [world * per_rank]: this rank's filled in, then summed over ranks */
    char (*keys)[64];    /* [world * per_rank]: "perf/rank<r>/fwd_ms", "system/rank<r>/..." */
    double *compute;     /* [world]: scratch for the median */
    double mine[32];     /* this rank's figures by figure, of its last step */
    zt_sys_sampler sys;
    zt_nvml *nvml;       /* NULL: no GPU metrics (CPU job, or NVML not present) */
    int gpu_index;
    double slow_ms;      /* ZTRAIN_INJECT_SLOW_RANK (tests): this rank's delay per batch */
} zt_rank_stats;

/* Sizes the record for the world, with the fp32 workspace's figure when the job trains in mixed
 * precision. With device cuda it opens NVML for the local rank's GPU; when
 * that fails the GPU figures are left out and, on rank 0, one line on `note` (may be NULL) says why.
 * Free with zt_rank_stats_free (also after a failure). */
zt_status zt_rank_stats_init(zt_rank_stats *rs, int rank, int world, int local_rank,
                             zt_device device, bool mixed_precision, FILE *note);
void zt_rank_stats_free(zt_rank_stats *rs);

/* The most metrics zt_rank_stats_collect writes. */
int zt_rank_stats_max_metrics(const zt_rank_stats *rs);

/* ZTRAIN_INJECT_SLOW_RANK="MS[:RANK]" (tests) makes rank RANK (default 0) sleep MS milliseconds
 * here; the trainer calls it as it takes each batch, so the delay is data wait and the rank a
 * straggler. Nothing without the variable. */
void zt_rank_stats_inject_delay(const zt_rank_stats *rs);

/* Keeps this rank's figures of the step just taken. */
void zt_rank_stats_step(zt_rank_stats *rs, const zt_rank_step *st);

/* Samples CPU and memory (over the interval since the previous collect) and the GPU, gathers
 * every rank's figures and its mem to every rank (one collective over comm; NULL for one rank)
 * and writes them, and with more than one rank the straggler, into dst; *n is the count (every
 * rank gets the same). A figure that is not known (no NVML, no /proc) is left out. The keys stay
 * valid until zt_rank_stats_free. */
zt_status zt_rank_stats_collect(zt_rank_stats *rs, zt_comm *comm, const zt_rank_memory *mem,
                                zt_metric *dst, int *n);

#endif
