/* DeepSpeed's steps_per_print line (DeepSpeedEngine._report_progress), in DeepSpeed's words:
 * "step=N, skipped=K, lr=[...], mom=[...]", where lr and mom are the param group's values as
 * Python prints them (internal to engine/train). */
#ifndef ZTRAIN_STEP_REPORT_H
#define ZTRAIN_STEP_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "ztrain/ds_config.h"

/* Writes the line to f, prefixed "[ztrain] ". mom is get_mom()'s list for the optimizer o:
 * SGD's momentum; for the Adam family the betas, a list when the config gave "betas" (DeepSpeed
 * hands the JSON list to the optimizer) and a tuple otherwise (the optimizer's default), with
 * beta1 the scheduled momentum when OneCycle cycles it (`cycled`), which DeepSpeed stores as a
 * tuple. */
void zt_step_report_print(FILE *f, long long step, long long skipped, double lr, double mom,
                          bool cycled, const zt_optimizer_config *o);

#endif
