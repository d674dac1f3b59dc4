/* Activation carving shared by model families (internal to libztrain): a model's activation
 * buffers are cut one after another out of one allocation, each rounded up to 64 bytes. The same
 * walk without a base only counts, in 64 bits, so a family's estimate and its creation cannot
 * disagree about the size. */
#ifndef ZTRAIN_MODELS_CARVE_H
#define ZTRAIN_MODELS_CARVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/size_math.h"

typedef struct {
    unsigned char *base; /* NULL: count only */
    uint64_t off;        /* bytes taken so far */
    bool overflow;       /* a count passed 64 bits */
} zt_carver;

/* The next n elements of elem bytes each (NULL when counting). */
static inline void *zt_carve(zt_carver *c, uint64_t n, uint64_t elem) {
    void *p = c->base ? c->base + c->off : NULL;
    uint64_t bytes = zt_u64_round_up(zt_u64_mul(n, elem, &c->overflow), 64, &c->overflow);
    c->off = zt_u64_add(c->off, bytes, &c->overflow);
    return p;
}

#endif
