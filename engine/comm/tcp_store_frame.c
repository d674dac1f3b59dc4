/* The rendezvous store's request frames (tcp_store.h): the one parser the server runs on the
 * bytes a client sends, kept apart from the sockets so that it can be fuzzed alone
 * (tests/fuzz/tcp_store_frame.c). */
#include <string.h>

#include "tcp_store.h"

static uint64_t get_be(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

int zt_tcp_store_parse(const unsigned char *buf, size_t len, zt_tcp_store_request *req) {
    memset(req, 0, sizeof *req);
    if (len < ZT_TCP_STORE_HEADER)
        return 0;
    int op = buf[0];
    uint64_t klen = get_be(buf + 1, 4);
    if (klen == 0 || klen > ZT_TCP_STORE_MAX_KEY)
        return -1;
    if (op != ZT_TCP_STORE_SET && op != ZT_TCP_STORE_GET && op != ZT_TCP_STORE_ADD &&
        op != ZT_TCP_STORE_AUTH)
        return -1;
    /* A key holding a NUL would name another key than its bytes say. */
    if (memchr(buf + 5, '\0', len - 5 < klen ? len - 5 : (size_t)klen))
        return -1;
    if (len < ZT_TCP_STORE_HEADER + klen)
        return 0;
    uint64_t arg = get_be(buf + 5 + klen, 8);
    size_t total = ZT_TCP_STORE_HEADER + (size_t)klen;
    if (op == ZT_TCP_STORE_SET) {
        if (arg > ZT_TCP_STORE_MAX_VALUE)
            return -1;
        total += (size_t)arg;
    } else if (op == ZT_TCP_STORE_AUTH && arg != 0) {
        return -1;
    }
    if (len < total)
        return 0;
    req->op = op;
    req->key = (const char *)buf + 5;
    req->key_len = (size_t)klen;
    req->arg = arg;
    req->value = op == ZT_TCP_STORE_SET ? buf + ZT_TCP_STORE_HEADER + klen : NULL;
    req->value_len = op == ZT_TCP_STORE_SET ? (size_t)arg : 0;
    req->total = total;
    return 1;
}
