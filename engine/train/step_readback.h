/* The one read a training step makes of the device (internal to engine/train): its scalars —
 * every micro-batch's summed token losses, the pieces of the squared gradient norm, from which
 * the overflow and clipping decisions follow, with loss-masked data the next step's counts of
 * targets (loss_norm.h), and where asked for the step's table of every rank's losses and values
 * (zt_engine_set_step_table) — are written to device memory as they are computed and come back
 * together, in one copy followed by the step's one synchronisation (docs/gpu.md, "Host round
 * trips"). On the CPU the same code runs with host memory.
 *
 * The block: [gas losses][2 counts of the next step][norm parts][world × k table], where a
 * rank's k = 4·gas + values table entries are its raw loss sums, the counts and shares that
 * turn them into its losses, the losses known at their forward, and its values. */
#ifndef ZTRAIN_STEP_READBACK_H
#define ZTRAIN_STEP_READBACK_H

#include <stdbool.h>

#include "ztrain/backend.h"
#include "ztrain/status.h"

typedef struct zt_comm zt_comm;

typedef struct {
    zt_backend *be;
    int gas;         /* micro-batches per step: loss slots [0, gas) */
    int cap;         /* slots of the block (above) */
    double *dev;     /* [cap] device memory */
    double *host;    /* [cap] pinned host memory: the copy lands here without a wait of its own */
    /* Per micro-batch of the current step: whether its loss waits in its slot (else `loss` is
     * already known, read at its forward), its trained targets and its share (engine.h). */
    bool *deferred;
    int *counted;
    double *share;
    float *loss;     /* the micro-batches' losses once read */
    bool ahead;      /* the counts' slots are summed on the device this step */
    /* The step's table (values > 0): world ranks of k entries each in the block, this rank's
     * host-known part staged in pinned `table_in`, the result in `table` [world][gas + values]. */
    int norm_parts;             /* slots of the norm's parts */
    int world, rank, values, k;
    double *table_in;           /* pinned [3·gas + values]: counts, shares, known losses, values */
    double *table;              /* [world][gas + values] */
    size_t *offsets, *counts;   /* [world]: the all-gather's pieces, in doubles */
    bool table_on_device;       /* gathered on the device this step */
} zt_step_readback;

/* Room for gas losses, norm_parts parts of the norm and, with values > 0, the step's table of
 * the world ranks (this one `rank`) of `values` values each (the only allocations). Free with
 * zt_step_readback_free, which takes a zeroed struct too. */
zt_status zt_step_readback_init(zt_step_readback *r, zt_backend *be, int gas, int norm_parts,
                                int world, int rank, int values);
void zt_step_readback_free(zt_step_readback *r);

/* The device slot micro-batch `micro`'s forward sums its token losses into (zt_model.loss_out);
 * its loss is then sum / counted times share, as the forward would have returned it. */
double *zt_step_readback_defer(zt_step_readback *r, int micro, int counted, double share);
/* A micro-batch whose loss was read at its forward. */
void zt_step_readback_known(zt_step_readback *r, int micro, float loss);
/* Where the norm's parts go: [0, zt_step_readback_init's norm_parts). */
double *zt_step_readback_norm_slots(zt_step_readback *r);
/* The next step's counts of targets, this rank's (loss_norm.h): uploaded from pinned memory
 * (no wait) into the device slots returned, which the caller sums over the ranks there; the
 * step's synchronisation brings the sums back with the rest, to zt_step_readback_ahead_sums. */
double *zt_step_readback_ahead(zt_step_readback *r, const double counts[2]);

/* The step's table: this rank's values, to write before the step's synchronisation. */
double *zt_step_readback_table_in(zt_step_readback *r);
/* Before the synchronisation, on a communicator that gathers device memory itself (NCCL): this
 * rank's raw loss sums and the host's part of its entry go into its place in the block's table,
 * and the table is all-gathered there over comm, posted, so that the synchronisation's copy
 * brings back every rank's. */
zt_status zt_step_readback_table_gather(zt_step_readback *r, zt_comm *comm);

/* The step's synchronisation: copies the first `micros` losses, the counts of
 * zt_step_readback_ahead when given this step, the table and `parts` norm parts back,
 * waits for the device (zt_backend_sync, whose error, naming the device, it returns) and turns
 * the deferred sums into losses. The parts are then at zt_step_readback_norm_parts. */
zt_status zt_step_readback_sync(zt_step_readback *r, int micros, int parts);
const double *zt_step_readback_norm_parts(const zt_step_readback *r);
const double *zt_step_readback_ahead_sums(const zt_step_readback *r);

/* After the synchronisation: the table's rows, every rank's losses by the arithmetic of
 * zt_step_readback_sync from what the device gathered, or else this rank's row all-gathered over
 * comm (NULL: one rank) on the host, which waits for nothing on the device. Every rank's losses
 * are the bits that rank computed for itself, whichever way they came. */
zt_status zt_step_readback_table_finish(zt_step_readback *r, zt_comm *comm);

#endif
