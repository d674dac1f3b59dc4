/* Element types that ztrain stores, computes in and communicates.
 *
 * One enum for the whole project: the backend's ops, the flat buffers, the communicator and the
 * checkpoint files name a type with it. 16-bit values are raw IEEE binary16 / bfloat16 bits held
 * in uint16_t. */
#ifndef ZTRAIN_DTYPE_H
#define ZTRAIN_DTYPE_H

#include <stddef.h>

typedef enum {
    ZT_F32 = 0,
    ZT_BF16,
    ZT_F16,
    ZT_F64,
    ZT_DTYPE_COUNT
} zt_dtype;

/* Bytes per element: 4, 2, 2, 8. */
static inline size_t zt_dtype_size(zt_dtype t) {
    return t == ZT_F64 ? 8 : t == ZT_F32 ? 4 : 2;
}

/* "fp32", "bf16", "fp16", "fp64": the names DeepSpeed's configs use. */
static inline const char *zt_dtype_name(zt_dtype t) {
    static const char *const names[] = {"fp32", "bf16", "fp16", "fp64"};
    return (unsigned)t < ZT_DTYPE_COUNT ? names[t] : "?";
}

static inline int zt_dtype_is_half(zt_dtype t) { return t == ZT_BF16 || t == ZT_F16; }

#endif
