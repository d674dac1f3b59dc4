/* Packed documents' positions held for a model (doc_pos.h). */
#include "doc_pos.h"

#include <string.h>

zt_status zt_doc_pos_set(zt_doc_pos *d, zt_backend *be, size_t cap, int slots,
                         const int32_t *pos, int B, int T) {
    d->on = false;
    if (!pos)
        return ZT_OK;
    size_t n = (size_t)B * (size_t)T;
    if (n > cap)
        return zt_error(ZT_ERR_INVALID, "model: %d×%d document positions exceed the %zu tokens "
                        "of a micro-batch", B, T, cap);
    for (size_t i = 0; i < n; i++) {
        int t = (int)(i % (size_t)T);
        if (pos[i] != 0 && (t == 0 || pos[i] != pos[i - 1] + 1))
            return zt_error(ZT_ERR_INVALID, "model: document position %d of token %d in row %d "
                            "is neither 0 nor one past the token before", pos[i], t,
                            (int)(i / (size_t)T));
    }
    if (!d->ring) {
        d->slots = slots > 1 ? slots : 1;
        d->ring = zt_backend_alloc(be, ZT_MEM_PINNED, (size_t)d->slots * cap * sizeof(int32_t));
        d->dev = zt_backend_alloc(be, ZT_MEM_DEVICE, cap * sizeof(int32_t));
        d->cap = cap;
        d->slot = d->slots - 1;
        if (!d->ring || !d->dev) {
            zt_doc_pos_free(d, be);
            return zt_error(ZT_ERR_NOMEM, "model: out of memory for document positions");
        }
    }
    d->slot = (d->slot + 1) % d->slots;
    d->host = d->ring + (size_t)d->slot * d->cap;
    memcpy(d->host, pos, n * sizeof *pos);
    zt_backend_copy(be, d->dev, d->host, n * sizeof *pos, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    d->on = true;
    return ZT_OK;
}

void zt_doc_pos_free(zt_doc_pos *d, zt_backend *be) {
    zt_backend_free(be, ZT_MEM_PINNED, d->ring, (size_t)d->slots * d->cap * sizeof(int32_t));
    zt_backend_free(be, ZT_MEM_DEVICE, d->dev, d->cap * sizeof(int32_t));
    memset(d, 0, sizeof *d);
}
