/* DeepSpeed's learning-rate schedules: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle and
 * LRRangeTest, with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py).
 *
 * The state is DeepSpeed's last_batch_iteration k: -1 after construction, +1 per applied optimizer
 * step (a skipped fp16 step does not advance it). zt_lr_schedule_lr() is the lr the next update
 * uses: the construction value while k = -1 (e.g. warmup_min_lr for WarmupLR, 0 for
 * WarmupCosineLR, cycle_min_lr for OneCycle), then f(k). */
#ifndef ZTRAIN_LR_SCHEDULE_H
#define ZTRAIN_LR_SCHEDULE_H

#include <stdint.h>

#include "ztrain/ds_config.h"

typedef struct {
    zt_schedule_config cfg;
    double base_lr;    /* the optimizer's configured lr (WarmupCosineLR scales it) */
    double base_beta1; /* the optimizer's beta1 or momentum (OneCycle without cycling keeps it) */
    int64_t last_batch_iteration;
} zt_lr_schedule;

/* Starts a schedule at k = -1. `base_lr` and `base_beta1` come from the optimizer config. */
void zt_lr_schedule_init(zt_lr_schedule *s, const zt_schedule_config *cfg, double base_lr,
                         double base_beta1);

/* The lr for the next optimizer update. */
double zt_lr_schedule_lr(const zt_lr_schedule *s);

/* The momentum (Adam beta1 or SGD momentum) for the next update; OneCycle cycles it when
 * cycle_momentum, every other schedule returns base_beta1. */
double zt_lr_schedule_momentum(const zt_lr_schedule *s);

/* Advances k by one: call after each applied optimizer step. */
void zt_lr_schedule_step(zt_lr_schedule *s);

#endif
