/* What the ZeRO files share (zero.c: partition state; zero_gather.c: parameter gathering;
 * zero_buckets.c: gradient buckets and their reduction; zero_comm_thread.c: the communication
 * thread; zero_optim.c: the partition's optimizer state and update). Not part of zero.h's
 * interface to the engine. */
#ifndef ZTRAIN_ZERO_INTERNAL_H
#define ZTRAIN_ZERO_INTERNAL_H

#include "ztrain/zero.h"

static inline size_t zt_min_sz(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t zt_max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The flat-buffer runs of a layer's tensors (layer -1: the outer tensors). */
static inline const zt_zero_segment *zt_zero_segment_of(const zt_zero *z, int layer) {
    return &z->segments[layer + 1];
}

/* Memory of the model's backend, in elements of fp32 or 16-bit buffers. */
static inline void zt_zero_release_f32(zt_zero *z, float *x, size_t lo, size_t hi) {
    zt_backend_release(z->be, x, lo * sizeof(float), hi * sizeof(float));
}
static inline void zt_zero_release_u16(zt_zero *z, uint16_t *x, size_t lo, size_t hi) {
    zt_backend_release(z->be, x, lo * 2, hi * 2);
}
static inline zt_status zt_zero_commit_f32(zt_zero *z, float *x, size_t lo, size_t hi) {
    return zt_backend_commit(z->be, x, lo * sizeof(float), hi * sizeof(float));
}
static inline double zt_zero_resident_f32(zt_zero *z, const float *x, size_t lo, size_t hi) {
    return (double)zt_backend_resident_bytes(z->be, x, lo * sizeof(float), hi * sizeof(float));
}
static inline double zt_zero_resident_u16(zt_zero *z, const uint16_t *x, size_t lo, size_t hi) {
    return (double)zt_backend_resident_bytes(z->be, x, lo * 2, hi * 2);
}

/* zero.c */
/* The pieces of [lo, hi) that each rank owns, relative to lo. */
void zt_zero_pieces(const zt_zero *z, size_t lo, size_t hi, size_t *offsets, size_t *counts);
/* Records the first failure (its message is the calling thread's zt_last_error); thread-safe. */
void zt_zero_fail(zt_zero *z, zt_status s);
/* With the comm thread's lock held (or without a comm thread): the same. */
void zt_zero_record(zt_zero *z, zt_status s);
/* The first failure, its message made this thread's zt_last_error. */
zt_status zt_zero_first_error(zt_zero *z);
/* *slot = max(*slot, v), under the lock: both threads record peaks. */
void zt_zero_note_max(zt_zero *z, double *slot, double v);

/* zero_comm_thread.c */
zt_status zt_zero_start_comm_thread(zt_zero *z);
void zt_zero_stop_comm_thread(zt_zero *z);
/* Queues a job for the communication thread (or runs it at once without one); its sequence
 * number (0 when it ran at once). */
uint64_t zt_zero_submit(zt_zero *z, zt_zero_job j);
/* Waits until job seq (and everything queued before it) has run, makes the compute stream
 * issued from now on wait for it, and lets go of the ranges those jobs reduced. */
void zt_zero_wait_for(zt_zero *z, uint64_t seq);
/* Whether the caller is the communication thread. */
bool zt_zero_on_comm_thread(const zt_zero *z);
/* The ctx a job's ops run with: the communication thread's (its stream), else z->ctx. */
const zt_ctx *zt_zero_job_ctx(const zt_zero *z);
/* Waits for everything queued. */
void zt_zero_drain(zt_zero *z);

/* zero_gather.c */
/* Stage 3 brings layers in as they are used (gathered from their owners, or read from this
 * rank's file). */
bool zt_zero_gathers(const zt_zero *z);
/* Bytes of the fp32 working copy held (parameters and gradients), and at stage 3 the 16-bit
 * parameters gathered with it: mixed precision's workspace. */
double zt_zero_workspace(zt_zero *z);
zt_status zt_zero_gather_range(zt_zero *z, size_t lo, size_t hi);
/* Stage 3 in fp32, with tensors kept whole: `kept` takes their values from the model's fp32
 * parameters, whole at that moment (setup, a load), or, after a step, from their owners. */
zt_status zt_zero_init_kept(zt_zero *z);
void zt_zero_fill_kept(zt_zero *z);
zt_status zt_zero_gather_kept(zt_zero *z);
void zt_zero_hook_fetch(void *ctx, int layer, bool backward);
void zt_zero_hook_grads_write(void *ctx, int layer);
void zt_zero_hook_release(void *ctx, int layer);
void zt_zero_hook_release_half(void *ctx, int layer);

/* zero_buckets.c */
/* Reduces the gradients of [lo, hi) into this rank's accumulator and lets the range go; on the
 * communication thread the letting go is the training thread's (zt_zero_let_go_reduced, from
 * zt_zero_wait_for). */
zt_status zt_zero_reduce_range(zt_zero *z, size_t lo, size_t hi);
void zt_zero_let_go_reduced(zt_zero *z, size_t lo, size_t hi);
void zt_zero_hook_grads_ready(void *ctx, int layer);

#endif
