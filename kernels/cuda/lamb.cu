/* LAMB's two passes on the GPU (ops.h, DeepSpeed's FusedLamb): the moments with the sums of p²
 * and u² in double (two-pass, fixed block count, as optim.cu's sum of squares), returned or
 * added to a tensor's device slot (lamb_moments_to); each tensor's step from its slot
 * (lamb_steps); then the update scaled by the step it reads from device memory, which can write
 * the 16-bit parameters in the same pass. Per element the CPU's IEEE operations
 * (kernels/cpu/lamb.c), so m, v, the steps and p match it bit for bit. */
#include "optim_vec.cuh"

struct lamb_coef {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, wd;
    bool eps_inside_sqrt;
};

static lamb_coef lamb_coef_of(const zt_lamb_args *a) {
    lamb_coef c;
    c.beta1 = a->beta1;
    c.one_minus_beta1 = (float)(1.0 - a->beta1);
    c.beta2 = a->beta2;
    c.one_minus_beta2 = (float)(1.0 - a->beta2);
    c.eps = a->eps;
    c.wd = a->weight_decay;
    c.eps_inside_sqrt = a->eps_inside_sqrt;
    return c;
}

__device__ __forceinline__ float lamb_u(float p, float m, float v, const lamb_coef &c) {
    float denom = c.eps_inside_sqrt ? __fsqrt_rn(__fadd_rn(v, c.eps))
                                    : __fadd_rn(__fsqrt_rn(v), c.eps);
    return __fmaf_rn(c.wd, p, __fdiv_rn(m, denom));
}

__global__ void lamb_moments_kernel(const float *p, const float *g, float *m, float *v, size_t n,
                                    lamb_coef c, double *partial) {
    __shared__ double red[32];
    double w2 = 0.0, u2 = 0.0;
    ZT_GRID_LOOP(i, n) {
        float gi = g[i];
        float mi = __fmaf_rn(c.beta1, m[i], __fmul_rn(c.one_minus_beta1, gi));
        float vi = __fmaf_rn(c.beta2, v[i], __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float u = lamb_u(p[i], mi, vi, c);
        w2 += (double)p[i] * p[i];
        u2 += (double)u * u;
    }
    w2 = zt_block_sum(w2, red);
    u2 = zt_block_sum(u2, red);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = w2;
        partial[ZT_CUDA_SUM_BLOCKS + blockIdx.x] = u2;
    }
}

/* Each tensor's step: zt_cpu_lamb_steps' operations in its order, each rounded as there (the
 * double roots rounded once to float, then float divide, compares and multiply). One thread a
 * tensor; a step has a few hundred at most. */
__global__ void lamb_steps_kernel(float *steps, const double *sums, size_t n,
                                  zt_lamb_step_args a) {
    ZT_GRID_LOOP(i, n) {
        float w = __double2float_rn(__dsqrt_rn(sums[2 * i]));
        float u = __double2float_rn(__dsqrt_rn(sums[2 * i + 1]));
        float coeff = 1.0f;
        if (w != 0.0f && u != 0.0f) {
            coeff = __fdiv_rn(w, u);
            if (coeff > a.max_coeff)
                coeff = a.max_coeff;
            if (coeff < a.min_coeff)
                coeff = a.min_coeff;
        }
        steps[i] = __fmul_rn(a.step_size, coeff);
    }
}

/* The second pass in chunks (optim_vec.cuh); param16 NULL: no 16-bit copy. The step is the
 * tensor's lamb_steps slot, written earlier in stream order. */
__global__ void lamb_apply_kernel(float *p, const float *m, const float *v, size_t n, lamb_coef c,
                                  const float *step_at, uint16_t *param16, bool param_bf16) {
    const float step = *step_at;
    OPT_LOOP(base, n) {
        float pi[OPT_VEC] = {}, mi[OPT_VEC] = {}, vi[OPT_VEC] = {};
        ld8(p, base, n, pi);
        ld8(m, base, n, mi);
        ld8(v, base, n, vi);
        for (int j = 0; j < OPT_VEC; j++)
            pi[j] = __fmaf_rn(-step, lamb_u(pi[j], mi[j], vi[j], c), pi[j]);
        st8(p, base, n, pi);
        if (param16)
            st8_half(param16, base, n, param_bf16, pi);
    }
}

extern "C" void zt_cuda_lamb_moments(const zt_ctx *x, const float *p, const float *g, float *m,
                                     float *v, size_t n, const zt_lamb_args *a, double sums[2]) {
    unsigned blocks = zt_cuda_sum_blocks(n);
    ZT_LAUNCH(lamb_moments_kernel, blocks, ZT_CUDA_BLOCK, 0, zt_cuda_stream(x), p, g, m, v, n,
              lamb_coef_of(a), zt_cuda_of(x)->sums_dev);
    ZT_CUDA_LAUNCHED(x->be);
    zt_cuda_sum_totals(x, blocks, 2, sums);
}

extern "C" void zt_cuda_lamb_moments_to(const zt_ctx *x, const float *p, const float *g,
                                        float *m, float *v, size_t n, const zt_lamb_args *a,
                                        double *sums) {
    unsigned blocks = zt_cuda_sum_blocks(n);
    ZT_LAUNCH(lamb_moments_kernel, blocks, ZT_CUDA_BLOCK, 0, zt_cuda_stream(x), p, g, m, v, n,
              lamb_coef_of(a), zt_cuda_of(x)->sums_dev);
    ZT_CUDA_LAUNCHED(x->be);
    zt_cuda_sum_totals_add(x, blocks, 2, sums);
}

extern "C" void zt_cuda_lamb_steps(const zt_ctx *x, float *steps, const double *sums, size_t n,
                                   const zt_lamb_step_args *a) {
    ZT_LAUNCH_1D(x, n, lamb_steps_kernel, steps, sums, n, *a);
}

extern "C" void zt_cuda_lamb_apply(const zt_ctx *x, float *p, const float *m, const float *v,
                                   size_t n, const zt_lamb_args *a, const float *step) {
    OPT_LAUNCH(x, n, lamb_apply_kernel, p, m, v, n, lamb_coef_of(a), step, (uint16_t *)NULL,
               false);
}

extern "C" void zt_cuda_lamb_apply_mixed(const zt_ctx *x, float *p, const float *m, const float *v,
                                         size_t n, const zt_lamb_args *a, const float *step,
                                         uint16_t *param16, zt_dtype param_type) {
    ZT_ASSERT(param_type == ZT_BF16 || param_type == ZT_F16);
    OPT_LAUNCH(x, n, lamb_apply_kernel, p, m, v, n, lamb_coef_of(a), step, param16,
               param_type == ZT_BF16);
}
