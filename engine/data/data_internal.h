/* What data.c and data_mix.c share (internal): globs of shards and weighted mixtures of sources
 * on top of the single-file dataset and loader of ztrain/data.h. */
#ifndef ZTRAIN_DATA_INTERNAL_H
#define ZTRAIN_DATA_INTERNAL_H

#include <stdbool.h>

#include "ztrain/data.h"

/* A path that does not exist and holds a glob character. */
bool zt_data_is_glob(const char *path);
/* Opens the matches of d->path (set by the caller) as d's parts; closes d on failure. */
zt_status zt_data_open_glob(zt_dataset *d, int vocab_size);

/* A glob loader's part_first table and sample count (l->ds, l->T set). */
zt_status zt_data_glob_samples(zt_loader *l);
/* The file of a glob's sample s. */
int zt_data_glob_part(const zt_loader *l, int64_t s);

/* A mixture loader's sources (l's fields from B to seed set); frees nothing on failure but
 * leaves l zeroed. */
zt_status zt_data_mix_init(zt_loader *l);
int zt_data_mix_next(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos);
void zt_data_mix_seek(zt_loader *l, int64_t drawn);

/* Sample s into in[T], tg[T] and, when not NULL, pos[T] (zt_loader_next_docs). */
void zt_data_copy_sample(const zt_loader *l, const zt_dataset *ds, int64_t s, int32_t *in,
                         int32_t *tg, int32_t *pos);

#endif
