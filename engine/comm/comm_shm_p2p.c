/* Point-to-point messages of the shared-memory transport: each ordered pair of ranks that
 * exchanges messages owns one channel of the segment (comm_shm.c says how many there are and
 * why), a byte ring with a stream position for each side, so the pair's messages stay in order
 * and never meet another pair's or the collectives'.
 *
 * A message is a header (magic, dtype, count), which the receiver checks against what it expects,
 * then the elements. The sender copies into the ring as far as the receiver has drained it and
 * the receiver copies out as far as the sender has filled it, each ringing the other's bell after
 * every copy, so a message of any size streams through a ring of any size. */
#define _GNU_SOURCE /* before any header */
#include <stdio.h>
#include <string.h>

#include "comm_shm.h"

#define MSG_MAGIC 0x7a74703270ULL /* "ztp2p" */

typedef struct {
    uint64_t magic;
    uint32_t dtype, unused;
    uint64_t n;
} msg_header;

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* Sleeps on this rank's bell until *word moves from seen, which peer's copies do. Fails when
 * another rank aborted, when peer has exited with *word still at seen, or when the timeout passes
 * without a move; doing names what peer was expected to do ("send", "receive"). */
static zt_status wait_for_peer(zt_shm_comm *c, const _Atomic uint64_t *word, uint64_t seen,
                               int peer, const char *what, const char *doing) {
    _Atomic uint32_t *bell = &c->ranks[c->comm.rank].bell;
    int64_t start = zt_shm_now_ns(), deadline = start + c->timeout_ns;
    int64_t next_check = start + ZT_SHM_WAIT_SLICE_NS;
    for (;;) {
        /* The bell is read before the word: a copy after that read rings it, so the futex wait
         * below returns at once instead of missing the copy. */
        uint32_t b = atomic_load_explicit(bell, memory_order_seq_cst);
        if (atomic_load_explicit(word, memory_order_acquire) != seen)
            return ZT_OK;
        ZT_TRY(zt_shm_check_aborted(c, what));
        int64_t now = zt_shm_now_ns();
        if (now >= next_check) {
            /* A peer may copy its last bytes and exit between the two loads. */
            if (!zt_shm_rank_alive(c, peer)) {
                if (atomic_load_explicit(word, memory_order_acquire) != seen)
                    return ZT_OK;
                return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: rank %d (pid %d) has exited", what,
                                    peer, (int)atomic_load(&c->ranks[peer].pid));
            }
            next_check = now + ZT_SHM_WAIT_SLICE_NS;
        }
        if (now >= deadline) {
            if (atomic_load_explicit(word, memory_order_acquire) != seen)
                return ZT_OK;
            return zt_comm_fail(&c->comm, ZT_ERR_TIMEOUT,
                                "%s: timed out after %g s waiting for rank %d to %s", what,
                                c->comm.timeout_s, peer, doing);
        }
        int64_t wait = (next_check < deadline ? next_check : deadline) - now;
        int err = zt_shm_futex_wait(bell, b, wait);
        if (err)
            return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: futex wait failed: %s", what,
                                strerror(err));
    }
}

static unsigned char *ring_of(const zt_shm_comm *c, uint32_t channel) {
    return c->rings + (size_t)channel * c->plan.channel_bytes;
}

/* Appends len bytes to the channel's stream, waiting for room as the receiver (peer) drains it. */
static zt_status ring_write(zt_shm_comm *c, uint32_t channel, const void *src, size_t len,
                            int peer) {
    zt_shm_channel *ch = &c->channels[channel];
    unsigned char *ring = ring_of(c, channel);
    const unsigned char *p = src;
    size_t cap = c->plan.channel_bytes;
    uint64_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
    while (len) {
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
        size_t room = cap - (size_t)(head - tail);
        if (room == 0) {
            ZT_TRY(wait_for_peer(c, &ch->tail, tail, peer, "send", "receive"));
            continue;
        }
        size_t m = min_sz(room, len), at = (size_t)(head % cap), first = min_sz(m, cap - at);
        memcpy(ring + at, p, first);
        memcpy(ring, p + first, m - first);
        head += m;
        p += m;
        len -= m;
        atomic_store_explicit(&ch->head, head, memory_order_release);
        zt_shm_ring(c, peer);
    }
    return ZT_OK;
}

/* Takes len bytes from the channel's stream, waiting for the sender (peer) to fill it. */
static zt_status ring_read(zt_shm_comm *c, uint32_t channel, void *dst, size_t len, int peer) {
    zt_shm_channel *ch = &c->channels[channel];
    const unsigned char *ring = ring_of(c, channel);
    unsigned char *p = dst;
    size_t cap = c->plan.channel_bytes;
    uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
    while (len) {
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
        size_t ready = (size_t)(head - tail);
        if (ready == 0) {
            ZT_TRY(wait_for_peer(c, &ch->head, head, peer, "recv", "send"));
            continue;
        }
        size_t m = min_sz(ready, len), at = (size_t)(tail % cap), first = min_sz(m, cap - at);
        memcpy(p, ring + at, first);
        memcpy(p + first, ring, m - first);
        tail += m;
        p += m;
        len -= m;
        atomic_store_explicit(&ch->tail, tail, memory_order_release);
        zt_shm_ring(c, peer);
    }
    return ZT_OK;
}

static _Atomic uint64_t *pair_word(zt_shm_comm *c, int from, int to) {
    return &c->pairs[(size_t)from * (size_t)c->comm.world + (size_t)to];
}

/* The channel from this rank to peer; the first message of the pair takes one from the pool.
 * Only this rank writes the pair's word, so no other rank races for it. */
static zt_status send_channel(zt_shm_comm *c, int peer, uint32_t *channel) {
    _Atomic uint64_t *w = pair_word(c, c->comm.rank, peer);
    uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
    if (v == 0) {
        uint32_t k = atomic_fetch_add_explicit(&c->hdr->next_channel, 1, memory_order_relaxed);
        if (k >= c->plan.channels)
            return zt_comm_fail(&c->comm, ZT_ERR_NOMEM,
                                "send: no channel left for rank %d -> rank %d: all %u of this "
                                "world of %d are taken by other pairs of ranks",
                                c->comm.rank, peer, c->plan.channels, c->comm.world);
        v = (uint64_t)k + 1;
        atomic_store_explicit(w, v, memory_order_release);
        zt_shm_ring(c, peer);
    }
    *channel = (uint32_t)(v - 1);
    return ZT_OK;
}

/* The channel from peer to this rank, once peer's first message has taken one. */
static zt_status recv_channel(zt_shm_comm *c, int peer, uint32_t *channel) {
    _Atomic uint64_t *w = pair_word(c, peer, c->comm.rank);
    uint64_t v;
    while ((v = atomic_load_explicit(w, memory_order_acquire)) == 0)
        ZT_TRY(wait_for_peer(c, w, 0, peer, "recv", "send"));
    if (v > c->plan.channels)
        return zt_comm_fail(&c->comm, ZT_ERR_IO, "recv: shared-memory segment is corrupt");
    *channel = (uint32_t)(v - 1);
    return ZT_OK;
}

zt_status zt_shm_send(zt_comm *cc, const void *buf, size_t n, zt_dtype t, int peer) {
    zt_shm_comm *c = (zt_shm_comm *)cc;
    uint32_t channel = 0;
    ZT_TRY(send_channel(c, peer, &channel));
    const msg_header h = {MSG_MAGIC, (uint32_t)t, 0, n};
    ZT_TRY(ring_write(c, channel, &h, sizeof h, peer));
    return ring_write(c, channel, buf, n * zt_dtype_size(t), peer);
}

zt_status zt_shm_recv(zt_comm *cc, void *buf, size_t n, zt_dtype t, int peer) {
    zt_shm_comm *c = (zt_shm_comm *)cc;
    uint32_t channel = 0;
    ZT_TRY(recv_channel(c, peer, &channel));
    msg_header h;
    ZT_TRY(ring_read(c, channel, &h, sizeof h, peer));
    if (h.magic != MSG_MAGIC || h.dtype >= ZT_DTYPE_COUNT)
        return zt_comm_fail(cc, ZT_ERR_IO, "recv: the channel from rank %d is corrupt", peer);
    if (h.dtype != (uint32_t)t || h.n != n)
        return zt_comm_fail(cc, ZT_ERR_INVALID,
                            "recv: rank %d sent %s[%llu] but rank %d expects %s[%zu] from it",
                            peer, zt_dtype_name((zt_dtype)h.dtype), (unsigned long long)h.n,
                            cc->rank, zt_dtype_name(t), n);
    return ring_read(c, channel, buf, n * zt_dtype_size(t), peer);
}
