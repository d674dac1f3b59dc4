/* Pipeline stages and activation checkpointing of the model families, on tiny models on the CPU:
 * a model cut into 2 or 3 stages run one after another gives exactly the whole model's loss and
 * gradients (the tied embedding's two shares summing to the whole model's gradient); several
 * activation sets with interleaved forwards and backwards equal one micro-batch at a time;
 * checkpointing every 1, 2 or 3 blocks, in device or host memory, changes no bit of the loss or
 * the gradients at fp32 or bf16; the activation bytes it saves are the README's formula; and a
 * stage loads its share of a whole model's safetensors file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/model.h"

enum { L = 4, B = 2, T = 8, SEED = 7 };

static zt_model_spec spec_of(const char *type, bool tied) {
    zt_model_spec s = {.n_layer = L, .n_head = 4, .n_embd = 32, .vocab_size = 97,
                       .block_size = T};
    snprintf(s.type, sizeof s.type, "%s", type);
    if (strcmp(type, "llama") == 0) {
        s.n_kv_head = 2;
        s.intermediate_size = 48;
        s.rms_norm_eps = 1e-5;
        s.rope_theta = 10000;
        s.rope_factor = 1;
        s.rope_low_freq_factor = 1;
        s.rope_high_freq_factor = 4;
        s.rope_original_max_position = 8192;
        s.tie_word_embeddings = tied;
    }
    return s;
}

/* Tokens that are all different, so that no embedding row gathers two positions' gradients: the
 * whole model adds the head's share to a row before the embedding's and a pipeline after, which
 * is the same sum only for one term each. Targets repeat freely; one is ignored (-1). */
static void batch_of(int mb, int32_t *tokens, int32_t *targets) {
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (i * 37 + mb * 11) % 97;
        targets[i] = (i * 5 + mb * 3 + 1) % 97;
    }
    targets[3] = -1;
}

/* A model's gradients (or parameters) by tensor name, read back to the host. */
typedef struct {
    int n;
    zt_tensor_info *t;
    float *v;
} snapshot;

static snapshot snap(zt_model *m, bool grads) {
    snapshot s = {m->n_tensors, malloc(sizeof(zt_tensor_info) * (size_t)m->n_tensors),
                  malloc(sizeof(float) * (m->n_params ? m->n_params : 1))};
    memcpy(s.t, m->tensors, sizeof(zt_tensor_info) * (size_t)m->n_tensors);
    zt_backend_copy(m->ctx.be, s.v, grads ? m->grads : m->params, m->n_params * sizeof(float),
                    ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    return s;
}

static void snap_free(snapshot *s) {
    free(s->t);
    free(s->v);
}

static const zt_tensor_info *find(const snapshot *s, const char *name, bool tied_copy) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->t[i].name, name) == 0 && s->t[i].tied_copy == tied_copy)
            return &s->t[i];
    return NULL;
}

/* Over several micro-batches the whole model adds the tied embedding's two shares in another
 * order than a pipeline (head, embedding, head, embedding against the sum of each's), so that sum
 * is equal only within rounding: a few fp32 ulps of the largest term. */
static double tied_tolerance = 0.0;

/* Bitwise equality of want[name] and got[name] (+ extra[name] when given, within
 * tied_tolerance relative to the larger magnitude). */
static void same_tensor(const char *what, const snapshot *want, const zt_tensor_info *wt,
                        const snapshot *got, const zt_tensor_info *gt, const snapshot *extra,
                        const zt_tensor_info *et) {
    size_t bad = 0, first = 0;
    float first_v = 0;
    for (size_t i = 0; i < wt->numel; i++) {
        float v = got->v[gt->offset + i], w = want->v[wt->offset + i];
        bool ok;
        if (et) {
            float a = v, b = extra->v[et->offset + i];
            v = a + b;
            double scale = fmax(fabs((double)a), fabs((double)b));
            ok = memcmp(&v, &w, sizeof v) == 0 || fabs((double)v - w) <= tied_tolerance * scale;
        } else {
            ok = memcmp(&v, &w, sizeof v) == 0;
        }
        if (!ok && !bad++) {
            first = i;
            first_v = v;
        }
    }
    CHECK(bad == 0, "%s: %s differs at %zu of %zu elements (first [%zu]: %.9g, want %.9g)", what,
          wt->name, bad, wt->numel, first, (double)first_v,
          (double)want->v[wt->offset + first]);
}

/* Every tensor of `want` equals the same-named tensor of `got`. */
static void same_all(const char *what, const snapshot *want, const snapshot *got) {
    CHECK(want->n == got->n, "%s: %d tensors, want %d", what, got->n, want->n);
    for (int i = 0; i < want->n; i++) {
        const zt_tensor_info *gt = find(got, want->t[i].name, want->t[i].tied_copy);
        if (check_at(__FILE__, __LINE__, gt != NULL, "%s: %s missing", what, want->t[i].name))
            same_tensor(what, want, &want->t[i], got, gt, NULL, NULL);
    }
}

static bool same_float(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static zt_model *create(const zt_model_spec *s, zt_backend *be, zt_dtype act,
                        const zt_model_stage *st) {
    zt_model *m = NULL;
    zt_status rc = zt_model_create_stage(&m, s, be, act, B, 1, st);
    if (!check_at(__FILE__, __LINE__, rc == ZT_OK, "%s: create stage [%d,%d): %s", s->type,
                  st->first_layer, st->last_layer, zt_last_error()))
        return NULL;
    CHECK(m->ops->init_weights(m, SEED) == ZT_OK);
    return m;
}

/* The whole model over micro-batches 0..mbs-1, one forward and backward each (gradients
 * accumulate); losses[mb]. */
static zt_model *run_whole(const zt_model_spec *s, zt_backend *be, zt_dtype act, int mbs,
                           float *losses) {
    zt_model_stage full = zt_model_full_stage(s->n_layer);
    zt_model *m = create(s, be, act, &full);
    if (!m)
        return NULL;
    for (int mb = 0; mb < mbs; mb++) {
        int32_t tokens[B * T], targets[B * T];
        batch_of(mb, tokens, targets);
        losses[mb] = m->ops->forward(m, tokens, targets, B, T, 1.0f / (B * T));
        m->ops->backward(m);
    }
    return m;
}

/* The stages of a split, run one after another: every micro-batch's forward through all stages,
 * then (interleaved: after all forwards, buffer mb for micro-batch mb) the backwards in reverse
 * stage order. */
static void run_split(zt_model **st, int n, int mbs, bool interleaved, float *losses) {
    zt_backend *be = st[0]->ctx.be;
    const size_t bytes = (size_t)B * T * st[0]->spec.n_embd *
                         zt_backend_act_size(be, st[0]->ctx.act);
    void *act[4][4], *grad[4];
    for (int i = 0; i < n; i++) {
        grad[i] = zt_backend_alloc(be, ZT_MEM_DEVICE, bytes);
        for (int mb = 0; mb < mbs; mb++)
            act[i][mb] = zt_backend_alloc(be, ZT_MEM_DEVICE, bytes);
    }
    for (int round = 0; round < (interleaved ? 1 : mbs); round++) {
        int lo = interleaved ? 0 : round, hi = interleaved ? mbs : round + 1;
        for (int mb = lo; mb < hi; mb++) {
            int32_t tokens[B * T], targets[B * T];
            batch_of(mb, tokens, targets);
            int buf = interleaved ? mb : 0;
            for (int i = 0; i < n; i++)
                losses[mb] = st[i]->ops->stage_forward(st[i], buf, tokens,
                                                       i ? act[i - 1][mb] : NULL, targets,
                                                       act[i][mb], B, T, 1.0f / (B * T));
        }
        for (int mb = lo; mb < hi; mb++) {
            int buf = interleaved ? mb : 0;
            for (int i = n - 1; i >= 0; i--)
                st[i]->ops->stage_backward(st[i], buf, i + 1 < n ? grad[i + 1] : NULL,
                                           i ? grad[i] : NULL);
        }
    }
    for (int i = 0; i < n; i++) {
        zt_backend_free(be, ZT_MEM_DEVICE, grad[i], bytes);
        for (int mb = 0; mb < mbs; mb++)
            zt_backend_free(be, ZT_MEM_DEVICE, act[i][mb], bytes);
    }
}

/* Compares a split's parameters and gradients with the whole model's, tensor by tensor; the
 * embedding's gradient as the first stage's plus the last stage's tied copy's. */
static void compare_split(const char *what, zt_model *whole, zt_model **st, int n) {
    snapshot wp = snap(whole, false), wg = snap(whole, true);
    int seen = 0;
    snapshot first_g = snap(st[0], true);
    for (int i = 0; i < n; i++) {
        snapshot p = snap(st[i], false), g = snap(st[i], true);
        for (int t = 0; t < p.n; t++) {
            const zt_tensor_info *mine = &p.t[t];
            const zt_tensor_info *w = find(&wp, mine->name, false);
            if (!check_at(__FILE__, __LINE__, w != NULL, "%s: stage %d's %s is no tensor of the "
                          "whole model", what, i, mine->name))
                continue;
            /* Every stage starts from the whole model's values, the copy included. */
            same_tensor(what, &wp, w, &p, mine, NULL, NULL);
            if (mine->tied_copy) {
                CHECK(i == n - 1 && st[i]->stage.head && !st[i]->stage.embed);
                const zt_tensor_info *e = find(&first_g, mine->name, false);
                if (check_at(__FILE__, __LINE__, e != NULL, "%s: the first stage has %s", what,
                             mine->name))
                    same_tensor(what, &wg, w, &g, mine, &first_g, e);
            } else {
                seen++;
                /* The first stage's share of a tied embedding is checked with the copy's. */
                bool tied_elsewhere = false;
                for (int j = 1; j < n && i == 0; j++)
                    for (int u = 0; u < st[j]->n_tensors; u++)
                        tied_elsewhere |= st[j]->tensors[u].tied_copy &&
                                          strcmp(st[j]->tensors[u].name, mine->name) == 0;
                if (!tied_elsewhere)
                    same_tensor(what, &wg, w, &g, mine, NULL, NULL);
            }
        }
        snap_free(&p);
        snap_free(&g);
    }
    CHECK(seen == whole->n_tensors, "%s: the stages hold %d of the whole model's %d tensors", what,
          seen, whole->n_tensors);
    snap_free(&first_g);
    snap_free(&wp);
    snap_free(&wg);
}

static void test_split(zt_backend *be, const char *type, bool tied, int n,
                       const zt_model_stage *stages, int mbs, bool interleaved) {
    zt_model_spec s = spec_of(type, tied);
    char what[160];
    snprintf(what, sizeof what, "%s%s %d stages (first [%d,%d)), %d micro-batches%s", type,
             tied ? " tied" : "", n, stages[0].first_layer, stages[0].last_layer, mbs,
             interleaved ? " interleaved" : "");
    float want[4] = {0}, got[4] = {0};
    zt_model *whole = run_whole(&s, be, ZT_F32, mbs, want);
    zt_model *st[4] = {0};
    bool ok = whole != NULL;
    for (int i = 0; i < n && ok; i++)
        ok = (st[i] = create(&s, be, ZT_F32, &stages[i])) != NULL;
    zt_model *seq[4] = {0};
    if (ok) {
        run_split(st, n, mbs, interleaved, got);
        for (int mb = 0; mb < mbs; mb++)
            CHECK(same_float(got[mb], want[mb]), "%s: micro-batch %d loss %.9g, want %.9g", what,
                  mb, (double)got[mb], (double)want[mb]);
        tied_tolerance = mbs > 1 ? 4 * 0x1p-23 : 0.0;
        compare_split(what, whole, st, n);
        tied_tolerance = 0.0;
    }
    if (ok && interleaved) {
        /* The same stages with one activation set each, one micro-batch at a time: every
         * gradient equal bit for bit, the tied ones included. */
        for (int i = 0; i < n && ok; i++) {
            zt_model_stage one = stages[i];
            one.buffers = 1;
            ok = (seq[i] = create(&s, be, ZT_F32, &one)) != NULL;
        }
        if (ok) {
            float seq_losses[4] = {0};
            run_split(seq, n, mbs, false, seq_losses);
            for (int i = 0; i < n; i++) {
                snapshot a = snap(seq[i], true), b = snap(st[i], true);
                same_all(what, &a, &b);
                snap_free(&a);
                snap_free(&b);
            }
            for (int mb = 0; mb < mbs; mb++)
                CHECK(same_float(got[mb], seq_losses[mb]));
        }
    }
    for (int i = 0; i < n; i++) {
        zt_model_destroy(st[i]);
        zt_model_destroy(seq[i]);
    }
    zt_model_destroy(whole);
}

static void test_splits(zt_backend *be, const char *type, bool tied) {
    const zt_model_stage two[2] = {{0, 2, true, false, 2, 1, 0}, {2, L, false, true, 2, 1, 0}};
    const zt_model_stage three[3] = {{0, 1, true, false, 2, 1, 0}, {1, 3, false, false, 2, 1, 0},
                                     {3, L, false, true, 2, 1, 0}};
    /* Stages without blocks: the embedding alone, and the head alone. */
    const zt_model_stage bare[3] = {{0, 0, true, false, 2, 1, 0}, {0, L, false, false, 2, 1, 0},
                                    {L, L, false, true, 2, 1, 0}};
    test_split(be, type, tied, 2, two, 1, false);
    test_split(be, type, tied, 3, three, 1, false);
    test_split(be, type, tied, 3, bare, 1, false);
    test_split(be, type, tied, 2, two, 2, true);
    test_split(be, type, tied, 3, three, 2, true);
}

/* Checkpointing every `every` blocks (host memory: cpu) against keeping everything: same losses
 * and gradients, bit for bit, over two micro-batches. */
static void test_checkpointing(zt_backend *be, const char *type, zt_dtype act, int every,
                               bool cpu) {
    zt_model_spec s = spec_of(type, true);
    char what[128];
    snprintf(what, sizeof what, "%s %s checkpoint_interval %d%s", type,
             act == ZT_F32 ? "fp32" : "bf16", every, cpu ? " cpu" : "");
    float want[2] = {0}, got[2] = {0};
    zt_model *plain = run_whole(&s, be, act, 2, want);
    s.checkpoint_interval = every;
    s.checkpoint_cpu = cpu;
    zt_model *ck = run_whole(&s, be, act, 2, got);
    if (plain && ck) {
        for (int mb = 0; mb < 2; mb++)
            CHECK(same_float(got[mb], want[mb]), "%s: micro-batch %d loss %.9g, want %.9g", what,
                  mb, (double)got[mb], (double)want[mb]);
        snapshot a = snap(plain, true), b = snap(ck, true);
        same_all(what, &a, &b);
        snap_free(&a);
        snap_free(&b);
        /* DeepSpeedExamples' count: 4 passes of the forward instead of 3. */
        double f3 = plain->ops->flops_per_token(plain), f4 = ck->ops->flops_per_token(ck);
        CHECK(fabs(f4 - f3 * 4.0 / 3.0) <= 1e-9 * f4, "%s: %g FLOPs per token, want 4/3 of %g",
              what, f4, f3);
    }
    zt_model_destroy(plain);
    zt_model_destroy(ck);
}

/* A pipeline stage checkpoints too: splits with interleaved micro-batches, every stage
 * checkpointing every 2 blocks (in host memory: cpu), equal the whole model without; the second
 * split has stages without blocks (the embedding alone, the head alone). */
static void test_checkpointed_stages(zt_backend *be, const char *type, bool cpu) {
    const zt_model_stage splits[2][3] = {
        {{0, 3, true, false, 2, 1, 0}, {3, L, false, true, 2, 1, 0}},
        {{0, 0, true, false, 2, 1, 0}, {0, L, false, false, 2, 1, 0}, {L, L, false, true, 2, 1, 0}}};
    const int n[2] = {2, 3};
    for (int k = 0; k < 2; k++) {
        zt_model_spec s = spec_of(type, true);
        float want[2] = {0}, got[2] = {0};
        zt_model *whole = run_whole(&s, be, ZT_F32, 2, want);
        s.checkpoint_interval = 2;
        s.checkpoint_cpu = cpu;
        zt_model *st[3] = {0};
        bool ok = whole != NULL;
        for (int i = 0; i < n[k] && ok; i++)
            ok = (st[i] = create(&s, be, ZT_F32, &splits[k][i])) != NULL;
        if (ok) {
            run_split(st, n[k], 2, true, got);
            for (int mb = 0; mb < 2; mb++)
                CHECK(same_float(got[mb], want[mb]), "%s checkpointed %d stages%s: loss %.9g, "
                      "want %.9g", type, n[k], cpu ? " cpu" : "", (double)got[mb],
                      (double)want[mb]);
            char what[96];
            snprintf(what, sizeof what, "%s checkpointed %d stages%s", type, n[k],
                     cpu ? " cpu" : "");
            tied_tolerance = 4 * 0x1p-23;
            compare_split(what, whole, st, n[k]);
            tied_tolerance = 0.0;
        }
        for (int i = 0; i < n[k]; i++)
            zt_model_destroy(st[i]);
        zt_model_destroy(whole);
    }
}

/* ---- The memory formula (README, "Activation checkpointing") -------------------------------- */

static uint64_t r64(uint64_t bytes) { return (bytes + 63) / 64 * 64; }

/* The bytes one block keeps for its backward at `es` bytes per activation element: every buffer
 * of it rounded to 64 bytes, as the README lists them. */
static uint64_t block_bytes(const zt_model_spec *s, uint64_t es) {
    const uint64_t BT = (uint64_t)B * T, C = (uint64_t)s->n_embd, NH = (uint64_t)s->n_head;
    const uint64_t att = r64((uint64_t)B * NH * T * T * 4);
    if (strcmp(s->type, "gpt2") == 0)
        /* ln1, qkv, atty, res2, ln2, fch, fch_gelu, res3; four LayerNorm statistics. */
        return r64(BT * C * es) * 5 + r64(BT * 3 * C * es) + r64(BT * 4 * C * es) * 2 +
               r64(BT * 4) * 4 + att;
    const uint64_t HD = C / NH, KV = (uint64_t)s->n_kv_head, I = (uint64_t)s->intermediate_size;
    /* ln1, qkv, atty, res2, ln2, gate, up, hmul, res3; two RMSNorm statistics. */
    return r64(BT * C * es) * 4 + r64(BT * (NH + 2 * KV) * HD * es) + r64(BT * NH * HD * es) +
           r64(BT * I * es) * 3 + r64(BT * 4) * 2 + att;
}

static void test_memory(const char *type, int every, bool cpu) {
    zt_model_spec s = spec_of(type, true);
    const uint64_t es = sizeof(float);
    zt_model_estimate plain, ck;
    const zt_model_estimate_args args = {.micro_batch = B, .act_size = es};
    CHECK(zt_model_estimate_spec(&s, &args, "t", &plain) == ZT_OK);
    s.checkpoint_interval = every;
    s.checkpoint_cpu = cpu;
    CHECK(zt_model_estimate_spec(&s, &args, "t", &ck) == ZT_OK);
    /* Kept: min(k, L) blocks' activations instead of L, and ceil(L / k) block inputs instead of
     * one (the embedding's output); with cpu those inputs are in host memory and one device copy
     * is in use. */
    const uint64_t kept = (uint64_t)(every < L ? every : L), groups = (L + every - 1) / every;
    const uint64_t input = r64((uint64_t)B * T * s.n_embd * es), block = block_bytes(&s, es);
    const uint64_t saved = (L - kept) * block - (cpu ? 0 : (groups - 1) * input);
    CHECK(plain.activation_bytes - ck.activation_bytes == saved,
          "%s checkpoint_interval %d%s: %llu activation bytes instead of %llu, saving %llu; the "
          "formula says %llu", type, every, cpu ? " cpu" : "",
          (unsigned long long)ck.activation_bytes, (unsigned long long)plain.activation_bytes,
          (unsigned long long)(plain.activation_bytes - ck.activation_bytes),
          (unsigned long long)saved);
    CHECK(ck.host_bytes - plain.host_bytes == (cpu ? groups * input : 0),
          "%s: %llu more host bytes", type, (unsigned long long)(ck.host_bytes - plain.host_bytes));
}

/* A backend whose attention keeps row statistics (the CUDA one) carves, per block and once for
 * the backward's scratch, B·n_head·T floats where the probabilities take B·n_head·T·T: the
 * only difference between the two estimates, so no T×T buffer is left anywhere. */
static void test_attention_state(const char *type) {
    zt_model_spec s = spec_of(type, true);
    zt_model_estimate probs, lse;
    const zt_model_estimate_args a = {.micro_batch = B, .act_size = sizeof(float)},
                                 b = {.micro_batch = B, .act_size = sizeof(float),
                                      .attn_lse = true};
    CHECK(zt_model_estimate_spec(&s, &a, "t", &probs) == ZT_OK);
    CHECK(zt_model_estimate_spec(&s, &b, "t", &lse) == ZT_OK);
    const uint64_t NH = (uint64_t)s.n_head;
    const uint64_t per = r64((uint64_t)B * NH * T * T * 4) - r64((uint64_t)B * NH * T * 4);
    CHECK(probs.activation_bytes - lse.activation_bytes == (L + 1) * per,
          "%s: row statistics save %llu activation bytes; (n_layer + 1) · (B·n_head·T·T − "
          "B·n_head·T) floats are %llu", type,
          (unsigned long long)(probs.activation_bytes - lse.activation_bytes),
          (unsigned long long)((L + 1) * per));
}

/* A stage loads its own tensors (and its tied copy) from a whole model's safetensors file and
 * skips the rest: it then holds the whole model's values. */
static void test_load(zt_backend *be, const char *type, bool tied) {
    zt_model_spec s = spec_of(type, tied);
    zt_model_stage full = zt_model_full_stage(L);
    zt_model *whole = create(&s, be, ZT_F32, &full);
    const zt_model_stage three[3] = {{0, 1, true, false, 1, 1, 0}, {1, 3, false, false, 1, 1, 0},
                                     {3, L, false, true, 1, 1, 0}};
    char path[64];
    snprintf(path, sizeof path, "%s%s.safetensors", type, tied ? "-tied" : "");
    const char *file = check_tmp_path(path);
    if (!whole || !check_at(__FILE__, __LINE__, zt_model_save_safetensors(whole, file) == ZT_OK,
                            "save: %s", zt_last_error())) {
        zt_model_destroy(whole);
        return;
    }
    snapshot want = snap(whole, false);
    for (int i = 0; i < 3; i++) {
        zt_model *m = NULL;
        if (zt_model_create_stage(&m, &s, be, ZT_F32, B, 1, &three[i]) != ZT_OK)
            continue;
        zt_status rc = zt_model_load_safetensors(m, file);
        if (check_at(__FILE__, __LINE__, rc == ZT_OK, "%s stage %d: load: %s", type, i,
                     zt_last_error())) {
            snapshot got = snap(m, false);
            for (int t = 0; t < got.n; t++) {
                const zt_tensor_info *w = find(&want, got.t[t].name, false);
                if (check_at(__FILE__, __LINE__, w != NULL, "%s", got.t[t].name))
                    same_tensor("loaded stage", &want, w, &got, &got.t[t], NULL, NULL);
            }
            snap_free(&got);
        }
        zt_model_destroy(m);
    }
    snap_free(&want);
    zt_model_destroy(whole);
}

static void test_bad_stages(zt_backend *be) {
    zt_model_spec s = spec_of("gpt2", true);
    const zt_model_stage bad[] = {{-1, 2, true, false, 1, 1, 0}, {3, 2, false, false, 1, 1, 0},
                                  {0, L + 1, true, true, 1, 1, 0}, {1, 1, false, false, 1, 1, 0},
                                  {0, 2, true, false, 0, 1, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zt_model *m = NULL;
        zt_status rc = zt_model_create_stage(&m, &s, be, ZT_F32, B, 1, &bad[i]);
        CHECK(rc == ZT_ERR_INVALID && m == NULL && strstr(zt_last_error(), "stage"),
              "stage %zu: %d %s", i, rc, zt_last_error());
    }
}

int main(void) {
    zt_backend *be;
    if (zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        fprintf(stderr, "no CPU backend: %s\n", zt_last_error());
        return 1;
    }
    test_splits(be, "gpt2", true);
    test_splits(be, "llama", true);
    test_splits(be, "llama", false);
    const zt_dtype acts[2] = {ZT_F32, ZT_BF16};
    for (int a = 0; a < 2; a++)
        for (int every = 1; every <= 3; every++)
            for (int cpu = 0; cpu < 2; cpu++) {
                test_checkpointing(be, "gpt2", acts[a], every, cpu);
                test_checkpointing(be, "llama", acts[a], every, cpu);
            }
    for (int cpu = 0; cpu < 2; cpu++) {
        test_checkpointed_stages(be, "gpt2", cpu);
        test_checkpointed_stages(be, "llama", cpu);
    }
    for (int every = 1; every <= 5; every++)
        for (int cpu = 0; cpu < 2; cpu++) {
            test_memory("gpt2", every, cpu);
            test_memory("llama", every, cpu);
        }
    test_attention_state("gpt2");
    test_attention_state("llama");
    check_tmpdir_create("test_model_stage");
    test_load(be, "gpt2", true);
    test_load(be, "llama", true);
    test_load(be, "llama", false);
    check_tmpdir_remove();
    test_bad_stages(be);
    zt_backend_destroy(be);
    return check_summary("test_model_stage");
}
