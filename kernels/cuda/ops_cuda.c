/* The CUDA backend's op table: every entry is a kernel file's entry point with the field's own
 * signature (cuda_backend.h), so this file only gathers them. */
#include "cuda_backend.h"

static const zt_ops cuda_ops = {
    .embedding_forward = zt_cuda_embedding_forward,
    .embedding_backward = zt_cuda_embedding_backward,
    .layernorm_forward = zt_cuda_layernorm_forward,
    .layernorm_backward = zt_cuda_layernorm_backward,
    .rmsnorm_forward = zt_cuda_rmsnorm_forward,
    .rmsnorm_backward = zt_cuda_rmsnorm_backward,
    .rope_forward = zt_cuda_rope_forward,
    .rope_backward = zt_cuda_rope_backward,
    .linear_forward = zt_cuda_linear_forward,
    .linear_backward = zt_cuda_linear_backward,
    .linear_gelu_forward = zt_cuda_linear_gelu_forward,
    .linear_backward_gelu = zt_cuda_linear_backward_gelu,
    .attention_forward = zt_cuda_attention_forward,
    .attention_backward = zt_cuda_attention_backward,
    .gelu_forward = zt_cuda_gelu_forward,
    .gelu_backward = zt_cuda_gelu_backward,
    .silu_mul_forward = zt_cuda_silu_mul_forward,
    .silu_mul_backward = zt_cuda_silu_mul_backward,
    .add = zt_cuda_add,
    .softmax_xent = zt_cuda_softmax_xent,
    .xent_partial_stats = zt_cuda_xent_partial_stats,
    .xent_partial_grad = zt_cuda_xent_partial_grad,
    .adam_update = zt_cuda_adam_update,
    .sgd_update = zt_cuda_sgd_update,
    .adam_update_mixed = zt_cuda_adam_update_mixed,
    .lamb_moments = zt_cuda_lamb_moments,
    .lamb_apply = zt_cuda_lamb_apply,
    .sum_squares = zt_cuda_sum_squares,
    .scale = zt_cuda_scale,
    .to_half = zt_cuda_to_half,
    .from_half = zt_cuda_from_half,
    .round_to = zt_cuda_round_to,
    .accumulate_half = zt_cuda_accumulate_half,
    .sum_squares_half = zt_cuda_sum_squares_half,
    .sum_to = zt_cuda_sum_to,
};

const zt_ops *zt_cuda_ops(void) { return &cuda_ops; }
