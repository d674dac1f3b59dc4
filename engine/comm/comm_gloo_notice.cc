// Failure notices between the Gloo transport's ranks (engine/comm/comm_gloo.h): every rank listens on
// a small TCP port of its own, and a rank that fails tells every peer it can reach, in one line,
// which rank it blames and why.
//
// This is what lets every survivor name the culprit. When a link goes down, the ranks on each
// side time out, but not all of them wait on the other side: a rank may wait on a peer of its
// own host that is itself stuck waiting across the link, and Gloo closes every connection of a
// rank whose wait times out, so the first thing a neighbour sees is that peer "going away". With
// notices, the neighbour learns from that peer whom it waited for and reports the chain's end.
// The TCP store cannot carry this: it lives on rank 0's host, which may be the one cut off.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm_gloo.h"

namespace {

constexpr size_t MAX_NOTICE = 1024;
// How long a notice may take to arrive (connect and write) before the sender gives up on a peer,
// and how long the listener waits for a connection's bytes.
constexpr int DELIVERY_MS = 1000;

void serve_notices(zt_gloo_comm *c) {
    for (;;) {
        struct pollfd p[2] = {{c->notice_wake[0], POLLIN, 0}, {c->notice_fd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            return;
        if (p[0].revents)
            return;
        if (!(p[1].revents & POLLIN))
            continue;
        int fd = accept4(c->notice_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        char buf[MAX_NOTICE + 1];
        size_t len = 0;
        while (len < MAX_NOTICE) {
            struct pollfd q = {fd, POLLIN, 0};
            if (poll(&q, 1, DELIVERY_MS) <= 0)
                break;
            ssize_t n = read(fd, buf + len, MAX_NOTICE - len);
            if (n <= 0)
                break;
            len += size_t(n);
        }
        close(fd);
        buf[len] = '\0';
        int from, blame, used = 0;
        if (sscanf(buf, "%d %d %n", &from, &blame, &used) < 2 || from < 0 ||
            from >= c->comm.world || blame < -1 || blame >= c->comm.world)
            continue;
        std::string text(buf + used);
        if (!text.empty() && text.back() == '\n')
            text.pop_back();
        std::lock_guard<std::mutex> lock(c->notice_mu);
        zt_gloo_notice &n = c->notices[size_t(from)];
        if (!n.present) {
            n = {true, blame, text};
            c->notice_cv.notify_all();
        }
    }
}

// Connects to every peer at once, writes the line, and gives up on the peers that do not take
// it within DELIVERY_MS (those across a cut link).
void deliver(std::vector<std::string> endpoints, std::string line) {
    struct Conn {
        int fd;
        bool done;
    };
    std::vector<Conn> conns;
    for (const auto &e : endpoints) {
        size_t sp = e.rfind(' ');
        if (e.empty() || sp == std::string::npos)
            continue;
        struct addrinfo hints = {}, *res = nullptr;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
        if (getaddrinfo(e.substr(0, sp).c_str(), e.substr(sp + 1).c_str(), &hints, &res) != 0)
            continue;
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
            close(fd);
            fd = -1;
        }
        freeaddrinfo(res);
        if (fd >= 0)
            conns.push_back({fd, false});
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(DELIVERY_MS);
    for (;;) {
        std::vector<struct pollfd> p;
        std::vector<size_t> which;
        for (size_t i = 0; i < conns.size(); i++) {
            if (!conns[i].done) {
                p.push_back({conns[i].fd, POLLOUT, 0});
                which.push_back(i);
            }
        }
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
        if (p.empty() || left <= 0 || poll(p.data(), p.size(), int(left)) <= 0)
            break;
        for (size_t k = 0; k < p.size(); k++) {
            if (!p[k].revents)
                continue;
            Conn &cn = conns[which[k]];
            // The line is far smaller than a socket's buffer: one write delivers it or fails.
            if (p[k].revents & POLLOUT)
                (void)!send(cn.fd, line.data(), line.size(), MSG_NOSIGNAL);
            cn.done = true;
        }
    }
    for (auto &cn : conns)
        close(cn.fd);
}

} // namespace

zt_status zt_gloo_notice_listen(zt_gloo_comm *c, const std::string &addr, std::string *endpoint) {
    c->notices.assign(size_t(c->comm.world), zt_gloo_notice{});
    c->notice_endpoints.assign(size_t(c->comm.world), "");
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    if (getaddrinfo(addr.c_str(), "0", &hints, &res) != 0)
        return zt_error(ZT_ERR_IO, "gloo: cannot use address %s for failure notices", addr.c_str());
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage self;
    socklen_t len = sizeof self;
    bool ok = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 64) == 0 &&
              getsockname(fd, reinterpret_cast<sockaddr *>(&self), &len) == 0;
    int err = errno;
    freeaddrinfo(res);
    if (!ok || pipe2(c->notice_wake, O_CLOEXEC) != 0) {
        if (fd >= 0)
            close(fd);
        return zt_error(ZT_ERR_IO, "gloo: cannot listen for failure notices on %s: %s",
                        addr.c_str(), strerror(err));
    }
    c->notice_fd = fd;
    char port[16];
    getnameinfo(reinterpret_cast<sockaddr *>(&self), len, nullptr, 0, port, sizeof port,
                NI_NUMERICSERV);
    *endpoint = addr + " " + port;
    c->notice_thread = std::thread(serve_notices, c);
    return ZT_OK;
}

void zt_gloo_notice_send(zt_gloo_comm *c, int blame, const std::string &text) {
    if (c->notice_sent || c->notice_fd < 0)
        return;
    c->notice_sent = true;
    std::vector<std::string> peers;
    for (int r = 0; r < c->comm.world; r++)
        if (r != c->comm.rank)
            peers.push_back(c->notice_endpoints[size_t(r)]);
    std::string line = std::to_string(c->comm.rank) + " " + std::to_string(blame) + " " +
                       text.substr(0, MAX_NOTICE - 32) + "\n";
    c->notice_sender = std::thread(deliver, std::move(peers), std::move(line));
}

std::string zt_gloo_notice_cause(zt_gloo_comm *c, int peer, double grace_s) {
    if (c->notice_fd < 0)
        return "";
    std::unique_lock<std::mutex> lock(c->notice_mu);
    auto from_peer = [&] { return c->notices[size_t(peer)].present; };
    c->notice_cv.wait_for(lock, std::chrono::duration<double>(grace_s), from_peer);
    // Follow the chain of blame from the peer: each notice names whom its sender waited for.
    // A notice that blames this rank says nothing new (this rank knows it is alive).
    std::string cause;
    std::vector<bool> seen(size_t(c->comm.world), false);
    for (int r = peer; r >= 0 && !seen[size_t(r)] && c->notices[size_t(r)].present;) {
        const zt_gloo_notice &n = c->notices[size_t(r)];
        if (n.blame == c->comm.rank)
            break;
        seen[size_t(r)] = true;
        cause = n.text;
        r = n.blame;
    }
    return cause;
}

void zt_gloo_notice_stop(zt_gloo_comm *c) {
    if (c->notice_sender.joinable())
        c->notice_sender.join();
    if (c->notice_fd >= 0) {
        char b = 1;
        (void)!write(c->notice_wake[1], &b, 1);
        c->notice_thread.join();
        close(c->notice_fd);
        close(c->notice_wake[0]);
        close(c->notice_wake[1]);
        c->notice_fd = -1;
    }
}
