// The Gloo transport's connection: the rendezvous through the TCP store that rank 0 serves at
// MASTER_ADDR:MASTER_PORT, the checks that every rank joined the same job, Gloo's full mesh, and
// the reporting of failures by rank and host (engine/comm/comm_gloo.h).
//
// The store holds, besides Gloo's own addresses (under "gloo/"): "world" (rank 0's world size,
// which every rank compares with its own), "join/<rank>" (a counter that catches two processes
// with one rank), "joined" (how many ranks have arrived), "host/<rank>" ("name (address)", for
// messages) and "abort" (the first failure of any rank, which the others report as the cause of
// theirs).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "comm_gloo.h"

namespace {

// Last messages on the way out (the abort notice, the look for another rank's) wait at most this
// long for the store, whose host may be the one that went away.
constexpr double ABORT_STORE_TIMEOUT_S = 2.0;
// How long a rank that lost a peer waits for that peer's notice saying whom it waited for.
constexpr double NOTICE_GRACE_S = 2.0;

using Clock = std::chrono::steady_clock;

zt_gloo_comm *gl(zt_comm *c) { return reinterpret_cast<zt_gloo_comm *>(c); }

// Gloo's rendezvous store interface over the TCP store; Gloo's keys live under "gloo/". Gloo
// expects failures as exceptions; zt_last_error() keeps the store's message for the caller.
class StoreAdapter : public gloo::rendezvous::Store {
  public:
    StoreAdapter(zt_tcp_store *s, double timeout_s) : s_(s), timeout_s_(timeout_s) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        if (zt_tcp_store_set(s_, ("gloo/" + key).c_str(), data.data(), data.size()) != ZT_OK)
            throw std::runtime_error(zt_last_error());
    }
    std::vector<char> get(const std::string &key) override {
        void *v;
        size_t n;
        if (zt_tcp_store_get(s_, ("gloo/" + key).c_str(), &v, &n, timeout_s_) != ZT_OK)
            throw std::runtime_error(zt_last_error());
        std::vector<char> out(static_cast<char *>(v), static_cast<char *>(v) + n);
        free(v);
        return out;
    }
    void wait(const std::vector<std::string> &keys) override { wait(keys, kDefaultTimeout); }
    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
        std::vector<std::string> full;
        std::vector<const char *> ptrs;
        for (const auto &k : keys)
            full.push_back("gloo/" + k);
        for (const auto &k : full)
            ptrs.push_back(k.c_str());
        if (zt_tcp_store_wait(s_, ptrs.data(), int(ptrs.size()), timeout_s_, nullptr) != ZT_OK)
            throw std::runtime_error(zt_last_error());
    }

  private:
    zt_tcp_store *s_;
    double timeout_s_;
};

// The first address of interface `name`, or "" when it has none (or does not exist).
std::string interface_address(const struct ifaddrs *list, const std::string &name) {
    for (auto *a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || name != a->ifa_name ||
            (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6))
            continue;
        char host[NI_MAXHOST];
        socklen_t len = a->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in)
                                                            : sizeof(sockaddr_in6);
        if (getnameinfo(a->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0)
            return host;
    }
    return "";
}

// GLOO_SOCKET_IFNAME as PyTorch reads it: a comma-separated list ("eth0,eth1"), of which
// PyTorch makes one Gloo device per name and fails on a name without an address. Every name is
// checked the same way here, and the ranks use the first: one device carries all of a job's
// connections (docs/parallelism.md).
zt_status ifname_address(const char *ifnames, std::string *out) {
    struct ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0)
        return zt_error(ZT_ERR_IO, "gloo: cannot list network interfaces: %s", strerror(errno));
    std::string all(ifnames), bad;
    size_t from = 0;
    for (;;) {
        size_t comma = all.find(',', from);
        std::string name = all.substr(from, comma == std::string::npos ? comma : comma - from);
        std::string addr = interface_address(list, name);
        if (addr.empty()) {
            bad = name;
            break;
        }
        if (out->empty())
            *out = addr;
        if (comma == std::string::npos)
            break;
        from = comma + 1;
    }
    freeifaddrs(list);
    if (!bad.empty() || out->empty()) {
        out->clear();
        return zt_error(ZT_ERR_INVALID,
                        "gloo: GLOO_SOCKET_IFNAME='%s': '%s' names no interface with an address "
                        "on this host",
                        ifnames, bad.c_str());
    }
    return ZT_OK;
}

// "MASTER_ADDR", or with where its value came from when no variable of that name gave it
// ("MASTER_ADDR (the first node of SLURM_STEP_NODELIST)"), for messages.
std::string master_addr_name(const zt_dist_info *d) {
    if (!d->addr_origin[0] || strcmp(d->addr_origin, "MASTER_ADDR") == 0)
        return "MASTER_ADDR";
    return std::string("MASTER_ADDR (") + d->addr_origin + ")";
}

// The address this rank's Gloo device listens on: the one of GLOO_SOCKET_IFNAME when set (as
// for PyTorch), else the one this host would use to reach MASTER_ADDR, which is on a network
// every rank can reach (rank 0 is there). A MASTER_ADDR that does not resolve yet is asked
// again until the timeout (zt_tcp_store_resolve).
zt_status local_address(const zt_dist_info *d, double timeout_s, std::string *out) {
    const char *ifname = getenv("GLOO_SOCKET_IFNAME");
    if (ifname && *ifname)
        return ifname_address(ifname, out);
    struct addrinfo *res = nullptr;
    std::string what = "gloo: " + master_addr_name(d);
    ZT_TRY(zt_tcp_store_resolve(what.c_str(), d->master_addr, d->master_port, SOCK_DGRAM,
                                timeout_s, &res));
    // Connecting a datagram socket sends nothing; it only asks the kernel for the route.
    int err = ENETUNREACH;
    for (auto *a = res; a && out->empty(); a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        struct sockaddr_storage self;
        socklen_t len = sizeof self;
        char host[NI_MAXHOST];
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr *>(&self), &len) == 0 &&
            getnameinfo(reinterpret_cast<sockaddr *>(&self), len, host, sizeof host, nullptr, 0,
                        NI_NUMERICHOST) == 0)
            *out = host;
        else
            err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (out->empty())
        return zt_error(ZT_ERR_IO, "gloo: no route from this host to %s '%s': %s",
                        master_addr_name(d).c_str(), d->master_addr, strerror(err));
    return ZT_OK;
}

std::string text_of(void *v, size_t n) {
    std::string s(static_cast<char *>(v), n);
    free(v);
    return s;
}

// The first failure another rank published, or "" (none, or the store is out of reach).
std::string published_failure(zt_gloo_comm *c) {
    if (!c->store)
        return "";
    zt_tcp_store_set_timeout(c->store, std::min(ABORT_STORE_TIMEOUT_S, c->comm.timeout_s));
    void *v;
    size_t n;
    if (zt_tcp_store_get(c->store, "abort", &v, &n, 0) != ZT_OK)
        return "";
    return text_of(v, n);
}

std::string host_of(const zt_gloo_comm *c, int r) {
    return size_t(r) < c->hosts.size() && !c->hosts[size_t(r)].empty() ? c->hosts[size_t(r)]
                                                                        : "an unknown host";
}

// "1, 3 and 2 more" for the ranks whose host/<rank> key is absent.
std::string missing_ranks(zt_gloo_comm *c) {
    std::string out;
    int named = 0, more = 0;
    for (int r = 0; r < c->comm.world; r++) {
        void *v;
        size_t n;
        std::string key = "host/" + std::to_string(r);
        if (zt_tcp_store_get(c->store, key.c_str(), &v, &n, 0) == ZT_OK) {
            free(v);
            continue;
        }
        if (named++ < 16)
            out += (out.empty() ? "" : ", ") + std::to_string(r);
        else
            more++;
    }
    if (more)
        out += " and " + std::to_string(more) + " more";
    return out;
}

// Publishes this rank, checks it against rank 0's world and the other ranks, and waits until
// every rank has published, or a rank has reported a failure, or the timeout passes.
zt_status join(zt_gloo_comm *c, const zt_dist_info *d, double timeout_s) {
    int me = d->rank, world = d->world_size;
    std::string wtext = std::to_string(world);
    if (me == 0)
        ZT_TRY(zt_tcp_store_set(c->store, "world", wtext.data(), wtext.size()));
    void *v;
    size_t n;
    // Rank 0 writes "world" as soon as its store listens, so a server that accepts this rank but
    // never shows it is most likely another program holding the port (rank 0 then failed with
    // "already in use"), or a rank 0 that failed at once.
    zt_status s = zt_tcp_store_get(c->store, "world", &v, &n, timeout_s);
    if (s == ZT_ERR_TIMEOUT)
        return zt_error(ZT_ERR_TIMEOUT,
                        "gloo rendezvous timed out after %g s: a server at %s (MASTER_ADDR:"
                        "MASTER_PORT) accepted this rank but rank 0 never joined it: another "
                        "program may hold that port on rank 0's host, or rank 0 failed (see its "
                        "log)",
                        timeout_s, c->store_addr.c_str());
    ZT_TRY(s);
    std::string theirs = text_of(v, n);
    if (theirs != wtext)
        return zt_comm_fail(&c->comm, ZT_ERR_INVALID,
                            "gloo rendezvous: rank %d has world size %d (WORLD_SIZE) but rank 0 "
                            "at %s has %s: the ranks were started for different jobs",
                            me, world, c->store_addr.c_str(), theirs.c_str());
    int64_t count;
    std::string key = "join/" + std::to_string(me);
    ZT_TRY(zt_tcp_store_add(c->store, key.c_str(), 1, &count));
    if (count != 1)
        return zt_comm_fail(&c->comm, ZT_ERR_INVALID,
                            "gloo rendezvous: rank %d joined %s twice: two processes have "
                            "RANK=%d",
                            me, c->store_addr.c_str(), me);
    key = "notice/" + std::to_string(me);
    const std::string &endpoint = c->notice_endpoints[size_t(me)];
    ZT_TRY(zt_tcp_store_set(c->store, key.c_str(), endpoint.data(), endpoint.size()));
    key = "host/" + std::to_string(me);
    const std::string &mine = c->hosts[size_t(me)];
    ZT_TRY(zt_tcp_store_set(c->store, key.c_str(), mine.data(), mine.size()));
    ZT_TRY(zt_tcp_store_add(c->store, "joined", 1, &count));

    auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    auto pause = std::chrono::milliseconds(2);
    while (count < world) {
        std::string failure = published_failure(c);
        zt_tcp_store_set_timeout(c->store, timeout_s);
        if (!failure.empty())
            return zt_comm_fail(&c->comm, ZT_ERR_IO, "gloo rendezvous stopped: %s",
                                failure.c_str());
        // Every rank times out (or stops) on its own, so neither is published as a failure for
        // the others to report.
        if (zt_comm_stop_requested())
            return zt_error(ZT_ERR_STOPPED,
                            "gloo rendezvous at %s: a stop was asked for while waiting for "
                            "rank(s) %s of %d to join",
                            c->store_addr.c_str(), missing_ranks(c).c_str(), world);
        if (Clock::now() >= deadline)
            return zt_error(ZT_ERR_TIMEOUT,
                            "gloo rendezvous timed out after %g s at %s: rank(s) %s of %d never "
                            "joined",
                            timeout_s, c->store_addr.c_str(), missing_ranks(c).c_str(), world);
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
        ZT_TRY(zt_tcp_store_add(c->store, "joined", 0, &count));
    }
    for (int r = 0; r < world; r++) {
        key = "host/" + std::to_string(r);
        ZT_TRY(zt_tcp_store_get(c->store, key.c_str(), &v, &n, timeout_s));
        c->hosts[size_t(r)] = text_of(v, n);
        key = "notice/" + std::to_string(r);
        ZT_TRY(zt_tcp_store_get(c->store, key.c_str(), &v, &n, timeout_s));
        c->notice_endpoints[size_t(r)] = text_of(v, n);
    }
    return ZT_OK;
}

void release(zt_gloo_comm *c) {
    for (auto &r : c->retired) // before the context their transport belongs to
        r.clear();
    if (c->ctx) {
        try {
            c->ctx->closeConnections();
        } catch (const std::exception &) {
            // The connections are going away either way; their owners free them below.
        }
        c->ctx.reset();
    }
    zt_gloo_notice_stop(c);
    zt_tcp_store_close(c->store);
    zt_tcp_store_server_stop(c->server);
    delete c;
}

// The ranks on the host whose address Gloo's message names ("Connect timeout
// [10.0.0.1]:25507"), as "rank(s) 0, 1 on host n1 (10.0.0.1)", or "" when it names none.
std::string ranks_at_address(const zt_gloo_comm *c, const std::string &said) {
    std::string ranks, host;
    for (size_t r = 0; r < c->hosts.size(); r++) {
        const std::string &h = c->hosts[r];
        size_t open = h.rfind('(');
        if (open == std::string::npos || h.size() < open + 3)
            continue;
        std::string addr = h.substr(open + 1, h.size() - open - 2);
        if (said.find("[" + addr + "]") == std::string::npos)
            continue;
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        host = h;
    }
    return ranks.empty() ? "" : "rank(s) " + ranks + " on " + host;
}

zt_status connect_mesh(zt_gloo_comm *c, const zt_dist_info *d, const std::string &addr,
                       double timeout_s) {
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = addr;
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(d->rank, d->world_size);
        // Gloo waits five times its context's timeout for a pair to connect; a fifth of the
        // timeout here keeps that wait within ZTRAIN_COMM_TIMEOUT_S. The collectives give every
        // wait its own timeout, so the context's is set back once the mesh stands.
        ctx->setTimeout(std::chrono::milliseconds(std::max<int64_t>(1, c->timeout_ms / 5)));
        StoreAdapter store(c->store, timeout_s);
        ctx->connectFullMesh(store, dev);
        ctx->setTimeout(std::chrono::milliseconds(c->timeout_ms));
        c->ctx = ctx;
    } catch (const std::exception &e) {
        std::string said = e.what(), peer = ranks_at_address(c, said);
        bool timed_out = said.find("timeout") != std::string::npos;
        return zt_comm_fail(
            &c->comm, timed_out ? ZT_ERR_TIMEOUT : ZT_ERR_IO,
            "gloo rendezvous: connecting rank %d (%s) to %s failed%s: %s%s", d->rank,
            c->hosts[size_t(d->rank)].c_str(), peer.empty() ? "its peers" : peer.c_str(),
            timed_out ? " within the timeout" : "", said.c_str(),
            timed_out ? " (Gloo connects each pair of ranks on a port of its own: are the ports "
                        "between the hosts open, not only MASTER_PORT?)"
                      : "");
    }
    return ZT_OK;
}

} // namespace

zt_status zt_gloo_peer_failed(zt_gloo_comm *c, const char *what, int peer, bool timed_out,
                              const char *detail) {
    std::string host = host_of(c, peer);
    char own[ZT_COMM_REASON_LEN];
    if (timed_out)
        snprintf(own, sizeof own,
                 "%s: timed out after %g s waiting for rank %d on %s (is its host reachable? do "
                 "all ranks call the same collectives?)",
                 what, c->comm.timeout_s, peer, host.c_str());
    else
        snprintf(own, sizeof own, "%s: lost rank %d on %s: it has exited or its connection broke (%s)",
                 what, peer, host.c_str(), detail);
    // The peers hear this rank's view at once; then the peer it blames may explain itself (it
    // was waiting for another), and that explanation, not this rank's, names the culprit.
    std::string me = "rank " + std::to_string(c->comm.rank) + " on " + host_of(c, c->comm.rank);
    zt_gloo_notice_send(c, peer, me + " failed: " + own);
    std::string cause = zt_gloo_notice_cause(c, peer, std::min(NOTICE_GRACE_S, c->comm.timeout_s));
    if (cause.empty()) {
        cause = published_failure(c);
        if (cause.compare(0, me.size(), me) == 0)
            cause.clear();
    }
    if (!cause.empty())
        return zt_comm_fail(&c->comm, ZT_ERR_IO, "%s: stopped because %s", what, cause.c_str());
    return zt_comm_fail(&c->comm, timed_out ? ZT_ERR_TIMEOUT : ZT_ERR_IO, "%s", own);
}

// Tells the others why this rank stops (only the first failure of the job is kept), then closes
// the connections, so that peers waiting on this rank stop at once and find the reason.
void zt_gloo_abort(zt_comm *cc) {
    zt_gloo_comm *c = gl(cc);
    std::string me = "rank " + std::to_string(cc->rank) + " on " + host_of(c, cc->rank);
    zt_gloo_notice_send(c, -1, me + " failed: " + cc->failure);
    if (c->store) {
        zt_tcp_store_set_timeout(c->store, std::min(ABORT_STORE_TIMEOUT_S, cc->timeout_s));
        int64_t first = 0;
        if (zt_tcp_store_add(c->store, "abort_count", 1, &first) == ZT_OK && first == 1) {
            std::string msg = me + " failed: " + cc->failure;
            zt_tcp_store_set(c->store, "abort", msg.data(), msg.size());
        }
    }
    if (c->ctx) {
        try {
            c->ctx->closeConnections();
        } catch (const std::exception &) {
            // Closing is best effort: the process ends soon after and the kernel closes the rest.
        }
    }
}

zt_status zt_gloo_create(zt_comm **out, const zt_dist_info *d, double timeout_s) {
    /* Gloo writes to its peers' sockets without MSG_NOSIGNAL: a peer that dies would kill this
     * rank with SIGPIPE instead of failing the call that names it. A handler the program set
     * itself is left alone. */
    struct sigaction sa;
    if (sigaction(SIGPIPE, nullptr, &sa) == 0 && sa.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
    zt_gloo_comm *c = new (std::nothrow) zt_gloo_comm;
    if (!c)
        return zt_error(ZT_ERR_NOMEM, "gloo communicator: out of memory");
    zt_comm_init_header(&c->comm, &zt_comm_gloo_ops, d, timeout_s);
    c->timeout_ms = std::max<int64_t>(1, int64_t(timeout_s * 1e3));
    char store_at[sizeof d->master_addr + 16];
    zt_dist_endpoint(d->master_addr, d->master_port, store_at, sizeof store_at);
    c->store_addr = store_at;
    c->hosts.assign(size_t(d->world_size), "");

    std::string addr;
    auto started = Clock::now();
    zt_status s = local_address(d, timeout_s, &addr);
    char name[256] = "";
    if (gethostname(name, sizeof name - 1) != 0)
        snprintf(name, sizeof name, "unknown");
    c->hosts[size_t(d->rank)] = std::string("host ") + name + " (" + addr + ")";
    std::string endpoint;
    if (s == ZT_OK)
        s = zt_gloo_notice_listen(c, addr, &endpoint);
    if (s == ZT_OK)
        c->notice_endpoints[size_t(d->rank)] = endpoint;
    if (s == ZT_OK && d->rank == 0)
        s = zt_tcp_store_serve_job(&c->server, d);
    // Waiting for MASTER_ADDR's name to resolve counts against the same timeout.
    double left = timeout_s - std::chrono::duration<double>(Clock::now() - started).count();
    if (s == ZT_OK)
        s = zt_tcp_store_connect(&c->store, d->master_addr, d->master_port,
                                 std::max(left, 0.001), zt_tcp_store_secret());
    if (s == ZT_OK)
        zt_tcp_store_set_timeout(c->store, timeout_s);
    if (s == ZT_OK)
        s = join(c, d, timeout_s);
    if (s == ZT_OK)
        s = connect_mesh(c, d, addr, timeout_s);
    if (s != ZT_OK) {
        // Rank 0's store outlives its failure a moment, so that ranks whose deadlines come a
        // little later read their own timeout or this rank's reason, not a vanished store. A
        // stop needs no such moment: the others are being stopped too.
        if (c->server && s != ZT_ERR_STOPPED)
            std::this_thread::sleep_for(
                std::chrono::duration<double>(std::min(ABORT_STORE_TIMEOUT_S, timeout_s)));
        // The message is zt_last_error()'s; releasing touches no error state.
        release(c);
        return s;
    }
    *out = &c->comm;
    return ZT_OK;
}

void zt_gloo_destroy(zt_comm *c) { release(gl(c)); }
