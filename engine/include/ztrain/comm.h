/* Collectives and point-to-point messages between the ranks of one job, behind one interface.
 *
 * A communicator connects world_size ranks through one transport, picked by name when it is
 * created: "shm" (ranks on one host, through one shared-memory segment, engine/comm/comm_shm.c) is
 * built in; "gloo" (CPU ranks on any hosts, over TCP, engine/comm/comm_gloo*.cc) is built when
 * Debian's libgloo-dev is installed; "nccl" (GPU ranks on any hosts, engine/comm/comm_nccl.c over
 * the CUDA module's NCCL, ztrain/nccl.h) is built with the CUDA toolkit's NCCL. engine/comm/comm.c checks the arguments
 * (the same for every transport) and dispatches. Every rank calls the same collectives in the same
 * order, with the same counts, dtype and op; a point-to-point message is one send matched by one
 * recv. One thread at a time may use a communicator (groups: zt_comm_pairs_concurrent). Buffers are host memory for the calls below
 * on every transport (NCCL stages them through its own device buffer) and the attached backend's
 * device memory for the zt_comm_dev_ calls at the end; they stay the caller's.
 *
 * On "nccl", reductions of host buffers keep the rules below exactly (each rank's values are
 * gathered and reduced on the host in rank order); reductions of device buffers are NCCL's, in
 * its own order (ring or tree): bit-identical on every rank, but not the rank-order sums "shm"
 * computes, and MAX follows NCCL's comparison. A dead peer is found by polling the collective and
 * ncclCommGetAsyncError against the timeout (NCCL's non-blocking protocol), then ncclCommAbort; the message names the ranks that
 * reported a failure through the rendezvous store, or says that a peer is dead or stuck.
 *
 * Every wait is bounded: when a peer has exited, the call fails at once with ZT_ERR_IO naming the
 * rank ("rank 2 (pid 1234) has exited"); when a peer is alive but does not arrive within the
 * timeout, it fails with ZT_ERR_TIMEOUT naming the ranks it waited for. After a failure,
 * including a bad argument, the communicator is unusable and the peers stop at their next wait:
 * the caller reports and exits.
 *
 * Results are bit-identical on every rank, so replicated state never drifts: a reduction adds
 * the ranks' contributions in rank order. fp32 adds in fp32, fp64 in double; bf16 and fp16 are
 * widened exactly, added in fp32 in rank order and rounded once, to nearest even, at the end
 * (AVG divides the fp32 sum by the world size before that rounding). MAX keeps a NaN from any
 * rank, so an overflow flag survives. */
#ifndef ZTRAIN_COMM_H
#define ZTRAIN_COMM_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/dtype.h"
#include "ztrain/status.h"

/* The most ranks a job may have: the job spec, the daemon and every transport refuse more, and
 * per-rank tables (ZeRO's pieces, the per-rank memory metrics) are sized by it. */
#define ZT_MAX_WORLD 512

typedef enum { ZT_REDUCE_SUM = 0, ZT_REDUCE_AVG, ZT_REDUCE_MAX } zt_reduce_op;

typedef struct zt_comm zt_comm;

/* Whose variables say where this process is in its job. */
typedef enum {
    ZT_DIST_NONE = 0, /* none: rank 0 of 1 */
    ZT_DIST_TORCHRUN, /* RANK / WORLD_SIZE: torchrun, Kubeflow PyTorchJob, by hand */
    ZT_DIST_SLURM,    /* SLURM_PROCID / SLURM_NTASKS */
} zt_dist_launcher;

/* The one precedence every reader of the launcher's environment follows (zt_dist_from_env, the
 * transport's choice, the worker's messages): torchrun's variables when RANK or WORLD_SIZE is
 * set (torchrun may run inside a Slurm allocation), else Slurm's when SLURM_PROCID is, else
 * none. A variable set to "" counts as unset, here and in zt_dist_env. */
zt_dist_launcher zt_dist_launcher_from_env(void);
/* getenv(name), NULL when unset or empty; the string is the environment's. */
const char *zt_dist_env(const char *name);

/* Who this process is, from the launcher's environment. */
typedef struct {
    int rank, world_size, local_rank, local_world_size;
    char master_addr[256];
    int master_port;
    char run_id[128];  /* distinguishes concurrent jobs on one host (see zt_dist_from_env) */
    zt_dist_launcher launcher; /* whose variables were read */
    /* Where master_port came from, for messages: "MASTER_PORT" (also when empty), "MASTER_PORT+1:
     * torchrun's agent store holds MASTER_PORT=29500", "derived from SLURM_JOB_ID and
     * SLURM_STEP_ID". */
    char port_origin[96];
    /* Where master_addr came from, likewise: "MASTER_ADDR", "the first node of
     * SLURM_STEP_NODELIST" (or of the job's node list), "not set: the default". */
    char addr_origin[64];
} zt_dist_info;

/* Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun,
 * Kubeflow PyTorchJob) or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (Slurm), whichever
 * zt_dist_launcher_from_env picks. With none of them it is rank 0 of 1. run_id comes from
 * ZTRAIN_RUN_ID, TORCHELASTIC_RUN_ID (not its placeholder "none") or SLURM_JOB_ID (with
 * SLURM_STEP_ID when set: "4242_1"), else from the port. The port is MASTER_PORT; under Slurm
 * without it, 20000 + (SLURM_JOB_ID + 997 * SLURM_STEP_ID) mod 10000, so that two steps of one
 * allocation do not collide; with TORCHELASTIC_USE_AGENT_STORE=True (torchrun's static
 * rendezvous, whose agent already serves a store at MASTER_PORT) MASTER_PORT + 1. A malformed or
 * inconsistent value (RANK >= WORLD_SIZE, a non-number) is an error naming the variable. A
 * MASTER_ADDR in brackets ("[fd00::1]", as URLs and torchrun's --rdzv-endpoint write an IPv6
 * address) is taken without them. */
zt_status zt_dist_from_env(zt_dist_info *d);

/* "host:port" for messages into out (cap bytes), an IPv6 address in brackets as in a URL
 * ("[fd00::1]:29500"), so that the port cannot be read as part of the address. */
void zt_dist_endpoint(const char *host, int port, char *out, size_t cap);

/* Which transport a job's ranks use: a job spec's "comm" ("auto", "shm", "gloo", "nccl"). */
typedef enum { ZT_COMM_AUTO = 0, ZT_COMM_SHM, ZT_COMM_GLOO, ZT_COMM_NCCL } zt_comm_choice;

/* Reads "auto", "shm", "gloo" or "nccl" into *out; false (and *out unchanged) for anything
 * else. */
bool zt_comm_choice_parse(const char *s, zt_comm_choice *out);

/* The transport this rank uses. The environment's ZTRAIN_COMM ("auto", "shm", "gloo", "nccl";
 * anything else is ZT_ERR_INVALID naming it) overrides the job's choice. Auto picks "shm" when
 * every rank of the job runs on this host, which it is faster for, and "gloo" when they do not:
 * when
 * LOCAL_WORLD_SIZE is below WORLD_SIZE (torchrun across nodes; Kubeflow's PyTorchJob, one rank
 * per pod, sets no LOCAL_WORLD_SIZE and so counts as one rank per host), or, under Slurm, when
 * SLURM_NNODES is above 1 or this node runs fewer tasks than the step. *name is static storage;
 * why[cap] (may be NULL) says what decided, for the log ("LOCAL_WORLD_SIZE=2 < WORLD_SIZE=4:
 * ranks on several hosts"). */
zt_status zt_comm_choose(const zt_dist_info *d, zt_comm_choice job, const char **name, char *why,
                         size_t cap);

/* The same for ranks that compute on GPUs (cuda) with gpus of them visible on this host: auto
 * picks "nccl" when every rank of this host has a GPU of its own (LOCAL_WORLD_SIZE <= gpus), on
 * one host or several; when ranks must share GPUs, which NCCL refuses, it picks what
 * zt_comm_choose would ("shm" on one host, "gloo" across hosts), and their device buffers are
 * staged through host memory (zt_comm_dev_*). Without cuda it is zt_comm_choose. */
zt_status zt_comm_choose_on(const zt_dist_info *d, zt_comm_choice job, bool cuda, int gpus,
                            const char **name, char *why, size_t cap);

/* The transport a job with `nodes` hosts gets from `choice`, as zt_comm_choose decides it for a
 * launcher that spreads the ranks over exactly those hosts (ztraind's): auto is "gloo" when
 * nodes > 1, else "shm" (a CPU job's; a GPU job's ranks pick "nccl" themselves when each has a
 * GPU of its own), and "nccl" when named. Static storage. */
const char *zt_comm_for_nodes(zt_comm_choice choice, int nodes);

/* The longest timeout zt_comm_create takes, in seconds (about 31 years): the waits count in
 * nanoseconds, which a longer one would overflow. */
#define ZT_COMM_MAX_TIMEOUT_S 1e9

/* Connects this rank to the job's others through the named transport ("shm"), waiting up to
 * timeout_s seconds for them; every later wait is bounded by the same timeout. A world size
 * outside [1, ZT_MAX_WORLD], a rank outside the world, a timeout outside (0,
 * ZT_COMM_MAX_TIMEOUT_S], or a transport
 * that is unknown or not in this build (the message names it and the transports this build has)
 * is ZT_ERR_INVALID. "shm": rank 0 creates the segment, the others attach, and the segment's name
 * is removed once all have, so nothing is left in /dev/shm however the job ends; run_id must be
 * [A-Za-z0-9_-] and distinct between jobs running at once. Each rank holds its rank of the run
 * on this host (an abstract Unix socket named after the run id and the rank) while the
 * communicator lives, so a second process with the same rank fails at once, before and after the
 * rendezvous, with ZT_ERR_INVALID saying "two processes have RANK=<r>" and the first one's pid,
 * and leaves the job of the first one alone. "gloo": rank 0 serves a TCP
 * key-value store at master_port on every address of its host, every rank publishes there the
 * address it reaches master_addr from (or that of GLOO_SOCKET_IFNAME's first interface: a
 * comma-separated list as for PyTorch, each of whose names must have an address) and its host
 * name, and the ranks connect in a full mesh; a master_addr that does not resolve is asked for
 * again until the timeout, then ZT_ERR_TIMEOUT naming it, a port in use on rank 0's host
 * ZT_ERR_IO (named with d->port_origin), ranks started with different world sizes or two with one rank
 * ZT_ERR_INVALID, and ranks that do not all join within the timeout ZT_ERR_TIMEOUT naming the
 * missing ones. After that a peer that exits or whose host becomes unreachable is ZT_ERR_IO or
 * ZT_ERR_TIMEOUT naming its rank and host ("lost rank 2 on host n2 (10.0.0.2)"); a rank that
 * fails tells the others through the store, and they report its reason. Creating a "gloo"
 * communicator sets SIGPIPE to be ignored (unless the program handles it), so that a write to a
 * dead peer fails the call instead of killing the rank. *out is NULL on
 * failure; free with zt_comm_destroy. */
zt_status zt_comm_create(zt_comm **out, const char *transport, const zt_dist_info *d,
                         double timeout_s);
/* The process's stop request (stop_signals.h's flag; NULL, the default: none). While the ranks
 * meet in zt_comm_create (waiting for rank 0's shared-memory segment or store, for the others
 * to attach or join), a set *flag ends the wait at once with ZT_ERR_STOPPED, naming the ranks
 * waited for: nothing has been trained yet, so a stop must not wait out the timeout. Waits after
 * the rendezvous (collectives) ignore it: a stop ends a step on every rank together. */
void zt_comm_set_stop_flag(const volatile sig_atomic_t *flag);
/* Removes the name of the "shm" segment of the job with run_id from /dev/shm, if it is there:
 * rank 0 removes it once every rank has attached, so it stays only when rank 0 was killed
 * (SIGKILL, the OOM killer) before that. For the keeper of a job's ranks (ztrain run, ztraind),
 * once every rank has ended and before it starts ranks with that run id again. */
void zt_comm_shm_remove_leftover(const char *run_id);
/* Frees the communicator, failed or not; NULL is fine. */
void zt_comm_destroy(zt_comm *c);

int zt_comm_rank(const zt_comm *c);
int zt_comm_world_size(const zt_comm *c);
/* The transport's name ("shm", "gloo"); static storage. */
const char *zt_comm_transport(const zt_comm *c);
/* Whether two threads may use groups of c's transport (zt_comm_create_group, for a group: of its
 * parent's) at once when no pair of ranks exchanges messages in both: "shm" gives each ordered
 * pair its own channel and "gloo" its own connection, so they may (tensor parallelism's group
 * beside ZeRO's communication thread); "nccl" queues every operation on one NCCL communicator,
 * which one thread at a time may use. */
bool zt_comm_pairs_concurrent(const zt_comm *c);

/* buf[n] of dtype t becomes op over all ranks' buf[n] (every rank gets the result). */
zt_status zt_comm_all_reduce(zt_comm *c, void *buf, size_t n, zt_dtype t, zt_reduce_op op);

/* Reduce-scatter over a range that ranks own in contiguous pieces: every rank passes the same
 * in[n]; piece r is in[offsets[r] .. offsets[r] + counts[r]) and rank r receives op over all
 * ranks' piece r in out[counts[r]] (out may alias in + offsets[rank]; no other part of in
 * changes). offsets[] and counts[] hold world_size entries, the same on every rank; pieces must
 * lie inside [0, n) and be disjoint; counts may be 0. */
zt_status zt_comm_reduce_scatter(zt_comm *c, const void *in, void *out, size_t n,
                                 const size_t *offsets, const size_t *counts, zt_dtype t,
                                 zt_reduce_op op);

/* All-gather into buf[n]: rank r contributes buf[offsets[r] .. + counts[r]) and afterwards every
 * rank holds every piece (elements in no piece are left as they are). Pieces as for
 * reduce_scatter. */
zt_status zt_comm_all_gather(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                             const size_t *counts, zt_dtype t);

/* buf[n] of rank root is copied to every rank. */
zt_status zt_comm_broadcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root);

zt_status zt_comm_barrier(zt_comm *c);

/* Point-to-point, for pipeline stages: send hands buf[n] of dtype t to rank peer, which takes it
 * with a recv naming this rank and the same n and t (a mismatch is ZT_ERR_INVALID on the
 * receiver, naming both). Messages between one sender and one receiver arrive in the order they
 * were sent, whatever the collectives and other pairs' messages in between; any n works (large
 * messages stream in pieces). Both calls block: recv until the whole message is in buf, send until
 * the transport holds or has delivered all of it. A send may wait for its receiver (on "shm",
 * once the message outgrows the pair's channel), so order the calls so that every send meets its
 * recv (even stages send first, odd ones receive first) or the pair times out. A wait that makes
 * no progress for the timeout is ZT_ERR_TIMEOUT naming the peer; a peer that has exited is
 * ZT_ERR_IO naming it. peer must be another rank: sending to oneself is ZT_ERR_INVALID. On "gloo"
 * a send always waits until its receiver has posted the matching recv. On "shm"
 * each ordered pair that exchanges messages holds one channel of a fixed pool: every pair gets
 * one in worlds up to 23 ranks, and larger worlds have max(512, 4 × world_size) channels, so a
 * rank may talk to several others but not all; a send past the pool is ZT_ERR_NOMEM naming the
 * pair. */
zt_status zt_comm_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer);
zt_status zt_comm_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer);

/* A communicator over members ranks[0..n) of parent (distinct ranks; this rank among them), for
 * the collectives of a subset: a pipeline stage's data-parallel replicas, or one replica's stages.
 * Member i is the group's rank i. Its collectives and messages travel as parent's point-to-point
 * messages, so they follow the rules above (the same order on every member, results bit-identical
 * to a communicator of those ranks alone), and they must not interleave with other traffic
 * between the same ranks that the members order differently. A failure fails the parent too.
 * Only the members call, all at the same point of their calls on parent. On "nccl" (parent, or
 * the communicator under parent's groups) the group is instead an NCCL communicator of the
 * members alone, joined with a unique id that member 0 sends to the others through parent: its
 * zt_comm_dev_ collectives run on the device like the parent's (nothing staged), its host ones
 * keep the rules above, and its transport's name is "nccl". Free with zt_comm_destroy before the
 * parent. */
zt_status zt_comm_create_group(zt_comm **out, zt_comm *parent, const int *ranks, int n);

/* Communication time of the calling thread, for the step breakdown (the perf/rank<r>/comm_ms
 * metric): the milliseconds it has spent inside the calls above, on any communicator, since it
 * started, plus what it reported with zt_comm_add_wait_ms. A caller takes the difference over
 * the span it times. Per thread: a helper thread's collectives (ZeRO's overlap_comm) count for
 * the training thread only where it waits for them, which the waiting code reports with
 * zt_comm_add_wait_ms. */
double zt_comm_thread_ms(void);
void zt_comm_add_wait_ms(double ms);
/* ---- device buffers (engine/comm/comm_device.c) ------------------------------------------------ */

struct zt_backend;

/* The calls above take host memory on every transport. The zt_comm_dev_ calls below take the
 * device memory of the backend attached here (ZeRO's flat buffers) and otherwise mean the same,
 * with the same checks. Attach once, before the first zt_comm_dev_ call; the backend must outlive
 * the communicator's use (it is not freed with it); NULL detaches (host memory again).
 *
 * How a device buffer travels depends on the transport: "nccl" reads it where it is; "shm" and
 * "gloo" read host memory, so on a backend whose device memory is the host's (the CPU) the
 * buffer is passed as it is, and otherwise (several ranks sharing one GPU, where NCCL refuses to
 * run) it is copied to a host staging buffer of the communicator's (grown to the largest message
 * once, then reused), reduced there, and copied back. The copies run on the backend's
 * communication stream after everything issued on its compute stream, and the compute stream
 * issued afterwards waits for them, so a caller on either thread sees the collective's result in
 * stream order (unless the calling thread orders the streams itself, below). The same holds for
 * NCCL's collectives, posted on the communication stream. An allocation failure of the staging
 * buffer is ZT_ERR_NOMEM naming its size. */
zt_status zt_comm_attach_backend(zt_comm *c, struct zt_backend *be);
/* Whether the calling thread orders the communication stream against the compute stream itself:
 * ZeRO's communication thread, each of whose jobs starts on the device after an event its
 * submitter recorded on the compute stream and records one that whoever uses its result makes
 * the compute stream wait for. The zt_comm_dev_ calls of such a thread then issue nothing on the
 * compute stream: no wait there for the collective (which would land wherever the other thread
 * has got to in issuing the compute, stalling it for a reduction that nothing there reads) and
 * no event behind everything issued there so far (which would hold the collective back until
 * compute it does not need had run). Off (the default) on every thread until it says so. */
void zt_comm_dev_thread_orders_streams(bool on);
/* Whether a zt_comm_dev_ call copies through host memory on this communicator (false without a
 * backend attached). */
bool zt_comm_dev_staged(const zt_comm *c);
/* Whether the transport reads the attached backend's device memory itself (NCCL), so that a
 * zt_comm_dev_ call is posted on the communication stream without a host wait (false without a
 * backend attached, and for a host transport even on the CPU backend). */
bool zt_comm_dev_native(const zt_comm *c);
zt_status zt_comm_dev_all_reduce(zt_comm *c, void *buf, size_t n, zt_dtype t, zt_reduce_op op);
zt_status zt_comm_dev_reduce_scatter(zt_comm *c, const void *in, void *out, size_t n,
                                     const size_t *offsets, const size_t *counts, zt_dtype t,
                                     zt_reduce_op op);
zt_status zt_comm_dev_all_gather(zt_comm *c, void *buf, size_t n, const size_t *offsets,
                                 const size_t *counts, zt_dtype t);
zt_status zt_comm_dev_broadcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root);
zt_status zt_comm_dev_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer);
zt_status zt_comm_dev_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer);

/* What this communicator's zt_comm_dev_ calls did since the backend was attached: how many there
 * were, the bytes of their payloads (n times the element size, as the caller gave them: what each
 * rank puts into an all-reduce or reduce-scatter, the whole buffer of an all-gather or
 * broadcast, a message), those of the reductions (all-reduce and reduce-scatter) apart, and, where the buffers are staged through host memory, the copies to and from the
 * staging buffer. Each copy to it is a wait of the host for the device (the host transport reads
 * the bytes next), and each copy back an upload from pageable memory: the round trips a transport
 * that reads host memory cannot do without, which a step's count of waits sets apart. Counted by
 * the thread that calls the collective; read them when none is in flight. */
typedef struct {
    unsigned long long calls, payload_bytes, reduced_bytes;
    unsigned long long staged_waits, staged_uploads;
} zt_comm_dev_stats;
zt_comm_dev_stats zt_comm_dev_counts(const zt_comm *c);
/* The counts of n communicators added up (a NULL entry counts nothing): what a rank's engine
 * used over all its groups. */
zt_comm_dev_stats zt_comm_dev_counts_sum(zt_comm *const *comms, size_t n);

#endif
