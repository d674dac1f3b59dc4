/* The Llama family's model as built: tensors named and shaped as Hugging Face's LlamaForCausalLM
 * holds them (biases and the head present as the spec says), the parameter count of the formula,
 * the estimate agreeing with what is built, Hugging Face's initialisation (normal 0.02, zero
 * biases, unit norms), the FLOP count of the README's formula, and rotary inverse frequencies
 * against the llama3 and linear formulas worked by hand. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "models/llama.h"
#include "ztrain/model.h"

static zt_model_spec spec_of(const char *type) {
    zt_model_spec s = {.n_layer = 2, .n_head = 8, .n_kv_head = 2, .n_embd = 64, .head_dim = 16,
                       .intermediate_size = 96, .vocab_size = 97, .block_size = 16,
                       .rms_norm_eps = 1e-5, .rope_theta = 10000, .rope_factor = 1,
                       .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                       .rope_original_max_position = 8192};
    snprintf(s.type, sizeof s.type, "%s", type);
    return s;
}

/* What LlamaForCausalLM holds for the spec, counted from its module shapes. */
static size_t hf_params(const zt_model_spec *s) {
    size_t C = (size_t)s->n_embd, Q = (size_t)s->n_head * s->head_dim,
           KV = (size_t)s->n_kv_head * s->head_dim, I = (size_t)s->intermediate_size,
           V = (size_t)s->vocab_size;
    size_t layer = C + Q * C + 2 * KV * C + C * Q + C + 3 * I * C;
    if (s->qkv_bias)
        layer += Q + 2 * KV;
    if (s->o_bias)
        layer += C;
    return V * C + (size_t)s->n_layer * layer + C + (s->tie_word_embeddings ? 0 : V * C);
}

static void check_tensor(const zt_model *m, const char *name, int64_t d0, int64_t d1) {
    const zt_tensor_info *t = zt_model_find_tensor(m, name);
    if (!check_at(__FILE__, __LINE__, t != NULL, "%s: tensor %s exists", m->spec.type, name))
        return;
    CHECK(t->shape[0] == d0 && t->shape[1] == d1 && t->ndim == (d1 ? 2 : 1),
          "%s: %s is [%lld, %lld], want [%lld, %lld]", m->spec.type, name,
          (long long)t->shape[0], (long long)t->shape[1], (long long)d0, (long long)d1);
}

static void test_layout(zt_backend *be, const char *type, bool tied, bool qkv_bias, bool o_bias) {
    zt_model_spec s = spec_of(type);
    s.tie_word_embeddings = tied;
    s.qkv_bias = qkv_bias;
    s.o_bias = o_bias;
    zt_model *m;
    if (!check_at(__FILE__, __LINE__, zt_model_create(&m, &s, be, ZT_F32, 2, 1) == ZT_OK,
                  "%s: create: %s", type, zt_last_error()))
        return;
    CHECK(m->n_params == hf_params(&s), "%s tied %d bias %d/%d: %zu parameters, want %zu", type,
          tied, qkv_bias, o_bias, m->n_params, hf_params(&s));
    zt_model_estimate est;
    const zt_model_estimate_args args = {.micro_batch = 2, .act_size = sizeof(float)};
    CHECK(zt_model_estimate_spec(&s, &args, "t", &est) == ZT_OK &&
              est.params == m->n_params && est.n_tensors == (uint64_t)m->n_tensors,
          "%s: the estimate's %llu parameters and %llu tensors are the model's", type,
          (unsigned long long)est.params, (unsigned long long)est.n_tensors);
    check_tensor(m, "model.embed_tokens.weight", 97, 64);
    check_tensor(m, "model.layers.1.input_layernorm.weight", 64, 0);
    check_tensor(m, "model.layers.1.self_attn.q_proj.weight", 128, 64);
    check_tensor(m, "model.layers.1.self_attn.k_proj.weight", 32, 64);
    check_tensor(m, "model.layers.1.self_attn.v_proj.weight", 32, 64);
    check_tensor(m, "model.layers.1.self_attn.o_proj.weight", 64, 128);
    check_tensor(m, "model.layers.1.post_attention_layernorm.weight", 64, 0);
    check_tensor(m, "model.layers.1.mlp.gate_proj.weight", 96, 64);
    check_tensor(m, "model.layers.1.mlp.up_proj.weight", 96, 64);
    check_tensor(m, "model.layers.1.mlp.down_proj.weight", 64, 96);
    check_tensor(m, "model.norm.weight", 64, 0);
    if (qkv_bias) {
        check_tensor(m, "model.layers.0.self_attn.q_proj.bias", 128, 0);
        check_tensor(m, "model.layers.0.self_attn.v_proj.bias", 32, 0);
    }
    CHECK((zt_model_find_tensor(m, "model.layers.0.self_attn.k_proj.bias") != NULL) == qkv_bias,
          "%s: k bias present iff qkv_bias", type);
    CHECK((zt_model_find_tensor(m, "model.layers.0.self_attn.o_proj.bias") != NULL) == o_bias,
          "%s: o bias present iff o_bias", type);
    if (tied)
        CHECK(zt_model_find_tensor(m, "lm_head.weight") == NULL, "%s: tied, no lm_head", type);
    else
        check_tensor(m, "lm_head.weight", 97, 64);
    /* 6·Ψ + 12·L·n_head·head_dim·block_size (README). */
    double want = 6.0 * (double)hf_params(&s) + 12.0 * 2 * 8 * 16 * 16;
    CHECK(m->ops->flops_per_token(m) == want, "%s: %g FLOPs per token, want %g", type,
          m->ops->flops_per_token(m), want);
    zt_model_destroy(m);
}

/* Hugging Face's _init_weights: normal(0, 0.02) matrices and embedding, zero biases, unit
 * norms. */
static void test_init(zt_backend *be) {
    zt_model_spec s = spec_of("qwen2");
    s.qkv_bias = true;
    s.n_embd = 128;
    s.intermediate_size = 256;
    zt_model *m;
    if (!check_at(__FILE__, __LINE__, zt_model_create(&m, &s, be, ZT_F32, 1, 1) == ZT_OK,
                  "create: %s", zt_last_error()))
        return;
    CHECK(m->ops->init_weights(m, 7) == ZT_OK);
    float *p = malloc(m->n_params * sizeof(float));
    zt_backend_copy(be, p, m->params, m->n_params * sizeof(float), ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    for (int i = 0; i < m->n_tensors; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        const float *x = p + t->offset;
        double sum = 0, sq = 0;
        for (size_t j = 0; j < t->numel; j++) {
            sum += x[j];
            sq += (double)x[j] * x[j];
        }
        double mean = sum / t->numel, std = sqrt(sq / t->numel - mean * mean);
        if (strstr(t->name, "norm.weight"))
            CHECK(mean == 1.0 && std == 0.0, "%s: ones (mean %g std %g)", t->name, mean, std);
        else if (strstr(t->name, ".bias"))
            CHECK(sq == 0.0, "%s: zeros", t->name);
        else
            /* At least 8192 draws: the sample std is within 3% of 0.02 with overwhelming odds. */
            CHECK(fabs(std - 0.02) < 0.03 * 0.02 && fabs(mean) < 0.003, "%s: normal(0, 0.02), "
                  "mean %g std %g over %zu", t->name, mean, std, t->numel);
    }
    free(p);
    zt_model_destroy(m);
}

/* The llama3 formula for theta 10000, head_dim 16, factor 8, low 1, high 4, original 64: the
 * wavelengths 2π·10000^(2j/16) are 6.3, 19.9, 62.8, 199, ... against the band (16, 64]: j = 0
 * is kept (below 16), j = 1 and 2 are blended with smooth = (64/λ - 1)/3, and j ≥ 3 (above 64)
 * is divided by 8. Linear scaling divides every frequency by the factor. */
static void test_rope_scaling(void) {
    zt_model_spec s = spec_of("llama");
    snprintf(s.rope_scaling, sizeof s.rope_scaling, "llama3");
    s.rope_factor = 8;
    s.rope_original_max_position = 64;
    double f[8];
    zt_llama_rope_inv_freq(&s, 16, f);
    for (int j = 0; j < 8; j++) {
        double base = pow(10000.0, -2.0 * j / 16), lambda = 2 * M_PI / base, want;
        if (lambda < 16)
            want = base;
        else if (lambda > 64)
            want = base / 8;
        else {
            double smooth = (64 / lambda - 1) / 3;
            want = (1 - smooth) * base / 8 + smooth * base;
        }
        CHECK(fabs(f[j] - want) <= 1e-15 * want, "llama3 inv_freq[%d] %.17g, want %.17g", j, f[j],
              want);
    }
    CHECK(f[0] == 1.0 && fabs(f[4] - 0.01 / 8) < 1e-18, "llama3: j=0 kept, j=4 divided by 8");
    snprintf(s.rope_scaling, sizeof s.rope_scaling, "linear");
    s.rope_factor = 4;
    zt_llama_rope_inv_freq(&s, 16, f);
    CHECK(f[0] == 0.25 && fabs(f[4] - 0.01 / 4) < 1e-18, "linear: divided by 4 (%g %g)", f[0],
          f[4]);
}

int main(void) {
    zt_backend *be;
    if (zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        fprintf(stderr, "no CPU backend: %s\n", zt_last_error());
        return 1;
    }
    test_layout(be, "llama", false, false, false);
    test_layout(be, "llama", true, true, true);
    test_layout(be, "mistral", true, false, false);
    test_layout(be, "qwen2", false, true, false);
    test_init(be);
    test_rope_scaling();
    zt_backend_destroy(be);
    return check_summary("test_llama_model");
}
