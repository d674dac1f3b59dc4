/* Token datasets and the distributed sampler (see ztrain/data.h for the contract).
 *
 * A dataset is a read-only mapping of the whole file, validated once at open so the step loop can
 * index tokens without checks. The loader reproduces torch's DistributedSampler + DataLoader: the
 * per-epoch order is a pure function of (seed, epoch, rank, world_size), so any position can be
 * rebuilt exactly on resume. */
#define _POSIX_C_SOURCE 200809L /* strdup, O_CLOEXEC; before any header */
#include "ztrain/data.h"
#include "ztrain/loss_mask.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_internal.h"
#include "ztrain/fsutil.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are little-endian and are read in place; a big-endian host needs byte swapping"
#endif

#define LLMC_HEADER_BYTES 1024
#define LLMC_HEADER_INTS 256
#define LLMC_MAGIC_U16 20240520
#define LLMC_VERSION_U16 1
#define LLMC_MAGIC_U32 20240801
#define LLMC_VERSION_U32 7

/* ---------------------------------------------------------------------------------------------
 * Datasets */

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

static int32_t read_i32(const unsigned char *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Checks an llm.c header and fills kind, n_tokens and tokens. */
static zt_status parse_token_header(zt_dataset *d, const unsigned char *map, size_t size) {
    if (size < LLMC_HEADER_BYTES)
        return zt_error(ZT_ERR_FORMAT,
                        "%s: file has %zu bytes, shorter than the %d-byte llm.c token file header",
                        d->path, size, LLMC_HEADER_BYTES);
    int32_t magic = read_i32(map), version = read_i32(map + 4), ntok = read_i32(map + 8);
    size_t token_size;
    if (magic == LLMC_MAGIC_U16) {
        if (version != LLMC_VERSION_U16)
            return zt_error(ZT_ERR_FORMAT,
                            "%s: bad version %d for magic %d (uint16 tokens), expected %d",
                            d->path, version, magic, LLMC_VERSION_U16);
        d->kind = ZT_DATA_TOKENS16;
        token_size = 2;
    } else if (magic == LLMC_MAGIC_U32) {
        if (version != LLMC_VERSION_U32)
            return zt_error(ZT_ERR_FORMAT,
                            "%s: bad version %d for magic %d (uint32 tokens), expected %d",
                            d->path, version, magic, LLMC_VERSION_U32);
        d->kind = ZT_DATA_TOKENS32;
        token_size = 4;
    } else {
        return zt_error(ZT_ERR_FORMAT,
                        "%s: bad magic %d, expected %d (llm.c uint16 tokens) or %d (uint32 tokens)",
                        d->path, magic, LLMC_MAGIC_U16, LLMC_MAGIC_U32);
    }
    if (ntok < 0)
        return zt_error(ZT_ERR_FORMAT, "%s: header says %d tokens, a negative count", d->path,
                        ntok);
    size_t expect = LLMC_HEADER_BYTES + (size_t)ntok * token_size;
    if (size != expect)
        return zt_error(ZT_ERR_FORMAT,
                        "%s: header says %d tokens (%zu bytes) but the file has %zu bytes",
                        d->path, ntok, expect, size);
    d->n_tokens = (size_t)ntok;
    d->tokens = map + LLMC_HEADER_BYTES;
    return ZT_OK;
}

/* The first token >= vocab_size, scanned once at open so that a bad id is reported with its
 * position instead of surfacing later as an out-of-bounds embedding lookup. */
static zt_status check_vocab(const zt_dataset *d, int vocab_size) {
    size_t bad = d->n_tokens;
    uint32_t v = (uint32_t)vocab_size;
    switch (d->kind) {
    case ZT_DATA_TOKENS16: {
        const uint16_t *t = d->tokens;
        if (v > UINT16_MAX)
            return ZT_OK;
        for (size_t i = 0; i < d->n_tokens; i++)
            if (t[i] >= v) {
                bad = i;
                break;
            }
        break;
    }
    case ZT_DATA_TOKENS32: {
        const uint32_t *t = d->tokens;
        for (size_t i = 0; i < d->n_tokens; i++)
            if (t[i] >= v) {
                bad = i;
                break;
            }
        break;
    }
    case ZT_DATA_BYTES: {
        const uint8_t *t = d->tokens;
        if (v > UINT8_MAX)
            return ZT_OK;
        for (size_t i = 0; i < d->n_tokens; i++)
            if (t[i] >= v) {
                bad = i;
                break;
            }
        break;
    }
    }
    if (bad == d->n_tokens)
        return ZT_OK;
    return zt_error(ZT_ERR_FORMAT, "%s: token %ld at position %zu is outside the model's vocab_size %d",
                    d->path, (long)zt_dataset_token(d, bad), bad, vocab_size);
}

zt_status zt_dataset_open(zt_dataset *d, const char *path, int vocab_size) {
    memset(d, 0, sizeof *d);
    if (!path)
        return zt_error(ZT_ERR_INVALID, "no data path (a mixture opens with zt_dataset_open_train)");
    if (vocab_size <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: vocab_size %d must be positive", path, vocab_size);
    d->path = strdup(path);
    if (!d->path)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    if (zt_data_is_glob(path))
        return zt_data_open_glob(d, vocab_size);

    zt_status s = zt_map_file(path, &d->map, &d->map_size);
    if (s == ZT_OK && d->map_size == 0)
        s = zt_error(ZT_ERR_FORMAT, "%s: empty file, no tokens", path);
    if (s != ZT_OK)
        goto fail;
    size_t size = d->map_size;

    /* A .bin file must be a token file; any other file is one only when it opens with a magic,
     * so text corpora are read as bytes without a naming convention. */
    const unsigned char *bytes = d->map;
    int32_t first = size >= 4 ? read_i32(bytes) : 0;
    if (has_suffix(path, ".bin") || first == LLMC_MAGIC_U16 || first == LLMC_MAGIC_U32) {
        s = parse_token_header(d, bytes, size);
    } else {
        d->kind = ZT_DATA_BYTES;
        d->n_tokens = size;
        d->tokens = bytes;
    }
    if (s == ZT_OK)
        s = check_vocab(d, vocab_size);
    if (s == ZT_OK)
        return ZT_OK;
fail:
    zt_dataset_close(d);
    return s;
}

void zt_dataset_close(zt_dataset *d) {
    for (int i = 0; i < d->n_parts; i++)
        zt_dataset_close(&d->parts[i]);
    free(d->parts);
    free(d->weights);
    zt_unmap_file(d->map, d->map_size);
    zt_unmap_file(d->mask_map, d->mask_map_size);
    free(d->docs);
    free(d->path);
    memset(d, 0, sizeof *d);
}

zt_status zt_dataset_set_padded(zt_dataset *d) {
    for (int i = 0; i < d->n_parts; i++)
        ZT_TRY(zt_dataset_set_padded(&d->parts[i]));
    if (!d->n_parts && !d->mask)
        return zt_error(ZT_ERR_INVALID, "%s: data.packing \"padded\" needs the file's loss mask "
                        "(data.format \"masked\")", d->path);
    d->padded = true;
    return ZT_OK;
}

int32_t zt_dataset_token(const zt_dataset *d, size_t i) {
    for (int k = 0; k < d->n_parts; k++) {
        if (i < d->parts[k].n_tokens)
            return zt_dataset_token(&d->parts[k], i);
        i -= d->parts[k].n_tokens;
    }
    switch (d->kind) {
    case ZT_DATA_TOKENS16: return ((const uint16_t *)d->tokens)[i];
    case ZT_DATA_TOKENS32: return (int32_t)((const uint32_t *)d->tokens)[i];
    case ZT_DATA_BYTES: return ((const uint8_t *)d->tokens)[i];
    }
    return 0;
}

void zt_dataset_header(int32_t header[ZT_DATASET_HEADER_INTS], bool uint32_tokens, int32_t n) {
    memset(header, 0, ZT_DATASET_HEADER_INTS * sizeof *header);
    header[0] = uint32_tokens ? LLMC_MAGIC_U32 : LLMC_MAGIC_U16;
    header[1] = uint32_tokens ? LLMC_VERSION_U32 : LLMC_VERSION_U16;
    header[2] = n;
}

zt_status zt_dataset_write_tokens(const char *path, const uint16_t *tokens, size_t n) {
    if (n > (size_t)INT32_MAX)
        return zt_error(ZT_ERR_INVALID, "%s: %zu tokens do not fit the int32 count of the header",
                        path, n);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);

    int32_t header[LLMC_HEADER_INTS];
    zt_dataset_header(header, false, (int32_t)n);
    zt_status s = ZT_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = zt_error(ZT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    s = zt_write_all(fd, header, sizeof header, tmp);
    if (s == ZT_OK)
        s = zt_write_all(fd, tokens, n * sizeof *tokens, tmp);
    if (s == ZT_OK && fsync(fd) != 0)
        s = zt_error(ZT_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == ZT_OK)
        s = zt_error(ZT_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (s == ZT_OK && rename(tmp, path) != 0)
        s = zt_error(ZT_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    if (s != ZT_OK)
        unlink(tmp);
    free(tmp);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Sampler
 *
 * xoshiro256** seeded through splitmix64: small, fast, and with no weak low bits, so every rank
 * (and every later resume) derives the same permutation from the same 64-bit seed. */

typedef struct {
    uint64_t s[4];
} rng256;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void rng_seed(rng256 *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng256 *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, n) without modulo bias (Lemire's multiply-and-reject). */
static uint64_t rng_below(rng256 *r, uint64_t n) {
    unsigned __int128 m = (unsigned __int128)rng_next(r) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t threshold = -n % n;
        while (lo < threshold) {
            m = (unsigned __int128)rng_next(r) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* The full permutation lives right after this rank's share in the same allocation, so building
 * an epoch never allocates. */
static int64_t *loader_scratch(const zt_loader *l) { return l->order + l->per_rank; }

/* Builds this rank's share of `epoch`: the (shuffled) indices padded by wrap-around to
 * per_rank * world_size, of which this rank takes every world_size-th from its rank. */
static void loader_build_epoch(zt_loader *l, int64_t epoch) {
    int64_t n = l->n_samples, *perm = loader_scratch(l);
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    if (l->shuffle) {
        rng256 r;
        rng_seed(&r, l->seed + (uint64_t)epoch);
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
            int64_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    }
    for (int64_t k = 0; k < l->per_rank; k++) {
        int64_t g = l->rank + k * l->world_size;
        l->order[k] = perm[g % n];
    }
    l->epoch = epoch;
}

/* Where the epoch ends for this rank: the full share, or the last full batch with drop_last. */
static int64_t loader_epoch_end(const zt_loader *l) {
    return l->drop_last ? (l->per_rank / l->B) * l->B : l->per_rank;
}

zt_status zt_loader_init(zt_loader *l, const zt_dataset *ds, int B, int T, int rank,
                         int world_size, bool shuffle, bool drop_last, uint64_t seed) {
    memset(l, 0, sizeof *l);
    if (B <= 0 || T <= 0)
        return zt_error(ZT_ERR_INVALID, "%s: batch size %d and sequence length %d must be positive",
                        ds->path, B, T);
    if (world_size <= 0 || rank < 0 || rank >= world_size)
        return zt_error(ZT_ERR_INVALID, "%s: rank %d is outside world size %d", ds->path, rank,
                        world_size);
    if (!ds->padded && ds->n_tokens < (size_t)T + 1)
        return zt_error(ZT_ERR_INVALID,
                        "%s: %zu tokens are fewer than one sample of T+1 = %d tokens", ds->path,
                        ds->n_tokens, T + 1);
    l->ds = ds;
    l->B = B;
    l->T = T;
    l->rank = rank;
    l->world_size = world_size;
    l->shuffle = shuffle;
    l->drop_last = drop_last;
    l->seed = seed;
    if (ds->weights)
        return zt_data_mix_init(l);
    l->n_samples = ds->padded ? (int64_t)ds->n_docs : (int64_t)((ds->n_tokens - 1) / (size_t)T);
    if (ds->parts) {
        zt_status s = zt_data_glob_samples(l);
        if (s != ZT_OK) {
            memset(l, 0, sizeof *l);
            return s;
        }
    }
    l->per_rank = (l->n_samples + world_size - 1) / world_size;
    if (drop_last && l->per_rank < B) {
        zt_status s = zt_error(ZT_ERR_INVALID,
                               "%s: %lld samples of %d tokens give each of %d ranks %lld, fewer "
                               "than one batch of %d, and dataloader_drop_last drops it",
                               ds->path, (long long)l->n_samples, T + 1, world_size,
                               (long long)l->per_rank, B);
        memset(l, 0, sizeof *l);
        return s;
    }
    l->order = malloc((size_t)(l->per_rank + l->n_samples) * sizeof *l->order);
    if (!l->order) {
        zt_status s = zt_error(ZT_ERR_NOMEM, "%s: out of memory for the order of %lld samples",
                               ds->path, (long long)l->n_samples);
        memset(l, 0, sizeof *l);
        return s;
    }
    loader_build_epoch(l, 0);
    l->pos = 0;
    return ZT_OK;
}

void zt_loader_free(zt_loader *l) {
    for (int i = 0; l->subs && i < l->ds->n_parts; i++)
        zt_loader_free(&l->subs[i]);
    free(l->subs);
    free(l->part_first);
    free(l->order);
    memset(l, 0, sizeof *l);
}

int64_t zt_loader_batches_per_epoch(const zt_loader *l) {
    if (l->subs)
        return l->per_rank / l->B > 0 ? l->per_rank / l->B : 1;
    return l->drop_last ? l->per_rank / l->B : (l->per_rank + l->B - 1) / l->B;
}

/* Copies T inputs and T targets of sample `s`; one loop per token width keeps this branch-free.
 * A glob's sample is first found in its file. */
/* data.packing "padded": document k of ds as one row, cut at T, padded after its end. Its last
 * token's target is the next document's first, never trained. */
static void copy_document(const zt_dataset *ds, size_t k, int T, int32_t *in, int32_t *tg,
                          int32_t *pos) {
    size_t start = ds->docs[k], end = k + 1 < ds->n_docs ? ds->docs[k + 1] : ds->n_tokens;
    size_t len = end - start < (size_t)T ? end - start : (size_t)T;
    for (size_t i = 0; i < (size_t)T; i++) {
        bool real = i < len;
        size_t at = start + i;
        in[i] = real ? zt_dataset_token(ds, at) : 0;
        bool target = real && at + 1 < end && (ds->mask[at + 1] & ZT_LOSS_MASK_TRAINED);
        tg[i] = target ? zt_dataset_token(ds, at + 1) : -1;
        /* the padding is a document of its own, so the real tokens never see it */
        if (pos)
            pos[i] = real ? (int32_t)i : (int32_t)(i - len);
    }
}

void zt_data_copy_sample(const zt_loader *l, const zt_dataset *ds, int64_t s, int32_t *in,
                         int32_t *tg, int32_t *pos) {
    int T = l->T;
    if (ds->parts) {
        int k = zt_data_glob_part(l, s);
        s -= l->part_first[k];
        ds = &ds->parts[k];
    }
    if (ds->padded) {
        copy_document(ds, (size_t)s, T, in, tg, pos);
        return;
    }
    size_t start = (size_t)s * (size_t)T;
    switch (ds->kind) {
    case ZT_DATA_TOKENS16: {
        const uint16_t *t = (const uint16_t *)ds->tokens + start;
        for (int i = 0; i < T; i++) {
            in[i] = t[i];
            tg[i] = t[i + 1];
        }
        break;
    }
    case ZT_DATA_TOKENS32: {
        const uint32_t *t = (const uint32_t *)ds->tokens + start;
        for (int i = 0; i < T; i++) {
            in[i] = (int32_t)t[i];
            tg[i] = (int32_t)t[i + 1];
        }
        break;
    }
    case ZT_DATA_BYTES: {
        const uint8_t *t = (const uint8_t *)ds->tokens + start;
        for (int i = 0; i < T; i++) {
            in[i] = t[i];
            tg[i] = t[i + 1];
        }
        break;
    }
    }
    /* Target i is token start + i + 1: its mask byte says whether its loss counts; the first
     * token of a document is never predicted from the document before it. */
    const uint8_t *m = ds->mask ? ds->mask + start : NULL;
    if (m)
        for (int i = 0; i < T; i++)
            if ((m[i + 1] & (ZT_LOSS_MASK_TRAINED | ZT_LOSS_MASK_DOC_START)) !=
                ZT_LOSS_MASK_TRAINED)
                tg[i] = -1;
    /* Positions restart at each document's first token and at the window's. */
    if (pos)
        for (int i = 0; i < T; i++)
            pos[i] = i == 0 || (m && (m[i] & ZT_LOSS_MASK_DOC_START)) ? 0 : pos[i - 1] + 1;
}

int zt_loader_next(zt_loader *l, int32_t *inputs, int32_t *targets) {
    return zt_loader_next_docs(l, inputs, targets, NULL);
}

int zt_loader_next_docs(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos) {
    if (l->subs)
        return zt_data_mix_next(l, inputs, targets, doc_pos);
    int64_t end = loader_epoch_end(l);
    int64_t left = end - l->pos;
    int n = left < l->B ? (int)left : l->B;
    size_t T = (size_t)l->T;
    for (int b = 0; b < n; b++)
        zt_data_copy_sample(l, l->ds, l->order[l->pos + b], inputs + b * T, targets + b * T,
                            doc_pos ? doc_pos + b * T : NULL);
    /* Rows past a short last batch are zeroed so that a caller that ignores the count still sees
     * deterministic data. */
    if (n < l->B) {
        memset(inputs + n * T, 0, (size_t)(l->B - n) * T * sizeof *inputs);
        memset(targets + n * T, 0, (size_t)(l->B - n) * T * sizeof *targets);
        if (doc_pos)
            memset(doc_pos + n * T, 0, (size_t)(l->B - n) * T * sizeof *doc_pos);
    }
    l->pos += n;
    /* Move on as soon as the epoch is used up, so (epoch, pos) read after a step is already the
     * position of the next batch, which is what a checkpoint records. */
    if (l->pos >= end) {
        loader_build_epoch(l, l->epoch + 1);
        l->pos = 0;
    }
    return n;
}

void zt_loader_seek(zt_loader *l, int64_t epoch, int64_t pos) {
    ZT_ASSERT(epoch >= 0 && pos >= 0);
    if (l->subs) {
        zt_data_mix_seek(l, epoch * l->per_rank + pos);
        return;
    }
    /* A position at or past the end of the epoch is where next() would already have moved on. */
    if (pos >= loader_epoch_end(l)) {
        epoch++;
        pos = 0;
    }
    loader_build_epoch(l, epoch);
    l->pos = pos;
}
