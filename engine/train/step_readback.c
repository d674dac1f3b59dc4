/* The step's one read of the device (step_readback.h). */
#include <stdlib.h>
#include <string.h>

#include "step_readback.h"

#include "ztrain/comm.h"

/* The slots of the next step's counts, after the losses. */
#define AHEAD 2

/* Where the norm's parts and the table start in the block: after the losses and the next
 * step's counts, the parts; last the table, read back only when it was gathered there. */
static size_t parts_at(const zt_step_readback *r) { return (size_t)r->gas + AHEAD; }
static size_t table_at(const zt_step_readback *r) { return parts_at(r) + (size_t)r->norm_parts; }
static size_t table_len(const zt_step_readback *r) { return (size_t)r->world * (size_t)r->k; }

zt_status zt_step_readback_init(zt_step_readback *r, zt_backend *be, int gas, int norm_parts,
                                int world, int rank, int values) {
    memset(r, 0, sizeof *r);
    r->be = be;
    r->gas = gas;
    r->world = world;
    r->rank = rank;
    r->values = values;
    r->norm_parts = norm_parts;
    r->k = values > 0 ? 4 * gas + values : 0;
    r->cap = (int)(table_at(r) + table_len(r));
    r->dev = zt_backend_alloc(be, ZT_MEM_DEVICE, (size_t)r->cap * sizeof(double));
    r->host = zt_backend_alloc(be, ZT_MEM_PINNED, (size_t)r->cap * sizeof(double));
    r->deferred = calloc((size_t)gas, sizeof *r->deferred);
    r->counted = calloc((size_t)gas, sizeof *r->counted);
    r->share = calloc((size_t)gas, sizeof *r->share);
    r->loss = calloc((size_t)gas, sizeof *r->loss);
    bool ok = r->dev && r->host && r->deferred && r->counted && r->share && r->loss;
    if (ok && values > 0) {
        r->table_in = zt_backend_alloc(be, ZT_MEM_PINNED, (size_t)(r->k - gas) * sizeof(double));
        r->table = calloc((size_t)world * (size_t)(gas + values), sizeof *r->table);
        r->offsets = calloc((size_t)world, sizeof *r->offsets);
        r->counts = calloc((size_t)world, sizeof *r->counts);
        ok = r->table_in && r->table && r->offsets && r->counts;
    }
    if (!ok) {
        zt_step_readback_free(r);
        return zt_error(ZT_ERR_NOMEM, "engine: out of memory for the step's %d scalars", r->cap);
    }
    return ZT_OK;
}

void zt_step_readback_free(zt_step_readback *r) {
    if (r->be) {
        zt_backend_free(r->be, ZT_MEM_DEVICE, r->dev, (size_t)r->cap * sizeof(double));
        zt_backend_free(r->be, ZT_MEM_PINNED, r->host, (size_t)r->cap * sizeof(double));
        if (r->k)
            zt_backend_free(r->be, ZT_MEM_PINNED, r->table_in,
                            (size_t)(r->k - r->gas) * sizeof(double));
    }
    free(r->deferred);
    free(r->counted);
    free(r->share);
    free(r->loss);
    free(r->table);
    free(r->offsets);
    free(r->counts);
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

double *zt_step_readback_norm_slots(zt_step_readback *r) { return r->dev + parts_at(r); }

const double *zt_step_readback_norm_parts(const zt_step_readback *r) {
    return r->host + parts_at(r);
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

/* A deferred micro-batch's loss from its summed token losses: the mean over its trained
 * targets, then its share (engine.h), as the forward would have returned it. */
static float loss_of(double sum, int counted, double share) {
    float mean = counted ? (float)(sum / counted) : 0.0f;
    return (float)((double)mean * share);
}

zt_status zt_step_readback_sync(zt_step_readback *r, int micros, int parts) {
    /* One copy into pinned memory, which does not wait: the sync below is the only wait. It
     * stops at the last slot filled this step; the slots of micro-batches this step did not
     * defer come along unread. */
    size_t n = r->table_on_device ? table_at(r) + table_len(r)
               : parts > 0        ? parts_at(r) + (size_t)parts
               : r->ahead         ? parts_at(r)
                                  : (size_t)micros;
    r->ahead = false;
    if (n > 0)
        zt_backend_copy(r->be, r->host, r->dev, n * sizeof(double), ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
    ZT_TRY(zt_backend_sync(r->be));
    for (int i = 0; i < micros; i++) {
        if (!r->deferred[i])
            continue;
        r->loss[i] = loss_of(r->host[i], r->counted[i], r->share[i]);
        r->deferred[i] = false;
    }
    return ZT_OK;
}

/* ---- the step's table ----------------------------------------------------------------------- */

double *zt_step_readback_table_in(zt_step_readback *r) {
    return r->k ? r->table_in + 3 * r->gas : NULL;
}

/* The all-gather's pieces: every rank `each` doubles, in rank order. */
static void pieces(zt_step_readback *r, size_t each) {
    for (int q = 0; q < r->world; q++) {
        r->offsets[q] = (size_t)q * each;
        r->counts[q] = each;
    }
}

zt_status zt_step_readback_table_gather(zt_step_readback *r, zt_comm *comm) {
    const int gas = r->gas;
    double *in = r->table_in; /* counts (-1: known at the forward), shares, known losses */
    for (int i = 0; i < gas; i++) {
        in[i] = r->deferred[i] ? (double)r->counted[i] : -1.0;
        in[gas + i] = r->share[i];
        in[2 * gas + i] = r->deferred[i] ? 0.0 : (double)r->loss[i];
    }
    double *table = r->dev + table_at(r), *mine = table + (size_t)r->rank * (size_t)r->k;
    /* The pinned part is not written again before the synchronisation that follows. */
    zt_backend_copy(r->be, mine, r->dev, (size_t)gas * sizeof(double), ZT_COPY_D2D,
                    ZT_STREAM_COMPUTE);
    zt_backend_copy(r->be, mine + gas, in, (size_t)(r->k - gas) * sizeof(double), ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
    pieces(r, (size_t)r->k);
    ZT_TRY(zt_comm_dev_all_gather(comm, table, table_len(r), r->offsets, r->counts, ZT_F64));
    r->table_on_device = true;
    return ZT_OK;
}

zt_status zt_step_readback_table_finish(zt_step_readback *r, zt_comm *comm) {
    const int gas = r->gas, cols = gas + r->values;
    if (r->table_on_device) {
        r->table_on_device = false;
        for (int q = 0; q < r->world; q++) {
            const double *e = r->host + table_at(r) + (size_t)q * (size_t)r->k;
            double *row = r->table + (size_t)q * (size_t)cols;
            for (int i = 0; i < gas; i++)
                row[i] = e[gas + i] < 0.0 ? e[3 * gas + i]
                                          : (double)loss_of(e[i], (int)e[gas + i], e[2 * gas + i]);
            memcpy(row + gas, e + 4 * gas, (size_t)r->values * sizeof *row);
        }
        return ZT_OK;
    }
    double *row = r->table + (size_t)r->rank * (size_t)cols;
    for (int i = 0; i < gas; i++)
        row[i] = r->loss[i];
    memcpy(row + gas, r->table_in + 3 * gas, (size_t)r->values * sizeof *row);
    if (!comm)
        return ZT_OK;
    pieces(r, (size_t)cols);
    return zt_comm_all_gather(comm, r->table, (size_t)r->world * (size_t)cols, r->offsets,
                              r->counts, ZT_F64);
}
