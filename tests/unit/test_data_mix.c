/* Tests for globs of shards and weighted mixtures of sources (engine/data/data_glob.c,
 * data_mix.c) and their job spec (data.train as a list).
 *
 * Every token says where it came from (source * 10000 + its position in its file, positions below
 * 10000), so a sample's first input token identifies its source, file and window. The glob is
 * checked against the rule written out here (windows of each file in name order, none crossing
 * files); the mixture's proportions against the weights within 5 standard deviations of a
 * binomial; ranks against DistributedSampler's disjointness within each source's epoch; resume
 * against a loader that was actually advanced, bit for bit. */
#define _XOPEN_SOURCE 700 /* mkdtemp and realpath, for check.h; before any header */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/data.h"
#include "ztrain/job_spec.h"

enum { T = 4, B = 8, VOCAB = 65536 };

/* A shard of n tokens, token i = base + i. */
static void write_shard(const char *name, int base, int n) {
    uint16_t *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < n; i++)
        t[i] = (uint16_t)(base + i);
    ZT_ASSERT(zt_dataset_write_tokens(check_tmp_path(name), t, (size_t)n) == ZT_OK);
    free(t);
}

static void test_glob(void) {
    /* Files a (9 tokens: 2 windows), b (3 tokens: none), c (13 tokens: 3 windows). */
    write_shard("g_a.bin", 0, 9);
    write_shard("g_b.bin", 100, 3);
    write_shard("g_c.bin", 200, 13);
    zt_dataset d;
    zt_status s = zt_dataset_open(&d, check_tmp_path("g_*.bin"), VOCAB);
    CHECK(s == ZT_OK, "%s", zt_last_error());
    if (s != ZT_OK)
        return;
    CHECK(d.n_parts == 3 && d.n_tokens == 25);
    zt_loader l;
    CHECK(zt_loader_init(&l, &d, 1, T, 0, 1, false, false, 1) == ZT_OK, "%s", zt_last_error());
    CHECK(l.n_samples == 5, "%lld samples", (long long)l.n_samples);
    const int first[5] = {0, 4, 200, 204, 208};
    for (int k = 0; k < 5; k++) {
        int32_t in[T], tg[T];
        zt_loader_next(&l, in, tg);
        for (int i = 0; i < T; i++)
            CHECK(in[i] == first[k] + i && tg[i] == first[k] + i + 1,
                  "sample %d token %d: %d %d", k, i, in[i], tg[i]);
    }
    zt_loader_free(&l);
    zt_dataset_close(&d);

    s = zt_dataset_open(&d, check_tmp_path("nothing_*.bin"), VOCAB);
    CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "no file matches"), "%s", zt_last_error());

    /* uint16 and uint32 shards together come from different tokenizers. */
    int32_t header[ZT_DATASET_HEADER_INTS];
    zt_dataset_header(header, true, 5);
    unsigned char buf[1024 + 20] = {0};
    memcpy(buf, header, sizeof header);
    check_write_file(check_tmp_path("g_d.bin"), buf, sizeof buf);
    s = zt_dataset_open(&d, check_tmp_path("g_*.bin"), VOCAB);
    CHECK(s == ZT_ERR_FORMAT && strstr(zt_last_error(), "uint16 tokens") &&
              strstr(zt_last_error(), "uint32 tokens") && strstr(zt_last_error(), "g_d.bin"),
          "%s", zt_last_error());
    remove(check_tmp_path("g_d.bin"));
}

/* Three sources of different sizes; source i's tokens are i * 10000 + position. */
static void open_mixture(zt_dataset *d, const double *w) {
    write_shard("m0.bin", 0, 4 * 50 + 1);
    write_shard("m1_a.bin", 10000, 4 * 20 + 1);
    write_shard("m1_b.bin", 15000, 4 * 10 + 1);
    write_shard("m2.bin", 20000, 4 * 7 + 1);
    const char *paths[3] = {check_tmp_path("m0.bin"), check_tmp_path("m1_*.bin"),
                            check_tmp_path("m2.bin")};
    zt_status s = zt_dataset_open_mixture(d, paths, w, 3, VOCAB);
    CHECK(s == ZT_OK, "%s", zt_last_error());
}

static void test_proportions(void) {
    const double w[3] = {0.5, 0.3, 0.2};
    zt_dataset d;
    open_mixture(&d, w);
    zt_loader l;
    CHECK(zt_loader_init(&l, &d, B, T, 0, 1, true, false, 77) == ZT_OK, "%s", zt_last_error());
    CHECK(l.per_rank == 50 + 30 + 7, "per_rank %lld", (long long)l.per_rank);
    int32_t in[B * T], tg[B * T];
    long count[3] = {0}, n = 0;
    for (int step = 0; step < 2500; step++) {
        CHECK(zt_loader_next(&l, in, tg) == B);
        for (int b = 0; b < B; b++, n++) {
            int src = in[b * T] / 10000;
            count[src < 3 ? src : 0]++;
            /* A window is contiguous within one file. */
            for (int i = 1; i < T; i++)
                CHECK(in[b * T + i] == in[b * T] + i && tg[b * T + i - 1] == in[b * T + i]);
        }
    }
    for (int i = 0; i < 3; i++) {
        double sd = sqrt(n * w[i] * (1 - w[i]));
        CHECK(fabs(count[i] - n * w[i]) < 5 * sd, "source %d: %ld of %ld draws, expected %.0f ± %.0f",
              i, count[i], n, n * w[i], 5 * sd);
    }
    zt_loader_free(&l);
    zt_dataset_close(&d);
}

static void test_ranks(void) {
    const double w[3] = {1, 1, 1};
    zt_dataset d;
    open_mixture(&d, w);
    /* Within the first epoch of a source, the two ranks' samples of it never coincide. */
    static char seen[3][100];
    memset(seen, 0, sizeof seen);
    zt_loader l[2];
    for (int r = 0; r < 2; r++)
        CHECK(zt_loader_init(&l[r], &d, 1, T, r, 2, true, false, 5) == ZT_OK, "%s",
              zt_last_error());
    int per_rank[3] = {25, 15, 4}; /* ceil(samples / 2) */
    int taken[2][3] = {{0}};
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 200; k++) {
            int32_t in[T], tg[T];
            zt_loader_next(&l[r], in, tg);
            int src = in[0] / 10000, pos = in[0] % 10000;
            int sample = src == 1 && pos >= 5000 ? 20 + (pos - 5000) / T : pos / T;
            if (taken[r][src]++ >= per_rank[src] || (src == 2 && taken[r][src] > 3))
                continue; /* past the first epoch (source 2's 7 samples pad to 8: one repeats) */
            CHECK(!(seen[src][sample] & (1 << (1 - r))), "rank %d repeats rank %d's sample %d of "
                  "source %d", r, 1 - r, sample, src);
            seen[src][sample] |= (char)(1 << r);
        }
    }
    for (int r = 0; r < 2; r++)
        zt_loader_free(&l[r]);
    zt_dataset_close(&d);
}

static void test_resume(void) {
    const double w[3] = {2, 1, 1};
    zt_dataset d;
    open_mixture(&d, w);
    zt_loader a, b;
    ZT_ASSERT(zt_loader_init(&a, &d, B, T, 1, 2, true, false, 9) == ZT_OK);
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    /* Far enough that every source has wrapped into later epochs. */
    for (int i = 0; i < 37; i++)
        zt_loader_next(&a, in, tg);
    int64_t epoch = a.epoch, pos = a.pos;
    CHECK(epoch >= 1, "epoch %lld", (long long)epoch);
    ZT_ASSERT(zt_loader_init(&b, &d, B, T, 1, 2, true, false, 9) == ZT_OK);
    zt_loader_seek(&b, epoch, pos);
    for (int i = 0; i < 50; i++) {
        zt_loader_next(&a, in, tg);
        zt_loader_next(&b, in2, tg2);
        CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0,
              "batch %d after resuming at (%lld, %lld) differs", i, (long long)epoch,
              (long long)pos);
        CHECK(a.epoch == b.epoch && a.pos == b.pos);
    }
    zt_loader_free(&a);
    zt_loader_free(&b);
    zt_dataset_close(&d);

    const double bad[2] = {1, 0};
    const char *paths[2] = {check_tmp_path("m0.bin"), check_tmp_path("m2.bin")};
    zt_status s = zt_dataset_open_mixture(&d, paths, bad, 2, VOCAB);
    CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "weight 0") &&
              strstr(zt_last_error(), "m2.bin"), "%s", zt_last_error());
}

static void test_job_spec(void) {
    const char *head = "{\"model\": {\"n_layer\": 1, \"n_head\": 1, \"n_embd\": 8, \"vocab_size\": "
                       "256, \"block_size\": 8}, \"deepspeed\": {\"train_micro_batch_size_per_gpu\""
                       ": 1}, \"data\": ";
    char text[1024];
    zt_job_spec job;
    snprintf(text, sizeof text, "%s{\"train\": [{\"path\": \"web_*.bin\", \"weight\": 0.7}, "
             "{\"path\": \"/abs/code.bin\", \"weight\": 0.3}], \"tokenizer\": \"tok.json\"}}", head);
    zt_status s = zt_job_spec_parse(&job, text, "job.json", "/base");
    CHECK(s == ZT_OK, "%s", zt_last_error());
    if (s == ZT_OK) {
        CHECK(job.data.train == NULL && job.data.n_train_mix == 2);
        CHECK_STR(job.data.train_mix[0].path, "/base/web_*.bin");
        CHECK_STR(job.data.train_mix[1].path, "/abs/code.bin");
        CHECK(job.data.train_mix[0].weight == 0.7 && job.data.train_mix[1].weight == 0.3);
        CHECK_STR(job.data.tokenizer, "/base/tok.json");
        zt_job_spec_free(&job);
    }
    snprintf(text, sizeof text, "%s{\"train\": [{\"path\": \"a.bin\", \"weight\": 0}]}}", head);
    s = zt_job_spec_parse(&job, text, "job.json", "/base");
    check_error_is(__FILE__, __LINE__, "job", text, s, ZT_ERR_INVALID,
                   "job.json: key 'data.train[0].weight' must be > 0, got 0", false);
    snprintf(text, sizeof text, "%s{\"train\": [{\"path\": \"a.bin\", \"weigth\": 1}]}}", head);
    s = zt_job_spec_parse(&job, text, "job.json", "/base");
    CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "weigth"), "%s", zt_last_error());
    snprintf(text, sizeof text, "%s{\"train\": \"a.bin\", \"sample_tokens\": 8}}", head);
    s = zt_job_spec_parse(&job, text, "job.json", "/base");
    check_error_is(__FILE__, __LINE__, "job", text, s, ZT_ERR_INVALID,
                   "job.json: key 'data.sample_tokens' is 8 but data.tokenizer is not set", false);
    snprintf(text, sizeof text, "%s{\"train\": []}}", head);
    s = zt_job_spec_parse(&job, text, "job.json", "/base");
    CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "empty mixture"), "%s", zt_last_error());
}

int main(void) {
    check_tmpdir_create("zt_test_data_mix");
    test_glob();
    test_proportions();
    test_ranks();
    test_resume();
    test_job_spec();
    check_tmpdir_remove();
    return check_summary("test_data_mix");
}
