/* Internal to engine/train: what admission.c and device_estimate.c share, the working buffers
 * of the host estimate and the device's fp32 copy, and what a "cuda" job refused for its device
 * memory is told. */
#ifndef ZTRAIN_TRAIN_DEVICE_ESTIMATE_H
#define ZTRAIN_TRAIN_DEVICE_ESTIMATE_H

#include <stddef.h>
#include <stdint.h>

#include "ztrain/admission.h"
#include "ztrain/model.h"

/* What the engine holds beyond ZeRO's terms at once, in fp32 elements of the model's working
 * buffers: at start the fp32 model as it is initialised or loaded, before it is rounded and
 * partitioned; in training the layers in use (and the one stage 3 prefetches) and stage 3's
 * small tensors kept whole, and the gradients in flight (two reduce buckets from stage 2, the
 * layer in use in mixed precision below that); the more of the two. It is the host estimate's
 * working buffers and, in mixed precision, the part of the fp32 copy the kernels need live on
 * the device. *params_tmp: the training parameters' part. Padded is Ψ padded, N the
 * data-parallel size. */
uint64_t zt_admission_working_set(const zt_job_spec *job, const zt_model_estimate *m,
                                  uint64_t padded, uint64_t N, uint64_t *params_tmp, bool *ov);

/* Writes the single changes to the job (a higher ZeRO stage, offload_optimizer "cpu", activation
 * checkpointing of every block, the largest smaller micro-batch) whose device estimate is at most
 * limit, each with its estimate: "each of these alone would fit: ZeRO stage 3 (41.2 GiB),
 * activation checkpointing of every block (70.3 GiB)"; or, when none is, says so and what is
 * left. */
void zt_device_estimate_advice(const zt_job_spec *job, uint64_t limit, char *buf, size_t size);

#endif
