/* The one read a training step makes of the device (internal to engine/train): its scalars —
 * every micro-batch's summed token losses, the pieces of the squared gradient norm, from which
 * the overflow and clipping decisions follow, and with loss-masked data the next step's counts
 * of targets (loss_norm.h) — are written to device memory as they are computed and come back
 * together, in one copy followed by the step's one synchronisation (docs/gpu.md, "Host round
 * trips"). On the CPU the same code runs with host memory. */
#ifndef ZTRAIN_STEP_READBACK_H
#define ZTRAIN_STEP_READBACK_H

#include <stdbool.h>

#include "ztrain/backend.h"
#include "ztrain/status.h"

typedef struct {
    zt_backend *be;
    int gas;         /* micro-batches per step: loss slots [0, gas) */
    int cap;         /* slots: gas losses, 2 counts of the next step, then the norm's parts */
    double *dev;     /* [cap] device memory */
    double *host;    /* [cap] pinned host memory: the copy lands here without a wait of its own */
    /* Per micro-batch of the current step: whether its loss waits in its slot (else `loss` is
     * already known, read at its forward), its trained targets and its share (engine.h). */
    bool *deferred;
    int *counted;
    double *share;
    float *loss;     /* the micro-batches' losses once read */
    bool ahead;      /* the counts' slots are summed on the device this step */
} zt_step_readback;

/* Room for gas losses and norm_parts parts of the norm (the only allocations). Free with
 * zt_step_readback_free, which takes a zeroed struct too. */
zt_status zt_step_readback_init(zt_step_readback *r, zt_backend *be, int gas, int norm_parts);
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

/* The step's synchronisation: copies the first `micros` losses, the counts of
 * zt_step_readback_ahead when given this step and `parts` norm parts back,
 * waits for the device (zt_backend_sync, whose error, naming the device, it returns) and turns
 * the deferred sums into losses. The parts are then at zt_step_readback_norm_parts. */
zt_status zt_step_readback_sync(zt_step_readback *r, int micros, int parts);
const double *zt_step_readback_norm_parts(const zt_step_readback *r);
const double *zt_step_readback_ahead_sums(const zt_step_readback *r);

#endif
