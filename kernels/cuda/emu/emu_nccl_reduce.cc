/* The emulated NCCL's reductions (emu_nccl.h): in rank order, a 16-bit sum rounded to its type
 * after every addition, an average scaling each contribution by 1/n rounded to the type first. */
#include <cmath>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "emu_nccl.h"

namespace zt_emu_nccl {

namespace {

/* ---- 16-bit rounding ------------------------------------------------------------------------ */

/* x rounded to float with round-to-odd, so that rounding the float again to a 16-bit type gives
 * the correctly rounded result of x (float keeps more than 2 bits beyond bf16's and fp16's). */
float to_float_odd(double x) {
    float f = (float)x;
    if ((double)f == x || !std::isfinite(f))
        return f;
    if (std::fabs((double)f) > std::fabs(x))
        f = std::nextafter(f, 0.0f);
    uint32_t b;
    memcpy(&b, &f, 4);
    b |= 1;
    memcpy(&f, &b, 4);
    return f;
}

struct bf16_t {
    static float get(const void *p, size_t i) {
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    }
    static void put(void *p, size_t i, double v) {
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(to_float_odd(v));
    }
};

struct f16_t {
    static float get(const void *p, size_t i) { return __half2float(((const __half *)p)[i]); }
    static void put(void *p, size_t i, double v) {
        ((__half *)p)[i] = __float2half_rn(to_float_odd(v));
    }
};

/* One element of a 16-bit type: each step computed exactly in double, then rounded once. */
template <class H>
void reduce16(void *out, const std::vector<const char *> &src, size_t n, ncclRedOp_t redop) {
    const int k = (int)src.size();
    char scale_bits[2];
    H::put(scale_bits, 0, 1.0 / k);
    const double scale = H::get(scale_bits, 0);
    char tmp[2];
    for (size_t i = 0; i < n; i++) {
        double acc = 0;
        for (int r = 0; r < k; r++) {
            double x = H::get(src[r], i);
            if (redop == ncclAvg) {
                H::put(tmp, 0, x * scale);
                x = H::get(tmp, 0);
            }
            if (r == 0) {
                acc = x;
            } else if (redop == ncclMax) {
                acc = std::isnan(acc) || std::isnan(x) ? NAN : acc > x ? acc : x;
            } else {
                H::put(tmp, 0, acc + x);
                acc = H::get(tmp, 0);
            }
        }
        H::put(out, i, acc);
    }
}

template <class T>
void reduce_wide(void *out, const std::vector<const char *> &src, size_t n, ncclRedOp_t redop) {
    const int k = (int)src.size();
    const T scale = (T)1 / (T)k;
    for (size_t i = 0; i < n; i++) {
        T acc = 0;
        for (int r = 0; r < k; r++) {
            T x;
            memcpy(&x, src[r] + i * sizeof(T), sizeof(T));
            if (redop == ncclAvg)
                x = x * scale;
            if (r == 0)
                acc = x;
            else if (redop == ncclMax)
                acc = std::isnan(acc) || std::isnan(x) ? (T)NAN : acc > x ? acc : x;
            else
                acc = acc + x;
        }
        memcpy((char *)out + i * sizeof(T), &acc, sizeof(T));
    }
}

void reduce_i64(void *out, const std::vector<const char *> &src, size_t n, ncclRedOp_t redop) {
    for (size_t i = 0; i < n; i++) {
        int64_t acc = 0;
        for (size_t r = 0; r < src.size(); r++) {
            int64_t x;
            memcpy(&x, src[r] + i * 8, 8);
            acc = r == 0 ? x : redop == ncclMax ? (acc > x ? acc : x) : acc + x;
        }
        if (redop == ncclAvg)
            acc /= (int64_t)src.size();
        memcpy((char *)out + i * 8, &acc, 8);
    }
}

} // namespace

void reduce(void *out, const std::vector<const char *> &src, size_t n, ncclDataType_t t,
            ncclRedOp_t redop) {
    switch (t) {
    case ncclBfloat16: reduce16<bf16_t>(out, src, n, redop); break;
    case ncclFloat16: reduce16<f16_t>(out, src, n, redop); break;
    case ncclFloat32: reduce_wide<float>(out, src, n, redop); break;
    case ncclFloat64: reduce_wide<double>(out, src, n, redop); break;
    default: reduce_i64(out, src, n, redop); break;
    }
}

} // namespace zt_emu_nccl
