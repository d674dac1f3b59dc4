/* A job's TCP metrics endpoint (service/ranks/metrics_listener.c), over real loopback sockets: a wrong
 * token, a handshake that never ends and a line too long are refused; the right token hands over
 * the connection with the bytes after the handshake still unread, and then the port closes. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "ranks/metrics_listener.h"

static int port_of(const zt_metrics_listener *l) {
    const char *colon = strrchr(zt_metrics_listener_addr(l), ':');
    return colon ? atoi(colon + 1) : -1;
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_text(int fd, const char *text) {
    CHECK(send(fd, text, strlen(text), MSG_NOSIGNAL) == (ssize_t)strlen(text));
}

/* Steps the listener until it hands out a connection or `ms` have passed. */
static int step_until(zt_metrics_listener *l, int ms, int *rejected) {
    for (int waited = 0; waited <= ms; waited += 10) {
        struct pollfd pfd[8];
        int n = zt_metrics_listener_fds(l, pfd, 8);
        poll(pfd, (nfds_t)n, 10);
        int fd = zt_metrics_listener_step(l, rejected);
        if (fd >= 0)
            return fd;
    }
    return -1;
}

/* Whether the peer closed fd within a second: EOF, or a reset when it left bytes unread. */
static bool closed_by_peer(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char ch;
    return poll(&p, 1, 1000) == 1 && recv(fd, &ch, 1, 0) <= 0;
}

int main(void) {
    zt_metrics_listener *l = NULL;
    CHECK(zt_metrics_listener_create(&l, "127.0.0.1") == ZT_OK, "%s", zt_last_error());
    if (!l)
        return check_summary("test_metrics_listener");
    const char *token = zt_metrics_listener_token(l);
    CHECK(strlen(token) == 32, "a 128-bit token in hex: %s", token);
    CHECK(strncmp(zt_metrics_listener_addr(l), "127.0.0.1:", 10) == 0 && port_of(l) > 0,
          "addr %s", zt_metrics_listener_addr(l));
    zt_metrics_listener *other = NULL;
    CHECK(zt_metrics_listener_create(&other, "127.0.0.1") == ZT_OK);
    CHECK(other && strcmp(zt_metrics_listener_token(other), token) != 0, "tokens differ per job");
    zt_metrics_listener_destroy(other);

    int port = port_of(l), rejected = 0;
    int bad = dial(port);
    char line[256];
    snprintf(line, sizeof line, "%s %.31sx\n{\"train/loss\": 1}\n", ZT_METRICS_HELLO, token);
    send_text(bad, line);
    int too_long = dial(port);
    char big[300];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    send_text(too_long, big);
    int silent = dial(port);
    CHECK(step_until(l, 300, &rejected) < 0, "a wrong token or an endless line is not accepted");
    CHECK(rejected == 2, "both were refused (%d)", rejected);
    CHECK(closed_by_peer(bad) && closed_by_peer(too_long), "and their connections closed");

    int good = dial(port);
    snprintf(line, sizeof line, "%s %s\n{\"train/loss\": 2.5}\n", ZT_METRICS_HELLO, token);
    send_text(good, line);
    int fd = step_until(l, 2000, &rejected);
    CHECK(fd >= 0, "the right token is accepted while another connection stays silent");
    if (fd >= 0) {
        char buf[64] = "";
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 1000);
        ssize_t k = read(fd, buf, sizeof buf - 1);
        buf[k > 0 ? k : 0] = '\0';
        CHECK_STR(buf, "{\"train/loss\": 2.5}\n");
        close(fd);
    }
    CHECK(closed_by_peer(silent), "the silent handshake is dropped once one is accepted");
    CHECK(zt_metrics_listener_fds(l, (struct pollfd[8]){0}, 8) == 0, "nothing left to poll");
    int late = dial(port);
    CHECK(late < 0, "the port is closed after the handover");
    if (late >= 0)
        close(late);
    close(bad);
    close(too_long);
    close(silent);
    close(good);
    zt_metrics_listener_destroy(l);

    /* TEST-NET-1: a valid address that is none of this host's. */
    CHECK(zt_metrics_listener_create(&l, "192.0.2.1") != ZT_OK &&
              strstr(zt_last_error(), "192.0.2.1"),
          "an address not of this host is an error naming it: %s", zt_last_error());
    return check_summary("test_metrics_listener");
}
