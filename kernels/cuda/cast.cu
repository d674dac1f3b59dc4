/* Conversions between fp32 and 16-bit buffers on the GPU, with the CPU's exact rounding
 * (cuda_common.cuh's conversions reproduce kernels/cpu/half.h bit for bit), and the sum of
 * squares of a 16-bit buffer in double (two-pass, as optim.cu's). */
#include "cuda_common.cuh"

static bool half_is_bf16(zt_dtype t, const char *fn) {
    if (t != ZT_BF16 && t != ZT_F16) {
        fprintf(stderr, "ztrain: %s: dtype %d is not ZT_BF16 or ZT_F16\n", fn, (int)t);
        abort();
    }
    return t == ZT_BF16;
}

/* Each thread converts a chunk of 8 elements: one 16-byte load or store of the 16-bit side, two
 * of the fp32 side (cuda_common.cuh's 128-bit loads, element by element at a tail or a
 * misaligned slice). */
__global__ void to_half_kernel(uint16_t *dst, const float *src, size_t n, bool bf16) {
    ZT_GRID_LOOP_VEC(uint16_t, base, n) {
        float x[ZT_VEC(uint16_t)] = {};
        zt_ldv_f32<ZT_VEC(uint16_t)>(src, base, n, x);
        zt_stv_as(dst, base, n, x, zt_half_bits{bf16});
    }
}

__global__ void from_half_kernel(float *dst, const uint16_t *src, size_t n, bool bf16) {
    ZT_GRID_LOOP_VEC(uint16_t, base, n) {
        float x[ZT_VEC(uint16_t)] = {};
        zt_ldv_as(src, base, n, x, zt_half_bits{bf16});
        zt_stv_f32<ZT_VEC(uint16_t)>(dst, base, n, x);
    }
}

__global__ void round_kernel(float *v, size_t n, bool bf16) {
    ZT_GRID_LOOP_VEC(float, base, n) {
        float x[ZT_VEC(float)] = {};
        zt_ldv(v, base, n, x);
        for (int j = 0; j < ZT_VEC(float); j++)
            x[j] = zt_f32_from_half(zt_half_from_f32(x[j], bf16), bf16);
        zt_stv(v, base, n, x);
    }
}

/* A NaN accumulator passes through as it is, as the CPU's acc_sum. */
__global__ void accumulate_kernel(uint16_t *dst, const float *src, size_t n, bool bf16) {
    const zt_half_bits bits{bf16};
    ZT_GRID_LOOP_VEC(uint16_t, base, n) {
        float acc[ZT_VEC(uint16_t)] = {}, x[ZT_VEC(uint16_t)] = {};
        zt_ldv_as(dst, base, n, acc, bits);
        zt_ldv_f32<ZT_VEC(uint16_t)>(src, base, n, x);
        for (int j = 0; j < ZT_VEC(uint16_t); j++) {
            float s = __fadd_rn(acc[j], x[j]);
            acc[j] = acc[j] != acc[j] ? acc[j] : s;
        }
        zt_stv_as(dst, base, n, acc, bits);
    }
}

extern "C" void zt_cuda_to_half(const zt_ctx *x, uint16_t *dst, const float *src, size_t n,
                                zt_dtype t) {
    bool bf16 = half_is_bf16(t, "to_half");
    ZT_LAUNCH_VEC(x, uint16_t, n, to_half_kernel, dst, src, n, bf16);
}

extern "C" void zt_cuda_from_half(const zt_ctx *x, float *dst, const uint16_t *src, size_t n,
                                  zt_dtype t) {
    bool bf16 = half_is_bf16(t, "from_half");
    ZT_LAUNCH_VEC(x, uint16_t, n, from_half_kernel, dst, src, n, bf16);
}

extern "C" void zt_cuda_round_to(const zt_ctx *x, float *v, size_t n, zt_dtype t) {
    if (t == ZT_F32)
        return;
    bool bf16 = half_is_bf16(t, "round_to");
    ZT_LAUNCH_VEC(x, float, n, round_kernel, v, n, bf16);
}

extern "C" void zt_cuda_accumulate_half(const zt_ctx *x, uint16_t *dst, const float *src,
                                        size_t n, zt_dtype t) {
    bool bf16 = half_is_bf16(t, "accumulate_half");
    ZT_LAUNCH_VEC(x, uint16_t, n, accumulate_kernel, dst, src, n, bf16);
}

extern "C" double zt_cuda_sum_squares_half(const zt_ctx *x, const uint16_t *v, size_t n,
                                           zt_dtype t) {
    half_is_bf16(t, "sum_squares_half");
    return zt_cuda_squares_now(x, v, n, t);
}
