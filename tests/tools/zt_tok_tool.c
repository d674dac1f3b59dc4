/* zt_tok_tool: drives the tokenizer library from tests/reference/test_tokenizer.py.
 *
 *   zt_tok_tool TOK.json encode IN OUT [--no-special] [--threads N]
 *       IN holds documents, each a little-endian uint32 byte length and the bytes; OUT gets, per
 *       document, a uint32 count and that many int32 ids (encode_batch on N threads).
 *   zt_tok_tool TOK.json decode IN OUT [--keep-special]
 *       IN holds id lists (uint32 count, int32 ids); OUT gets per list the text's uint32 length
 *       and bytes (special tokens skipped unless --keep-special).
 *   zt_tok_tool TOK.json offsets IN OUT
 *       IN as for encode; OUT gets, per document, its ids without the template as encode writes
 *       them, an int32 1 when zt_tokenizer_offsets knows their offsets exactly (else 0), and
 *       that many uint32 ends (zero when not exact).
 *   zt_tok_tool TOK.json vocab       prints the vocabulary size
 *
 * Exit status: 0 success, 1 the library refused the tokenizer or the input, 2 usage or I/O. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/tokenizer.h"

static int fail(zt_status s) {
    fprintf(stderr, "%s: %s\n", zt_status_name(s), zt_last_error());
    return 1;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0;
    *n = 0;
    for (;;) {
        if (*n + 65536 > cap) {
            cap = 2 * cap + 65536;
            unsigned char *p = realloc(buf, cap);
            if (!p)
                break;
            buf = p;
        }
        size_t got = fread(buf + *n, 1, cap - *n, f);
        *n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    return buf;
}

static uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: zt_tok_tool TOK.json encode|decode|vocab ...\n");
        return 2;
    }
    zt_tokenizer_t *t;
    zt_status s = zt_tokenizer_load(argv[1], &t);
    if (s != ZT_OK)
        return fail(s);
    if (strcmp(argv[2], "vocab") == 0) {
        printf("%d\n", zt_tokenizer_vocab_size(t));
        zt_tokenizer_destroy(t);
        return 0;
    }
    if (argc < 5)
        return 2;
    bool special = true, keep_special = false;
    int threads = 1;
    for (int i = 5; i < argc; i++) {
        if (strcmp(argv[i], "--no-special") == 0)
            special = false;
        else if (strcmp(argv[i], "--keep-special") == 0)
            keep_special = true;
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
    }
    size_t n;
    unsigned char *in = slurp(argv[3], &n);
    FILE *out = fopen(argv[4], "wb");
    if (!in || !out) {
        fprintf(stderr, "zt_tok_tool: cannot read %s or write %s\n", argv[3], argv[4]);
        return 2;
    }
    int rc = 0;
    bool offsets = strcmp(argv[2], "offsets") == 0;
    if (offsets)
        special = false;
    if (strcmp(argv[2], "encode") == 0 || offsets) {
        size_t cap = 1024, nd = 0;
        const char **texts = malloc(cap * sizeof *texts);
        size_t *lens = malloc(cap * sizeof *lens);
        for (size_t off = 0; off + 4 <= n;) {
            if (nd == cap) {
                cap *= 2;
                texts = realloc(texts, cap * sizeof *texts);
                lens = realloc(lens, cap * sizeof *lens);
            }
            lens[nd] = rd32(in + off);
            texts[nd++] = (const char *)in + off + 4;
            off += 4 + lens[nd - 1];
        }
        zt_tok_ids *outs = calloc(nd + 1, sizeof *outs);
        s = zt_tokenizer_encode_batch(t, texts, lens, nd, special, threads, outs, NULL);
        if (s != ZT_OK)
            rc = fail(s);
        for (size_t i = 0; rc == 0 && i < nd; i++) {
            uint32_t c = (uint32_t)outs[i].n;
            fwrite(&c, 4, 1, out);
            fwrite(outs[i].ids, 4, outs[i].n, out);
            if (offsets) {
                size_t *ends = calloc(outs[i].n + 1, sizeof *ends);
                int32_t exact = zt_tokenizer_offsets(t, outs[i].ids, outs[i].n, texts[i],
                                                     lens[i], ends);
                fwrite(&exact, 4, 1, out);
                for (size_t k = 0; k < outs[i].n; k++) {
                    uint32_t e = exact ? (uint32_t)ends[k] : 0;
                    fwrite(&e, 4, 1, out);
                }
                free(ends);
            }
        }
        for (size_t i = 0; i < nd; i++)
            free(outs[i].ids);
        free(outs);
        free(texts);
        free(lens);
    } else {
        for (size_t off = 0; rc == 0 && off + 4 <= n;) {
            uint32_t c = rd32(in + off);
            int32_t *ids = malloc((c + 1) * sizeof *ids);
            memcpy(ids, in + off + 4, (size_t)c * 4);
            off += 4 + (size_t)c * 4;
            char *text;
            size_t len;
            s = zt_tokenizer_decode(t, ids, c, !keep_special, &text, &len);
            free(ids);
            if (s != ZT_OK) {
                rc = fail(s);
                break;
            }
            uint32_t l = (uint32_t)len;
            fwrite(&l, 4, 1, out);
            fwrite(text, 1, len, out);
            free(text);
        }
    }
    free(in);
    if (fclose(out) != 0)
        rc = 2;
    zt_tokenizer_destroy(t);
    return rc;
}
