// The Gloo transport ("gloo"): CPU ranks on any number of hosts, connected by Gloo's TCP
// transport in a full mesh, after a rendezvous through the TCP key-value store that rank 0 serves
// at MASTER_ADDR:MASTER_PORT (engine/comm/tcp_store.h). The rendezvous lives in comm_gloo_rdzv.cc,
// the failure notices between ranks in comm_gloo_notice.cc.
//
// The collectives are built here on Gloo's point-to-point buffers rather than taken from its
// algorithms, for two reasons. Results must be bit-identical to the shm transport's, which folds
// every rank's contribution in rank order with zt_comm_reduce (16-bit values in fp32): here each
// rank owns a 1/N share of the buffer, receives every rank's contribution to its share, reduces
// them in rank order with the same function, and sends the result to all — the same bytes on the
// wire as a ring all-reduce, 2(N-1)/N of the buffer per rank. And a wait must know which peer it
// waits for, so that a dead rank, a lost link or a timeout is reported by rank and host.
//
// Unlike shm, the ranks do not compare what they were asked to do: ranks that call different
// collectives (a bug in the caller) post messages in different slots (Step) and time out, rather
// than fail at once with a message saying which collectives disagreed.
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <vector>

#include <gloo/transport/unbound_buffer.h>

#include "comm_gloo.h"

namespace {

using Clock = std::chrono::steady_clock;
using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

// A reduction moves the buffer in chunks of this many bytes, which bounds the scratch space that
// receives every rank's contribution to this rank's share (two chunks' worth: one being reduced,
// the next arriving).
constexpr size_t CHUNK_BYTES = size_t(4) << 20;

// Slots tell Gloo's messages apart: collectives number theirs from a counter every rank advances
// alike; point-to-point messages between a pair use one slot, in which Gloo keeps them in order.
constexpr uint64_t P2P_SLOT = uint64_t(1) << 62;
constexpr uint64_t P2P_MAGIC = 0x7a7467703270ULL; // "ztgp2p"

zt_gloo_comm *gl(zt_comm *c) { return reinterpret_cast<zt_gloo_comm *>(c); }

// A hash of what a collective was asked to do: its kind, count, dtype, op or root, and its pieces.
uint64_t desc_of(int kind, size_t n, zt_dtype t, int arg, int world, const size_t *offsets,
                 const size_t *counts) {
    uint64_t h = 1469598103934665603ULL;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
    mix(uint64_t(kind));
    mix(uint64_t(n));
    mix(uint64_t(t));
    mix(uint64_t(arg));
    for (int r = 0; offsets && r < world; r++) {
        mix(offsets[r]);
        mix(counts[r]);
    }
    return h;
}

// Gloo's buffer destructor waits, yielding the CPU in a loop, until Gloo's event thread has let go
// of the buffer, which it holds from the moment it starts a transfer until it returns from the
// completion it signals. Freed at once, a buffer whose completion just woke this thread makes
// the destructor wait for that thread to be scheduled again, and on a busy machine each such
// wait is a scheduler tick (4 ms here, more than the whole all-reduce of 64 KB takes). So the
// buffers of a completed step are kept until the next step completes, when the event thread has
// long finished with them (it has since handled the next step's messages on the same pairs). A
// step that failed frees its buffers at once, as Gloo expects: operations may still be pending on
// them, and the caller's memory may go away after the failure.
//
// Two threads may retire steps on one communicator at once (its groups' sends and receives from
// the training thread and from ZeRO's communication thread): the buffers go into a ring under a
// lock, and what they push out is freed after the lock is let go (its destructor may wait).
void retire_buffers(zt_gloo_comm *c, std::vector<Buffer> bufs) {
    std::vector<Buffer> old;
    {
        std::lock_guard<std::mutex> g(c->retired_mu);
        std::vector<Buffer> &slot = c->retired[c->retired_at++ % zt_gloo_comm::RETIRED];
        old = std::move(slot);
        slot = std::move(bufs);
    }
}

// The sends and receives of one step of a collective, one buffer per peer, so that a failure is
// pinned on the peer whose buffer failed.
class Step {
  public:
    // desc is the collective's description (desc_of): it goes into the slot, so that ranks
    // calling different collectives post messages that never match, and time out, instead of
    // a message larger than the buffer awaiting it (which Gloo cannot recover from).
    Step(zt_gloo_comm *c, const char *what, uint64_t desc)
        : c_(c), what_(what),
          slot_(((desc << 24) ^ (c->next_slot++ & 0xffffff)) & (P2P_SLOT - 1)) {}
    Step(const Step &) = delete;
    Step &operator=(const Step &) = delete;

    // A completed step's buffers outlive it until the next step completes (retire_buffers).
    ~Step() {
        if (!done_)
            return;
        std::vector<Buffer> bufs;
        for (auto *list : {&recvs_, &sends_})
            for (auto &op : *list)
                bufs.push_back(std::move(op.buf));
        retire_buffers(c_, std::move(bufs));
    }

    // Posting to a peer whose connection already broke throws: the first such peer is kept and
    // reported by wait(), like a failure seen while waiting.
    void send(int peer, const void *p, size_t bytes) {
        if (!bytes || failed_peer_ >= 0)
            return;
        try {
            sends_.push_back({peer, c_->ctx->createUnboundBuffer(const_cast<void *>(p), bytes)});
            sends_.back().buf->send(peer, slot_);
        } catch (const std::exception &e) {
            failed_peer_ = peer;
            failure_ = e.what();
        }
    }
    void recv(int peer, void *p, size_t bytes) {
        if (!bytes || failed_peer_ >= 0)
            return;
        try {
            recvs_.push_back({peer, c_->ctx->createUnboundBuffer(p, bytes)});
            recvs_.back().buf->recv(peer, slot_);
        } catch (const std::exception &e) {
            failed_peer_ = peer;
            failure_ = e.what();
        }
    }
    // Waits for every receive, then every send, each within the timeout from the start of the
    // wait. ZT_OK, or the communicator's failure naming the peer.
    zt_status wait() {
        if (failed_peer_ >= 0)
            return zt_gloo_peer_failed(c_, what_, failed_peer_, false, failure_.c_str());
        auto deadline = Clock::now() + std::chrono::milliseconds(c_->timeout_ms);
        for (auto *list : {&recvs_, &sends_}) {
            for (auto &op : *list) {
                zt_status s = wait_one(op, list == &recvs_, deadline);
                if (s != ZT_OK)
                    return s;
            }
        }
        done_ = true;
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
    int failed_peer_ = -1;
    std::string failure_;
    bool done_ = false;
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

// Grows the communicator's scratch space (kept between calls, so the step loop does not allocate)
// to hold two halves of half_bytes each, and returns the start of half i % 2.
unsigned char *scratch_half(zt_gloo_comm *c, size_t half_bytes, size_t i) {
    if (c->scratch.size() < 2 * half_bytes)
        c->scratch.resize(2 * half_bytes);
    return c->scratch.data() + (i % 2) * half_bytes;
}

// Keeps at most `keep` steps in flight, waiting for the oldest beyond that.
zt_status settle(std::deque<std::unique_ptr<Step>> &steps, size_t keep) {
    while (steps.size() > keep) {
        ZT_TRY(steps.front()->wait());
        steps.pop_front();
    }
    return ZT_OK;
}

// Small buffers in one step: every rank sends its whole buffer to every other and folds all the
// contributions itself, in rank order, so every rank computes the same bits the share-wise
// reduction below would. A step costs a rendezvous per peer (Gloo's sender waits for the
// receiver's notice that its buffer is posted) and a wake-up of Gloo's event thread and of the
// waiting thread on each side; below this size those, not the bytes, are the time, and the
// two-step reduction pays them twice. Up to this many bytes times the world size.
constexpr size_t ONE_STEP_BYTES = size_t(1) << 20;

// Whether an all-reduce of `bytes` goes in one step. Small ones always. On two ranks larger ones
// too, up to the scratch space the chunked reduction uses anyway (two chunks): there one step
// sends each rank's buffer once, exactly the bytes of the two steps (two halves), and waits once
// instead of twice (a 1 MiB all-reduce went from 4-11 ms to 1.1-1.2 ms, the median of 100, on
// the loaded 2-core development machine; bench/README.md). On more ranks one step would send
// (N-1)/2 times the bytes of two.
bool all_reduce_in_one_step(size_t bytes, int world) {
    size_t scratch = bytes * size_t(world);
    return scratch <= ONE_STEP_BYTES || (world == 2 && scratch <= 2 * CHUNK_BYTES);
}

zt_status all_reduce_one_step(zt_gloo_comm *c, unsigned char *p, size_t n, zt_dtype t,
                              zt_reduce_op op, uint64_t desc) {
    int world = c->comm.world, me = c->comm.rank;
    size_t bytes = n * zt_dtype_size(t);
    unsigned char *s = scratch_half(c, size_t(world) * bytes, 0);
    Step step(c, "all_reduce", desc);
    for (int k = 0; k < world; k++) {
        if (k == me)
            continue;
        step.recv(k, s + size_t(k) * bytes, bytes);
        step.send(k, p, bytes);
    }
    std::memcpy(s + size_t(me) * bytes, p, bytes);
    ZT_TRY(step.wait());
    zt_comm_reduce(p, s, bytes, world, n, t, op);
    return ZT_OK;
}

// In chunks, pipelined: while this rank reduces its share of chunk i, chunk i+1's contributions
// are already on the way (into the other half of the scratch space) and chunk i-1's results are
// still going out.
zt_status gloo_all_reduce(zt_comm *cc, void *buf, size_t n, zt_dtype t, zt_reduce_op op) {
    zt_gloo_comm *c = gl(cc);
    const char *what = "all_reduce";
    int world = cc->world, me = cc->rank;
    if (world == 1 || n == 0)
        return ZT_OK;
    return guarded(c, what, [&]() -> zt_status {
        size_t es = zt_dtype_size(t);
        if (all_reduce_in_one_step(n * es, world))
            return all_reduce_one_step(c, static_cast<unsigned char *>(buf), n, t, op,
                                       desc_of(1, n, t, op, world, nullptr, nullptr));
        size_t chunk = std::max<size_t>(CHUNK_BYTES / es, size_t(world));
        size_t nchunks = (n + chunk - 1) / chunk;
        size_t half = size_t(world) * ((chunk + size_t(world) - 1) / size_t(world)) * es;
        uint64_t desc = desc_of(1, n, t, op, world, nullptr, nullptr);
        auto *p = static_cast<unsigned char *>(buf);
        auto base = [&](size_t i) { return p + i * chunk * es; };
        auto size = [&](size_t i) { return std::min(chunk, n - i * chunk); };
        auto gather = [&](size_t i) {
            size_t m = size(i), lo = share_lo(m, me, world);
            size_t cnt = share_lo(m, me + 1, world) - lo;
            unsigned char *s = scratch_half(c, half, i);
            auto step = std::make_unique<Step>(c, what, desc);
            for (int k = 0; k < world; k++) {
                if (k == me)
                    continue;
                size_t klo = share_lo(m, k, world), khi = share_lo(m, k + 1, world);
                step->recv(k, s + size_t(k) * cnt * es, cnt * es);
                step->send(k, base(i) + klo * es, (khi - klo) * es);
            }
            if (cnt)
                std::memcpy(s + size_t(me) * cnt * es, base(i) + lo * es, cnt * es);
            return step;
        };
        std::deque<std::unique_ptr<Step>> spreads;
        auto next = gather(0);
        for (size_t i = 0; i < nchunks; i++) {
            ZT_TRY(next->wait());
            if (i + 1 < nchunks)
                next = gather(i + 1);
            size_t m = size(i), lo = share_lo(m, me, world);
            size_t cnt = share_lo(m, me + 1, world) - lo;
            if (cnt)
                zt_comm_reduce(base(i) + lo * es, scratch_half(c, half, i), cnt * es, world, cnt,
                               t, op);
            auto spread = std::make_unique<Step>(c, what, desc);
            for (int k = 0; k < world; k++) {
                if (k == me)
                    continue;
                size_t klo = share_lo(m, k, world), khi = share_lo(m, k + 1, world);
                spread->recv(k, base(i) + klo * es, (khi - klo) * es);
                spread->send(k, base(i) + lo * es, cnt * es);
            }
            spreads.push_back(std::move(spread));
            ZT_TRY(settle(spreads, 2));
        }
        return settle(spreads, 0);
    });
}

// Piece by piece in rounds: round i moves, for every rank k, elements [i*chunk, (i+1)*chunk) of
// piece k, so the scratch space stays one chunk per rank whatever the pieces' sizes; round i+1
// is on the way while round i is reduced.
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
        size_t rounds = (longest + chunk - 1) / chunk, half = size_t(world) * chunk * es;
        uint64_t desc = desc_of(2, n, t, op, world, offsets, counts);
        auto part = [&](int k, size_t i) {
            size_t pos = i * chunk;
            return counts[k] > pos ? std::min(chunk, counts[k] - pos) : size_t(0);
        };
        auto post = [&](size_t i) {
            size_t mine = part(me, i), pos = i * chunk;
            unsigned char *s = scratch_half(c, half, i);
            auto step = std::make_unique<Step>(c, what, desc);
            for (int k = 0; k < world; k++) {
                if (k == me)
                    continue;
                step->recv(k, s + size_t(k) * mine * es, mine * es);
                step->send(k, src + (offsets[k] + pos) * es, part(k, i) * es);
            }
            if (mine)
                std::memcpy(s + size_t(me) * mine * es, src + (offsets[me] + pos) * es,
                            mine * es);
            return step;
        };
        if (rounds == 0)
            return ZT_OK;
        auto next = post(0);
        for (size_t i = 0; i < rounds; i++) {
            ZT_TRY(next->wait());
            if (i + 1 < rounds)
                next = post(i + 1);
            size_t mine = part(me, i);
            if (mine)
                zt_comm_reduce(dst + i * chunk * es, scratch_half(c, half, i), mine * es, world,
                               mine, t, op);
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
        Step step(c, what, desc_of(3, n, t, 0, world, offsets, counts));
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
        Step step(c, what, desc_of(4, n, t, root, world, nullptr, nullptr));
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
        Step step(c, what, desc_of(5, 0, ZT_F32, 0, world, nullptr, nullptr));
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
        std::vector<Buffer> done;
        done.push_back(std::move(head));
        done.push_back(std::move(body));
        retire_buffers(c, std::move(done));
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
        std::vector<Buffer> done;
        done.push_back(std::move(head));
        if (n) {
            auto body = c->ctx->createUnboundBuffer(buf, n * zt_dtype_size(t));
            body->recv(peer, P2P_SLOT);
            ZT_TRY(wait(body));
            done.push_back(std::move(body));
        }
        retire_buffers(c, std::move(done));
        return ZT_OK;
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
    /* Host buffers only: comm_device.c stages device buffers through host memory. */
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr, /* groups: comm_group.c's, of point-to-point messages */
};
