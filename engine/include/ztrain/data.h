/* Training data: token files and the distributed sampler that cuts them into batches.
 *
 * A dataset is either an llm.c token file (1024-byte header of int32: magic 20240520, version 1,
 * token count; then uint16 tokens; or magic 20240801, version 7, uint32 tokens), or any other file
 * read as bytes (vocab 256). A file named *.bin must be a valid token file. A sample is a window of
 * T+1 tokens starting at a multiple of T: inputs are its first T tokens, targets the last T.
 *
 * A dataset may also be a glob of files (shards, in name order): its samples are those of every
 * file, never crossing from one file into the next; or a weighted mixture of such sources, from
 * which each sample is drawn: source i with probability weight_i / sum(weights), chosen by a hash
 * of (seed, the rank's sample count, rank), and within a source in that source's own
 * DistributedSampler order (its seed is the loader's plus the source's index).
 *
 * The loader follows torch's DistributedSampler + DataLoader as DeepSpeed builds them: every epoch
 * the sample indices are shuffled with a generator seeded by seed + epoch (when shuffle), padded by
 * wrapping around to a multiple of the world size, and rank r takes indices r, r+W, r+2W, ...;
 * batches are consecutive runs of B of them, and a last short batch is dropped when drop_last. */
#ifndef ZTRAIN_DATA_H
#define ZTRAIN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

typedef enum { ZT_DATA_TOKENS16 = 0, ZT_DATA_TOKENS32, ZT_DATA_BYTES } zt_data_kind;

typedef struct zt_dataset {
    char *path;
    zt_data_kind kind;
    size_t n_tokens;
    const void *tokens; /* points into the mapping, past any header; NULL for a glob or mixture */
    void *map;
    size_t map_size;
    struct zt_dataset *parts; /* a glob's files or a mixture's sources; NULL for one file */
    int n_parts;
    double *weights;          /* a mixture's weights, summing to 1; NULL for a glob */
    /* The loss mask (ztrain/loss_mask.h), one byte per token, once zt_loss_mask_attach mapped
     * it; NULL otherwise, and for a glob or mixture (its parts hold theirs). */
    const uint8_t *mask;
    void *mask_map;
    size_t mask_map_size;
    /* With a mask: where its documents start (bit 1; token 0 always), n_docs of them. */
    size_t *docs;
    size_t n_docs;
    /* data.packing "padded": a sample is one document (zt_dataset_set_padded). */
    bool padded;
} zt_dataset;

/* Maps a data file read-only and validates it: header magic and version, file size equal to
 * header + n_tokens * token size, and every token < vocab_size (the message names the file, the
 * position and the token). A path that does not exist and holds * ? or [ is a glob: every match
 * is opened so, and all must be token files of one token width (uint16 and uint32 shards, or
 * text among shards, come from different tokenizers and are refused naming two of them); a
 * pattern that matches nothing is an error naming it. Close with zt_dataset_close(). */
zt_status zt_dataset_open(zt_dataset *d, const char *path, int vocab_size);

/* Opens the n files a glob matched when the job was checked (data.train_files / val_files), as
 * one dataset in that order, named `pattern` in messages. Each path must still resolve to
 * itself (the list holds resolved paths): a file turned into a symlink, or a directory on its
 * way swapped for one, since the check is an error naming the file and where it now leads. */
zt_status zt_dataset_open_files(zt_dataset *d, const char *pattern, char *const *files, int n,
                                int vocab_size);

/* Opens the training data a job spec names (data.train): its file or glob (or the glob's
 * checked files, data.train_files), or its mixture.
 * Everything that opens a job's training data goes through here, so a mixture is never taken
 * for a missing path. */
struct zt_data_spec_s;
zt_status zt_dataset_open_train(zt_dataset *d, const struct zt_data_spec_s *spec, int vocab_size);
/* Opens the validation data (data.val) the same way, loss masks included. */
zt_status zt_dataset_open_val(zt_dataset *d, const struct zt_data_spec_s *spec, int vocab_size);

/* The most sources a job's mixture may name. */
#define ZT_MAX_MIX_SOURCES 64

/* Opens a mixture of n sources (each a path or glob as above) with weights > 0 (an error names a
 * weight <= 0 or not finite). All sources must have the same token width. */
zt_status zt_dataset_open_mixture(zt_dataset *d, const char *const *paths, const double *weights,
                                  int n, int vocab_size);
void zt_dataset_close(zt_dataset *d);

/* Makes every sample of d (and of its files and sources) one document of its loss mask: its
 * first min(length, T) tokens, with targets up to the document's end, then padding (input 0,
 * target -1). Documents are the samples the sampler shuffles and shares out. Needs masks
 * (zt_loss_mask_attach); ZT_ERR_INVALID naming the file otherwise. */
zt_status zt_dataset_set_padded(zt_dataset *d);

/* Token i (0 <= i < n_tokens; a glob's files and a mixture's sources one after the other). */
int32_t zt_dataset_token(const zt_dataset *d, size_t i);

/* Fills the 1024-byte llm.c header of a token file of n tokens: magic 20240520 version 1 for
 * uint16 tokens, magic 20240801 version 7 for uint32 tokens (what zt_dataset_open accepts). */
#define ZT_DATASET_HEADER_INTS 256
void zt_dataset_header(int32_t header[ZT_DATASET_HEADER_INTS], bool uint32_tokens, int32_t n);

/* Writes tokens as an llm.c uint16 token file (tokens must be < 65536). For tests and tools. */
zt_status zt_dataset_write_tokens(const char *path, const uint16_t *tokens, size_t n);

typedef struct zt_loader {
    const zt_dataset *ds;
    int B, T;
    int rank, world_size;
    bool shuffle, drop_last;
    uint64_t seed;
    int64_t n_samples;   /* windows in the dataset: (n_tokens - 1) / T */
    int64_t per_rank;    /* samples this rank sees per epoch (after padding) */
    int64_t epoch;       /* current epoch, from 0 */
    int64_t pos;         /* next position in this rank's share of the epoch */
    int64_t *order;      /* sample indices of this rank's share for the current epoch (a
                            mixture: scratch for its seek, one count per source) */
    int64_t *part_first; /* a glob: the first sample of each file, n_parts + 1 entries */
    struct zt_loader *subs; /* a mixture: one loader (B = 1) per source */
    int64_t drawn;       /* a mixture: samples drawn by this rank since the start */
} zt_loader;

/* Prepares a loader at epoch 0, position 0. Fails when the dataset has fewer than T+1 tokens, or
 * when drop_last leaves this rank no full batch (the loader would never yield one).
 * A mixture's batches are always full; its epoch is as many samples as its sources hold
 * together (per rank), and its (epoch, pos) is the count of samples drawn, which seek replays.
 * Free with zt_loader_free(). */
zt_status zt_loader_init(zt_loader *l, const zt_dataset *ds, int B, int T, int rank,
                         int world_size, bool shuffle, bool drop_last, uint64_t seed);
void zt_loader_free(zt_loader *l);

/* Fills inputs[B*T] and targets[B*T] with the next batch (with a loss mask, an untrained
 * target is -1) and returns how many sequences it holds
 * (B, or fewer for the last batch of an epoch when not drop_last; the rows past it are zeroed).
 * At the end of an epoch the loader moves on to the next epoch by itself, reshuffling: right
 * after the call that returns an epoch's last batch, (epoch, pos) already read (epoch+1, 0), so
 * the pair saved in a checkpoint always names the next batch. Never allocates. */
int zt_loader_next(zt_loader *l, int32_t *inputs, int32_t *targets);
/* zt_loader_next that also writes doc_pos[B*T] (when not NULL): each input's position inside
 * its document, restarting at 0 at the window's first token and at every token a loss mask
 * marks as a document's first (ztrain/loss_mask.h); without a mask, 0..T-1 in every row. This
 * is zt_attn_shape.doc_pos, and the positions of the rotary and learned position embeddings. */
int zt_loader_next_docs(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos);
/* Both return -1, with the error set ("PATH: changed size while training: N bytes, was M"), when
 * a data file (or its loss mask) shrank under its mapping since it was opened: the batch is
 * read through zt_map_guarded (ztrain/map_guard.h), so that is an error and not a SIGBUS. The
 * loader's position is then undefined; the run is over. */

/* The error for a read of d's mappings that faulted at addr (zt_map_guarded's *fault): names the
 * file holding addr, its size now and at opening. Returns ZT_ERR_IO. */
zt_status zt_dataset_read_fault(const zt_dataset *d, const void *addr);

/* Batches per epoch for this rank. */
int64_t zt_loader_batches_per_epoch(const zt_loader *l);

/* Moves to (epoch, pos), e.g. when resuming from a checkpoint; the loader is then exactly as if
 * next() had been called up to there. A pos at or past the end of the epoch means (epoch+1, 0). */
void zt_loader_seek(zt_loader *l, int64_t epoch, int64_t pos);

#endif
