/* Bytes and characters for the tokenizer: GPT-2's byte-to-unicode alphabet (every byte a
 * printable character, so byte-level BPE works on strings), UTF-8 validation with the
 * replacement rule Python and Rust share, and the growable buffers the pipeline works in. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

tok_bytechar tok_byte_to_char[256];
static int char_to_byte[324];
static pthread_once_t bytes_once = PTHREAD_ONCE_INIT;

/* Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68
 * bytes take the code points from 256 up, in byte order. */
static void build_alphabet(void) {
    int next = 256;
    for (int i = 0; i < 324; i++)
        char_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        int cp = printable ? b : next++;
        char buf[4];
        int n = tok_utf8_encode((uint32_t)cp, buf);
        memcpy(tok_byte_to_char[b].s, buf, 2);
        tok_byte_to_char[b].len = (uint8_t)n;
        char_to_byte[cp] = b;
    }
}

void tok_bytes_init(void) { pthread_once(&bytes_once, build_alphabet); }

int tok_char_to_byte(uint32_t cp) { return cp < 324 ? char_to_byte[cp] : -1; }

bool tok_all_bytes(const char *s, size_t len) {
    for (size_t k = 0; k < len;) {
        size_t cl;
        if (tok_char_to_byte(tok_utf8_decode((const unsigned char *)s + k, &cl)) < 0)
            return false;
        k += cl;
    }
    return true;
}

size_t tok_utf8_valid(const unsigned char *p, size_t n, size_t *bad) {
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c == 0xE0) {
        need = 2;
        lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
        need = 2;
    } else if (c == 0xED) {
        need = 2;
        hi = 0x9F; /* no surrogates */
    } else if (c == 0xF0) {
        need = 3;
        lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
        need = 3;
    } else if (c == 0xF4) {
        need = 3;
        hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (i >= n || p[i] < l || p[i] > h) {
            *bad = i;
            return 0;
        }
    }
    return need + 1;
}

uint32_t tok_utf8_decode(const unsigned char *p, size_t *len) {
    unsigned c = p[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    }
    if (c < 0xF0) {
        *len = 3;
        return ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    }
    *len = 4;
    return ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

int tok_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

void tok_buf_restart(zt_strbuf *b) {
    if (b->oom)
        zt_strbuf_free(b);
    else
        zt_strbuf_clear(b);
}

bool tok_pieces_add(tok_pieces *p, const char *s, size_t len, bool first) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        tok_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return false;
        p->v = v;
        p->cap = cap;
    }
    size_t off = p->buf.len;
    zt_strbuf_append(&p->buf, s, len);
    if (p->buf.oom)
        return false;
    p->v[p->n++] = (tok_piece){off, len, first};
    return true;
}

void tok_pieces_clear(tok_pieces *p) {
    p->n = 0;
    tok_buf_restart(&p->buf);
}

void tok_pieces_free(tok_pieces *p) {
    free(p->v);
    zt_strbuf_free(&p->buf);
    memset(p, 0, sizeof *p);
}

bool tok_ids_push(zt_tok_ids *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 256;
        int32_t *ids = realloc(o->ids, cap * sizeof *ids);
        if (!ids)
            return false;
        o->ids = ids;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return true;
}
