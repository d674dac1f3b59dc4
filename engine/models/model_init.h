/* Random initialisation shared by model families (internal to libztrain): a normal stream from
 * splitmix64 and Box–Muller, reproducible from a seed on every platform.
 *
 * splitmix64's state is a counter (each draw adds one constant), so draw k of a stream that
 * starts at s is a function of s + k·γ alone: a tensor's elements are drawn in parallel, and a
 * tensor this rank does not hold is skipped, with the same numbers as one thread drawing
 * every element in turn. */
#ifndef ZTRAIN_MODELS_MODEL_INIT_H
#define ZTRAIN_MODELS_MODEL_INIT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define ZT_INIT_GAMMA 0x9E3779B97F4A7C15ull

/* The draw whose counter is z (splitmix64's output function). */
static inline uint64_t zt_init_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1), never 0, so that log() below is finite. */
static inline double zt_init_uniform01(uint64_t z) {
    return ((zt_init_mix(z) >> 11) + 0.5) * 0x1.0p-53;
}

/* Element i of the normal(0, std) draws of a stream at s0 (two uniforms an element). */
static inline float zt_init_normal_at(uint64_t s0, uint64_t i, double std) {
    double u1 = zt_init_uniform01(s0 + (2 * i + 1) * ZT_INIT_GAMMA);
    double u2 = zt_init_uniform01(s0 + (2 * i + 2) * ZT_INIT_GAMMA);
    return (float)(std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* Moves the stream s past the draws of n elements without making them. */
static inline void zt_init_skip_normal(size_t n, uint64_t *s) {
    *s += 2 * (uint64_t)n * ZT_INIT_GAMMA;
}

#endif
