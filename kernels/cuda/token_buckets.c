/* Positions grouped by token for the CUDA embedding backward (cuda_host.h): a sort of
 * (token, position) keys on the host, where the tokens already are. */
#include <stdlib.h>

#include "cuda_host.h"

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int zt_cuda_token_buckets(const int32_t *tokens, int n, int32_t *uniq, int32_t *start,
                          int32_t *pos, uint64_t *work) {
    /* Token in the high half and position in the low half: one sort orders by token, then by
     * position, which keeps each token's sum in position order. A negative token (no row in a
     * vocabulary-parallel shard) sorts last as its own bucket, which the kernel skips. */
    for (int i = 0; i < n; i++) {
        work[i] = (uint64_t)(uint32_t)tokens[i] << 32 | (uint32_t)i;
    }
    qsort(work, (size_t)n, sizeof *work, cmp_u64);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int32_t tok = (int32_t)(work[i] >> 32);
        if (k == 0 || uniq[k - 1] != tok) {
            uniq[k] = tok;
            start[k++] = i;
        }
        pos[i] = (int32_t)(work[i] & 0xFFFFFFFFu);
    }
    start[k] = n;
    return k;
}
