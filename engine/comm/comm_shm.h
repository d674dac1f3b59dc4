/* The shared-memory transport's segment layout and the pieces its files share (internal):
 * comm_shm.c holds the segment's life, the barrier and the collectives, comm_shm_p2p.c the
 * point-to-point channels, comm_shm_claim.c which process runs each rank.
 *
 * The segment, in order: the header; one record per rank; the point-to-point pair table (one
 * word per ordered pair: 0, or 1 + the channel it uses) and channel counters; two buffer sets for
 * the collectives, one slot per rank in each; the channels' ring buffers. Every size follows from
 * the world size alone (shm_plan), so each rank computes the same layout. */
#ifndef ZTRAIN_COMM_SHM_H
#define ZTRAIN_COMM_SHM_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm_transport.h"

/* A waiting rank wakes at least this often to check its peers' processes and its deadline. */
#define ZT_SHM_WAIT_SLICE_NS 50000000LL

/* What a rank is about to do. Each rank publishes one at the start of a collective and compares
 * all of them after the first barrier, so ranks that call different collectives (a bug in the
 * caller) fail with a message saying so instead of silently exchanging wrong data. */
typedef struct {
    uint32_t kind;
    uint32_t arg;    /* the reduce op, or the broadcast root */
    uint64_t n;
    uint64_t layout; /* a hash of offsets and counts for reduce_scatter and all_gather */
    uint32_t dtype;
    uint32_t unused;
} zt_shm_desc;

/* One per rank; each field is written only by its own rank, except bell. */
typedef struct {
    alignas(64) _Atomic int32_t pid; /* 0 until the rank has attached */
    int32_t abort_status;
    uint64_t start_time;         /* from /proc/<pid>/stat; tells a reused pid from the rank */
    _Atomic uint32_t arrived;    /* 1 + the barrier generation the rank last arrived at */
    uint32_t unused;
    zt_shm_desc desc[2];         /* one per buffer set, see phase_sync */
    char abort_reason[ZT_COMM_REASON_LEN];
    /* Rung (incremented, then futex-woken) by any rank that moves data this rank may be waiting
     * for in a point-to-point channel, and by an abort; the rank sleeps on it. */
    alignas(64) _Atomic uint32_t bell;
} zt_shm_rank;

typedef struct {
    uint64_t magic;
    uint32_t version, world_size;
    /* Random per session. Staleness is judged by rank 0's pid and start time, not by this; it
     * lets a person inspecting /dev/shm or a core dump tell two sessions under one name apart. */
    uint64_t nonce;
    uint64_t slot_bytes, channel_bytes, total_bytes;
    uint32_t channels;
    _Atomic uint32_t next_channel; /* channels handed out so far (may overshoot when all are) */
    _Atomic uint32_t ready;   /* set last by rank 0, once everything above is written */
    _Atomic uint32_t aborted; /* 0, or 1 + the rank that failed first */
    /* The barrier: ranks count themselves in; the last one resets the count and advances the
     * generation, which is the word everyone else sleeps on with futex. */
    alignas(64) _Atomic uint32_t count;
    alignas(64) _Atomic uint32_t gen;
} zt_shm_header;

/* A channel's two stream positions, in bytes since the communicator began: the sender advances
 * head after writing into the ring, the receiver tail after reading out of it. head - tail bytes
 * are in flight, at most the ring's size. */
typedef struct {
    alignas(64) _Atomic uint64_t head;
    alignas(64) _Atomic uint64_t tail;
} zt_shm_channel;

/* Where everything lies in the segment, and the sizes that decide it. */
typedef struct {
    size_t slot_bytes;    /* one rank's part of a collective buffer set */
    size_t channel_bytes; /* one channel's ring */
    uint32_t channels;
    size_t ranks_off, pairs_off, channels_off, sets_off, rings_off, total;
} zt_shm_plan;

typedef struct {
    zt_comm comm; /* first: the zt_comm the caller holds */
    int64_t timeout_ns;
    char name[192];
    unsigned char *base;
    size_t map_bytes;
    zt_shm_plan plan;
    zt_shm_header *hdr;
    zt_shm_rank *ranks;
    _Atomic uint64_t *pairs; /* [sender * world + receiver] */
    zt_shm_channel *channels;
    unsigned char *sets, *rings;
    /* Counts the phases (chunks) done; its parity picks the buffer set. Two sets let a rank fill
     * the next chunk while slower ranks still read the last one, with no extra barrier. */
    uint64_t phase;
    bool unlinked;
    int claim_fd; /* this rank's claim on the host (comm_shm_claim.c), or -1 */
} zt_shm_comm;

static inline int64_t zt_shm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Sleeps until *word != val, a wake-up, or ns pass. The segment is shared between processes, so
 * these are the non-private futex operations. Returns 0 or an errno that is not a normal wake. */
static inline int zt_shm_futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0) == 0)
        return 0;
    return errno == EAGAIN || errno == ETIMEDOUT || errno == EINTR ? 0 : errno;
}

static inline void zt_shm_futex_wake_all(_Atomic uint32_t *word) {
    /* A failed wake leaves the sleepers to their next time slice, so it costs latency only. */
    (void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wakes rank r if it sleeps on its bell. */
static inline void zt_shm_ring(zt_shm_comm *c, int r) {
    atomic_fetch_add_explicit(&c->ranks[r].bell, 1, memory_order_seq_cst);
    zt_shm_futex_wake_all(&c->ranks[r].bell);
}

/* Whether rank r's process still runs (see comm_shm.c). */
bool zt_shm_rank_alive(const zt_shm_comm *c, int r);
/* ZT_OK, or the failure of the rank that aborted the segment, recorded as this rank's. */
zt_status zt_shm_check_aborted(zt_shm_comm *c, const char *what);

/* Claims c's rank of c's job for this process until zt_shm_release_rank (c->claim_fd). Another
 * live process holding it is ZT_ERR_INVALID saying "two processes have RANK=<r>" and naming its
 * pid; nothing of the job it belongs to is touched. */
zt_status zt_shm_claim_rank(zt_shm_comm *c);
/* Gives the claim up, if held. */
void zt_shm_release_rank(zt_shm_comm *c);

zt_status zt_shm_send(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer);
zt_status zt_shm_recv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer);

#endif
