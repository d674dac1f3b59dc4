/* 64-bit size arithmetic that notices overflow (internal to libztrain): model sizes, activation
 * carving and memory estimates are products of user-given dimensions, and a product that wraps
 * must become an error naming the dimension, never a silently smaller buffer. */
#ifndef ZTRAIN_SIZE_MATH_H
#define ZTRAIN_SIZE_MATH_H

#include <stdbool.h>
#include <stdint.h>

/* Each operation returns the exact result, or UINT64_MAX and sets *overflow when the result does
 * not fit; *overflow is never cleared, so a formula of several steps checks its flag once at the
 * end, and a saturated UINT64_MAX stays larger than any limit it is compared with. */
static inline uint64_t zt_u64_mul(uint64_t a, uint64_t b, bool *overflow) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) {
        *overflow = true;
        return UINT64_MAX;
    }
    return r;
}

static inline uint64_t zt_u64_add(uint64_t a, uint64_t b, bool *overflow) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) {
        *overflow = true;
        return UINT64_MAX;
    }
    return r;
}

/* a rounded up to a multiple of m (m > 0). */
static inline uint64_t zt_u64_round_up(uint64_t a, uint64_t m, bool *overflow) {
    uint64_t r = a % m;
    return r ? zt_u64_add(a, m - r, overflow) : a;
}

/* ceil(a / b) for b > 0. */
static inline uint64_t zt_u64_div_up(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

#endif
