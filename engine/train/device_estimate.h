/* Internal to engine/train: what admission.c tells a "cuda" job refused for its device memory. */
#ifndef ZTRAIN_TRAIN_DEVICE_ESTIMATE_H
#define ZTRAIN_TRAIN_DEVICE_ESTIMATE_H

#include <stddef.h>
#include <stdint.h>

#include "ztrain/admission.h"

/* Writes the single changes to the job (a higher ZeRO stage, offload_optimizer "cpu", activation
 * checkpointing of every block, the largest smaller micro-batch) whose device estimate is at most
 * limit, each with its estimate: "each of these alone would fit: ZeRO stage 3 (41.2 GiB),
 * activation checkpointing of every block (70.3 GiB)"; or, when none is, says so and what is
 * left. */
void zt_device_estimate_advice(const zt_job_spec *job, uint64_t limit, char *buf, size_t size);

#endif
