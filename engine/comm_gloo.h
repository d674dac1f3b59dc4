// The Gloo transport's communicator object and what its two files share (internal, C++):
// comm_gloo_rdzv.cc makes and ends the connection (rendezvous, hosts, failures), comm_gloo.cc
// runs the collectives over it.
#ifndef ZTRAIN_COMM_GLOO_H
#define ZTRAIN_COMM_GLOO_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/context.h>

extern "C" {
#include "comm_transport.h"
#include "tcp_store.h"
}

struct zt_gloo_comm {
    zt_comm comm; // first: the zt_comm the caller holds
    int64_t timeout_ms;
    uint64_t next_slot = 1;
    std::shared_ptr<gloo::Context> ctx;
    zt_tcp_store_server *server = nullptr; // rank 0 only
    zt_tcp_store *store = nullptr;
    std::string store_addr;         // "MASTER_ADDR:MASTER_PORT", for messages
    std::vector<std::string> hosts; // per rank: "host (address)"
};

// The failure of a wait on peer: names the peer and its host, or, when another rank failed
// first and said why in the store, reports that rank's reason instead (its failure is the cause
// and this rank's the consequence). timed_out picks the wording; detail is Gloo's message.
zt_status zt_gloo_peer_failed(zt_gloo_comm *c, const char *what, int peer, bool timed_out,
                              const char *detail);

zt_status zt_gloo_create(zt_comm **out, const zt_dist_info *d, double timeout_s);
void zt_gloo_destroy(zt_comm *c);
void zt_gloo_abort(zt_comm *c);

#endif
