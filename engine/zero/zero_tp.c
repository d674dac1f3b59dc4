/* The partitioner of a tensor-parallel shard (zero.h: zt_zero_set_tensor_parallel): the gradient
 * norm counts every tensor of the whole model once, although the TP ranks hold shards of some
 * and identical copies of others (Megatron counts a duplicate on TP rank 0 only; weighting it
 * 1/tp on every rank gives the same sum without singling one out). */
#include <stdlib.h>

#include "ztrain/zero.h"

zt_status zt_zero_set_tensor_parallel(zt_zero *z, zt_comm *norm_comm) {
    const zt_model *m = z->model;
    free(z->norm_ranges);
    free(z->norm_weights);
    z->n_norm_ranges = 0;
    z->norm_ranges = calloc((size_t)m->n_tensors + 1, sizeof *z->norm_ranges);
    z->norm_weights = calloc((size_t)m->n_tensors + 1, sizeof *z->norm_weights);
    if (!z->norm_ranges || !z->norm_weights)
        return zt_error(ZT_ERR_NOMEM, "zero: out of memory for the norm's %d tensor ranges",
                        m->n_tensors);
    /* Tensors are laid out back to back; neighbours of the same weight share a range. */
    for (int t = 0; t < m->n_tensors; t++) {
        const zt_tensor_info *ti = &m->tensors[t];
        double w = ti->tied_copy ? 0.0 : 1.0 / (ti->tp_shared > 0 ? ti->tp_shared : 1);
        struct zt_zero_norm_range *last =
            z->n_norm_ranges ? &z->norm_ranges[z->n_norm_ranges - 1] : NULL;
        if (last && last->weight == w && last->hi == ti->offset)
            last->hi = ti->offset + ti->numel;
        else
            z->norm_ranges[z->n_norm_ranges++] =
                (struct zt_zero_norm_range){ti->offset, ti->offset + ti->numel, w};
    }
    z->norm_comm = norm_comm;
    return ZT_OK;
}
