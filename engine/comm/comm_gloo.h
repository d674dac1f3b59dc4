// The Gloo transport's communicator object and what its files share (internal, C++):
// comm_gloo_rdzv.cc makes and ends the connection (rendezvous, hosts, failures),
// comm_gloo_notice.cc carries failure notices between the ranks, comm_gloo.cc runs the
// collectives.
#ifndef ZTRAIN_COMM_GLOO_H
#define ZTRAIN_COMM_GLOO_H

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

extern "C" {
#include "comm_transport.h"
#include "tcp_store.h"
}

// What one peer said when it failed: whom it blames (-1: nobody, its own failure) and why.
struct zt_gloo_notice {
    bool present = false;
    int blame = -1;
    std::string text;
};

struct zt_gloo_comm {
    zt_comm comm; // first: the zt_comm the caller holds
    int64_t timeout_ms;
    uint64_t next_slot = 1;
    std::shared_ptr<gloo::Context> ctx;
    zt_tcp_store_server *server = nullptr; // rank 0 only
    zt_tcp_store *store = nullptr;
    std::string store_addr;         // "MASTER_ADDR:MASTER_PORT", for messages
    std::vector<std::string> hosts; // per rank: "host (address)"
    std::vector<unsigned char> scratch; // the reductions' incoming contributions (comm_gloo.cc)
    // The buffers of the last completed steps, each freed a few steps later (comm_gloo.cc). Two
    // threads retire steps (the training thread and ZeRO's communication thread send and
    // receive on the same communicator through its groups), so the ring is under a lock.
    static constexpr unsigned RETIRED = 4;
    std::mutex retired_mu;
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> retired[RETIRED];
    unsigned retired_at = 0;

    // Failure notices (comm_gloo_notice.cc): this rank's listener and what it has heard.
    int notice_fd = -1;
    int notice_wake[2] = {-1, -1};
    std::thread notice_thread, notice_sender;
    std::mutex notice_mu;
    std::condition_variable notice_cv;
    std::vector<zt_gloo_notice> notices;          // per rank
    std::vector<std::string> notice_endpoints;    // per rank: "address port"
    bool notice_sent = false;
};

// Listens for notices on addr (a free port); *endpoint is "addr port" for the peers.
zt_status zt_gloo_notice_listen(zt_gloo_comm *c, const std::string &addr, std::string *endpoint);
// Tells every peer, from a thread of its own (at most once per communicator), that this rank
// fails blaming rank blame (-1: nobody) for text.
void zt_gloo_notice_send(zt_gloo_comm *c, int blame, const std::string &text);
// Waits up to grace_s for peer's notice and follows the chain of blame from it; returns the text
// of the last notice on the chain, or "" when peer said nothing (it is dead or cut off).
std::string zt_gloo_notice_cause(zt_gloo_comm *c, int peer, double grace_s);
// Waits for the notice being sent, stops the listener.
void zt_gloo_notice_stop(zt_gloo_comm *c);

// The failure of a wait on peer: names the peer and its host, or, when another rank failed
// first and said why in the store, reports that rank's reason instead (its failure is the cause
// and this rank's the consequence). timed_out picks the wording; detail is Gloo's message.
zt_status zt_gloo_peer_failed(zt_gloo_comm *c, const char *what, int peer, bool timed_out,
                              const char *detail);

zt_status zt_gloo_create(zt_comm **out, const zt_dist_info *d, double timeout_s);
void zt_gloo_destroy(zt_comm *c);
void zt_gloo_abort(zt_comm *c);

#endif
