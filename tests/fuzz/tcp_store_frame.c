/* Fuzz target: the rendezvous store's request frames (engine/comm/tcp_store_frame.c), the parser
 * rank 0's store runs on every byte a client sends. The input is a stream of requests as a client
 * would write them. Every request the parser takes must lie within the bytes given, name a known
 * op and a key of 1 to ZT_TCP_STORE_MAX_KEY bytes without a NUL, carry a SET's value within
 * ZT_TCP_STORE_MAX_VALUE, and parse the same from a buffer cut just after it, while one byte
 * fewer must ask for more; a request that needs more bytes must still need them from any shorter
 * prefix. */
#include "comm/tcp_store.h"
#include "fuzz_util.h"

static void check_request(const uint8_t *buf, size_t len, const zt_tcp_store_request *r) {
    FUZZ_CHECK(r->total >= ZT_TCP_STORE_HEADER + r->key_len && r->total <= len,
               "request of %zu bytes in a buffer of %zu", r->total, len);
    FUZZ_CHECK(r->op == ZT_TCP_STORE_SET || r->op == ZT_TCP_STORE_GET ||
               r->op == ZT_TCP_STORE_ADD || r->op == ZT_TCP_STORE_AUTH, "op %d taken", r->op);
    FUZZ_CHECK(r->key_len >= 1 && r->key_len <= ZT_TCP_STORE_MAX_KEY, "key of %zu bytes",
               r->key_len);
    FUZZ_CHECK((const uint8_t *)r->key == buf + 5 && !memchr(r->key, '\0', r->key_len),
               "key not where the frame puts it, or holding a NUL");
    if (r->op == ZT_TCP_STORE_SET)
        FUZZ_CHECK(r->value == buf + ZT_TCP_STORE_HEADER + r->key_len &&
                   r->value_len == r->arg && r->value_len <= ZT_TCP_STORE_MAX_VALUE &&
                   r->total == ZT_TCP_STORE_HEADER + r->key_len + r->value_len,
                   "SET value of %zu bytes at the wrong place", r->value_len);
    else
        FUZZ_CHECK(r->value == NULL && r->value_len == 0 &&
                   r->total == ZT_TCP_STORE_HEADER + r->key_len, "a value outside SET");
    if (r->op == ZT_TCP_STORE_AUTH)
        FUZZ_CHECK(r->arg == 0, "AUTH with argument %llu", (unsigned long long)r->arg);
    /* Exactly its bytes parse to the same request; one fewer needs more. */
    uint8_t *exact = malloc(r->total);
    FUZZ_CHECK(exact != NULL, "out of memory");
    memcpy(exact, buf, r->total);
    zt_tcp_store_request again;
    FUZZ_CHECK(zt_tcp_store_parse(exact, r->total, &again) == 1 && again.total == r->total &&
               again.op == r->op && again.key_len == r->key_len && again.arg == r->arg,
               "the request's own bytes parse differently");
    FUZZ_CHECK(zt_tcp_store_parse(exact, r->total - 1, &again) == 0,
               "a request one byte short is not 'need more'");
    free(exact);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The stream as the server sees it: requests one after the other until one is incomplete
     * or malformed. */
    size_t pos = 0;
    for (int n = 0; n < 10000; n++) {
        zt_tcp_store_request r;
        int got = zt_tcp_store_parse(data + pos, size - pos, &r);
        FUZZ_CHECK(got >= -1 && got <= 1, "parse returned %d", got);
        if (got == 1) {
            check_request(data + pos, size - pos, &r);
            pos += r.total;
            continue;
        }
        if (got == 0) {
            /* Needing more bytes is true of every shorter prefix too. */
            for (size_t cut = 0; cut < size - pos && cut < 64; cut++)
                FUZZ_CHECK(zt_tcp_store_parse(data + pos, cut, &r) == 0,
                           "a prefix of %zu bytes of an incomplete request is not incomplete",
                           cut);
        }
        break;
    }
    return 0;
}
