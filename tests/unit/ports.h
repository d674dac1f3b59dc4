/* Free TCP ports of the loopback interface for the C tests that start ranks or servers (as
 * tests/ports.py for the Python ones): the ports the kernel hands out for port 0, free when they
 * are asked for (another program can still take one before the test binds it). */
#ifndef ZT_TEST_PORTS_H
#define ZT_TEST_PORTS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* n different free ports into ports[n] (all held open until every one is found, so none
 * repeats); false with a message when there are none. */
static inline bool free_ports(int *ports, int n) {
    int socks[n];
    bool ok = true;
    int made = 0;
    for (; made < n && ok; made++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        socks[made] = socket(AF_INET, SOCK_STREAM, 0);
        ok = socks[made] >= 0 && bind(socks[made], (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(socks[made], (struct sockaddr *)&a, &len) == 0;
        if (ok)
            ports[made] = ntohs(a.sin_port);
        else
            fprintf(stderr, "no free TCP port: %s\n", strerror(errno));
    }
    for (int i = 0; i < made; i++)
        if (socks[i] >= 0)
            close(socks[i]);
    return ok;
}

/* One free port, or exit status 2: a test that cannot set up has nothing to say. */
static inline int free_port(void) {
    int port;
    if (!free_ports(&port, 1))
        exit(2);
    return port;
}

#endif
