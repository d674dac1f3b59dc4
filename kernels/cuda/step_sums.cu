/* The sum_to op: the double-precision sums a training step needs (the gradient norm's sums of
 * squares, a batch's token losses) written to device memory, so that the engine reads all of a
 * step's scalars back at once, at its one synchronisation (docs/gpu.md, "Host round trips").
 *
 * sum_squares and sum_squares_half (optim.cu, cast.cu) are these passes followed by a read back
 * (zt_cuda_squares_now), so a sum of squares left on the device equals the one read at once bit
 * for bit (test_ops checks it). */
#include "cuda_common.cuh"

enum { SUM_F32 = 0, SQUARES_F32 = 1, SQUARES_HALF = 2 };

/* Pass 1: block b sums its grid-strided elements (or their squares) into partial[b]. Each mode
 * has its own loop, written as the op it must match writes it. */
__global__ void step_sum_partial(const void *v, size_t n, int mode, bool bf16, double *partial) {
    __shared__ double red[32];
    double acc = 0.0;
    if (mode == SUM_F32) {
        const float *f = (const float *)v;
        ZT_GRID_LOOP(i, n) { acc += (double)f[i]; }
    } else if (mode == SQUARES_F32) {
        const float *f = (const float *)v;
        ZT_GRID_LOOP(i, n) {
            double d = (double)f[i];
            acc += d * d;
        }
    } else {
        const uint16_t *h = (const uint16_t *)v;
        ZT_GRID_LOOP(i, n) {
            double d = (double)zt_f32_from_half(h[i], bf16);
            acc += d * d;
        }
    }
    acc = zt_block_sum(acc, red);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = acc;
}

/* Pass 1 into the backend's partial sums (sums_dev); returns the blocks it used, 0 when the type
 * is refused (the failure is recorded). Pass 2 is optim.cu's sum_partials, as for every other
 * two-pass sum. */
static unsigned sum_partial_pass(const zt_ctx *x, const void *v, size_t n, zt_dtype t,
                                 bool squares) {
    int mode;
    if (t == ZT_F32) {
        mode = squares ? SQUARES_F32 : SUM_F32;
    } else if ((t == ZT_BF16 || t == ZT_F16) && squares) {
        mode = SQUARES_HALF;
    } else {
        zt_cuda_fail(x->be, "ztrain", "sum_to", "a plain sum is of fp32 values, squares of fp32, "
                     "bf16 or fp16 ones", __FILE__, __LINE__);
        return 0;
    }
    unsigned blocks = zt_cuda_sum_blocks(n);
    ZT_LAUNCH(step_sum_partial, blocks, ZT_CUDA_BLOCK, 0, zt_cuda_stream(x), v, n, mode,
              t == ZT_BF16, zt_cuda_of(x)->sums_dev);
    ZT_CUDA_LAUNCHED(x->be);
    return blocks;
}

extern "C" void zt_cuda_sum_to(const zt_ctx *x, double *out, const void *v, size_t n, zt_dtype t,
                               bool squares) {
    unsigned blocks = sum_partial_pass(x, v, n, t, squares);
    if (blocks)
        zt_cuda_sum_totals_to(x, blocks, 1, out);
}

extern "C" double zt_cuda_squares_now(const zt_ctx *x, const void *v, size_t n, zt_dtype t) {
    unsigned blocks = sum_partial_pass(x, v, n, t, true);
    double total = 0.0;
    if (blocks)
        zt_cuda_sum_totals(x, blocks, 1, &total);
    return total;
}

/* weighted_sum_to: the parts are few (the norm's pieces, one a weighted range with tensor
 * parallelism), so one thread adds them in order. The weights travel as a kernel argument, a
 * chunk a launch, instead of through an upload; each launch but the first goes on from *out. */
enum { WEIGHTS_PER_LAUNCH = 32 };

typedef struct {
    double w[WEIGHTS_PER_LAUNCH];
} weight_chunk;

__global__ void weighted_sum_kernel(double *out, const double *parts, int n, bool ones,
                                    weight_chunk w, bool first) {
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    double s = first ? 0.0 : *out;
    for (int i = 0; i < n; i++)
        s = ones ? s + parts[i] : fma(w.w[i], parts[i], s);
    *out = s;
}

extern "C" void zt_cuda_weighted_sum_to(const zt_ctx *x, double *out, const double *parts,
                                        const double *weights, int n) {
    int i = 0;
    do {
        int len = n - i < WEIGHTS_PER_LAUNCH ? n - i : WEIGHTS_PER_LAUNCH;
        weight_chunk w = {{0.0}};
        for (int k = 0; k < len && weights; k++)
            w.w[k] = weights[i + k];
        ZT_LAUNCH(weighted_sum_kernel, 1, 1, 0, zt_cuda_stream(x), out, parts + i, len,
                  weights == NULL, w, i == 0);
        ZT_CUDA_LAUNCHED(x->be);
        i += len;
    } while (i < n);
}
