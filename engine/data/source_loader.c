/* The loader over one source (a file or a glob of shards): torch's DistributedSampler +
 * DataLoader as DeepSpeed builds them (see ztrain/data.h). The per-epoch order is a pure function
 * of (seed, epoch, rank, world_size), so any position can be rebuilt exactly on resume.
 * A mixture (data_mix.c) draws from one such loader per source; loader.c chooses. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "ztrain/loss_mask.h"

/* xoshiro256** seeded through splitmix64: small, fast, and with no weak low bits, so every rank
 * (and every later resume) derives the same permutation from the same 64-bit seed. */

typedef struct {
    uint64_t s[4];
} rng256;

uint64_t zt_data_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = zt_data_mix64(*x);
    *x += 0x9e3779b97f4a7c15ULL;
    return z;
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

zt_status zt_loader_setup(zt_loader *l, const zt_dataset *ds, int B, int T, int rank,
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
    return ZT_OK;
}

zt_status zt_source_loader_start(zt_loader *l) {
    const zt_dataset *ds = l->ds;
    int B = l->B, T = l->T, world_size = l->world_size;
    bool drop_last = l->drop_last;
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

zt_status zt_source_loader_init(zt_loader *l, const zt_dataset *ds, int B, int T, int rank,
                                int world_size, bool shuffle, bool drop_last, uint64_t seed) {
    ZT_TRY(zt_loader_setup(l, ds, B, T, rank, world_size, shuffle, drop_last, seed));
    return zt_source_loader_start(l);
}

void zt_source_loader_free(zt_loader *l) {
    free(l->part_first);
    free(l->order);
    memset(l, 0, sizeof *l);
}

int64_t zt_source_loader_batches_per_epoch(const zt_loader *l) {
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

static void copy_sample(const zt_loader *l, const zt_dataset *ds, int64_t s, int32_t *in,
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

int zt_source_loader_next(zt_loader *l, int32_t *inputs, int32_t *targets, int32_t *doc_pos) {
    int64_t end = loader_epoch_end(l);
    int64_t left = end - l->pos;
    int n = left < l->B ? (int)left : l->B;
    size_t T = (size_t)l->T;
    for (int b = 0; b < n; b++)
        copy_sample(l, l->ds, l->order[l->pos + b], inputs + b * T, targets + b * T,
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

void zt_source_loader_seek(zt_loader *l, int64_t epoch, int64_t pos) {
    /* A position at or past the end of the epoch is where next() would already have moved on. */
    if (pos >= loader_epoch_end(l)) {
        epoch++;
        pos = 0;
    }
    loader_build_epoch(l, epoch);
    l->pos = pos;
}
