/* The loss of loss-masked data as transformers' Trainer computes it (internal to engine/train).
 *
 * With labels = -100 on the untrained tokens, transformers (4.46 to 5.x) divides each
 * micro-batch's summed token losses by num_items_in_batch: the trained targets of all the
 * micro-batches of the optimizer step, summed over the data-parallel ranks when
 * average_tokens_across_devices (the default), and multiplies by the world size, which the
 * gradient average divides out again. The optimised objective is therefore the mean over the
 * trained targets of the whole global batch, not a mean of per-micro-batch means. To know that
 * count before the first backward, the engine draws the step's micro-batches ahead: this file
 * holds them and the counts. */
#ifndef ZTRAIN_LOSS_NORM_H
#define ZTRAIN_LOSS_NORM_H

#include <stdint.h>

#include "ztrain/data.h"
#include "ztrain/status.h"

typedef struct zt_comm zt_comm;

typedef struct {
    int gas, B, T;
    int32_t *inputs, *targets; /* [gas][B·T]: the step's micro-batches */
    int32_t *doc_pos;          /* [gas][B·T]: their positions in their documents */
    int *rows;                 /* [gas]: sequences in each (zt_loader_next's count) */
    double trained;            /* trained targets of the global batch, every rank */
    double tokens;             /* all targets of the global batch, every rank */
} zt_loss_norm;

/* Allocates room for gas micro-batches of B×T (the only allocation). Free with
 * zt_loss_norm_free. */
zt_status zt_loss_norm_init(zt_loss_norm *n, int gas, int B, int T);
void zt_loss_norm_free(zt_loss_norm *n);

/* Collective over comm (NULL: one rank): draws the step's gas micro-batches from the loader,
 * counts their trained and all targets and sums the counts over the ranks. A global batch
 * without one trained target is an error naming the step: its loss would be 0/0. */
zt_status zt_loss_norm_fill(zt_loss_norm *n, zt_loader *l, zt_comm *comm, int64_t step);

#endif
