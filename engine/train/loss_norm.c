/* The step's micro-batches drawn ahead and their trained targets counted over the ranks
 * (loss_norm.h). */
#include "loss_norm.h"

#include <stdlib.h>
#include <string.h>

#include "ztrain/comm.h"

zt_status zt_loss_norm_init(zt_loss_norm *n, int gas, int B, int T) {
    memset(n, 0, sizeof *n);
    n->gas = gas;
    n->B = B;
    n->T = T;
    size_t each = (size_t)B * (size_t)T;
    n->inputs = calloc((size_t)gas * each, sizeof *n->inputs);
    n->targets = calloc((size_t)gas * each, sizeof *n->targets);
    n->doc_pos = calloc((size_t)gas * each, sizeof *n->doc_pos);
    n->rows = calloc((size_t)gas, sizeof *n->rows);
    if (!n->inputs || !n->targets || !n->doc_pos || !n->rows) {
        zt_loss_norm_free(n);
        return zt_error(ZT_ERR_NOMEM, "engine: out of memory for %d micro-batches of %d×%d", gas,
                        B, T);
    }
    return ZT_OK;
}

void zt_loss_norm_free(zt_loss_norm *n) {
    free(n->inputs);
    free(n->targets);
    free(n->doc_pos);
    free(n->rows);
    memset(n, 0, sizeof *n);
}

zt_status zt_loss_norm_fill(zt_loss_norm *n, zt_loader *l, zt_comm *comm, int64_t step) {
    size_t each = (size_t)n->B * (size_t)n->T;
    double counts[2] = {0.0, 0.0};
    for (int m = 0; m < n->gas; m++) {
        int32_t *tg = n->targets + (size_t)m * each;
        n->rows[m] = zt_loader_next_docs(l, n->inputs + (size_t)m * each, tg,
                                         n->doc_pos + (size_t)m * each);
        size_t used = (size_t)n->rows[m] * (size_t)n->T;
        for (size_t i = 0; i < used; i++)
            counts[0] += tg[i] >= 0;
        counts[1] += (double)used;
    }
    if (comm)
        ZT_TRY(zt_comm_all_reduce(comm, counts, 2, ZT_F64, ZT_REDUCE_SUM));
    n->trained = counts[0];
    n->tokens = counts[1];
    if (n->trained == 0)
        return zt_error(ZT_ERR_INVALID, "data.format \"masked\": the global batch of step %lld "
                        "has no trained target (every token of its %d micro-batch(es) per rank "
                        "is masked), so its loss is undefined", (long long)step, n->gas);
    return ZT_OK;
}
