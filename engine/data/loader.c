/* The public loader: a mixture's (data_mix.c) or one source's (source_loader.c), chosen by
 * the dataset it is made over (see ztrain/data.h). */
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "ztrain/map_guard.h"

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

typedef struct {
    zt_loader *l;
    int32_t *inputs, *targets, *doc_pos;
    int n;
} next_call;

static void next_batch(void *ctx) {
    next_call *c = ctx;
    c->n = c->l->subs ? zt_data_mix_next(c->l, c->inputs, c->targets, c->doc_pos)
                      : zt_source_loader_next(c->l, c->inputs, c->targets, c->doc_pos);
}

int zt_loader_next_docs(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos) {
    next_call c = {l, inputs, targets, doc_pos, 0};
    const void *fault;
    if (zt_map_guarded(next_batch, &c, &fault) != ZT_OK) {
        if (fault)
            zt_dataset_read_fault(l->ds, fault);
        return -1;
    }
    return c.n;
}

void zt_loader_seek(zt_loader *l, int64_t epoch, int64_t pos) {
    ZT_ASSERT(epoch >= 0 && pos >= 0);
    if (l->subs)
        zt_data_mix_seek(l, epoch * l->per_rank + pos);
    else
        zt_source_loader_seek(l, epoch, pos);
}
