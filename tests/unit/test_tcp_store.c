/* Tests for the rendezvous key-value store (engine/comm/tcp_store.h): values set by one client and
 * read by another, many clients counting on one key at once (the total is the number of adds),
 * a waiting get that a later set releases, clients that disconnect mid-request or send garbage
 * (the others are unaffected), and every bounded wait: an absent key, a server that never comes,
 * a server that accepts but never answers, a port in use, a host that does not resolve (retried
 * until the timeout). */
#define _GNU_SOURCE /* before any header */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/tcp_store.h"

static int failures;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,     \
                    zt_last_error());                                               \
            failures++;                                                             \
        }                                                                           \
    } while (0)

enum { CLIENTS = 32, ADDS = 40 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int server_port;

static void *count_client(void *arg) {
    long id = (long)arg;
    zt_tcp_store *c;
    if (zt_tcp_store_connect(&c, "127.0.0.1", server_port, 10, NULL) != ZT_OK)
        return (void *)1;
    long bad = 0;
    for (int i = 0; i < ADDS; i++) {
        int64_t v;
        if (zt_tcp_store_add(c, "counter", 1, &v) != ZT_OK || v < 1 || v > CLIENTS * ADDS)
            bad++;
    }
    char key[32], val[32];
    snprintf(key, sizeof key, "client/%ld", id);
    snprintf(val, sizeof val, "value %ld", id * 7);
    if (zt_tcp_store_set(c, key, val, strlen(val)) != ZT_OK)
        bad++;
    zt_tcp_store_close(c);
    return (void *)bad;
}

static void *set_later(void *arg) {
    (void)arg;
    zt_tcp_store *c;
    if (zt_tcp_store_connect(&c, "localhost", server_port, 10, NULL) != ZT_OK)
        return (void *)1;
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    zt_status s = zt_tcp_store_set(c, "late", "here", 4);
    zt_tcp_store_close(c);
    return (void *)(long)(s != ZT_OK);
}

/* A raw connection that sends bytes and hangs up, as a crashed or foreign client would. */
static void raw_send_close(const void *bytes, size_t len) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)server_port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
        (void)!write(fd, bytes, len);
    close(fd);
}

static void test_values_and_many_clients(void) {
    zt_tcp_store *c;
    CHECK(zt_tcp_store_connect(&c, "127.0.0.1", server_port, 5, NULL) == ZT_OK);
    CHECK(zt_tcp_store_set(c, "a", "hello", 5) == ZT_OK);
    CHECK(zt_tcp_store_set(c, "empty", "", 0) == ZT_OK);
    void *v;
    size_t n;
    CHECK(zt_tcp_store_get(c, "a", &v, &n, 0) == ZT_OK && n == 5 && memcmp(v, "hello", 6) == 0);
    free(v);
    CHECK(zt_tcp_store_get(c, "empty", &v, &n, 0) == ZT_OK && n == 0);
    free(v);
    CHECK(zt_tcp_store_set(c, "a", "bye", 3) == ZT_OK);
    CHECK(zt_tcp_store_get(c, "a", &v, &n, 0) == ZT_OK && n == 3 && memcmp(v, "bye", 3) == 0);
    free(v);
    /* A large value arrives whole. */
    size_t big = (size_t)3 << 20;
    unsigned char *b = malloc(big);
    for (size_t i = 0; i < big; i++)
        b[i] = (unsigned char)(i * 131 + 7);
    CHECK(zt_tcp_store_set(c, "big", b, big) == ZT_OK);
    CHECK(zt_tcp_store_get(c, "big", &v, &n, 0) == ZT_OK && n == big && memcmp(v, b, big) == 0);
    free(v);
    free(b);
    int64_t r;
    CHECK(zt_tcp_store_add(c, "a", 1, &r) == ZT_ERR_INVALID && strstr(zt_last_error(), "'a'"));

    pthread_t t[CLIENTS];
    for (long i = 0; i < CLIENTS; i++)
        pthread_create(&t[i], NULL, count_client, (void *)i);
    long bad = 0;
    for (int i = 0; i < CLIENTS; i++) {
        void *rv;
        pthread_join(t[i], &rv);
        bad += (long)rv;
    }
    CHECK(bad == 0);
    CHECK(zt_tcp_store_add(c, "counter", 0, &r) == ZT_OK && r == CLIENTS * ADDS);
    const char *keys[CLIENTS];
    char names[CLIENTS][32];
    for (int i = 0; i < CLIENTS; i++) {
        snprintf(names[i], sizeof names[i], "client/%d", i);
        keys[i] = names[i];
    }
    CHECK(zt_tcp_store_wait(c, keys, CLIENTS, 1, NULL) == ZT_OK);
    CHECK(zt_tcp_store_get(c, "client/9", &v, &n, 0) == ZT_OK && strcmp(v, "value 63") == 0);
    free(v);
    zt_tcp_store_close(c);
}

static void test_waits_and_disconnects(void) {
    zt_tcp_store *c;
    CHECK(zt_tcp_store_connect(&c, "127.0.0.1", server_port, 5, NULL) == ZT_OK);
    /* A waiting get is released by a set from another client. */
    pthread_t t;
    pthread_create(&t, NULL, set_later, NULL);
    void *v = NULL;
    size_t n;
    double t0 = now_s();
    CHECK(zt_tcp_store_get(c, "late", &v, &n, 10) == ZT_OK && n == 4 && now_s() - t0 < 5);
    free(v);
    void *rv;
    pthread_join(t, &rv);
    CHECK(rv == NULL);

    /* An absent key times out on time, naming it; wait names the first missing key. */
    t0 = now_s();
    CHECK(zt_tcp_store_get(c, "never", &v, &n, 0.3) == ZT_ERR_TIMEOUT && v == NULL &&
          strstr(zt_last_error(), "'never'"));
    double took = now_s() - t0;
    CHECK(took >= 0.29 && took < 2);
    const char *keys[] = {"a", "never", "late"};
    int missing = -1;
    CHECK(zt_tcp_store_wait(c, keys, 3, 0.2, &missing) == ZT_ERR_TIMEOUT && missing == 1);

    /* Clients that hang up mid-request, or send what is not a request, lose only their own
     * connection. */
    unsigned char half[] = {ZT_TCP_STORE_SET, 0, 0, 0, 1, 'k', 0, 0, 0, 0, 0, 0, 0, 100, 'x'};
    raw_send_close(half, sizeof half);
    unsigned char garbage[] = {99, 0, 0, 0, 1, 'k', 0, 0, 0, 0, 0, 0, 0, 0};
    raw_send_close(garbage, sizeof garbage);
    unsigned char huge_key[] = {ZT_TCP_STORE_GET, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0};
    raw_send_close(huge_key, sizeof huge_key);
    CHECK(zt_tcp_store_get(c, "k", &v, &n, 0) == ZT_ERR_TIMEOUT);
    CHECK(zt_tcp_store_set(c, "after", "ok", 2) == ZT_OK);
    CHECK(zt_tcp_store_get(c, "after", &v, &n, 0) == ZT_OK && n == 2);
    free(v);
    zt_tcp_store_close(c);
}

static void test_failures(void) {
    zt_tcp_store *c = NULL;
    /* A port in use: the running server's. */
    zt_tcp_store_server *s2 = NULL;
    CHECK(zt_tcp_store_server_start(&s2, NULL, server_port, NULL) == ZT_ERR_IO && s2 == NULL &&
          strstr(zt_last_error(), "already in use"));

    /* A host that does not resolve is asked for again until the timeout (a Kubernetes pod's
     * name may resolve only after a while, and PyTorch waits for it), then named. */
    double t0 = now_s();
    CHECK(zt_tcp_store_connect(&c, "no-such-host.invalid", server_port, 1.5, NULL) ==
              ZT_ERR_TIMEOUT &&
          c == NULL &&
          strstr(zt_last_error(), "'no-such-host.invalid' did not resolve within 1.5 s"));
    CHECK(now_s() - t0 >= 1.5 && now_s() - t0 < 5);

    /* No server at all: retried until the deadline, then a timeout naming the address. A port
     * just freed by the kernel is one nothing listens on. */
    zt_tcp_store_server *tmp = NULL;
    CHECK(zt_tcp_store_server_start(&tmp, NULL, 0, NULL) == ZT_OK);
    int free_port = tmp ? zt_tcp_store_server_port(tmp) : 1;
    zt_tcp_store_server_stop(tmp);
    t0 = now_s();
    CHECK(zt_tcp_store_connect(&c, "127.0.0.1", free_port, 0.5, NULL) == ZT_ERR_TIMEOUT && c == NULL);
    double took = now_s() - t0;
    CHECK(took >= 0.45 && took < 3);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", free_port);
    CHECK(strstr(zt_last_error(), where) != NULL);

    /* A server that accepts connections (the kernel does, from the backlog) but never answers:
     * the request times out instead of hanging. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t alen = sizeof a;
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    CHECK(zt_tcp_store_connect(&c, "127.0.0.1", ntohs(a.sin_port), 0.4, NULL) == ZT_OK);
    t0 = now_s();
    CHECK(zt_tcp_store_set(c, "x", "y", 1) == ZT_ERR_TIMEOUT &&
          strstr(zt_last_error(), "did not reply"));
    took = now_s() - t0;
    CHECK(took >= 0.35 && took < 3);
    zt_tcp_store_close(c);

    /* A server that goes away: the client's next request is an error naming it. */
    CHECK(zt_tcp_store_connect(&c, "127.0.0.1", ntohs(a.sin_port), 0.4, NULL) == ZT_OK);
    close(fd);
    CHECK(zt_tcp_store_set(c, "x", "y", 1) == ZT_ERR_IO &&
          strstr(zt_last_error(), "closed the connection"));
    zt_tcp_store_close(c);
}

int main(void) {
    zt_tcp_store_server *s;
    if (zt_tcp_store_server_start(&s, NULL, 0, NULL) != ZT_OK) {
        fprintf(stderr, "FAIL: cannot start the store: %s\n", zt_last_error());
        return 1;
    }
    server_port = zt_tcp_store_server_port(s);
    test_values_and_many_clients();
    test_waits_and_disconnects();
    test_failures();
    zt_tcp_store_server_stop(s);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_tcp_store: all checks passed\n");
    return 0;
}
