/* The step's micro-batches drawn ahead and their trained targets counted over the ranks
 * (loss_norm.h). */
#include "loss_norm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/comm.h"

zt_status zt_loss_norm_init(zt_loss_norm *n, int gas, int B, int T) {
    memset(n, 0, sizeof *n);
    n->gas = gas;
    n->B = B;
    n->T = T;
    size_t all = (size_t)gas * (size_t)B * (size_t)T;
    for (int d = 0; d < 2; d++) {
        zt_loss_draw *w = &n->draws[d];
        w->inputs = calloc(all, sizeof *w->inputs);
        w->targets = calloc(all, sizeof *w->targets);
        w->doc_pos = calloc(all, sizeof *w->doc_pos);
        w->rows = calloc((size_t)gas, sizeof *w->rows);
        if (!w->inputs || !w->targets || !w->doc_pos || !w->rows) {
            zt_loss_norm_free(n);
            return zt_error(ZT_ERR_NOMEM, "engine: out of memory for 2 × %d micro-batches of "
                            "%d×%d", gas, B, T);
        }
    }
    return ZT_OK;
}

void zt_loss_norm_free(zt_loss_norm *n) {
    for (int d = 0; d < 2; d++) {
        free(n->draws[d].inputs);
        free(n->draws[d].targets);
        free(n->draws[d].doc_pos);
        free(n->draws[d].rows);
    }
    memset(n, 0, sizeof *n);
}

/* Draws a step into w and counts this rank's trained and all targets; a data file that
 * changed size under the loader fails it (ZT_ERR_IO, message set). */
static zt_status draw(const zt_loss_norm *n, zt_loss_draw *w, zt_loader *l) {
    size_t each = (size_t)n->B * (size_t)n->T;
    w->counts[0] = w->counts[1] = 0.0;
    for (int m = 0; m < n->gas; m++) {
        int32_t *tg = w->targets + (size_t)m * each;
        w->rows[m] = zt_loader_next_docs(l, w->inputs + (size_t)m * each, tg,
                                         w->doc_pos + (size_t)m * each);
        if (w->rows[m] < 0)
            return ZT_ERR_IO;
        size_t used = (size_t)w->rows[m] * (size_t)n->T;
        for (size_t i = 0; i < used; i++)
            w->counts[0] += tg[i] >= 0;
        w->counts[1] += (double)used;
    }
    w->epoch = l->epoch;
    w->pos = l->pos;
    return ZT_OK;
}

/* Makes the summed counts of the current draw the step's. */
static zt_status adopt(zt_loss_norm *n, int64_t step) {
    const zt_loss_draw *w = zt_loss_norm_step(n);
    n->trained = w->counts[0];
    n->tokens = w->counts[1];
    if (n->trained == 0)
        return zt_error(ZT_ERR_INVALID, "data.format \"masked\": the global batch of step %lld "
                        "has no trained target (every token of its %d micro-batch(es) per rank "
                        "is masked), so its loss is undefined", (long long)step, n->gas);
    return ZT_OK;
}

zt_status zt_loss_norm_fill(zt_loss_norm *n, zt_loader *l, zt_comm *comm, int64_t step) {
    ZT_ASSERT(!n->ahead);
    zt_loss_draw *w = &n->draws[n->cur];
    ZT_TRY(draw(n, w, l));
    if (comm)
        ZT_TRY(zt_comm_all_reduce(comm, w->counts, 2, ZT_F64, ZT_REDUCE_SUM));
    return adopt(n, step);
}

double *zt_loss_norm_draw_ahead(zt_loss_norm *n, zt_loader *l) {
    zt_loss_draw *w = &n->draws[1 - n->cur];
    /* A failed draw is reported when the step takes it: the counts still go into this step's
     * collective, so every rank reaches it. */
    n->ahead_failed[0] = '\0';
    if (draw(n, w, l) != ZT_OK) {
        snprintf(n->ahead_failed, sizeof n->ahead_failed, "%s", zt_last_error());
        w->counts[0] = w->counts[1] = 0.0;
    }
    n->ahead = true;
    return w->counts;
}

zt_status zt_loss_norm_take_ahead(zt_loss_norm *n, int64_t step) {
    ZT_ASSERT(n->ahead);
    n->cur = 1 - n->cur;
    n->ahead = false;
    if (n->ahead_failed[0])
        return zt_error(ZT_ERR_IO, "%s", n->ahead_failed);
    return adopt(n, step);
}
