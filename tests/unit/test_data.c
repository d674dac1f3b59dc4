/* Tests for token datasets and the distributed sampler (engine/data/dataset.c, source_loader.c, loader.c).
 *
 * File validation is checked against hand-built files, one defect each; the sampler against the
 * DistributedSampler rules written out independently here (coverage, disjointness, wrap-around
 * padding, batch counts), and resume against a loader that was actually advanced. */
#define _XOPEN_SOURCE 700 /* mkdtemp and realpath, for check.h; before any header */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/data.h"
#include "ztrain/loss_mask.h"

/* An llm.c token file with a given header and body, valid or not. */
static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t ntok,
                       const void *body, size_t body_bytes) {
    size_t n = 1024 + body_bytes;
    unsigned char *buf = calloc(1, n);
    int32_t h[3] = {magic, version, ntok};
    memcpy(buf, h, sizeof h);
    if (body_bytes)
        memcpy(buf + 1024, body, body_bytes);
    check_write_file(path, buf, n);
    free(buf);
}

/* Opening must fail with `want`, and the message must name the file and contain each fact. */
static void expect_open_fails(const char *path, int vocab, zt_status want, ...) {
    zt_dataset d;
    zt_status s = zt_dataset_open(&d, path, vocab);
    va_list facts;
    va_start(facts, want);
    check_error_has(__FILE__, __LINE__, s, want, path, facts);
    va_end(facts);
    CHECK(d.map == NULL && d.path == NULL);
    if (s == ZT_OK)
        zt_dataset_close(&d);
}

static void test_bad_files(void) {
    uint16_t body[1000] = {0};
    const char *p = check_tmp_path("train.bin");

    write_llmc(p, 12345, 1, 1000, body, sizeof body);
    expect_open_fails(p, 256, ZT_ERR_FORMAT,
                      "bad magic 12345, expected 20240520 (llm.c uint16 tokens) or 20240801 (uint32 tokens)",
                      NULL);

    write_llmc(p, 20240520, 3, 1000, body, sizeof body);
    expect_open_fails(p, 256, ZT_ERR_FORMAT, "bad version 3", "expected 1", NULL);
    write_llmc(p, 20240801, 1, 500, body, sizeof body);
    expect_open_fails(p, 256, ZT_ERR_FORMAT, "bad version 1", "expected 7", NULL);

    unsigned char shortbuf[100] = {0};
    check_write_file(p, shortbuf, sizeof shortbuf);
    expect_open_fails(p, 256, ZT_ERR_FORMAT, "100 bytes", "1024", NULL);

    write_llmc(p, 20240520, 1, 1000, body, 1024);
    expect_open_fails(p, 256, ZT_ERR_FORMAT,
                      "header says 1000 tokens (3024 bytes) but the file has 2048 bytes", NULL);
    write_llmc(p, 20240801, 7, 1000, body, sizeof body);
    expect_open_fails(p, 256, ZT_ERR_FORMAT,
                      "header says 1000 tokens (5024 bytes) but the file has 3024 bytes", NULL);
    write_llmc(p, 20240520, 1, -5, body, 0);
    expect_open_fails(p, 256, ZT_ERR_FORMAT, "-5 tokens", NULL);

    for (int i = 0; i < 1000; i++)
        body[i] = (uint16_t)(i % 200);
    body[17] = 300;
    body[500] = 999;
    write_llmc(p, 20240520, 1, 1000, body, sizeof body);
    expect_open_fails(p, 256, ZT_ERR_FORMAT,
                      "token 300 at position 17 is outside the model's vocab_size 256", NULL);

    check_write_file(p, "", 0);
    expect_open_fails(p, 256, ZT_ERR_FORMAT, "empty", NULL);
    const char *txt = check_tmp_path("empty.txt");
    check_write_file(txt, "", 0);
    expect_open_fails(txt, 256, ZT_ERR_FORMAT, "empty", NULL);

    /* A .bin file holding text is a token file with a bad magic, not a byte file. */
    check_write_file(p, "hello world, this is text\n", 26);
    expect_open_fails(p, 256, ZT_ERR_FORMAT, "26 bytes", NULL);

    /* Any file that starts with a magic is a token file, whatever its name. */
    const char *tok = check_tmp_path("train.tokens");
    write_llmc(tok, 20240520, 1, 10, body, 8);
    expect_open_fails(tok, 256, ZT_ERR_FORMAT, "header says 10 tokens (1044 bytes)", NULL);

    expect_open_fails(check_tmp_path("missing.bin"), 256, ZT_ERR_IO, "No such file or directory",
                      NULL);
    expect_open_fails(check_tmpdir, 256, ZT_ERR_IO, "not a regular file", NULL);
    write_llmc(p, 20240520, 1, 2, body, 4);
    expect_open_fails(p, 0, ZT_ERR_INVALID, "vocab_size 0", NULL);
}

static void test_token_files(void) {
    /* uint16, written by the library and checked byte by byte against the llm.c layout. */
    uint16_t toks[300];
    for (int i = 0; i < 300; i++)
        toks[i] = (uint16_t)(i * 211 % 50257);
    const char *p = check_tmp_path("w.bin");
    CHECK(zt_dataset_write_tokens(p, toks, 300) == ZT_OK);
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == 1024 + 600);
    CHECK(access(check_tmp_path("w.bin.tmp"), F_OK) != 0);
    FILE *f = fopen(p, "rb");
    int32_t h[256];
    CHECK(f && fread(h, 4, 256, f) == 256);
    if (f)
        fclose(f);
    CHECK(h[0] == 20240520 && h[1] == 1 && h[2] == 300);
    for (int i = 3; i < 256; i++)
        CHECK(h[i] == 0);
    zt_dataset d;
    CHECK(zt_dataset_open(&d, p, 50257) == ZT_OK);
    CHECK(d.kind == ZT_DATA_TOKENS16 && d.n_tokens == 300);
    for (int i = 0; i < 300; i++)
        CHECK(zt_dataset_token(&d, (size_t)i) == toks[i]);
    zt_dataset_close(&d);
    zt_dataset_close(&d); /* closing twice is harmless */
    expect_open_fails(p, 50000, ZT_ERR_FORMAT, "at position", "vocab_size 50000", NULL);

    /* uint32 (Llama-3 style) with ids beyond 16 bits. */
    uint32_t t32[50];
    for (int i = 0; i < 50; i++)
        t32[i] = 100000u + (uint32_t)i * 1000u;
    const char *p32 = check_tmp_path("llama.bin");
    write_llmc(p32, 20240801, 7, 50, t32, sizeof t32);
    CHECK(zt_dataset_open(&d, p32, 200000) == ZT_OK);
    CHECK(d.kind == ZT_DATA_TOKENS32 && d.n_tokens == 50);
    for (int i = 0; i < 50; i++)
        CHECK(zt_dataset_token(&d, (size_t)i) == (int32_t)t32[i]);
    zt_dataset_close(&d);
    expect_open_fails(p32, 128256, ZT_ERR_FORMAT,
                      "token 129000 at position 29 is outside the model's vocab_size 128256", NULL);
}

static void test_byte_files(void) {
    const char *p = check_tmp_path("corpus.txt");
    const char *text = "hello world\n";
    check_write_file(p, text, strlen(text));
    zt_dataset d;
    CHECK(zt_dataset_open(&d, p, 256) == ZT_OK);
    CHECK(d.kind == ZT_DATA_BYTES && d.n_tokens == strlen(text));
    for (size_t i = 0; i < strlen(text); i++)
        CHECK(zt_dataset_token(&d, i) == (unsigned char)text[i]);
    zt_dataset_close(&d);
    /* 'o' (111) at position 4 is the first byte >= 109. */
    expect_open_fails(p, 109, ZT_ERR_FORMAT, "token 111 at position 4", "vocab_size 109", NULL);

    unsigned char hi[3] = {1, 255, 2};
    const char *ph = check_tmp_path("high.dat");
    check_write_file(ph, hi, 3);
    CHECK(zt_dataset_open(&d, ph, 256) == ZT_OK);
    CHECK(zt_dataset_token(&d, 1) == 255);
    zt_dataset_close(&d);
}

/* ---- sampler -------------------------------------------------------------------------------- */

/* A dataset whose token at position p is p, so a batch row tells which sample it came from. */
static void open_counting(zt_dataset *d, int T, int n_samples) {
    size_t n = (size_t)n_samples * (size_t)T + 1;
    uint16_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = (uint16_t)i;
    const char *p = check_tmp_path("count.bin");
    if (zt_dataset_write_tokens(p, t, n) != ZT_OK || zt_dataset_open(d, p, 65536) != ZT_OK) {
        fprintf(stderr, "cannot build dataset: %s\n", zt_last_error());
        exit(1);
    }
    free(t);
}

/* Reads one epoch from a loader through next(), checking every row's contents, and returns the
 * sample indices it yielded. */
static int64_t read_epoch(zt_loader *l, int64_t *out, int32_t *in, int32_t *tg) {
    int64_t n = 0, bpe = zt_loader_batches_per_epoch(l), e = l->epoch;
    int B = l->B, T = l->T;
    for (int64_t b = 0; b < bpe; b++) {
        CHECK(l->epoch == e);
        int got = zt_loader_next(l, in, tg);
        bool last = b == bpe - 1;
        int want = (!l->drop_last && last && l->per_rank % B) ? (int)(l->per_rank % B) : B;
        CHECK(got == want, "batch %lld of %lld: got %d rows, want %d", (long long)b,
              (long long)bpe, got, want);
        for (int r = 0; r < got; r++) {
            int64_t s = in[r * T] / T;
            for (int t = 0; t < T; t++) {
                CHECK(in[r * T + t] == s * T + t);
                CHECK(tg[r * T + t] == s * T + t + 1);
            }
            out[n++] = s;
        }
        for (int r = got; r < B; r++)
            for (int t = 0; t < T; t++)
                CHECK(in[r * T + t] == 0 && tg[r * T + t] == 0);
    }
    CHECK(l->epoch == e + 1 && l->pos == 0);
    return n;
}

static void test_sampler_partition(void) {
    const int T = 4;
    const int sizes[] = {1, 2, 5, 10, 11, 13, 37};
    int32_t *in = malloc(8 * T * sizeof *in), *tg = malloc(8 * T * sizeof *tg);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int N = sizes[si];
        zt_dataset d;
        open_counting(&d, T, N);
        /* The global order of each epoch as one rank of one sees it: the reference for all. */
        int64_t ref[2][64];
        for (int e = 0; e < 2; e++) {
            zt_loader l1;
            CHECK(zt_loader_init(&l1, &d, 1, T, 0, 1, true, false, 42) == ZT_OK);
            zt_loader_seek(&l1, e, 0);
            CHECK(l1.n_samples == N && l1.per_rank == N);
            memcpy(ref[e], l1.order, (size_t)N * sizeof(int64_t));
            zt_loader_free(&l1);
        }
        for (int W = 1; W <= 4; W++)
            for (int B = 1; B <= 3; B++)
                for (int drop = 0; drop <= 1; drop++) {
                    int64_t per_rank = (N + W - 1) / W;
                    int64_t bpe = drop ? per_rank / B : (per_rank + B - 1) / B;
                    int64_t G[2][64];
                    int filled[2][64] = {{0}};
                    for (int r = 0; r < W; r++) {
                        zt_loader l;
                        zt_status s = zt_loader_init(&l, &d, B, T, r, W, true, drop, 42);
                        if (drop && per_rank < B) {
                            CHECK(s == ZT_ERR_INVALID, "N=%d W=%d B=%d: a rank without a full "
                                  "batch must be refused", N, W, B);
                            continue;
                        }
                        CHECK(s == ZT_OK);
                        CHECK(l.per_rank == per_rank);
                        CHECK(zt_loader_batches_per_epoch(&l) == bpe, "N=%d W=%d B=%d drop=%d",
                              N, W, B, drop);
                        for (int e = 0; e < 2; e++) {
                            int64_t got[64];
                            int64_t n = read_epoch(&l, got, in, tg);
                            CHECK(n == (drop ? bpe * B : per_rank));
                            for (int64_t k = 0; k < n; k++) {
                                G[e][r + k * W] = got[k];
                                filled[e][r + k * W] = 1;
                            }
                        }
                        zt_loader_free(&l);
                    }
                    if (drop && per_rank < B)
                        continue;
                    for (int e = 0; e < 2; e++) {
                        /* Every rank saw the same order: the union of the shares, interleaved
                         * back, is the single-rank order, followed by wrap-around padding. */
                        int64_t total = per_rank * W;
                        for (int64_t g = 0; g < total; g++) {
                            if (!filled[e][g])
                                continue;
                            int64_t want = ref[e][g % N];
                            CHECK(G[e][g] == want, "N=%d W=%d B=%d drop=%d epoch %d slot %lld",
                                  N, W, B, drop, e, (long long)g);
                        }
                        if (!drop) {
                            int seen[64] = {0};
                            for (int64_t g = 0; g < N; g++)
                                CHECK(filled[e][g] && seen[G[e][g]]++ == 0);
                            for (int i = 0; i < N; i++)
                                CHECK(seen[i] == 1);
                            for (int64_t g = N; g < total; g++)
                                CHECK(filled[e][g]);
                        } else {
                            /* drop_last only removes each rank's short tail. */
                            int64_t dropped = 0;
                            for (int64_t g = 0; g < total; g++)
                                dropped += !filled[e][g];
                            CHECK(dropped == W * (per_rank % B));
                        }
                    }
                }
        zt_dataset_close(&d);
    }
    free(in);
    free(tg);
}

static void test_shuffle(void) {
    const int T = 2, N = 37;
    zt_dataset d;
    open_counting(&d, T, N);
    zt_loader a, b, c;
    CHECK(zt_loader_init(&a, &d, 1, T, 0, 1, true, false, 7) == ZT_OK);
    CHECK(zt_loader_init(&b, &d, 1, T, 0, 1, true, false, 8) == ZT_OK);
    CHECK(zt_loader_init(&c, &d, 1, T, 0, 1, false, false, 7) == ZT_OK);
    int64_t e0[N];
    memcpy(e0, a.order, sizeof e0);
    bool is_perm = true, same_seed_other = true, identity = true;
    int seen[N];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) {
        is_perm &= e0[i] >= 0 && e0[i] < N && seen[e0[i]]++ == 0;
        same_seed_other &= e0[i] == b.order[i];
        identity &= e0[i] == i;
    }
    CHECK(is_perm);
    CHECK(!identity);
    CHECK(!same_seed_other);
    /* seed + epoch: epoch 1 of seed 7 is epoch 0 of seed 8, and differs from epoch 0. */
    zt_loader_seek(&a, 1, 0);
    CHECK(memcmp(a.order, b.order, sizeof e0) == 0);
    CHECK(memcmp(a.order, e0, sizeof e0) != 0);
    /* Without shuffle every epoch is in file order. */
    for (int e = 0; e < 3; e++) {
        zt_loader_seek(&c, e, 0);
        for (int i = 0; i < N; i++)
            CHECK(c.order[i] == i);
    }
    zt_loader_free(&a);
    zt_loader_free(&b);
    zt_loader_free(&c);
    zt_dataset_close(&d);

    /* Fisher-Yates with an unbiased generator puts each sample first equally often: 8000 epochs
     * of 8 samples give 1000 per slot, with a standard deviation of about 30. */
    open_counting(&d, T, 8);
    zt_loader u;
    CHECK(zt_loader_init(&u, &d, 1, T, 0, 1, true, false, 123) == ZT_OK);
    int first[8] = {0}, last[8] = {0};
    for (int e = 0; e < 8000; e++) {
        zt_loader_seek(&u, e, 0);
        first[u.order[0]]++;
        last[u.order[7]]++;
    }
    for (int i = 0; i < 8; i++) {
        CHECK(first[i] > 850 && first[i] < 1150, "sample %d first %d times", i, first[i]);
        CHECK(last[i] > 850 && last[i] < 1150, "sample %d last %d times", i, last[i]);
    }
    zt_loader_free(&u);
    zt_dataset_close(&d);
}

static void test_seek(void) {
    const int T = 3, N = 37, B = 2;
    zt_dataset d;
    open_counting(&d, T, N);
    int32_t in1[B * T], tg1[B * T], in2[B * T], tg2[B * T];
    for (int drop = 0; drop <= 1; drop++) {
        zt_loader a;
        CHECK(zt_loader_init(&a, &d, B, T, 1, 3, true, drop, 99) == ZT_OK);
        int64_t bpe = zt_loader_batches_per_epoch(&a);
        for (int64_t step = 0; step < 3 * bpe + 2; step++) {
            zt_loader b;
            CHECK(zt_loader_init(&b, &d, B, T, 1, 3, true, drop, 99) == ZT_OK);
            zt_loader_seek(&b, a.epoch, a.pos);
            CHECK(b.epoch == a.epoch && b.pos == a.pos);
            CHECK(memcmp(a.order, b.order, (size_t)a.per_rank * sizeof(int64_t)) == 0);
            /* Run both past the next epoch boundary: every batch must match bit for bit. A copy
             * of `a` walks ahead so `a` itself advances one step per iteration. */
            zt_loader ahead = a;
            ahead.order = malloc((size_t)(a.per_rank + a.n_samples) * sizeof(int64_t));
            memcpy(ahead.order, a.order, (size_t)(a.per_rank + a.n_samples) * sizeof(int64_t));
            for (int64_t k = 0; k < bpe + 1; k++) {
                int n1 = zt_loader_next(&ahead, in1, tg1);
                int n2 = zt_loader_next(&b, in2, tg2);
                CHECK(n1 == n2);
                CHECK(memcmp(in1, in2, sizeof in1) == 0 && memcmp(tg1, tg2, sizeof tg1) == 0);
                CHECK(ahead.epoch == b.epoch && ahead.pos == b.pos);
            }
            zt_loader_free(&ahead);
            zt_loader_free(&b);
            zt_loader_next(&a, in1, tg1);
        }
        /* The end of an epoch and the start of the next are the same place. */
        zt_loader x, y;
        CHECK(zt_loader_init(&x, &d, B, T, 1, 3, true, drop, 99) == ZT_OK);
        CHECK(zt_loader_init(&y, &d, B, T, 1, 3, true, drop, 99) == ZT_OK);
        zt_loader_seek(&x, 4, x.per_rank);
        zt_loader_seek(&y, 5, 0);
        CHECK(x.epoch == 5 && x.pos == 0);
        CHECK(memcmp(x.order, y.order, (size_t)x.per_rank * sizeof(int64_t)) == 0);
        zt_loader_free(&x);
        zt_loader_free(&y);
        zt_loader_free(&a);
    }
    zt_dataset_close(&d);
}

static void test_small_datasets(void) {
    const int T = 8;
    uint16_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const char *p = check_tmp_path("small.bin");
    zt_dataset d;
    zt_loader l;
    CHECK(zt_dataset_write_tokens(p, t, 8) == ZT_OK);
    CHECK(zt_dataset_open(&d, p, 256) == ZT_OK);
    zt_status s = zt_loader_init(&l, &d, 1, T, 0, 1, true, false, 1);
    CHECK(s == ZT_ERR_INVALID);
    CHECK(strstr(zt_last_error(), p) && strstr(zt_last_error(), "8 tokens") &&
              strstr(zt_last_error(), "T+1 = 9"),
          "%s", zt_last_error());
    CHECK(l.order == NULL);
    zt_dataset_close(&d);

    /* Exactly T+1 tokens make one sample, which every rank gets (by padding). */
    CHECK(zt_dataset_write_tokens(p, t, 9) == ZT_OK);
    CHECK(zt_dataset_open(&d, p, 256) == ZT_OK);
    int32_t in[2 * T], tg[2 * T];
    for (int r = 0; r < 4; r++) {
        CHECK(zt_loader_init(&l, &d, 2, T, r, 4, true, false, 1) == ZT_OK);
        CHECK(l.n_samples == 1 && l.per_rank == 1);
        CHECK(zt_loader_next(&l, in, tg) == 1);
        CHECK(in[0] == 1 && in[T - 1] == 8 && tg[0] == 2 && tg[T - 1] == 9);
        zt_loader_free(&l);
    }
    CHECK(zt_loader_init(&l, &d, 2, T, 0, 1, true, true, 1) == ZT_ERR_INVALID);
    CHECK(zt_loader_init(&l, &d, 1, T, 4, 4, true, true, 1) == ZT_ERR_INVALID);
    zt_dataset_close(&d);

    /* A byte file through the loader. */
    const char *pt = check_tmp_path("bytes.txt");
    check_write_file(pt, "abcdefghijklmnopq", 17);
    CHECK(zt_dataset_open(&d, pt, 256) == ZT_OK);
    CHECK(zt_loader_init(&l, &d, 1, 4, 0, 1, false, true, 0) == ZT_OK);
    CHECK(l.n_samples == 4 && zt_loader_batches_per_epoch(&l) == 4);
    int32_t bi[4], bt[4];
    zt_loader_next(&l, bi, bt);
    zt_loader_next(&l, bi, bt);
    CHECK(bi[0] == 'e' && bi[3] == 'h' && bt[0] == 'f' && bt[3] == 'i');
    zt_loader_free(&l);
    zt_dataset_close(&d);
}

/* Loss masks (ztrain/loss_mask.h): the companion's bytes against the layout written out here,
 * targets -1 exactly where the token after the input is untrained, shards of a glob each with
 * their own mask, and a mask that does not fit its token file refused naming it. */
static void test_loss_masks(void) {
    const int T = 5, N = 61;
    uint16_t toks[61];
    uint8_t flags[61];
    for (int i = 0; i < N; i++) {
        toks[i] = (uint16_t)(i * 7 % 50);
        flags[i] = (uint8_t)((i / 3) % 2);
    }
    const char *p = check_tmp_path("sft.bin");
    CHECK(zt_dataset_write_tokens(p, toks, N) == ZT_OK, "%s", zt_last_error());
    char mp[PATH_MAX + 8];
    zt_loss_mask_path(p, mp, sizeof mp);
    CHECK(strcmp(mp + strlen(mp) - 9, ".bin.mask") == 0, "%s", mp);
    CHECK(zt_loss_mask_write(mp, flags, N) == ZT_OK, "%s", zt_last_error());
    FILE *f = fopen(mp, "rb");
    int32_t head[256];
    uint8_t body[61];
    CHECK(f && fread(head, 4, 256, f) == 256 && fread(body, 1, N, f) == (size_t)N &&
          fgetc(f) == EOF);
    if (f)
        fclose(f);
    CHECK(head[0] == 20261204 && head[1] == 1 && head[2] == N && head[3] == 0 &&
          memcmp(body, flags, N) == 0);

    zt_dataset d;
    CHECK(zt_dataset_open(&d, p, 50) == ZT_OK && zt_loss_mask_attach(&d) == ZT_OK, "%s",
          zt_last_error());
    zt_loader l;
    CHECK(zt_loader_init(&l, &d, 2, T, 0, 1, false, true, 1) == ZT_OK, "%s", zt_last_error());
    int32_t in[10], tg[10];
    bool right = true;
    for (int b = 0; b < 6; b++) {
        int n = zt_loader_next(&l, in, tg);
        for (int r = 0; r < n; r++)
            for (int t = 0; t < T; t++) {
                int s = 2 * b + r, i = s * T + t;
                int want = flags[i + 1] ? toks[i + 1] : -1;
                right = right && in[r * T + t] == toks[i] && tg[r * T + t] == want;
            }
    }
    CHECK(right, "targets follow the mask of the token after each input");
    zt_loader_free(&l);
    zt_dataset_close(&d);

    /* A glob: each shard has its own mask. */
    CHECK(zt_dataset_write_tokens(check_tmp_path("sh_0.bin"), toks, 31) == ZT_OK);
    CHECK(zt_dataset_write_tokens(check_tmp_path("sh_1.bin"), toks + 30, 31) == ZT_OK);
    snprintf(mp, sizeof mp, "%s.mask", check_tmp_path("sh_0.bin"));
    CHECK(zt_loss_mask_write(mp, flags, 31) == ZT_OK);
    const char *glob = check_tmp_path("sh_*.bin");
    CHECK(zt_dataset_open(&d, glob, 50) == ZT_OK);
    zt_status s = zt_loss_mask_attach(&d);
    CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "sh_1.bin.mask"), "%s", zt_last_error());
    CHECK(d.parts[0].mask == NULL, "a failed attach leaves nothing mapped");
    snprintf(mp, sizeof mp, "%s.mask", check_tmp_path("sh_1.bin"));
    CHECK(zt_loss_mask_write(mp, flags + 30, 31) == ZT_OK);
    CHECK(zt_loss_mask_attach(&d) == ZT_OK && d.parts[1].mask && d.parts[1].mask[0] == flags[30],
          "%s", zt_last_error());
    zt_dataset_close(&d);

    /* Documents (bit 1): positions restart at each one and at every window's first token, and a
     * document's first token is no target. */
    for (int i = 0; i < N; i++)
        flags[i] = (uint8_t)(ZT_LOSS_MASK_TRAINED | (i % 4 == 2 ? ZT_LOSS_MASK_DOC_START : 0));
    zt_loss_mask_path(p, mp, sizeof mp);
    CHECK(zt_loss_mask_write(mp, flags, N) == ZT_OK);
    CHECK(zt_dataset_open(&d, p, 50) == ZT_OK && zt_loss_mask_attach(&d) == ZT_OK, "%s",
          zt_last_error());
    CHECK(zt_loader_init(&l, &d, 2, T, 0, 1, false, true, 1) == ZT_OK, "%s", zt_last_error());
    int32_t pos[10];
    right = true;
    for (int b = 0; b < 6; b++) {
        int n = zt_loader_next_docs(&l, in, tg, pos);
        for (int r = 0; r < n; r++)
            for (int t = 0, want_pos = 0; t < T; t++) {
                int i = (2 * b + r) * T + t;
                want_pos = t == 0 || i % 4 == 2 ? 0 : want_pos + 1;
                int want_tg = (i + 1) % 4 == 2 ? -1 : toks[i + 1];
                right = right && pos[r * T + t] == want_pos && tg[r * T + t] == want_tg;
            }
    }
    CHECK(right, "document positions and targets follow bit 1");
    zt_loader_free(&l);
    zt_dataset_close(&d);

    /* data.packing "padded": a sample is one document (starting every 4th token from token 2,
     * and at token 0), cut at T, its last target -1, padded with inputs 0 and targets -1. */
    CHECK(zt_dataset_open(&d, p, 50) == ZT_OK && zt_loss_mask_attach(&d) == ZT_OK &&
          zt_dataset_set_padded(&d) == ZT_OK, "%s", zt_last_error());
    CHECK(d.n_docs == 1 + (size_t)(N - 2 + 3) / 4 && d.docs[0] == 0 && d.docs[1] == 2,
          "%zu documents", d.n_docs);
    CHECK(zt_loader_init(&l, &d, 1, T, 0, 1, false, false, 1) == ZT_OK, "%s", zt_last_error());
    right = l.n_samples == (int64_t)d.n_docs;
    for (size_t k = 0; k < d.n_docs; k++) {
        zt_loader_next_docs(&l, in, tg, pos);
        size_t a = d.docs[k], e = k + 1 < d.n_docs ? d.docs[k + 1] : (size_t)N;
        for (int t = 0; t < T; t++) {
            bool real = a + (size_t)t < e;
            int want_in = real ? toks[a + t] : 0;
            int want_tg = real && a + t + 1 < e ? toks[a + t + 1] : -1;
            right = right && in[t] == want_in && tg[t] == want_tg &&
                    pos[t] == (real ? t : t - (int)(e - a));
        }
    }
    CHECK(right, "padded samples are the documents");
    zt_loader_free(&l);
    zt_dataset_close(&d);
    zt_dataset d2;
    CHECK(zt_dataset_open(&d2, p, 50) == ZT_OK);
    CHECK(zt_dataset_set_padded(&d2) == ZT_ERR_INVALID && strstr(zt_last_error(), "sft.bin"),
          "padding without a mask: %s", zt_last_error());
    zt_dataset_close(&d2);

    /* A mask of another length, or with a reserved bit, is refused naming the file. */
    zt_loss_mask_path(p, mp, sizeof mp);
    CHECK(zt_loss_mask_write(mp, flags, N - 1) == ZT_OK);
    CHECK(zt_dataset_open(&d, p, 50) == ZT_OK);
    s = zt_loss_mask_attach(&d);
    CHECK(s == ZT_ERR_FORMAT && strstr(zt_last_error(), "sft.bin.mask") &&
          strstr(zt_last_error(), "60 tokens"), "%s", zt_last_error());
    flags[17] = 0x81;
    CHECK(zt_loss_mask_write(mp, flags, N) == ZT_OK);
    s = zt_loss_mask_attach(&d);
    CHECK(s == ZT_ERR_FORMAT && strstr(zt_last_error(), "token 17") &&
          strstr(zt_last_error(), "0x81"), "%s", zt_last_error());
    zt_dataset_close(&d);
}

int main(void) {
    check_tmpdir_create("zt_test_data");
    test_bad_files();
    test_token_files();
    test_byte_files();
    test_sampler_partition();
    test_shuffle();
    test_seek();
    test_small_datasets();
    test_loss_masks();
    check_tmpdir_remove();
    return check_summary("test_data");
}
