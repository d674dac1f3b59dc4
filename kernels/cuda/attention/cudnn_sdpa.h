/* cuDNN's fused attention as the CUDA backend's attention op runs it (cudnn_sdpa.c, built where
 * cuDNN's headers are found): the library opened on first use, one execution plan per shape and
 * direction built then and kept, and the calls that run them. attention.c asks these first. */
#ifndef ZTRAIN_CUDNN_SDPA_H
#define ZTRAIN_CUDNN_SDPA_H

#include <stdbool.h>

#include "ztrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs the forward (out and each row's log-sum-exp into stats, [B,n_head,T]) with cuDNN and
 * returns true, or returns false having run nothing, with *why saying why cuDNN does not take
 * this call (library missing, shape or precision it is not asked to run, no plan for it): the
 * caller then runs the flash kernel. The arguments are attention_forward's (ops.h). */
bool zt_cudnn_sdpa_forward(const zt_ctx *x, const zt_attn_shape *s, void *out, float *stats,
                           const void *q, const void *k, const void *v, const char **why);
/* The backward likewise (attention_backward's arguments; scratch, [B,n_head,T], receives
 * D = Σ dO·O). Grouped-query shapes are not taken (the graph has no reduction over a group). */
bool zt_cudnn_sdpa_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk, void *dv,
                            float *scratch, const void *dout, const void *out, const void *q,
                            const void *k, const void *v, const float *stats, const char **why);

#ifdef __cplusplus
}
#endif

#endif
