/* How ztrain's attention tensors look to cuDNN's fused attention (kernels/cuda/cudnn_sdpa.c):
 * which shapes and precisions it is asked to run, and each tensor's logical dims and strides.
 * Plain C with no cuDNN type, so that the arithmetic is unit-tested on any machine
 * (tests/unit/test_cudnn_sdpa_layout.c); the module's graph builder is its only other user.
 *
 * cuDNN's dims are always (B, H, T, D) (reference: /work/shared/reference/cudnn_sdpa.md §2);
 * ztrain's layout (ops.h, zt_attn_shape) is token-major rows, packed q|k|v or separate, which
 * cuDNN reads in place through the strides: no permute. */
#ifndef ZTRAIN_CUDNN_SDPA_LAYOUT_H
#define ZTRAIN_CUDNN_SDPA_LAYOUT_H

#include <stdint.h>

#include "ztrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensors of the forward and backward graphs. KT is K seen transposed, (B, H_kv, D, T), as
 * the backend's matmul wants its second operand; the gradients share their tensor's layout. */
typedef enum {
    ZT_SDPA_Q = 0,
    ZT_SDPA_K,
    ZT_SDPA_KT,
    ZT_SDPA_V,
    ZT_SDPA_O,
    ZT_SDPA_STATS,
    ZT_SDPA_TENSORS
} zt_sdpa_tensor_kind;

typedef struct {
    int64_t dim[4], stride[4]; /* in elements */
    int64_t offset;            /* elements from the pointer the op was given (packed k, v) */
} zt_sdpa_tensor;

/* The layout of tensor kind of shape s; O, dO and Stats are ztrain's own ([B,T,n_head·hd] and
 * the flash kernel's [B,n_head,T] log-sum-exp, which is cuDNN's Stats). */
zt_sdpa_tensor zt_sdpa_layout(const zt_attn_shape *s, zt_sdpa_tensor_kind kind);

/* NULL when cuDNN's fused attention is asked to run shape s at activation precision act, else a
 * static sentence saying why not (the op then runs ztrain's flash kernel): bf16 or fp16 only,
 * causal without a window or packed documents (cuDNN 9.19's composite graph has the causal mask
 * alone), head_dim a multiple of 8 and at most 128 (the backward's limit on Ampere). sm is the
 * device's compute capability × 10 (80 for an A100): SM80 or newer. */
const char *zt_sdpa_unsupported(const zt_attn_shape *s, zt_dtype act, int sm);

#ifdef __cplusplus
}
#endif

#endif
