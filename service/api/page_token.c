/* Page tokens bound to their list and filter (page_token.h). */
#include <stdint.h>
#include <string.h>

#include "page_token.h"

#define TOKEN_VERSION 1
#define MAX_CURSOR 64
/* version, kind, 8 bytes of the filter's hash, then the cursor's bytes. */
#define HEAD 10

static const char alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static uint64_t fnv1a(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static void head(uint8_t *raw, zt_page_list list, const char *filter) {
    uint64_t h = fnv1a(filter ? filter : "");
    raw[0] = TOKEN_VERSION;
    raw[1] = (uint8_t)list;
    for (int i = 0; i < 8; i++)
        raw[2 + i] = (uint8_t)(h >> (8 * i));
}

bool zt_page_token_make(zt_page_list list, const char *filter, const char *cursor, char *out,
                        size_t out_size) {
    uint8_t raw[HEAD + MAX_CURSOR];
    size_t n = strlen(cursor);
    if (out_size)
        out[0] = '\0';
    if (n > MAX_CURSOR || out_size < ZT_PAGE_TOKEN_MAX)
        return false;
    head(raw, list, filter);
    memcpy(raw + HEAD, cursor, n);
    n += HEAD;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)raw[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)raw[i + 1] << 8;
        if (i + 2 < n)
            v |= raw[i + 2];
        size_t chars = n - i >= 3 ? 4 : n - i + 1;
        for (size_t k = 0; k < chars; k++)
            out[o++] = alphabet[(v >> (18 - 6 * k)) & 63];
    }
    out[o] = '\0';
    return true;
}

static int sextet(char c) {
    const char *p = c ? strchr(alphabet, c) : NULL;
    return p ? (int)(p - alphabet) : -1;
}

bool zt_page_token_read(const char *token, zt_page_list list, const char *filter, char *cursor,
                        size_t cursor_size) {
    uint8_t raw[HEAD + MAX_CURSOR];
    size_t len = strlen(token), n = 0;
    /* Unpadded base64 never leaves one character over. */
    if (len % 4 == 1 || len > (HEAD + MAX_CURSOR + 2) / 3 * 4)
        return false;
    for (size_t i = 0; i < len; i += 4) {
        size_t chars = len - i >= 4 ? 4 : len - i;
        uint32_t v = 0;
        for (size_t k = 0; k < 4; k++) {
            int s = k < chars ? sextet(token[i + k]) : 0;
            if (s < 0)
                return false;
            v |= (uint32_t)s << (18 - 6 * k);
        }
        for (size_t k = 0; k + 1 < chars && n < sizeof raw; k++)
            raw[n++] = (uint8_t)(v >> (16 - 8 * k));
    }
    uint8_t want[HEAD];
    head(want, list, filter);
    if (n <= HEAD || memcmp(raw, want, HEAD) != 0 || n - HEAD >= cursor_size)
        return false;
    size_t m = n - HEAD;
    memcpy(cursor, raw + HEAD, m);
    cursor[m] = '\0';
    /* A cursor is text; a NUL inside would cut it short. */
    return strlen(cursor) == m;
}
