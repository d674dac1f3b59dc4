// The Gloo transport ("gloo"): CPU ranks on any number of hosts, connected by Gloo's TCP
// transport in a full mesh, after a rendezvous through the TCP key-value store that rank 0 serves
// at MASTER_ADDR:MASTER_PORT (engine/tcp_store.h). The rendezvous lives in comm_gloo_rdzv.cc.
//
// The collectives are built here on Gloo's point-to-point buffers rather than taken from its
// algorithms, for two reasons. Results must be bit-identical to the shm transport's, which folds
// every rank's contribution in rank order with zt_comm_reduce (16-bit values in fp32): here each
// rank owns a 1/N share of the buffer, receives every rank's contribution to its share, reduces
// them in rank order with the same function, and sends the result to all — the same bytes on the
// wire as a ring all-reduce, 2(N-1)/N of the buffer per rank. And a wait must know which peer it
// waits for, so that a dead rank, a lost link or a timeout is reported by rank and host.
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include <gloo/transport/unbound_buffer.h>

#include "comm_gloo.h"

namespace {

using Clock = std::chrono::steady_clock;
using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

// A reduction moves the buffer in chunks of this many bytes, which bounds the scratch space that
// receives every rank's contribution to this rank's share (one chunk's worth in all).
constexpr size_t CHUNK_BYTES = size_t(16) << 20;

// Slots tell Gloo's messages apart: collectives number theirs from a counter every rank advances
// alike; point-to-point messages between a pair use one slot, in which Gloo keeps them in order.
constexpr uint64_t P2P_SLOT = uint64_t(1) << 62;
constexpr uint64_t P2P_MAGIC = 0x7a7467703270ULL; // "ztgp2p"

zt_gloo_comm *gl(zt_comm *c) { return reinterpret_cast<zt_gloo_comm *>(c); }

// The sends and receives of one step of a collective, one buffer per peer, so that a failure is
// pinned on the peer whose buffer failed.
class Step {
  public:
    Step(zt_gloo_comm *c, const char *what) : c_(c), what_(what), slot_(c->next_slot++) {}

    void send(int peer, const void *p, size_t bytes) {
        if (!bytes)
            return;
        sends_.push_back({peer, c_->ctx->createUnboundBuffer(const_cast<void *>(p), bytes)});
        sends_.back().buf->send(peer, slot_);
    }
    void recv(int peer, void *p, size_t bytes) {
        if (!bytes)
            return;
        recvs_.push_back({peer, c_->ctx->createUnboundBuffer(p, bytes)});
        recvs_.back().buf->recv(peer, slot_);
    }
    // Waits for every receive, then every send, each within the timeout from the start of the
    // wait. ZT_OK, or the communicator's failure naming the peer.
    zt_status wait() {
        auto deadline = Clock::now() + std::chrono::milliseconds(c_->timeout_ms);
        for (auto *list : {&recvs_, &sends_}) {
            for (auto &op : *list) {
                zt_status s = wait_one(op, list == &recvs_, deadline);
                if (s != ZT_OK)
                    return s;
            }
        }
        return ZT_OK;
    }

  private:
    struct Op {
        int peer;
        Buffer buf;
    };

    zt_status wait_one(Op &op, bool receiving, Clock::time_point deadline) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() < 1)
            left = std::chrono::milliseconds(1);
        try {
            bool done = receiving ? op.buf->waitRecv(nullptr, left)
                                  : op.buf->waitSend(nullptr, left);
            if (done)
                return ZT_OK;
            return zt_gloo_peer_failed(c_, what_, op.peer, false, "the wait was aborted");
        } catch (const std::exception &e) {
            bool timed_out = Clock::now() >= deadline - std::chrono::milliseconds(5);
            return zt_gloo_peer_failed(c_, what_, op.peer, timed_out, e.what());
        }
    }

    zt_gloo_comm *c_;
    const char *what_;
    uint64_t slot_;
    std::vector<Op> sends_, recvs_;
};

// Runs a step body that may throw (a Gloo call refusing its arguments, memory running out) and
// turns the exception into the communicator's failure.
template <typename F> zt_status guarded(zt_gloo_comm *c, const char *what, F body) {
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return zt_comm_fail(&c->comm, ZT_ERR_NOMEM, "%s: out of memory", what);
    } catch (const std::exception &e) {
        return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: %s", what, e.what());
    }
}

size_t share_lo(size_t m, int k, int world) { return m * size_t(k) / size_t(world); }

zt_status gloo_all_reduce(zt_comm *cc, void *buf, size_t n, zt_dtype t, zt_reduce_op op) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "all_reduce";
    int world = cc->world, me = cc->rank;
    if (world == 1 || n == 0)
        return ZT_OK;
    return guarded(c, what, [&]() -> zt_status {
        size_t es = zt_dtype_size(t);
        size_t chunk = std::max<size_t>(CHUNK_BYTES / es, size_t(world));
        auto *p = static_cast<unsigned char *>(buf);
        std::vector<unsigned char> scratch;
        for (size_t off = 0; off < n; off += chunk) {
            size_t m = std::min(chunk, n - off);
            unsigned char *base = p + off * es;
            size_t lo = share_lo(m, me, world), cnt = share_lo(m, me + 1, world) - lo;
            scratch.resize(size_t(world) * cnt * es);
            {
                Step gather(c, what);
                for (int k = 0; k < world; k++) {
                    if (k == me)
                        continue;
                    size_t klo = share_lo(m, k, world), khi = share_lo(m, k + 1, world);
                    gather.recv(k, scratch.data() + size_t(k) * cnt * es, cnt * es);
                    gather.send(k, base + klo * es, (khi - klo) * es);
                }
                if (cnt)
                    std::memcpy(scratch.data() + size_t(me) * cnt * es, base + lo * es, cnt * es);
                ZT_TRY(gather.wait());
            }
            if (cnt)
                zt_comm_reduce(base + lo * es, scratch.data(), cnt * es, world, cnt, t, op);
            Step spread(c, what);
            for (int k = 0; k < world; k++) {
                if (k == me)
                    continue;
                size_t klo = share_lo(m, k, world), khi = share_lo(m, k + 1, world);
                spread.recv(k, base + klo * es, (khi - klo) * es);
                spread.send(k, base + lo * es, cnt * es);
            }
            ZT_TRY(spread.wait());
        }
        return ZT_OK;
    });
}

// Piece by piece in rounds: round i moves, for every rank k, elements [i*chunk, (i+1)*chunk) of
// piece k, so the scratch space stays one chunk per rank whatever the pieces' sizes.
zt_status gloo_reduce_scatter(zt_comm *cc, const void *in, void *out, size_t n,
                              const size_t *offsets, const size_t *counts, zt_dtype t,
                              zt_reduce_op op) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "reduce_scatter";
    int world = cc->world, me = cc->rank;
    size_t es = zt_dtype_size(t);
    const auto *src = static_cast<const unsigned char *>(in);
    auto *dst = static_cast<unsigned char *>(out);
    if (world == 1) {
        if (counts[me])
            std::memmove(dst, src + offsets[me] * es, counts[me] * es);
        return ZT_OK;
    }
    return guarded(c, what, [&]() -> zt_status {
        size_t chunk = std::max<size_t>(CHUNK_BYTES / es / size_t(world), 1), longest = 0;
        for (int k = 0; k < world; k++)
            longest = std::max(longest, counts[k]);
        std::vector<unsigned char> scratch;
        for (size_t pos = 0; pos < longest; pos += chunk) {
            auto part = [&](int k) { return counts[k] > pos ? std::min(chunk, counts[k] - pos) : 0; };
            size_t mine = part(me);
            scratch.resize(size_t(world) * mine * es);
            Step step(c, what);
            for (int k = 0; k < world; k++) {
                if (k == me)
                    continue;
                step.recv(k, scratch.data() + size_t(k) * mine * es, mine * es);
                step.send(k, src + (offsets[k] + pos) * es, part(k) * es);
            }
            if (mine)
                std::memcpy(scratch.data() + size_t(me) * mine * es,
                            src + (offsets[me] + pos) * es, mine * es);
            ZT_TRY(step.wait());
            if (mine)
                zt_comm_reduce(dst + pos * es, scratch.data(), mine * es, world, mine, t, op);
        }
        return ZT_OK;
    });
}

zt_status gloo_all_gather(zt_comm *cc, void *buf, size_t n, const size_t *offsets,
                          const size_t *counts, zt_dtype t) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "all_gather";
    int world = cc->world, me = cc->rank;
    if (world == 1)
        return ZT_OK;
    return guarded(c, what, [&]() -> zt_status {
        size_t es = zt_dtype_size(t);
        auto *p = static_cast<unsigned char *>(buf);
        Step step(c, what);
        for (int k = 0; k < world; k++) {
            if (k == me)
                continue;
            step.recv(k, p + offsets[k] * es, counts[k] * es);
            step.send(k, p + offsets[me] * es, counts[me] * es);
        }
        return step.wait();
    });
}

zt_status gloo_broadcast(zt_comm *cc, void *buf, size_t n, zt_dtype t, int root) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "broadcast";
    int world = cc->world, me = cc->rank;
    if (world == 1)
        return ZT_OK;
    return guarded(c, what, [&]() -> zt_status {
        size_t bytes = n * zt_dtype_size(t);
        Step step(c, what);
        if (me == root) {
            for (int k = 0; k < world; k++)
                if (k != me)
                    step.send(k, buf, bytes);
        } else {
            step.recv(root, buf, bytes);
        }
        return step.wait();
    });
}

// Every rank sends a byte to every other and waits for theirs.
zt_status gloo_barrier(zt_comm *cc) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "barrier";
    int world = cc->world, me = cc->rank;
    if (world == 1)
        return ZT_OK;
    return guarded(c, what, [&]() -> zt_status {
        unsigned char token = 1;
        std::vector<unsigned char> in(static_cast<size_t>(world));
        Step step(c, what);
        for (int k = 0; k < world; k++) {
            if (k == me)
                continue;
            step.recv(k, &in[size_t(k)], 1);
            step.send(k, &token, 1);
        }
        return step.wait();
    });
}

struct P2pHeader {
    uint64_t magic;
    uint32_t dtype, unused;
    uint64_t n;
};

// A header the receiver checks (dtype and count), then the elements, on the pair's slot.
zt_status gloo_send(zt_comm *cc, const void *buf, size_t n, zt_dtype t, int peer) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "send";
    return guarded(c, what, [&]() -> zt_status {
        P2pHeader h = {P2P_MAGIC, uint32_t(t), 0, uint64_t(n)};
        auto head = c->ctx->createUnboundBuffer(&h, sizeof h);
        head->send(peer, P2P_SLOT);
        Buffer body;
        if (n) {
            body = c->ctx->createUnboundBuffer(const_cast<void *>(buf), n * zt_dtype_size(t));
            body->send(peer, P2P_SLOT);
        }
        auto deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
        for (auto *b : {&head, &body}) {
            if (!*b)
                continue;
            try {
                auto left = std::max<int64_t>(
                    1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
                           .count());
                if (!(*b)->waitSend(nullptr, std::chrono::milliseconds(left)))
                    return zt_gloo_peer_failed(c, what, peer, false, "the wait was aborted");
            } catch (const std::exception &e) {
                return zt_gloo_peer_failed(c, what, peer, Clock::now() >= deadline, e.what());
            }
        }
        return ZT_OK;
    });
}

zt_status gloo_recv(zt_comm *cc, void *buf, size_t n, zt_dtype t, int peer) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "recv";
    return guarded(c, what, [&]() -> zt_status {
        P2pHeader h = {};
        auto deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
        auto wait = [&](Buffer &b) -> zt_status {
            try {
                auto left = std::max<int64_t>(
                    1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
                           .count());
                if (!b->waitRecv(nullptr, std::chrono::milliseconds(left)))
                    return zt_gloo_peer_failed(c, what, peer, false, "the wait was aborted");
            } catch (const std::exception &e) {
                return zt_gloo_peer_failed(c, what, peer, Clock::now() >= deadline, e.what());
            }
            return ZT_OK;
        };
        auto head = c->ctx->createUnboundBuffer(&h, sizeof h);
        head->recv(peer, P2P_SLOT);
        ZT_TRY(wait(head));
        if (h.magic != P2P_MAGIC)
            return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: rank %d sent a corrupt message header",
                                what, peer);
        if (h.dtype != uint32_t(t) || h.n != uint64_t(n))
            return zt_comm_fail(&c->comm, ZT_ERR_INVALID,
                                "%s: rank %d sent %llu elements of %s but rank %d expects %zu of %s",
                                what, peer, (unsigned long long)h.n,
                                zt_dtype_name(zt_dtype(h.dtype)), cc->rank, n, zt_dtype_name(t));
        if (!n)
            return ZT_OK;
        auto body = c->ctx->createUnboundBuffer(buf, n * zt_dtype_size(t));
        body->recv(peer, P2P_SLOT);
        return wait(body);
    });
}

} // namespace

extern "C" const zt_comm_ops zt_comm_gloo_ops = {
    "gloo",
    zt_gloo_create,
    zt_gloo_destroy,
    zt_gloo_abort,
    gloo_all_reduce,
    gloo_reduce_scatter,
    gloo_all_gather,
    gloo_broadcast,
    gloo_barrier,
    gloo_send,
    gloo_recv,
};
