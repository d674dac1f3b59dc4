/* The set of released device ranges that the CUDA backend's resident_bytes subtracts
 * (cuda_host.h): sorted disjoint intervals in two parallel arrays. Releases and commits come a
 * few per layer, so a linear pass per call is enough. */
#include <stdlib.h>

#include "cuda_host.h"

static zt_status reserve(zt_cuda_ranges *r, size_t n) {
    if (n <= r->cap)
        return ZT_OK;
    size_t cap = r->cap ? r->cap * 2 : 16;
    while (cap < n)
        cap *= 2;
    uintptr_t *lo = realloc(r->lo, cap * sizeof *lo);
    if (!lo)
        return zt_error(ZT_ERR_NOMEM, "cuda backend: out of host memory for released ranges");
    r->lo = lo;
    uintptr_t *hi = realloc(r->hi, cap * sizeof *hi);
    if (!hi)
        return zt_error(ZT_ERR_NOMEM, "cuda backend: out of host memory for released ranges");
    r->hi = hi;
    r->cap = cap;
    return ZT_OK;
}

zt_status zt_cuda_ranges_add(zt_cuda_ranges *r, uintptr_t lo, uintptr_t hi) {
    if (hi <= lo)
        return ZT_OK;
    ZT_TRY(reserve(r, r->n + 1));
    /* The intervals before [lo, hi) that do not touch it stay; those touching it merge into it. */
    size_t first = 0;
    while (first < r->n && r->hi[first] < lo)
        first++;
    size_t last = first;
    while (last < r->n && r->lo[last] <= hi) {
        lo = r->lo[last] < lo ? r->lo[last] : lo;
        hi = r->hi[last] > hi ? r->hi[last] : hi;
        last++;
    }
    size_t merged = last - first, tail = r->n - last;
    if (merged == 0) {
        for (size_t i = r->n; i > first; i--)
            r->lo[i] = r->lo[i - 1], r->hi[i] = r->hi[i - 1];
        r->n++;
    } else {
        for (size_t i = 0; i < tail; i++)
            r->lo[first + 1 + i] = r->lo[last + i], r->hi[first + 1 + i] = r->hi[last + i];
        r->n = first + 1 + tail;
    }
    r->lo[first] = lo;
    r->hi[first] = hi;
    return ZT_OK;
}

zt_status zt_cuda_ranges_remove(zt_cuda_ranges *r, uintptr_t lo, uintptr_t hi) {
    if (hi <= lo)
        return ZT_OK;
    /* An interval reaching past both ends of [lo, hi) becomes two; then, the intervals being
     * disjoint, no other one meets [lo, hi). */
    for (size_t i = 0; i < r->n; i++) {
        if (r->lo[i] < lo && r->hi[i] > hi) {
            ZT_TRY(reserve(r, r->n + 1));
            for (size_t j = r->n; j > i + 1; j--)
                r->lo[j] = r->lo[j - 1], r->hi[j] = r->hi[j - 1];
            r->lo[i + 1] = hi, r->hi[i + 1] = r->hi[i];
            r->hi[i] = lo;
            r->n++;
            return ZT_OK;
        }
    }
    /* Otherwise each interval keeps at most one piece, written back in place. */
    size_t out = 0;
    for (size_t i = 0; i < r->n; i++) {
        uintptr_t a = r->lo[i], b = r->hi[i];
        if (b <= lo || a >= hi)
            r->lo[out] = a, r->hi[out++] = b;
        else if (a < lo)
            r->lo[out] = a, r->hi[out++] = lo;
        else if (b > hi)
            r->lo[out] = hi, r->hi[out++] = b;
    }
    r->n = out;
    return ZT_OK;
}

size_t zt_cuda_ranges_overlap(const zt_cuda_ranges *r, uintptr_t lo, uintptr_t hi) {
    size_t bytes = 0;
    for (size_t i = 0; i < r->n && r->lo[i] < hi; i++) {
        uintptr_t a = r->lo[i] > lo ? r->lo[i] : lo, b = r->hi[i] < hi ? r->hi[i] : hi;
        if (b > a)
            bytes += b - a;
    }
    return bytes;
}

void zt_cuda_ranges_free(zt_cuda_ranges *r) {
    free(r->lo);
    free(r->hi);
    *r = (zt_cuda_ranges){0};
}
