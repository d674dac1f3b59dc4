/* The loss of loss-masked data as transformers' Trainer computes it (internal to engine/train).
 *
 * With labels = -100 on the untrained tokens, transformers (4.46 to 5.x) divides each
 * micro-batch's summed token losses by num_items_in_batch: the trained targets of all the
 * micro-batches of the optimizer step, summed over the data-parallel ranks when
 * average_tokens_across_devices (the default), and multiplies by the world size, which the
 * gradient average divides out again. The optimised objective is therefore the mean over the
 * trained targets of the whole global batch, not a mean of per-micro-batch means. To know that
 * count before the first backward, the engine draws the step's micro-batches ahead: this file
 * holds them and the counts.
 *
 * Drawing a step and summing its counts over the ranks right before its first forward is a
 * collective at the step's start, which a transport that reads device memory (NCCL) stages
 * through the device: a host wait of its own. So in the steady state the engine draws the next
 * step's micro-batches at the end of the current one (zt_loss_norm_draw_ahead), and their
 * counts are summed under the current step's one wait (engine.c, read_step). Only a step with
 * nothing drawn ahead (the first, the first after a seek) is drawn and summed where it starts
 * (zt_loss_norm_fill). */
#ifndef ZTRAIN_LOSS_NORM_H
#define ZTRAIN_LOSS_NORM_H

#include <stdbool.h>
#include <stdint.h>

#include "ztrain/data.h"
#include "ztrain/status.h"

typedef struct zt_comm zt_comm;

/* One step's micro-batches, as zt_loader_next_docs gives them. */
typedef struct {
    int32_t *inputs, *targets; /* [gas][B·T] */
    int32_t *doc_pos;          /* [gas][B·T]: their positions in their documents */
    int *rows;                 /* [gas]: sequences in each (zt_loader_next's count) */
    double counts[2];          /* trained targets and all targets: this rank's, then summed */
    int64_t epoch, pos;        /* the loader's place right after the draw */
} zt_loss_draw;

typedef struct {
    int gas, B, T;
    zt_loss_draw draws[2];
    int cur;                   /* draws[cur] is the current step's */
    bool ahead;                /* draws[1 - cur] holds the next step's (zt_loss_norm_draw_ahead) */
    char ahead_failed[512];    /* why that draw failed ("" when it did not) */
    double trained;            /* trained targets of the current step's global batch */
    double tokens;             /* all its targets */
} zt_loss_norm;

/* Allocates room for two steps of gas micro-batches of B×T (the only allocation). Free with
 * zt_loss_norm_free. */
zt_status zt_loss_norm_init(zt_loss_norm *n, int gas, int B, int T);
void zt_loss_norm_free(zt_loss_norm *n);

/* The current step's draw. */
static inline const zt_loss_draw *zt_loss_norm_step(const zt_loss_norm *n) {
    return &n->draws[n->cur];
}

/* Collective over comm (NULL: one rank): draws step `step`'s gas micro-batches from the loader
 * now, counts their trained and all targets and sums the counts over the ranks on the host; only
 * with nothing drawn ahead. A global batch without one trained target is an error naming the
 * step: its loss would be 0/0. */
zt_status zt_loss_norm_fill(zt_loss_norm *n, zt_loader *l, zt_comm *comm, int64_t step);

/* Draws the next step's micro-batches from the loader and counts this rank's targets: the
 * returned counts[2] are the caller's to sum over the ranks, in place, before
 * zt_loss_norm_take_ahead. */
double *zt_loss_norm_draw_ahead(zt_loss_norm *n, zt_loader *l);

/* Whether the next step was drawn ahead, and then makes it step `step`, whose counts its
 * caller has summed (the same checks as zt_loss_norm_fill). */
static inline bool zt_loss_norm_has_ahead(const zt_loss_norm *n) { return n->ahead; }
zt_status zt_loss_norm_take_ahead(zt_loss_norm *n, int64_t step);
/* Forgets what was drawn ahead, when the loader has been moved (a checkpoint's seek). */
static inline void zt_loss_norm_drop_ahead(zt_loss_norm *n) { n->ahead = false; }

#endif
