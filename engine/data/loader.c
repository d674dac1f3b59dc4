/* The public loader: a mixture's (data_mix.c) or one source's (source_loader.c), chosen by
 * the dataset it is made over (see ztrain/data.h). */
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"

zt_status zt_loader_init(zt_loader *l, const zt_dataset *ds, int B, int T, int rank,
                         int world_size, bool shuffle, bool drop_last, uint64_t seed) {
    ZT_TRY(zt_loader_setup(l, ds, B, T, rank, world_size, shuffle, drop_last, seed));
    return ds->weights ? zt_data_mix_init(l) : zt_source_loader_start(l);
}

void zt_loader_free(zt_loader *l) {
    if (l->subs)
        zt_data_mix_free(l);
    else
        zt_source_loader_free(l);
    memset(l, 0, sizeof *l);
}

int64_t zt_loader_batches_per_epoch(const zt_loader *l) {
    if (l->subs)
        return l->per_rank / l->B > 0 ? l->per_rank / l->B : 1;
    return zt_source_loader_batches_per_epoch(l);
}

int zt_loader_next(zt_loader *l, int32_t *inputs, int32_t *targets) {
    return zt_loader_next_docs(l, inputs, targets, NULL);
}

int zt_loader_next_docs(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos) {
    if (l->subs)
        return zt_data_mix_next(l, inputs, targets, doc_pos);
    return zt_source_loader_next(l, inputs, targets, doc_pos);
}

void zt_loader_seek(zt_loader *l, int64_t epoch, int64_t pos) {
    ZT_ASSERT(epoch >= 0 && pos >= 0);
    if (l->subs)
        zt_data_mix_seek(l, epoch * l->per_rank + pos);
    else
        zt_source_loader_seek(l, epoch, pos);
}
