/* One data file as a dataset: an llm.c token file (uint16 or uint32 tokens after a 1024-byte
 * header) or any other file read as bytes, mapped read-only and validated once at open, so that
 * the step loop indexes tokens without checks (see ztrain/data.h for the contract). The
 * dataset object itself (close, tokens, padding) also lives here: globs and mixtures are
 * datasets whose parts are datasets, and each function here walks them. */
#define _POSIX_C_SOURCE 200809L /* strdup, O_CLOEXEC; before any header */
#include "ztrain/data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_internal.h"
#include "ztrain/fsutil.h"
#include "ztrain/loss_mask.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are little-endian and are read in place; a big-endian host needs byte swapping"
#endif

#define LLMC_HEADER_BYTES 1024
#define LLMC_HEADER_INTS 256
#define LLMC_MAGIC_U16 20240520
#define LLMC_VERSION_U16 1
#define LLMC_MAGIC_U32 20240801
#define LLMC_VERSION_U32 7

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

zt_status zt_data_open_file(zt_dataset *d, int vocab_size) {
    const char *path = d->path;
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


const char *zt_data_kind_name(zt_data_kind k) {
    return k == ZT_DATA_TOKENS16 ? "uint16 tokens" : k == ZT_DATA_TOKENS32 ? "uint32 tokens"
                                                                           : "bytes";
}

/* Parts must share one token width: different widths (or text among shards) mean different
 * tokenizers, whose ids would be mixed silently. */
zt_status zt_data_same_kind(const zt_dataset *d, const zt_dataset *a, const zt_dataset *b) {
    if (a->kind == b->kind)
        return ZT_OK;
    return zt_error(ZT_ERR_FORMAT,
                    "%s: %s holds %s but %s holds %s: shards of different tokenizers (or text "
                    "among token files) cannot be read together",
                    d->path, a->path, zt_data_kind_name(a->kind), b->path, zt_data_kind_name(b->kind));
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
    int32_t header[LLMC_HEADER_INTS];
    zt_dataset_header(header, false, (int32_t)n);
    char *tmp;
    int fd;
    ZT_TRY(zt_atomic_write_begin(path, &tmp, &fd));
    zt_status s = zt_write_all(fd, header, sizeof header, tmp);
    if (s == ZT_OK)
        s = zt_write_all(fd, tokens, n * sizeof *tokens, tmp);
    return zt_atomic_write_end(fd, tmp, path, s);
}

/* The dataset among d and its parts whose token or mask mapping holds addr (*mask: the mask's). */
static const zt_dataset *mapping_of(const zt_dataset *d, const void *addr, bool *mask) {
    for (int i = 0; i < d->n_parts; i++) {
        const zt_dataset *p = mapping_of(&d->parts[i], addr, mask);
        if (p)
            return p;
    }
    const char *a = addr;
    *mask = d->mask_map && a >= (const char *)d->mask_map &&
            a < (const char *)d->mask_map + d->mask_map_size;
    if (*mask || (d->map && a >= (const char *)d->map && a < (const char *)d->map + d->map_size))
        return d;
    return NULL;
}

zt_status zt_dataset_read_fault(const zt_dataset *d, const void *addr) {
    bool mask = false;
    const zt_dataset *f = addr ? mapping_of(d, addr, &mask) : NULL;
    if (!f)
        return zt_error(ZT_ERR_IO, "%s: a data file changed size while training (a read at %p "
                        "faulted)", d->path, addr);
    char path[4200];
    if (mask)
        zt_loss_mask_path(f->path, path, sizeof path);
    else
        snprintf(path, sizeof path, "%s", f->path);
    size_t was = mask ? f->mask_map_size : f->map_size;
    struct stat st;
    if (stat(path, &st) != 0)
        return zt_error(ZT_ERR_IO, "%s: changed while training: %s (it had %zu bytes)", path,
                        strerror(errno), was);
    return zt_error(ZT_ERR_IO, "%s: changed size while training: %lld bytes, was %zu", path,
                    (long long)st.st_size, was);
}
