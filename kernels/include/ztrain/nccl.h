/* NCCL as the CUDA module offers it: the one table through which the engine's "nccl" transport
 * (engine/comm/comm_nccl.c) reaches NCCL, so that no program links libnccl or libcudart and the
 * engine includes no NCCL or CUDA header. The table lives in libztrain_cuda.so
 * (kernels/cuda/nccl/nccl_comm.c); zt_nccl_api() loads it with the rest of the module.
 *
 * A call on host memory (ZT_NCCL_HOST) returns only when its work is complete (or failed): the
 * module issues NCCL's non-blocking calls and then polls them against the communicator's timeout
 * (the protocol is kernels/cuda/nccl/nccl_wait.h's). A call on device memory returns once NCCL has
 * taken it: the collective or message runs on the attached backend's communication stream (or
 * the communicator's own) in stream order, as a kernel would, and the host does not wait. Its
 * buffers must stay untouched until work ordered after it (an event on that stream, the
 * backend's sync) says it is done. The attached backend's host waits watch it meanwhile, so a
 * dead or stuck peer still ends in an abort and an error, reported by the backend's sync, at
 * the latest a timeout after the posted work last made progress; a message whose header
 * disagrees (another count or type) is found when the posted work is known complete. Without an
 * attached backend the caller synchronises the communicator's stream through a later host call.
 * A call that fails or times out aborts the communicator (ncclCommAbort) and returns ZT_ERR_IO or
 * ZT_ERR_TIMEOUT with a message naming the rank, the GPU, the NCCL call and NCCL's text; every
 * later call then fails at once, naming the first failure. Rendezvous (handing the unique id to
 * the other ranks) and naming the peers that failed are the caller's. */
#ifndef ZTRAIN_NCCL_H
#define ZTRAIN_NCCL_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/dtype.h"
#include "ztrain/status.h"

struct zt_backend;

/* ncclUniqueId, carried as bytes (NCCL_UNIQUE_ID_BYTES is 128 in every NCCL 2.x). */
enum { ZT_NCCL_ID_BYTES = 128 };
typedef struct {
    char bytes[ZT_NCCL_ID_BYTES];
} zt_nccl_id;

typedef enum { ZT_NCCL_SUM = 0, ZT_NCCL_AVG, ZT_NCCL_MAX } zt_nccl_op;

/* Where the buffers of a call live: device memory of the communicator's GPU, or host memory,
 * which the module stages through pinned memory and a device buffer of its own. */
typedef enum { ZT_NCCL_DEVICE = 0, ZT_NCCL_HOST } zt_nccl_mem;

typedef struct zt_nccl_comm zt_nccl_comm;

/* Bumped whenever the table changes: a module built from other sources is refused. */
enum { ZT_NCCL_API_VERSION = 1 };

typedef struct {
    int version;
    /* The NCCL version the module runs with (ncclGetVersion: 22809 for 2.28.9). */
    int (*nccl_version)(void);
    /* The GPU of a rank whose LOCAL_RANK is local_rank among local_world ranks on its host:
     * local_rank modulo the visible GPUs. Refused, naming the rank: no visible GPU (with CUDA's
     * reason, e.g. a driver too old for this build's runtime), or fewer GPUs than ranks on the
     * host (NCCL needs a GPU per rank). */
    zt_status (*pick_device)(int rank, int local_rank, int local_world, int *device);
    /* A fresh unique id (rank 0 makes it; the caller hands it to the others). */
    zt_status (*unique_id)(zt_nccl_id *out);
    /* Joins rank `rank` of `world` on GPU `device` (a visible device index), waiting at most
     * timeout_s for every rank to join. The caller owns *out (zt_nccl_api.destroy). */
    zt_status (*create)(zt_nccl_comm **out, const zt_nccl_id *id, int world, int rank,
                        int device, double timeout_s);
    /* Flushes and frees a healthy communicator, or frees an aborted one; NULL is a no-op. */
    void (*destroy)(zt_nccl_comm *c);
    /* Aborts the communicator (idempotent): pending and later calls fail. */
    void (*abort)(zt_nccl_comm *c);
    /* The collectives run on be's communication stream when be is the CUDA backend of the same
     * GPU (so comm_device.c's events order them with compute, and be's host waits watch the
     * posted ones), else on the communicator's own stream after be has been synchronised. be may
     * be NULL. Work posted on the previous backend's stream is waited for first. */
    zt_status (*attach)(zt_nccl_comm *c, struct zt_backend *be);
    /* NCCL's asynchronous error, polled once without waiting: ZT_OK while the communicator is
     * healthy (or busy), the error (and an abort) otherwise. */
    zt_status (*async_error)(zt_nccl_comm *c);

    /* In place over n elements of device memory. */
    zt_status (*all_reduce)(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, zt_nccl_op op);
    /* Rank r's result is the reduction of in[offsets[r], + counts[r]) (elements), written to out
     * on rank r; in and out are device memory. Equal consecutive pieces take NCCL's
     * reduce-scatter, others one reduce per owner. */
    zt_status (*reduce_scatter)(zt_nccl_comm *c, const void *in, void *out,
                                const size_t *offsets, const size_t *counts, zt_dtype t,
                                zt_nccl_op op);
    /* Piece r of buf (offsets[r], counts[r] elements, of n) comes from rank r; elements in no
     * piece keep their values. */
    zt_status (*all_gather)(zt_nccl_comm *c, void *buf, size_t n, const size_t *offsets,
                            const size_t *counts, zt_dtype t, zt_nccl_mem mem);
    zt_status (*broadcast)(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, int root,
                           zt_nccl_mem mem);
    /* A message carries a header (count and dtype) before its elements, so recv refuses, with
     * ZT_ERR_INVALID naming both ranks, a message of another count or type. */
    zt_status (*send)(zt_nccl_comm *c, const void *buf, size_t n, zt_dtype t, int peer,
                      zt_nccl_mem mem);
    zt_status (*recv)(zt_nccl_comm *c, void *buf, size_t n, zt_dtype t, int peer,
                      zt_nccl_mem mem);
} zt_nccl_api;

/* The module's table, loaded on first use; NULL, with zt_last_error() saying why (no CUDA in this
 * build, the module not found, a module without NCCL or of another table version), otherwise. */
const zt_nccl_api *zt_nccl_api_get(void);

#endif
