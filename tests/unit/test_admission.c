/* Admission (ztrain/admission.h) against formulas written here: GPT-2's parameter count
 * 12·L·C² + 13·L·C + V·C + T·C + 2·C and its activation bytes; the ZeRO paper's per-rank model
 * state for every stage, fp32 (4 + 4 + 8 bytes per parameter) and 16-bit (2 + 2 + 12), SGD's
 * smaller state and offload; a tensor-parallel shard's parameters and activations (GPT-2, and
 * Llama with kv heads shared by several shards) partitioned over world / tp ranks; limits, sizes that overflow (refused naming the field, never wrapped),
 * sizes as flags write them, and the host's memory read from a made-up /proc and cgroup tree;
 * a "cuda" job's device memory term by term against docs/gpu.md's formula (ZeRO stages 0-3,
 * fp32 and bf16, activation checkpointing, offload) and its refusal against a device limit and a
 * GPU; a pipeline.partition the workers would refuse (type:REGEX compiled and matched against
 * the layer types embed, block, head, as DeepSpeed's re.search with IGNORECASE) refused by the
 * estimate that validate, run and ztraind share. */
#define _XOPEN_SOURCE 700
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "ztrain/host_memory.h"
#include "ztrain/admission.h"
#include "ztrain/job_spec.h"
#include "ztrain/model.h"

typedef unsigned long long ull;

/* A job spec with these model dimensions and DeepSpeed config (JSON text), parsed. */
static zt_status job_at(zt_job_spec *job, int world, int L, int NH, int C, int V, int T,
                        const char *ds) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"name\": \"t\", \"world_size\": %d, \"model\": {\"type\": \"gpt2\", \"n_layer\": %d,"
             " \"n_head\": %d, \"n_embd\": %d, \"vocab_size\": %d, \"block_size\": %d},"
             " \"data\": {\"train\": \"train.bin\"}, \"deepspeed\": %s}",
             world, L, NH, C, V, T, ds);
    return zt_job_spec_parse(job, json, "spec", "/base");
}

static uint64_t gpt2_params(uint64_t L, uint64_t C, uint64_t V, uint64_t T) {
    return 12 * L * C * C + 13 * L * C + V * C + T * C + 2 * C;
}

/* GPT-2's activations at 4 bytes an element for B sequences of T, with every buffer a multiple
 * of 64 bytes (so the carving's alignment adds nothing): per layer ln1, qkv (3), atty, res2, ln2,
 * fch (4), fch_gelu (4), res3 = 16·B·T·C, four B·T statistics and the B·NH·T·T softmax; then the
 * embedding output, the final norm and its two statistics, the logits, the losses, and the
 * backward's dres, dln, datty, dqkv (3), dfch (4) and its own B·NH·T·T. */
static uint64_t gpt2_activations(uint64_t B, uint64_t T, uint64_t C, uint64_t NH, uint64_t V,
                                 uint64_t L) {
    uint64_t BT = B * T, att = B * NH * T * T;
    uint64_t per_layer = 16 * BT * C + 4 * BT + att;
    return 4 * (BT * C + L * per_layer + BT * C + 2 * BT + BT * V + BT + 10 * BT * C + att);
}

static void test_model_sizes(void) {
    static const int cases[][6] = {
        /* L, NH, C, V, T, B */
        {2, 2, 32, 256, 32, 2}, {4, 4, 128, 256, 64, 1}, {12, 12, 768, 50257, 1024, 4},
        {1, 8, 4096, 32000, 128, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *c = cases[i];
        zt_model_spec spec = {.type = "gpt2", .n_layer = c[0], .n_head = c[1], .n_embd = c[2],
                              .vocab_size = c[3], .block_size = c[4]};
        zt_model_estimate e;
        zt_model_estimate_args args = {.micro_batch = c[5], .act_size = 4};
        zt_status s = zt_model_estimate_spec(&spec, &args, "spec", &e);
        CHECK(s == ZT_OK, "case %zu: %s", i, zt_last_error());
        uint64_t L = c[0], NH = c[1], C = c[2], V = c[3], T = c[4], B = c[5];
        CHECK(e.params == gpt2_params(L, C, V, T), "case %zu: %llu", i, (ull)e.params);
        CHECK(e.layer_params == 12 * C * C + 13 * C, "case %zu", i);
        CHECK(e.outer_params == V * C + T * C + 2 * C, "case %zu", i);
        CHECK(e.n_tensors == 12 * L + 4 && e.n_layer == c[0], "case %zu", i);
        CHECK(e.activation_bytes == gpt2_activations(B, T, C, NH, V, L),
              "case %zu: %llu, formula %llu", i, (ull)e.activation_bytes,
              (ull)gpt2_activations(B, T, C, NH, V, L));
        /* Without a persistence threshold nothing is small; with 1000 the norms and biases
         * below it are (C ≤ 128 here: 4C < 1000 for the first two cases). */
        CHECK(e.persistent_params == 0, "case %zu", i);
        if (C <= 128) {
            args.persistence_threshold = 1000;
            CHECK(zt_model_estimate_spec(&spec, &args, "spec", &e) == ZT_OK);
            /* Per block the four norm tensors and the four biases, 13·C; ln_f outside. */
            CHECK(e.persistent_params == L * 13 * C + 2 * C,
                  "case %zu: %llu", i, (ull)e.persistent_params);
        }
    }
    /* Buffers that are not multiples of 64 bytes are rounded up each: the total lies between
     * the formula and the formula plus 64 bytes for each of the 13·L + 12 buffers. */
    zt_model_spec odd = {.type = "gpt2", .n_layer = 3, .n_head = 3, .n_embd = 33, .vocab_size = 257,
                         .block_size = 7};
    zt_model_estimate e;
    const zt_model_estimate_args args = {.micro_batch = 3, .act_size = 4};
    CHECK(zt_model_estimate_spec(&odd, &args, "spec", &e) == ZT_OK);
    uint64_t f = gpt2_activations(3, 7, 33, 3, 257, 3);
    CHECK(e.activation_bytes >= f && e.activation_bytes <= f + 64 * (13 * 3 + 12),
          "%llu vs %llu", (ull)e.activation_bytes, (ull)f);
}

/* Sizes whose products overflow: refused when the spec is read, naming the field. */
static void test_overflow(void) {
    static const struct {
        int L, NH, C, V, T, B;
        const char *fact;
    } cases[] = {
        /* 4·n_embd overflows the int the kernels take. */
        {1, 1, 600000000, 256, 32, 1, "model.n_embd (600000000) is too large"},
        {1, 1, INT_MAX, 256, 32, 1, "model.n_embd"},
        /* 16 blocks of 12·C² parameters wrap 64 bits. */
        {16, 4, 536870908, 256, 32, 1, "model.n_layer (16) blocks"},
        {INT_MAX, 1, 400000000, 256, 32, 1, "model.n_layer"},
        /* 2^26 sequences of 64 tokens are more than one forward's int. */
        {1, 1, 64, 256, 64, 1 << 26, "is 4294967296 tokens"},
        /* B·NH·T·T of the softmax wraps 64 bits. */
        {1, 400000000, 400000000, 256, 127, 1 << 24, "the activations of a micro-batch"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char ds[256];
        snprintf(ds, sizeof ds, "{\"train_micro_batch_size_per_gpu\": %d}", cases[i].B);
        zt_job_spec job;
        zt_status s = job_at(&job, 1, cases[i].L, cases[i].NH, cases[i].C, cases[i].V, cases[i].T,
                             ds);
        const char *msg = zt_last_error();
        CHECK(s == ZT_ERR_INVALID, "case %zu: %s", i, s == ZT_OK ? "accepted" : msg);
        CHECK(strncmp(msg, "spec: ", 6) == 0 && strstr(msg, cases[i].fact), "case %zu: %s", i, msg);
        if (s == ZT_OK)
            zt_job_spec_free(&job);
    }
}

typedef struct {
    uint64_t p, g, o; /* the formula's bytes per rank */
} state_bytes;

/* The ZeRO paper's per-rank model state for padded Ψ on N ranks at a stage, with P bytes per
 * parameter and gradient and K bytes of optimizer state. */
static state_bytes zero_formula(uint64_t psi, uint64_t N, int stage, uint64_t P, uint64_t K) {
    return (state_bytes){stage == 3 ? P * psi / N : P * psi, stage >= 2 ? P * psi / N : P * psi,
                         stage >= 1 ? K * psi / N : K * psi};
}

static void test_zero_formulas(void) {
    static const struct {
        const char *precision; /* the DeepSpeed section, or "" */
        const char *optimizer;
        uint64_t P, K;
    } kinds[] = {
        {"", "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}", 4, 8},
        {"\"bf16\": {\"enabled\": true},", "{\"type\": \"Adam\", \"params\": {\"lr\": 0.001}}", 2,
         12},
        {"\"fp16\": {\"enabled\": true},", "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}", 2,
         12},
        {"", "{\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"momentum\": 0.9}}", 4, 4},
        {"", "{\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}", 4, 0},
    };
    const int L = 4, C = 128, V = 256, T = 64;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (int world = 1; world <= 4; world *= 2) {
            for (int stage = 0; stage <= 3; stage++) {
                char ds[512];
                snprintf(ds, sizeof ds,
                         "{\"train_micro_batch_size_per_gpu\": 2, %s \"optimizer\": %s, "
                         "\"zero_optimization\": {\"stage\": %d}, "
                         "\"zero_allow_untested_optimizer\": true}",
                         kinds[k].precision, kinds[k].optimizer, stage);
                zt_job_spec job;
                if (job_at(&job, world, L, 4, C, V, T, ds) != ZT_OK) {
                    CHECK(false, "%s", zt_last_error());
                    continue;
                }
                zt_memory_estimate e;
                CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK, "%s", zt_last_error());
                uint64_t psi = gpt2_params(L, C, V, T);
                uint64_t padded = (psi + 16 * world - 1) / (16 * world) * (16 * world);
                state_bytes f = zero_formula(padded, world, stage, kinds[k].P, kinds[k].K);
                CHECK(e.params == psi && e.padded == padded);
                CHECK(e.param_bytes == f.p && e.grad_bytes == f.g && e.optimizer_bytes == f.o,
                      "kind %zu, N=%d, stage %d: %llu %llu %llu, formula %llu %llu %llu", k, world,
                      stage, (ull)e.param_bytes, (ull)e.grad_bytes, (ull)e.optimizer_bytes,
                      (ull)f.p, (ull)f.g, (ull)f.o);
                CHECK(e.offload_bytes == 0 && e.param_size == (int)kinds[k].P &&
                      e.state_size == (int)kinds[k].K);
                /* Mixed precision initialises the whole fp32 model before rounding it; fp32
                 * stages 0-2 hold nothing beyond the formula but stage 2's buckets. */
                if (kinds[k].P == 2)
                    CHECK(e.workspace_bytes >= 4 * padded, "kind %zu stage %d", k, stage);
                else if (stage < 2)
                    CHECK(e.workspace_bytes == 0, "kind %zu stage %d: %llu", k, stage,
                          (ull)e.workspace_bytes);
                CHECK(e.activation_bytes == gpt2_activations(2, T, C, 4, V, L));
                uint64_t sum = e.param_bytes + e.grad_bytes + e.optimizer_bytes +
                               e.workspace_bytes + e.activation_bytes + e.overhead_bytes;
                CHECK(e.rank_bytes == sum && e.job_bytes == sum * (uint64_t)world &&
                      e.ranks_per_host == world && e.host_bytes == e.job_bytes);
                CHECK(e.overhead_bytes >= ZT_RANK_BASELINE_BYTES);
                zt_job_spec_free(&job);
            }
        }
    }
}

/* GPT-2's parameters on one tensor-parallel shard of tp: c_attn, c_fc (weights and biases), the
 * attention's and MLP's c_proj weights and wte split (12·C²/tp + 7·C/tp per layer, V·C/tp), the
 * rest whole (ln_1, ln_2, the two c_proj biases: 6·C per layer; wpe, ln_f). */
static uint64_t gpt2_shard_params(uint64_t L, uint64_t C, uint64_t V, uint64_t T, uint64_t tp) {
    return L * (12 * C * C / tp + 7 * C / tp + 6 * C) + V * C / tp + T * C + 2 * C;
}

/* A shard's activations: per layer ln1, res2, ln2 and res3 whole, qkv (3), atty, fch (4) and
 * fch_gelu (4) at 1/tp, the statistics, and the softmax of its NH/tp heads; the embedding output,
 * the final norm, the logits of its V/tp rows, the losses; the backward's dres, dln and datty
 * (carved at the whole width) whole, dqkv and dfch at 1/tp; and the vocabulary-parallel loss's
 * 3·tp + 1 floats a token (every shard's three statistics, gathered, and the log-partition). */
static uint64_t gpt2_shard_activations(uint64_t B, uint64_t T, uint64_t C, uint64_t NH,
                                       uint64_t V, uint64_t L, uint64_t tp) {
    uint64_t BT = B * T, att = B * NH / tp * T * T;
    uint64_t per_layer = 4 * BT * C + 12 * BT * C / tp + 4 * BT + att;
    return 4 * (BT * C + L * per_layer + BT * C + 2 * BT + BT * V / tp + BT + 3 * BT * C +
                7 * BT * C / tp + att + (3 * tp + 1) * BT);
}

/* Tensor parallelism: every term is a shard's, and ZeRO partitions it over world / tp ranks
 * (the ranks holding the same shard), not over the world. */
static void test_tensor_parallel(void) {
    const int L = 4, C = 128, V = 256, T = 64, world = 8;
    for (int tp = 2; tp <= 8; tp *= 2) {
        for (int stage = 0; stage <= 3; stage++) {
            char ds[512];
            snprintf(ds, sizeof ds,
                     "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\", "
                     "\"params\": {\"lr\": 0.001}}, \"zero_optimization\": {\"stage\": %d}, "
                     "\"tensor_parallel\": {\"autotp_size\": %d}}", stage, tp);
            zt_job_spec job;
            if (job_at(&job, world, L, 8, C, V, T, ds) != ZT_OK) {
                CHECK(false, "%s", zt_last_error());
                continue;
            }
            zt_memory_estimate e;
            CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK, "%s", zt_last_error());
            const uint64_t N = (uint64_t)(world / tp);
            uint64_t psi = gpt2_shard_params(L, C, V, T, (uint64_t)tp);
            uint64_t padded = (psi + 16 * N - 1) / (16 * N) * (16 * N);
            state_bytes f = zero_formula(padded, N, stage, 4, 8);
            CHECK(e.params == psi && e.padded == padded && e.tp_size == tp &&
                  e.zero_size == (int)N, "tp %d: %llu parameters (formula %llu), N %d", tp,
                  (ull)e.params, (ull)psi, e.zero_size);
            CHECK(e.param_bytes == f.p && e.grad_bytes == f.g && e.optimizer_bytes == f.o,
                  "tp %d, stage %d: %llu %llu %llu, formula %llu %llu %llu", tp, stage,
                  (ull)e.param_bytes, (ull)e.grad_bytes, (ull)e.optimizer_bytes, (ull)f.p,
                  (ull)f.g, (ull)f.o);
            uint64_t act = gpt2_shard_activations(2, T, C, 8, V, L, (uint64_t)tp);
            CHECK(e.activation_bytes == act, "tp %d: activations %llu, formula %llu", tp,
                  (ull)e.activation_bytes, (ull)act);
            uint64_t sum = e.param_bytes + e.grad_bytes + e.optimizer_bytes + e.workspace_bytes +
                           e.activation_bytes + e.overhead_bytes;
            CHECK(e.rank_bytes == sum && e.job_bytes == sum * (uint64_t)world &&
                  e.ranks_per_host == world);
            char desc[768];
            zt_memory_estimate_describe(&e, desc, sizeof desc);
            CHECK(strstr(desc, "a tensor-parallel shard of") != NULL, "%s", desc);
            zt_job_spec_free(&job);
        }
    }
    /* Llama with 2 kv heads at tp 4: each shard holds one kv head (shared by 2 shards). Per
     * layer two norms (2·C), q and o at Q/tp rows or columns, k and v one head_dim each, gate,
     * up and down at I/tp; the embedding and lm_head at V/tp rows, the final norm. */
    const char *llama = "{\"name\": \"t\", \"world_size\": 4, \"model\": {\"type\": \"llama\", "
                        "\"n_layer\": 2, \"n_head\": 8, \"n_kv_head\": 2, \"n_embd\": 64, "
                        "\"intermediate_size\": 96, \"vocab_size\": 256, \"block_size\": 16, "
                        "\"tie_word_embeddings\": false}, \"data\": {\"train\": \"x.bin\"}, "
                        "\"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2, "
                        "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, "
                        "\"tensor_parallel\": {\"autotp_size\": 4}}}";
    zt_job_spec job;
    zt_memory_estimate e;
    if (zt_job_spec_parse(&job, llama, "spec", "/base") != ZT_OK) {
        CHECK(false, "%s", zt_last_error());
        return;
    }
    CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK, "%s", zt_last_error());
    const uint64_t lC = 64, HD = 8, Q = 8 * HD, I = 96, lV = 256, tp = 4;
    uint64_t want = 2 * (2 * lC + 2 * (Q / tp) * lC + 2 * HD * lC + 3 * (I / tp) * lC) +
                    2 * (lV / tp) * lC + lC;
    CHECK(e.params == want && e.zero_size == 1, "Llama 2 kv heads at tp 4: %llu parameters, "
          "formula %llu", (ull)e.params, (ull)want);
    zt_job_spec_free(&job);
}

static void test_offload(void) {
    const int L = 4, C = 128, V = 256, T = 64, world = 2;
    uint64_t psi = gpt2_params(L, C, V, T), part = psi / world; /* 834304 is a multiple of 32 */
    zt_job_spec job;
    zt_memory_estimate e;
    /* "cpu" moves Adam's 8 bytes (and bf16's 4 of masters) per slice element to host memory. */
    const char *cpu = "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}, "
                      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, "
                      "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
                      "{\"device\": \"cpu\"}}}";
    CHECK(job_at(&job, world, L, 4, C, V, T, cpu) == ZT_OK, "%s", zt_last_error());
    CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK);
    CHECK(e.optimizer_bytes == 0 && e.offload_bytes == 12 * part, "%llu", (ull)e.offload_bytes);
    CHECK(e.param_bytes == 2 * psi && e.grad_bytes == 2 * part);
    zt_job_spec_free(&job);
    /* "nvme" keeps only the buffers: buffer_count tiles of sub_group_size (a multiple of 2048)
     * for each of the two moments, and the 1 MiB bounce buffer; offload_param moves the stage-3
     * slice to a file with buffers of its own. */
    const char *nvme = "{\"train_micro_batch_size_per_gpu\": 1, "
                       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, "
                       "\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 8192, "
                       "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\", "
                       "\"buffer_count\": 4}, \"offload_param\": {\"device\": \"nvme\", "
                       "\"nvme_path\": \"/tmp\"}}}";
    CHECK(job_at(&job, world, L, 4, C, V, T, nvme) == ZT_OK, "%s", zt_last_error());
    CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK);
    uint64_t buffers = 4 * 8192 * 4 * 2 + 4 * 8192 * 4 + (1 << 20);
    CHECK(e.optimizer_bytes == 0 && e.param_bytes == 0 && e.offload_bytes == buffers,
          "%llu, want %llu", (ull)e.offload_bytes, (ull)buffers);
    CHECK(e.grad_bytes == 4 * part);
    zt_job_spec_free(&job);
}

static void test_limits(void) {
    const char *ds = "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": "
                     "\"AdamW\", \"params\": {\"lr\": 0.001}}}";
    zt_job_spec job;
    CHECK(job_at(&job, 4, 2, 2, 64, 256, 32, ds) == ZT_OK, "%s", zt_last_error());
    zt_memory_estimate e;
    CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK);
    zt_admission_limits lim = {.rank_bytes = e.rank_bytes, .rank_name = "--max-rank-memory",
                               .job_bytes = e.job_bytes, .job_name = "--max-job-memory",
                               .host_bytes = e.host_bytes, .host_name = "the host's memory"};
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "exactly at every limit");
    char limit_s[32];
    struct {
        uint64_t *limit;
        const char *name;
    } each[] = {{&lim.rank_bytes, "--max-rank-memory"}, {&lim.job_bytes, "--max-job-memory"},
                {&lim.host_bytes, "the host's memory"}};
    for (int i = 0; i < 3; i++) {
        uint64_t saved = *each[i].limit;
        *each[i].limit = saved - 1;
        zt_memory_estimate got;
        zt_status s = zt_admission_check(&job, &lim, "spec", &got);
        const char *msg = zt_last_error();
        zt_format_bytes(saved - 1, limit_s, sizeof limit_s);
        CHECK(s == ZT_ERR_INVALID && strstr(msg, "spec: the job does not fit") &&
                  strstr(msg, each[i].name) && strstr(msg, limit_s) &&
                  strstr(msg, "per rank for"),
              "%s: %s", each[i].name, msg);
        CHECK(got.rank_bytes == e.rank_bytes);
        *each[i].limit = saved;
    }
    /* nodes spread the ranks: a host holds ceil(4 / 3) = 2 of them. */
    job.nodes = 3;
    CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK);
    CHECK(e.ranks_per_host == 2 && e.host_bytes == 2 * e.rank_bytes);
    zt_job_spec_free(&job);
}

static void test_bytes(void) {
    static const struct {
        const char *text;
        uint64_t want;
    } good[] = {{"1000", 1000},       {"512M", 512ull << 20}, {"64G", 64ull << 30},
                {"64g", 64ull << 30}, {"1.5GiB", 3ull << 29}, {"2 TB", 2ull << 40},
                {"4KiB", 4096},       {"7B", 7}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 0;
        CHECK(zt_parse_bytes(good[i].text, "--max-rank-memory", &v) == ZT_OK && v == good[i].want,
              "'%s': %llu", good[i].text, (ull)v);
    }
    static const char *const bad[] = {"", "0", "-1G", "12Q", "G", "nan", "1e30T", "64 G B"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v;
        zt_status s = zt_parse_bytes(bad[i], "--max-job-memory", &v);
        CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "--max-job-memory expects"),
              "'%s'", bad[i]);
    }
    char buf[32];
    zt_format_bytes(512, buf, sizeof buf);
    CHECK_STR(buf, "512 B");
    zt_format_bytes(1536, buf, sizeof buf);
    CHECK_STR(buf, "1.5 KiB");
    zt_format_bytes(3ull << 30, buf, sizeof buf);
    CHECK_STR(buf, "3.0 GiB");
}

static void write_at(const char *rel, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", check_tmp_path(rel));
    for (char *p = path + strlen(check_tmpdir) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0700);
        *p = '/';
    }
    check_write_file(path, text, strlen(text));
}

static void test_host_memory(void) {
    write_at("meminfo", "MemTotal:       16777216 kB\nMemFree:  100 kB\n"
                        "MemAvailable:   10485760 kB\nBuffers: 5 kB\n");
    char meminfo[PATH_MAX], root[PATH_MAX];
    snprintf(meminfo, sizeof meminfo, "%s", check_tmp_path("meminfo"));
    snprintf(root, sizeof root, "%s", check_tmp_path("sys"));
    zt_host_memory hm;
    CHECK(zt_host_memory_read_from(meminfo, NULL, root, &hm) == ZT_OK);
    CHECK(hm.total == 16ull << 30 && hm.available == 10ull << 30 && !hm.cgroup_limited);

    /* cgroup v2: a 4 GiB limit on the parent, none ("max") on the process's own level; 2 GiB
     * used of which 1 GiB is inactive page cache leaves 3 GiB. */
    write_at("cg2", "0::/a/b\n");
    write_at("sys/a/memory.max", "4294967296\n");
    write_at("sys/a/memory.current", "2147483648\n");
    write_at("sys/a/memory.stat", "anon 1073741824\ninactive_file 1073741824\nactive_file 0\n");
    write_at("sys/a/b/memory.max", "max\n");
    write_at("sys/a/b/memory.current", "2147483648\n");
    CHECK(zt_host_memory_read_from(meminfo, check_tmp_path("cg2"), root, &hm) == ZT_OK);
    CHECK(hm.total == 4ull << 30 && hm.available == 3ull << 30 && hm.cgroup_limited,
          "%llu %llu", (ull)hm.total, (ull)hm.available);

    /* cgroup v1 as Docker shows it: the path in /proc/self/cgroup is the host's, the container's
     * own cgroup is mounted at the controller's root. v1's "unlimited" is a huge number. */
    write_at("cg1", "9:name=systemd:/docker/x\n4:cpu,memory:/docker/x\n0::/\n");
    write_at("sys/memory/memory.limit_in_bytes", "8589934592\n");
    write_at("sys/memory/memory.usage_in_bytes", "1073741824\n");
    write_at("sys/memory/memory.stat", "cache 0\ntotal_inactive_file 0\n");
    CHECK(zt_host_memory_read_from(meminfo, check_tmp_path("cg1"), root, &hm) == ZT_OK);
    CHECK(hm.total == 8ull << 30 && hm.available == 7ull << 30 && hm.cgroup_limited,
          "%llu %llu", (ull)hm.total, (ull)hm.available);
    write_at("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
    CHECK(zt_host_memory_read_from(meminfo, check_tmp_path("cg1"), root, &hm) == ZT_OK);
    CHECK(hm.total == 16ull << 30 && hm.available == 10ull << 30 && !hm.cgroup_limited);

    CHECK(zt_host_memory_read_from(check_tmp_path("none"), NULL, root, &hm) == ZT_ERR_IO);
    /* This machine's own: something, and no more available than there is. */
    CHECK(zt_host_memory_read(&hm) == ZT_OK && hm.total > 0 && hm.available <= hm.total);
}

/* GPT-2's device activations on the CUDA backend (docs/gpu.md, "Device memory"), es bytes an
 * element, every buffer a multiple of 64 bytes: per block 16·B·T·C elements (ln1, q k v, atty,
 * res2, ln2, the FC pre-activation 4 and GELU output 4, the block output) and fp32 LayerNorm
 * statistics 4·B·T and flash attention's log-sum-exp B·H·T (no T×T matrix); the embedding
 * output; the final norm's output and statistics, the logits, the losses; the backward's dres and
 * one block's gradients (FC 4, QKV 3, attention output, norm output) and its per-row term. With
 * checkpointing every k blocks: ceil(L/k) group inputs and k blocks. */
static uint64_t gpt2_device_activations(uint64_t B, uint64_t T, uint64_t C, uint64_t H,
                                        uint64_t V, uint64_t L, uint64_t es, uint64_t k) {
    const uint64_t BT = B * T, BTC = BT * C, f32 = 4;
    const uint64_t block = es * 16 * BTC + f32 * (4 * BT + B * H * T);
    const uint64_t kept = k ? (k < L ? k : L) * block + es * ((L + k - 1) / k) * BTC
                            : L * block + es * BTC;
    const uint64_t head = es * BTC + f32 * 2 * BT + es * BT * V + f32 * BT;
    const uint64_t backward = es * BTC + es * 9 * BTC + f32 * B * H * T;
    return kept + head + backward;
}

/* A grown scratch buffer: a quarter more than asked. */
static uint64_t grown(uint64_t n) { return n + n / 4; }

/* The device estimate of GPT-2 jobs against the ZeRO paper's accounting on the CUDA backend
 * (docs/gpu.md's table): every stage in fp32 and bf16 on two ranks, with and without activation
 * checkpointing, each term against its formula. */
static void test_device_terms(void) {
    const uint64_t L = 2, H = 2, C = 64, V = 256, T = 32, B = 2, N = 2;
    const uint64_t psi = gpt2_params(L, C, V, T), p = (psi + 16 * N - 1) / (16 * N) * (16 * N);
    for (int half = 0; half <= 1; half++)
        for (int stage = 0; stage <= 3; stage++)
            for (int k = 0; k <= 1; k++) {
                char ds[512];
                snprintf(ds, sizeof ds, "{\"train_micro_batch_size_per_gpu\": %d, %s"
                         "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, "
                         "\"zero_optimization\": {\"stage\": %d}}", (int)B,
                         half ? "\"bf16\": {\"enabled\": true}, " : "", stage);
                zt_job_spec job;
                CHECK(job_at(&job, (int)N, (int)L, (int)H, (int)C, (int)V, (int)T, ds) == ZT_OK,
                      "%s", zt_last_error());
                job.model.checkpoint_interval = k;
                zt_memory_estimate e;
                CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK && !e.has_device,
                      "a cpu job has no device figure");
                job.device = ZT_DEVICE_CUDA;
                CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK && e.has_device);
                const zt_device_estimate *d = &e.device;
                const uint64_t part = p / N;
                /* Below ZT_CUDA_VMM_MIN_BYTES (this model) every buffer is cudaMalloc's, whose
                 * released ranges stay allocated: the 16-bit parameters whole, and the model's
                 * fp32 parameters (4Ψ) whole in mixed precision, its fp32 gradients whole in
                 * fp32 from stage 2 beside the slice ZeRO accumulates, and in mixed precision
                 * from stage 2 the 16-bit gradients the ops write (2Ψ) beside that slice. In
                 * mixed precision the fp32 gradients, never written, are a reservation that
                 * holds nothing at any size (backend.h, zt_backend_reserve). */
                /* At stage 3 in fp32 also the buffer of the tensors kept whole: under the
                 * default stage3_param_persistence_threshold (100,000) every tensor of this
                 * model, Ψ of them. */
                const uint64_t want_p = half ? 2 * p : 4 * p + (stage == 3 ? 4 * psi : 0);
                const uint64_t want_g =
                    (half ? 2 : 4) * (stage >= 2 ? part : p) + (half && stage >= 2 ? 2 * p : 0);
                /* Adam's two fp32 moments, and in bf16 the fp32 masters, of the optimizer's
                 * share. */
                const uint64_t want_o = (half ? 12 : 8) * (stage >= 1 ? part : p);
                const uint64_t want_copy = half ? 4 * p : stage >= 2 ? 4 * p : 0;
                /* Nothing is held only at setup: the step holds all of the fp32 model. */
                const uint64_t want_rel = 0;
                const uint64_t want_act =
                    gpt2_device_activations(B, T, C, H, V, L, half ? 2 : 4, (uint64_t)k);
                /* The sums, the scratch for tokens, buckets and the channel partials (the
                 * larger of the FC bias's 4·C channels over tiles of 64 rows and a LayerNorm's
                 * 2·C over the fused backward's tiles of 32 rows) and for the FC
                 * bias's gradient from cuBLASLt's epilogue (4·C floats), the read-back slots (one
                 * micro-batch, the next step's two counts of targets, two norm pieces, a slot a
                 * tensor, and the step table's entry of each of the N ranks: 4 for the one
                 * micro-batch and 3 values) and in bf16 ZeRO's chunk. */
                const uint64_t BT = B * T, bias = (BT + 63) / 64 * 4 * C;
                const uint64_t norm = (BT + 31) / 32 * 2 * C;
                const uint64_t partials = bias > norm ? bias : norm;
                const uint64_t want_ws = (2 * 1024 + 2) * 8 + grown(BT * 4) +
                                         grown((3 * BT + 2) * 4) + grown(4 * partials) +
                                         grown(4 * 4 * C) + (1 + 2 + 2 + 12 * L + 4 + N * (4 + 3)) * 8 +
                                         (half ? 4 << 16 : 0);
                CHECK(d->param_bytes == want_p && d->grad_bytes == want_g &&
                          d->optimizer_bytes == want_o && d->fp32_copy_bytes == want_copy &&
                          d->setup_bytes == want_rel,
                      "%s stage %d: parameters %llu (%llu), gradients %llu (%llu), optimizer %llu "
                      "(%llu), fp32 copy %llu (%llu), setup %llu (%llu)",
                      half ? "bf16" : "fp32", stage, (ull)d->param_bytes, (ull)want_p,
                      (ull)d->grad_bytes, (ull)want_g, (ull)d->optimizer_bytes, (ull)want_o,
                      (ull)d->fp32_copy_bytes, (ull)want_copy, (ull)d->setup_bytes,
                      (ull)want_rel);
                CHECK(d->activation_bytes == want_act, "%s stage %d, checkpointing %d: "
                      "activations %llu, formula %llu", half ? "bf16" : "fp32", stage, k,
                      (ull)d->activation_bytes, (ull)want_act);
                CHECK(d->cublas_bytes == 32u << 20 && d->workspace_bytes == want_ws,
                      "workspaces %llu, formula %llu", (ull)d->workspace_bytes, (ull)want_ws);
                CHECK(d->total_bytes == want_p + want_g + want_o + want_copy + want_rel +
                                            want_act + (32u << 20) + want_ws);
                zt_job_spec_free(&job);
            }
    /* Offloaded, the optimizer's share leaves the device; the rest stays. */
    const char *off = "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, "
                      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, "
                      "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
                      "{\"device\": \"cpu\"}}}";
    zt_job_spec job;
    CHECK(job_at(&job, (int)N, (int)L, (int)H, (int)C, (int)V, (int)T, off) == ZT_OK);
    job.device = ZT_DEVICE_CUDA;
    zt_memory_estimate e;
    CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK);
    CHECK(e.device.optimizer_bytes == 0 && e.device.grad_bytes == 2 * (p / N) + 2 * p &&
          e.device.fp32_copy_bytes == 4 * p && e.device.setup_bytes == 0);
    zt_job_spec_free(&job);
}

/* A "cuda" job above the device limit or the GPU is refused naming the figure, the limit and
 * the changes that would fit; a "cpu" job is not judged by them. */
static void test_device_refusal(void) {
    const char *ds = "{\"train_micro_batch_size_per_gpu\": 8, \"optimizer\": {\"type\": "
                     "\"AdamW\", \"params\": {\"lr\": 0.001}}}";
    zt_job_spec job;
    CHECK(job_at(&job, 4, 4, 4, 256, 4096, 256, ds) == ZT_OK, "%s", zt_last_error());
    job.device = ZT_DEVICE_CUDA;
    zt_memory_estimate e;
    CHECK(zt_memory_estimate_job(&job, "spec", &e) == ZT_OK);
    const uint64_t need = e.device.total_bytes;
    zt_admission_limits lim = {.device_bytes = need, .device_name = "--max-device-memory"};
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "exactly at the limit");
    /* Stage 3 alone brings it under a limit just below: ZeRO partitions the 16Ψ. */
    lim.device_bytes = need - 1;
    zt_status s = zt_admission_check(&job, &lim, "spec", NULL);
    char need_s[32], lim_s[32];
    zt_format_bytes(need, need_s, sizeof need_s);
    zt_format_bytes(need - 1, lim_s, sizeof lim_s);
    const char *msg = zt_last_error();
    CHECK(s == ZT_ERR_INVALID && strstr(msg, "spec: the job does not fit on the GPU") &&
              strstr(msg, need_s) && strstr(msg, "--max-device-memory") &&
              strstr(msg, "activations") && strstr(msg, "ZeRO stage 3 (") &&
              strstr(msg, "train_micro_batch_size_per_gpu 4 ("),
          "%s", msg);
    /* Far too little: nothing alone fits, and the message says what is left. */
    lim.device_bytes = 1 << 20;
    s = zt_admission_check(&job, &lim, "spec", NULL);
    CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "none of a higher ZeRO stage"),
          "%s", zt_last_error());
    /* A GPU is compared with the estimate and the reserve for the context. */
    lim = (zt_admission_limits){.gpu_bytes = need + ZT_DEVICE_RESERVE_BYTES,
                                .gpu_name = "GPU 0 (test)"};
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK);
    lim.gpu_bytes--;
    s = zt_admission_check(&job, &lim, "spec", NULL);
    CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "GPU 0 (test)") &&
              strstr(zt_last_error(), "for the CUDA context"), "%s", zt_last_error());
    lim.gpu_bytes = 1 << 20;
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_ERR_INVALID, "below the reserve");
    /* Four ranks on two GPUs: two share each, and each must fit half of it with its reserve. */
    lim = (zt_admission_limits){.gpu_bytes = need + ZT_DEVICE_RESERVE_BYTES,
                                .gpu_name = "GPU 0 (test)", .gpus = 2};
    s = zt_admission_check(&job, &lim, "spec", NULL);
    CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "a 1/2 share of GPU 0 (test), which 2 "
                                                         "ranks share"), "%s", zt_last_error());
    lim.gpu_bytes = 2 * (need + ZT_DEVICE_RESERVE_BYTES);
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "two ranks fit a GPU twice "
          "their size: %s", zt_last_error());
    lim.gpus = 4;
    lim.gpu_bytes = need + ZT_DEVICE_RESERVE_BYTES;
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "a GPU each: %s",
          zt_last_error());
    /* "comm": "nccl" needs a GPU per rank of a host (NCCL refuses two ranks on one GPU): four
     * ranks on two GPUs are refused naming the key, whatever the memory; "auto" shares them. */
    lim = (zt_admission_limits){.gpu_bytes = 8 * (need + ZT_DEVICE_RESERVE_BYTES),
                                .gpu_name = "GPU 0 (test)", .gpus = 2};
    job.comm = ZT_COMM_NCCL;
    s = zt_admission_check(&job, &lim, "spec", NULL);
    CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), "spec: key 'comm' is \"nccl\"") &&
              strstr(zt_last_error(), "the 4 ranks on one host would share 2 GPU(s)"),
          "%s", zt_last_error());
    lim.gpus = 4;
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "nccl, a GPU each: %s",
          zt_last_error());
    lim.gpus = 0; /* no GPU count known (ztraind under Slurm): not judged here */
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "nccl, GPUs unknown: %s",
          zt_last_error());
    lim.gpus = 2;
    job.comm = ZT_COMM_AUTO;
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "auto shares the GPUs: %s",
          zt_last_error());
    /* The same limits do not apply to a CPU job. */
    job.device = ZT_DEVICE_CPU;
    lim.device_bytes = 1;
    CHECK(zt_admission_check(&job, &lim, "spec", NULL) == ZT_OK, "%s", zt_last_error());
    zt_job_spec_free(&job);
}

/* The estimate refuses, naming pipeline.partition (message and field), a type:REGEX that would
 * make every worker fail; patterns that find a type (case-insensitively, anywhere) pass. */
static void test_partition(void) {
    static const struct {
        const char *method, *want; /* want NULL: accepted */
    } cases[] = {
        {"type:xyz", "spec: key 'pipeline.partition' \"type:xyz\": matches no layer; the layer "
                     "types are embed, block, head"},
        {"type:(", "spec: key 'pipeline.partition' \"type:(\": the pattern does not compile at "
                   "offset 1"},
        {"type:", "spec: key 'pipeline.partition' \"type:\": type: needs a pattern of 1 to 255 "
                  "characters"},
        {"type:embed", NULL}, {"type:BLOCK", NULL}, {"type:ea", NULL}, {"type:^h", NULL},
        {"parameters", NULL}, {"uniform", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"name\": \"t\", \"world_size\": 2, \"model\": {\"type\": \"gpt2\", "
                 "\"n_layer\": 4, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 256, "
                 "\"block_size\": 16}, \"data\": {\"train\": \"train.bin\"}, "
                 "\"pipeline\": {\"stages\": 2, \"partition\": \"%s\"}, "
                 "\"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2}}",
                 cases[i].method);
        zt_job_spec job;
        zt_status s = zt_job_spec_parse(&job, json, "spec", "/base");
        CHECK(s == ZT_OK, "%s: %s", cases[i].method, zt_last_error());
        if (s != ZT_OK)
            continue;
        zt_memory_estimate e;
        s = zt_memory_estimate_job(&job, "spec", &e);
        if (!cases[i].want) {
            CHECK(s == ZT_OK, "%s: %s", cases[i].method, zt_last_error());
        } else {
            CHECK(s == ZT_ERR_INVALID &&
                      strncmp(zt_last_error(), cases[i].want, strlen(cases[i].want)) == 0,
                  "%s: got '%s'", cases[i].method, zt_last_error());
            CHECK_STR(zt_last_error_field(), "pipeline.partition");
        }
        zt_job_spec_free(&job);
    }
}

int main(void) {
    check_tmpdir_create("zt_admission");
    test_partition();
    test_device_terms();
    test_device_refusal();
    test_model_sizes();
    test_overflow();
    test_zero_formulas();
    test_tensor_parallel();
    test_offload();
    test_limits();
    test_bytes();
    test_host_memory();
    check_tmpdir_remove();
    return check_summary("test_admission");
}
