/* The loss-mask stream (ztrain/loss_mask.h): a token file's companion X.mask, mapped beside it
 * and checked against it once, so the loader only reads a byte per target. */
#define _POSIX_C_SOURCE 200809L
#include "ztrain/loss_mask.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/data.h"
#include "ztrain/fsutil.h"

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * 4)

void zt_loss_mask_path(const char *token_path, char *buf, size_t n) {
    snprintf(buf, n, "%s.mask", token_path);
}

static int32_t read_i32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static zt_status check_mask(const zt_dataset *d, const char *path, const unsigned char *m,
                            size_t size) {
    if (size < HEADER_BYTES)
        return zt_error(ZT_ERR_FORMAT, "%s: %zu bytes, shorter than the %d-byte loss-mask header",
                        path, size, HEADER_BYTES);
    if (read_i32(m) != ZT_LOSS_MASK_MAGIC)
        return zt_error(ZT_ERR_FORMAT, "%s: magic %d is not a loss mask's (%d)", path,
                        read_i32(m), ZT_LOSS_MASK_MAGIC);
    if (read_i32(m + 4) != ZT_LOSS_MASK_VERSION)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: loss-mask version %d; this build reads version %d",
                        path, read_i32(m + 4), ZT_LOSS_MASK_VERSION);
    int32_t n = read_i32(m + 8);
    if (n < 0 || (size_t)n != d->n_tokens)
        return zt_error(ZT_ERR_FORMAT, "%s: header counts %d tokens, %s holds %zu", path, n,
                        d->path, d->n_tokens);
    if (size != HEADER_BYTES + (size_t)n)
        return zt_error(ZT_ERR_FORMAT, "%s: %zu bytes, the header's %d tokens need %zu", path,
                        size, n, HEADER_BYTES + (size_t)n);
    const unsigned char *flags = m + HEADER_BYTES;
    for (size_t i = 0; i < (size_t)n; i++)
        if (flags[i] & ~(ZT_LOSS_MASK_TRAINED | ZT_LOSS_MASK_DOC_START))
            return zt_error(ZT_ERR_FORMAT, "%s: token %zu has flags 0x%02x; version %d defines "
                            "bit 0 (trained) and bit 1 (document start) only", path, i, flags[i],
                            ZT_LOSS_MASK_VERSION);
    return ZT_OK;
}

zt_status zt_loss_mask_attach(zt_dataset *d) {
    if (d->n_parts) {
        for (int k = 0; k < d->n_parts; k++) {
            zt_status s = zt_loss_mask_attach(&d->parts[k]);
            if (s != ZT_OK) {
                for (int j = 0; j < k; j++) {
                    zt_unmap_file(d->parts[j].mask_map, d->parts[j].mask_map_size);
                    free(d->parts[j].docs);
                    d->parts[j].docs = NULL;
                    d->parts[j].n_docs = 0;
                    d->parts[j].mask_map = NULL;
                    d->parts[j].mask = NULL;
                }
                return s;
            }
        }
        return ZT_OK;
    }
    if (d->kind == ZT_DATA_BYTES)
        return zt_error(ZT_ERR_FORMAT, "%s: a loss mask needs a token file, not text read as "
                        "bytes", d->path);
    char path[4096];
    zt_loss_mask_path(d->path, path, sizeof path);
    void *map = NULL;
    size_t size = 0;
    zt_status s = zt_map_file(path, &map, &size);
    if (s == ZT_OK)
        s = check_mask(d, path, map, size);
    if (s != ZT_OK) {
        zt_unmap_file(map, size);
        return s;
    }
    /* The documents' starts, for data.packing "padded": token 0 and every bit-1 token. */
    const uint8_t *flags = (const uint8_t *)map + HEADER_BYTES;
    size_t n = d->n_tokens ? 1 : 0;
    for (size_t i = 1; i < d->n_tokens; i++)
        n += (flags[i] & ZT_LOSS_MASK_DOC_START) != 0;
    d->docs = malloc((n ? n : 1) * sizeof *d->docs);
    if (!d->docs) {
        zt_unmap_file(map, size);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    d->n_docs = 0;
    for (size_t i = 0; i < d->n_tokens; i++)
        if (i == 0 || (flags[i] & ZT_LOSS_MASK_DOC_START))
            d->docs[d->n_docs++] = i;
    d->mask_map = map;
    d->mask_map_size = size;
    d->mask = flags;
    return ZT_OK;
}

zt_status zt_loss_mask_write(const char *path, const uint8_t *flags, size_t n) {
    if (n > INT32_MAX)
        return zt_error(ZT_ERR_INVALID, "%s: %zu tokens do not fit the header's count", path, n);
    unsigned char *buf = calloc(1, HEADER_BYTES + n);
    if (!buf)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    const int32_t head[3] = {ZT_LOSS_MASK_MAGIC, ZT_LOSS_MASK_VERSION, (int32_t)n};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++)
            buf[4 * i + b] = (unsigned char)((uint32_t)head[i] >> (8 * b));
    memcpy(buf + HEADER_BYTES, flags, n);
    zt_status s = zt_write_file_atomic(path, buf, HEADER_BYTES + n);
    free(buf);
    return s;
}
