/* The step's one read of the device (step_readback.h). */
#include <stdlib.h>
#include <string.h>

#include "step_readback.h"

/* The slots of the next step's counts, after the losses. */
#define AHEAD 2

zt_status zt_step_readback_init(zt_step_readback *r, zt_backend *be, int gas, int norm_parts) {
    memset(r, 0, sizeof *r);
    r->be = be;
    r->gas = gas;
    r->cap = gas + AHEAD + norm_parts;
    r->dev = zt_backend_alloc(be, ZT_MEM_DEVICE, (size_t)r->cap * sizeof(double));
    r->host = zt_backend_alloc(be, ZT_MEM_PINNED, (size_t)r->cap * sizeof(double));
    r->deferred = calloc((size_t)gas, sizeof *r->deferred);
    r->counted = calloc((size_t)gas, sizeof *r->counted);
    r->share = calloc((size_t)gas, sizeof *r->share);
    r->loss = calloc((size_t)gas, sizeof *r->loss);
    if (!r->dev || !r->host || !r->deferred || !r->counted || !r->share || !r->loss) {
        zt_step_readback_free(r);
        return zt_error(ZT_ERR_NOMEM, "engine: out of memory for the step's %d scalars", r->cap);
    }
    return ZT_OK;
}

void zt_step_readback_free(zt_step_readback *r) {
    if (r->be) {
        zt_backend_free(r->be, ZT_MEM_DEVICE, r->dev, (size_t)r->cap * sizeof(double));
        zt_backend_free(r->be, ZT_MEM_PINNED, r->host, (size_t)r->cap * sizeof(double));
    }
    free(r->deferred);
    free(r->counted);
    free(r->share);
    free(r->loss);
    memset(r, 0, sizeof *r);
}

double *zt_step_readback_defer(zt_step_readback *r, int micro, int counted, double share) {
    r->deferred[micro] = true;
    r->counted[micro] = counted;
    r->share[micro] = share;
    return r->dev + micro;
}

void zt_step_readback_known(zt_step_readback *r, int micro, float loss) {
    r->deferred[micro] = false;
    r->loss[micro] = loss;
}

double *zt_step_readback_norm_slots(zt_step_readback *r) { return r->dev + r->gas + AHEAD; }

const double *zt_step_readback_norm_parts(const zt_step_readback *r) {
    return r->host + r->gas + AHEAD;
}

double *zt_step_readback_ahead(zt_step_readback *r, const double counts[2]) {
    /* The pinned slots are not written again before the sync's copy back, which the stream
     * orders after this upload. */
    double *host = r->host + r->gas, *dev = r->dev + r->gas;
    memcpy(host, counts, AHEAD * sizeof *host);
    zt_backend_copy(r->be, dev, host, AHEAD * sizeof *host, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    r->ahead = true;
    return dev;
}

const double *zt_step_readback_ahead_sums(const zt_step_readback *r) { return r->host + r->gas; }

zt_status zt_step_readback_sync(zt_step_readback *r, int micros, int parts) {
    /* One copy into pinned memory, which does not wait: the sync below is the only wait. The
     * slots of micro-batches this step did not defer come along unread. */
    size_t n = parts > 0 ? (size_t)(r->gas + AHEAD + parts)
               : r->ahead ? (size_t)(r->gas + AHEAD) : (size_t)micros;
    r->ahead = false;
    if (n > 0)
        zt_backend_copy(r->be, r->host, r->dev, n * sizeof(double), ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
    ZT_TRY(zt_backend_sync(r->be));
    for (int i = 0; i < micros; i++) {
        if (!r->deferred[i])
            continue;
        /* As the forward computed it: the mean over trained targets, then its share. */
        float mean = r->counted[i] ? (float)(r->host[i] / r->counted[i]) : 0.0f;
        r->loss[i] = (float)((double)mean * r->share[i]);
        r->deferred[i] = false;
    }
    return ZT_OK;
}
