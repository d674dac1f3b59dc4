/* Random initialisation shared by model families (internal to libztrain): a normal stream from
 * splitmix64 and Box–Muller, reproducible from a seed on every platform. */
#ifndef ZTRAIN_MODELS_MODEL_INIT_H
#define ZTRAIN_MODELS_MODEL_INIT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

static inline uint64_t zt_init_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1), never 0, so that log() below is finite. */
static inline double zt_init_uniform01(uint64_t *s) {
    return ((zt_init_splitmix64(s) >> 11) + 0.5) * 0x1.0p-53;
}

/* x[0..n) = normal(0, std) draws from the stream s. */
static inline void zt_init_fill_normal(float *x, size_t n, double std, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        double u1 = zt_init_uniform01(s), u2 = zt_init_uniform01(s);
        x[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
}

#endif
