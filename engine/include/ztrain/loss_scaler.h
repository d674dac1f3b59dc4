/* DeepSpeed's loss scaler for fp16 training (deepspeed/runtime/fp16/loss_scaler.py), exactly.
 *
 * Two rules, as in DeepSpeed: ZeRO stages 1–3 use DynamicLossScaler.update_scale (hysteresis,
 * consecutive_hysteresis, an error once the scale is already at min_loss_scale); stage 0 uses the
 * non-ZeRO FP16_Optimizer rule (halve on overflow down to the minimum, no hysteresis, no error).
 * Both double the scale after loss_scale_window clean steps. A static scale (fp16.loss_scale > 0)
 * never changes; bf16 and fp32 use a static scale of 1. */
#ifndef ZTRAIN_LOSS_SCALER_H
#define ZTRAIN_LOSS_SCALER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ztrain/ds_config.h"
#include "ztrain/status.h"

typedef enum {
    ZT_SCALER_STATIC = 0,  /* fixed scale */
    ZT_SCALER_ZERO,        /* DynamicLossScaler with hysteresis (ZeRO stages 1-3) */
    ZT_SCALER_NON_ZERO,    /* FP16_Optimizer's rule (stage 0) */
} zt_scaler_kind;

typedef struct {
    zt_scaler_kind kind;
    double cur_scale;
    double min_scale;
    int64_t cur_iter;
    int64_t last_overflow_iter;
    int scale_window;
    int hysteresis;        /* configured delayed shift */
    int cur_hysteresis;
    bool consecutive_hysteresis;
} zt_loss_scaler;

/* From the config: fp16 enabled → dynamic (kind by zero_stage) unless fp16.loss_scale > 0 (static);
 * otherwise static 1. */
void zt_loss_scaler_init(zt_loss_scaler *s, const zt_ds_config *cfg);

/* Records the result of one optimizer step (called once per step, with the overflow flag agreed
 * across ranks) and updates the scale by DeepSpeed's rule. Writes DeepSpeed's log lines to `log`
 * (may be NULL) — "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536,
 * reducing to 32768" and its hysteresis variant for the ZeRO rule; "Grad overflow on iteration N"
 * / "Reducing dynamic loss scale from A to B" for the non-ZeRO rule. Returns ZT_ERR_NUMERIC with
 * DeepSpeed's text "Current loss scale already at minimum - cannot decrease scale anymore. Exiting
 * run." when the ZeRO rule overflows at min_loss_scale. */
zt_status zt_loss_scaler_update(zt_loss_scaler *s, bool overflow, FILE *log);

double zt_loss_scaler_scale(const zt_loss_scaler *s);

#endif
