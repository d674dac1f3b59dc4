/* The CPU backend's operation table. */
#include <omp.h>

#include "cpu_kernels.h"

static const zt_kernels cpu_kernels = {
    .name = "cpu",
    .encoder_forward = zt_cpu_encoder_forward,
    .encoder_backward = zt_cpu_encoder_backward,
    .layernorm_forward = zt_cpu_layernorm_forward,
    .layernorm_backward = zt_cpu_layernorm_backward,
    .matmul_forward = zt_cpu_matmul_forward,
    .matmul_backward = zt_cpu_matmul_backward,
    .attention_forward = zt_cpu_attention_forward,
    .attention_backward = zt_cpu_attention_backward,
    .gelu_forward = zt_cpu_gelu_forward,
    .gelu_backward = zt_cpu_gelu_backward,
    .add = zt_cpu_add,
    .softmax_xent = zt_cpu_softmax_xent,
    .adam_update = zt_cpu_adam_update,
    .sgd_update = zt_cpu_sgd_update,
    .sum_squares = zt_cpu_sum_squares,
    .scale = zt_cpu_scale,
    .to_half = zt_cpu_to_half,
    .from_half = zt_cpu_from_half,
    .round_to = zt_cpu_round_to,
    .accumulate_half = zt_cpu_accumulate_half,
    .sum_squares_half = zt_cpu_sum_squares_half,
    .adam_update_mixed = zt_cpu_adam_update_mixed,
};

const zt_kernels *zt_kernels_cpu(void) { return &cpu_kernels; }

void zt_kernels_cpu_set_threads(int n) {
    if (n > 0)
        omp_set_num_threads(n);
}

const char *zt_kernels_cpu_optim_isa(void) { return zt_cpu_optim_isa(); }
