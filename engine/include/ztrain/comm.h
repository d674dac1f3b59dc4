/* Collectives between the ranks of one job, behind one interface.
 *
 * A communicator connects world_size ranks; every rank calls the same collectives in the same
 * order. The one backend so far is "shm" (ranks on one host, through one shared-memory segment,
 * engine/comm_shm.c), which defines these functions directly; the CUDA milestone's "nccl" backend
 * turns them into a dispatch on the communicator's backend. All buffers are host memory here.
 *
 * Every wait is bounded: when a peer has exited, the call fails at once with ZT_ERR_IO naming the
 * rank ("rank 2 (pid 1234) has exited"); when a peer is alive but does not arrive within the
 * timeout, it fails with ZT_ERR_TIMEOUT naming the ranks that did not arrive. After a failure the
 * communicator is unusable: the caller reports and exits. Results are bit-identical on every rank
 * (reductions add the ranks' contributions in rank order), so replicated state never drifts. */
#ifndef ZTRAIN_COMM_H
#define ZTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

/* The most ranks a job may have, everywhere: communicators, ZeRO's partitions, per-rank metrics. */
enum { ZT_MAX_WORLD = 512 };

typedef enum { ZT_REDUCE_SUM = 0, ZT_REDUCE_AVG, ZT_REDUCE_MAX } zt_reduce_op;

typedef struct zt_comm zt_comm;

/* Who this process is, from the launcher's environment. */
typedef struct {
    int rank, world_size, local_rank, local_world_size;
    char master_addr[256];
    int master_port;
    char run_id[128];  /* distinguishes concurrent jobs on one host (see zt_dist_from_env) */
} zt_dist_info;

/* Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun,
 * Kubeflow PyTorchJob) or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (Slurm). With none of them it
 * is rank 0 of 1. run_id comes from ZTRAIN_RUN_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID, else from
 * MASTER_PORT. A malformed or inconsistent value (RANK >= WORLD_SIZE, a non-number) is an error
 * naming the variable. */
zt_status zt_dist_from_env(zt_dist_info *d);

/* Connects to the job's other ranks through shared memory. Rank 0 creates the segment, the others
 * attach, retrying until timeout_s. Free with zt_comm_destroy (rank 0 removes the segment). */
zt_status zt_comm_create_shm(zt_comm **out, const zt_dist_info *d, double timeout_s);
void zt_comm_destroy(zt_comm *c);

int zt_comm_rank(const zt_comm *c);
int zt_comm_world_size(const zt_comm *c);

/* buf[n] becomes op over all ranks' buf[n] (every rank gets the result). */
zt_status zt_comm_all_reduce(zt_comm *c, float *buf, size_t n, zt_reduce_op op);
/* The same in double precision, for small statistics (norms, losses, counters). */
zt_status zt_comm_all_reduce_f64(zt_comm *c, double *buf, size_t n, zt_reduce_op op);

/* Reduce-scatter over a range that ranks own in contiguous pieces: every rank passes the same
 * in[n]; piece r is in[offsets[r] .. offsets[r] + counts[r]) and rank r receives op over all
 * ranks' piece r in out[counts[r]] (out may alias in + offsets[rank]). Pieces must be disjoint;
 * counts may be 0. */
zt_status zt_comm_reduce_scatter(zt_comm *c, const float *in, float *out, size_t n,
                                 const size_t *offsets, const size_t *counts, zt_reduce_op op);

/* All-gather into buf[n]: rank r contributes buf[offsets[r] .. + counts[r]) and afterwards every
 * rank holds every piece. */
zt_status zt_comm_all_gather(zt_comm *c, float *buf, size_t n, const size_t *offsets,
                             const size_t *counts);

/* buf[n] of rank root is copied to every rank. */
zt_status zt_comm_broadcast(zt_comm *c, float *buf, size_t n, int root);

zt_status zt_comm_barrier(zt_comm *c);

#endif
