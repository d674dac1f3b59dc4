/* What the files of the dataset and the loader share (internal). They call one way, from the
 * job's data down to one file:
 *
 *   data_spec_open.c  a job spec's data.train / data.val, with their loss masks
 *   loader.c          the public loader: a mixture's or one source's
 *   data_mix.c        a weighted mixture: its dataset and its loader of source loaders
 *   source_loader.c   the DistributedSampler over one source (a file or a glob)
 *   data_glob.c       a path: one file or a glob of shards; a glob's sample table
 *   dataset.c         one file; the dataset object (close, tokens, padding) */
#ifndef ZTRAIN_DATA_INTERNAL_H
#define ZTRAIN_DATA_INTERNAL_H

#include <stdbool.h>

#include "ztrain/data.h"

/* ---- dataset.c */

/* Maps and validates the one file d->path (set by the caller) as d; closes d on failure. */
zt_status zt_data_open_file(zt_dataset *d, int vocab_size);
/* "uint16 tokens", "uint32 tokens" or "bytes". */
const char *zt_data_kind_name(zt_data_kind k);
/* ZT_OK when parts a and b of d have one token width; else an error naming both: different
 * widths (or text among shards) mean different tokenizers, whose ids would be mixed silently. */
zt_status zt_data_same_kind(const zt_dataset *d, const zt_dataset *a, const zt_dataset *b);

/* ---- data_glob.c */

/* A glob loader's part_first table and sample count (l->ds, l->T set). */
zt_status zt_data_glob_samples(zt_loader *l);
/* The file of a glob's sample s. */
int zt_data_glob_part(const zt_loader *l, int64_t s);

/* ---- source_loader.c */

/* splitmix64's output for state x: a 64-bit hash with no weak bits (the sampler's seeding, a
 * mixture's choice of source). */
uint64_t zt_data_mix64(uint64_t x);

/* Checks the arguments of zt_loader_init and sets l's fields from them (l zeroed first). */
zt_status zt_loader_setup(zt_loader *l, const zt_dataset *ds, int B, int T, int rank,
                          int world_size, bool shuffle, bool drop_last, uint64_t seed);
/* A set-up loader over one source at epoch 0, position 0; l zeroed on failure. */
zt_status zt_source_loader_start(zt_loader *l);
/* zt_loader_setup then zt_source_loader_start. */
zt_status zt_source_loader_init(zt_loader *l, const zt_dataset *ds, int B, int T, int rank,
                                int world_size, bool shuffle, bool drop_last, uint64_t seed);
void zt_source_loader_free(zt_loader *l);
int64_t zt_source_loader_batches_per_epoch(const zt_loader *l);
int zt_source_loader_next(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos);
void zt_source_loader_seek(zt_loader *l, int64_t epoch, int64_t pos);

/* ---- data_mix.c */

/* A set-up mixture loader's sources; leaves l zeroed on failure. */
zt_status zt_data_mix_init(zt_loader *l);
void zt_data_mix_free(zt_loader *l);
int zt_data_mix_next(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos);
void zt_data_mix_seek(zt_loader *l, int64_t drawn);

#endif
