/* Optimizer and gradient ops on the GPU over flat fp32 slices: Adam/AdamW, the fused
 * mixed-precision Adam (16-bit gradients in, fp32 masters and moments, 16-bit parameters out),
 * SGD and its fused mixed-precision form, scale, and the double-precision sum of squares of the global norm.
 *
 * Each element goes through the CPU's sequence of IEEE operations (kernels/cpu/optim.c: explicit
 * fused multiply-adds, correctly rounded sqrt and divide, which nvcc keeps without
 * --use_fast_math) with the coefficients derived the same way on the host, so an element's result
 * is the CPU's bit for bit and does not depend on where a slice starts. The updates are memory
 * bound: each thread takes a chunk of OPT_VEC elements, moved in 16-byte loads and stores (two per
 * fp32 array, one per 16-bit one) where the chunk is whole and aligned, element by element
 * otherwise (a slice's tail, an odd offset). The sum of squares runs in two passes over a fixed
 * number of blocks: deterministic for a given n. */
#include "optim_vec.cuh"

struct adam_coef {
    float decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, sqrt_bc2, step_size;
};

static adam_coef adam_coef_of(const zt_adam_args *a) {
    adam_coef c;
    c.decay = a->adamw_mode ? (float)(1.0 - (double)a->lr * a->weight_decay) : 1.0f;
    c.l2 = a->adamw_mode ? 0.0f : a->weight_decay;
    c.beta1 = a->beta1;
    c.one_minus_beta1 = (float)(1.0 - a->beta1);
    c.beta2 = a->beta2;
    c.one_minus_beta2 = (float)(1.0 - a->beta2);
    c.eps = a->eps;
    c.sqrt_bc2 = (float)sqrt((double)a->bias_correction2);
    c.step_size = (float)((double)a->lr / a->bias_correction1);
    return c;
}

__device__ __forceinline__ float adam_elem(float p, float g, float *m, float *v,
                                           const adam_coef &c) {
    if (c.l2 != 0.0f)
        g = __fmaf_rn(c.l2, p, g);
    float mi = __fmaf_rn(c.beta1, *m, __fmul_rn(c.one_minus_beta1, g));
    float vi = __fmaf_rn(c.beta2, *v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
    *m = mi;
    *v = vi;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.sqrt_bc2), c.eps);
    return __fmaf_rn(p, c.decay, -__fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
}

/* grad_type: 0 fp32, 1 bf16, 2 fp16 (zt_dtype's values); param16 NULL for no 16-bit copy. The
 * plain fp32 update is this kernel with fp32 gradients, mul 1 (an exact product) and no copy. */
__global__ void adam_mixed_kernel(float *p, const void *grad, int grad_type, float mul, float *m,
                                  float *v, uint16_t *param16, bool param_bf16, size_t n,
                                  adam_coef c) {
    OPT_LOOP(base, n) {
        float pi[OPT_VEC] = {}, gi[OPT_VEC] = {}, mi[OPT_VEC] = {}, vi[OPT_VEC] = {};
        ld8(p, base, n, pi);
        if (grad_type == ZT_F32)
            ld8((const float *)grad, base, n, gi);
        else
            ld8_half((const uint16_t *)grad, base, n, grad_type == ZT_BF16, gi);
        ld8(m, base, n, mi);
        ld8(v, base, n, vi);
        for (int j = 0; j < OPT_VEC; j++)
            pi[j] = adam_elem(pi[j], __fmul_rn(gi[j], mul), mi + j, vi + j, c);
        st8(p, base, n, pi);
        st8(m, base, n, mi);
        st8(v, base, n, vi);
        if (param16)
            st8_half(param16, base, n, param_bf16, pi);
    }
}

struct sgd_coef {
    float lr, wd, momentum, one_minus_dampening;
    bool use_momentum, nesterov, maximize, first_step;
};

__device__ __forceinline__ float sgd_elem(float p, float g, float *buf, const sgd_coef &c) {
    if (c.maximize)
        g = -g;
    if (c.wd != 0.0f)
        g = __fmaf_rn(c.wd, p, g);
    if (c.use_momentum) {
        float b = c.first_step ? g
                               : __fmaf_rn(c.momentum, *buf, __fmul_rn(c.one_minus_dampening, g));
        *buf = b;
        g = c.nesterov ? __fmaf_rn(c.momentum, b, g) : b;
    }
    return __fmaf_rn(-c.lr, g, p);
}

/* grad_type as in adam_mixed_kernel; buf NULL without momentum, param16 NULL for no copy. */
__global__ void sgd_mixed_kernel(float *p, const void *grad, int grad_type, float mul, float *buf,
                                 uint16_t *param16, bool param_bf16, size_t n, sgd_coef c) {
    OPT_LOOP(base, n) {
        float pi[OPT_VEC] = {}, gi[OPT_VEC] = {}, bi[OPT_VEC] = {};
        ld8(p, base, n, pi);
        if (grad_type == ZT_F32)
            ld8((const float *)grad, base, n, gi);
        else
            ld8_half((const uint16_t *)grad, base, n, grad_type == ZT_BF16, gi);
        if (c.use_momentum && !c.first_step)
            ld8(buf, base, n, bi);
        for (int j = 0; j < OPT_VEC; j++)
            pi[j] = sgd_elem(pi[j], __fmul_rn(gi[j], mul), bi + j, c);
        st8(p, base, n, pi);
        if (c.use_momentum)
            st8(buf, base, n, bi);
        if (param16)
            st8_half(param16, base, n, param_bf16, pi);
    }
}

__global__ void scale_kernel(float *v, size_t n, float s) {
    OPT_LOOP(base, n) {
        float vi[OPT_VEC] = {};
        ld8(v, base, n, vi);
        for (int j = 0; j < OPT_VEC; j++)
            vi[j] = __fmul_rn(vi[j], s);
        st8(v, base, n, vi);
    }
}

extern "C" void zt_cuda_adam_update(const zt_ctx *x, float *p, const float *g, float *m, float *v,
                                    size_t n, const zt_adam_args *a) {
    /* maximize: torch negates the gradient first, a multiplier of -1 here. */
    OPT_LAUNCH(x, n, adam_mixed_kernel, p, g, (int)ZT_F32, a->maximize ? -1.0f : 1.0f, m, v,
               (uint16_t *)NULL, false, n, adam_coef_of(a));
}

extern "C" void zt_cuda_adam_update_mixed(const zt_ctx *x, float *master, const void *grad,
                                          zt_dtype grad_type, float grad_mul, float *m, float *v,
                                          uint16_t *param16, zt_dtype param_type, size_t n,
                                          const zt_adam_args *a) {
    ZT_ASSERT(grad_type == ZT_F32 || grad_type == ZT_BF16 || grad_type == ZT_F16);
    ZT_ASSERT(!param16 || param_type == ZT_BF16 || param_type == ZT_F16);
    /* -(g·mul) = g·(-mul) exactly: torch negates the gradient after unscaling. */
    OPT_LAUNCH(x, n, adam_mixed_kernel, master, grad, (int)grad_type,
               a->maximize ? -grad_mul : grad_mul, m, v, param16, param_type == ZT_BF16, n,
               adam_coef_of(a));
}

static sgd_coef sgd_coef_of(const zt_sgd_args *a, bool has_buf) {
    sgd_coef c;
    c.lr = a->lr;
    c.wd = a->weight_decay;
    c.momentum = a->momentum;
    c.one_minus_dampening = (float)(1.0 - a->dampening);
    c.use_momentum = has_buf && a->momentum != 0.0f;
    c.nesterov = a->nesterov;
    c.maximize = a->maximize;
    c.first_step = a->first_step;
    return c;
}

extern "C" void zt_cuda_sgd_update(const zt_ctx *x, float *p, const float *g, float *buf,
                                   size_t n, const zt_sgd_args *a) {
    OPT_LAUNCH(x, n, sgd_mixed_kernel, p, g, (int)ZT_F32, 1.0f, buf, (uint16_t *)NULL, false, n,
               sgd_coef_of(a, buf != NULL));
}

extern "C" void zt_cuda_sgd_update_mixed(const zt_ctx *x, float *master, const void *grad,
                                         zt_dtype grad_type, float grad_mul, float *buf,
                                         uint16_t *param16, zt_dtype param_type, size_t n,
                                         const zt_sgd_args *a) {
    ZT_ASSERT(grad_type == ZT_F32 || grad_type == ZT_BF16 || grad_type == ZT_F16);
    ZT_ASSERT(!param16 || param_type == ZT_BF16 || param_type == ZT_F16);
    OPT_LAUNCH(x, n, sgd_mixed_kernel, master, grad, (int)grad_type, grad_mul, buf, param16,
               param_type == ZT_BF16, n, sgd_coef_of(a, buf != NULL));
}

extern "C" void zt_cuda_scale(const zt_ctx *x, float *v, size_t n, float s) {
    OPT_LAUNCH(x, n, scale_kernel, v, n, s);
}

/* ---- the two-pass sum of squares --------------------------------------------------------------- */

/* Pass 2 (one block): total[j] = the sum of partial[j·stride + 0 .. blocks), for j < count;
 * with add, total[j] + that sum. */
__global__ void sum_partials(const double *partial, unsigned blocks, unsigned stride, int count,
                             bool add, double *total) {
    __shared__ double red[32];
    for (int j = 0; j < count; j++) {
        double acc = 0.0;
        for (unsigned b = threadIdx.x; b < blocks; b += blockDim.x)
            acc += partial[(size_t)j * stride + b];
        acc = zt_block_sum(acc, red);
        if (threadIdx.x == 0)
            total[j] = add ? total[j] + acc : acc;
    }
}

static void sum_totals(const zt_ctx *x, unsigned blocks, int count, bool add, double *out) {
    if (!zt_cuda_on_compute(x, "a two-pass sum"))
        return;
    ZT_LAUNCH(sum_partials, 1, ZT_CUDA_BLOCK, 0, zt_cuda_stream(x), zt_cuda_of(x)->sums_dev,
              blocks, ZT_CUDA_SUM_BLOCKS, count, add, out);
    ZT_CUDA_LAUNCHED(x->be);
}

extern "C" void zt_cuda_sum_totals_to(const zt_ctx *x, unsigned blocks, int count, double *out) {
    sum_totals(x, blocks, count, false, out);
}

extern "C" void zt_cuda_sum_totals_add(const zt_ctx *x, unsigned blocks, int count,
                                       double *out) {
    sum_totals(x, blocks, count, true, out);
}

extern "C" void zt_cuda_sum_totals(const zt_ctx *x, unsigned blocks, int count, double *out) {
    zt_cuda_state *st = zt_cuda_of(x);
    double *total = st->sums_dev + 2 * ZT_CUDA_SUM_BLOCKS;
    zt_cuda_sum_totals_to(x, blocks, count, total);
    ZT_CUDA_CHECK(x->be, cudaMemcpyAsync(st->sums_host, total, count * sizeof(double),
                                         cudaMemcpyDeviceToHost, zt_cuda_stream(x)));
    zt_cuda_count_read(x->be);
    zt_cuda_wait(x->be, zt_cuda_stream(x));
    for (int j = 0; j < count; j++)
        out[j] = st->sums_host[j];
}

extern "C" double zt_cuda_sum_squares(const zt_ctx *x, const float *v, size_t n) {
    return zt_cuda_squares_now(x, v, n, ZT_F32);
}
