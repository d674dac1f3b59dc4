/* The Llama family as the registry sees it: its spec fields (named after Hugging Face's
 * config.json keys), the checks across them, the exact sizes of a model built from a spec (its
 * shapes are llama_shape.c's), and the three registered families, "llama", "mistral" and "qwen2",
 * which share all of it. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "llama.h"
#include "ztrain/size_math.h"

/* ---- Checks ---------------------------------------------------------------------------------- */

static zt_status check_rope_scaling(const zt_model_spec *s, const char *source) {
    if (s->rope_scaling[0] == '\0')
        return ZT_OK;
    if (strcmp(s->rope_scaling, "linear") != 0 && strcmp(s->rope_scaling, "llama3") != 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: model.rope_scaling \"%s\" is not supported (known: "
                        "\"linear\", \"llama3\", or \"\" for none)", source, s->rope_scaling);
    /* A factor below 1 (positions stretched, not compressed) is computed as any other:
     * transformers only warns about it ("must be a float >= 1") and builds the model. */
    if (strcmp(s->rope_scaling, "llama3") == 0 &&
        !(s->rope_high_freq_factor > s->rope_low_freq_factor))
        return zt_error(ZT_ERR_INVALID, "%s: model.rope_high_freq_factor (%g) must be greater than "
                        "model.rope_low_freq_factor (%g): llama3 scaling blends between them",
                        source, s->rope_high_freq_factor, s->rope_low_freq_factor);
    return ZT_OK;
}

static zt_status llama_validate(const zt_model_spec *s, const char *source) {
    const int kv = s->n_kv_head ? s->n_kv_head : s->n_head;
    if (s->n_head % kv != 0)
        return zt_error(ZT_ERR_INVALID, "%s: model.n_head (%d) must be a multiple of "
                        "model.n_kv_head (%d)", source, s->n_head, kv);
    if (s->head_dim == 0 && s->n_embd % s->n_head != 0)
        return zt_error(ZT_ERR_INVALID, "%s: model.n_embd (%d) must be divisible by model.n_head "
                        "(%d) when model.head_dim is not given", source, s->n_embd, s->n_head);
    const int hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    if (hd % 2 != 0)
        return zt_error(ZT_ERR_INVALID, "%s: the head dimension (%d, model.head_dim or "
                        "n_embd / n_head) must be even: rotary embeddings rotate pairs", source, hd);
    /* The kernels take every width as an int; the packed q | k | v row is the widest after the
     * vocabulary and the SwiGLU width, which are ints already. */
    if ((int64_t)(s->n_head + 2LL * kv) * hd > INT_MAX)
        return zt_error(ZT_ERR_INVALID, "%s: the q, k and v projections' width (model.n_head %d + "
                        "2 · model.n_kv_head %d) · head_dim %d is above %d, the largest dimension "
                        "the kernels take", source, s->n_head, kv, hd, INT_MAX);
    if (s->max_position_embeddings != 0 && s->block_size > s->max_position_embeddings)
        return zt_error(ZT_ERR_INVALID, "%s: model.block_size (%d) must be at most "
                        "model.max_position_embeddings (%d)", source, s->block_size,
                        s->max_position_embeddings);
    return check_rope_scaling(s, source);
}

/* The head width and the key/value heads as zt_llama_dims builds the model with them, for a
 * description; a spec without heads (not yet validated) is left as it is. */
static void llama_effective(zt_model_spec *s) {
    if (s->n_head <= 0)
        return;
    const llama_dims d = zt_llama_dims(s);
    s->n_kv_head = (int)d.KV;
    s->head_dim = (int)d.HD;
}

/* ---- Sizes ----------------------------------------------------------------------------------- */

/* Exact sizes from the spec: the tensors zt_llama_create lays out and the activations it carves,
 * every sum and product in 64 bits and checked. */
static zt_status llama_estimate(const zt_model_spec *s, const zt_model_estimate_args *a,
                                const char *source, zt_model_estimate *out) {
    const llama_dims whole = zt_llama_dims(s);
    /* Under TP a shard's dimensions give its tensors (llama.c cuts each by them) and
     * activations; every shard's are the same size. */
    const int tp = a->tp_size > 1 ? a->tp_size : 1;
    const llama_dims d = zt_llama_shard_dims(&whole, tp);
    bool ov = false;
    uint64_t layer = 0, layer_small = 0, layer_tensors = 0, outer = 0, outer_small = 0;
    for (int i = 0; i < LLAMA_N_LAYER_TENSORS; i++) {
        uint64_t n = zt_llama_layer_numel(&d, i);
        layer = zt_u64_add(layer, n, &ov);
        layer_small += n < a->persistence_threshold ? n : 0;
        layer_tensors += n > 0;
    }
    /* zt_llama_lay_out's outer tensors: model.embed_tokens with the embedding; model.norm and
     * lm_head (untied) or a last stage's own copy of the embedding (tied) with the head. */
    zt_model_stage st = a->stage ? *a->stage : zt_model_full_stage(s->n_layer);
    st.tp_size = tp;
    const uint64_t blocks = (uint64_t)(st.last_layer - st.first_layer);
    const uint64_t table = zt_u64_mul(d.V, d.C, &ov);
    const uint64_t outer_t[] = {st.embed ? table : 0, st.head ? d.C : 0,
                                st.head && (!d.tied || !st.embed) ? table : 0};
    uint64_t outer_tensors = 0;
    for (size_t i = 0; i < sizeof outer_t / sizeof outer_t[0]; i++) {
        outer = zt_u64_add(outer, outer_t[i], &ov);
        outer_small += outer_t[i] < a->persistence_threshold ? outer_t[i] : 0;
        outer_tensors += outer_t[i] > 0;
    }
    uint64_t params = zt_u64_add(outer, zt_u64_mul(blocks, layer, &ov), &ov);
    /* The model keeps an fp32 buffer of parameters and one of gradients. */
    zt_u64_mul(params, 2 * sizeof(float), &ov);
    if (ov)
        return zt_error(ZT_ERR_INVALID, "%s: model.n_layer (%d) blocks of %llu parameters each "
                        "(model.n_embd %d, model.intermediate_size %d, model.vocab_size %d) are "
                        "more than a 64-bit size can hold", source, s->n_layer,
                        (unsigned long long)layer, s->n_embd, s->intermediate_size,
                        s->vocab_size);
    const uint64_t tokens = (uint64_t)a->micro_batch * d.T;
    if (tokens > INT_MAX)
        return zt_error(ZT_ERR_INVALID, "%s: a micro-batch of %d sequences of model.block_size %d "
                        "is %llu tokens, above %d, the most one forward takes", source,
                        a->micro_batch, s->block_size, (unsigned long long)tokens, INT_MAX);
    zt_blocks_shape shape = zt_llama_blocks_shape(s, &st, (uint64_t)a->micro_batch,
                                                  a->act_size);
    shape.attn_lse = a->attn_lse;
    uint64_t pinned = 0;
    uint64_t act = zt_llama_carve(&d, &shape, NULL, NULL, NULL, NULL, &pinned, &ov);
    /* A shard that shares its kv head keeps the k and v gradients aside (llama.c). */
    if (tp > (int)whole.KV)
        act = zt_u64_add(act, (2 * d.KVD * d.C + (d.qkv_bias ? 2 * d.KVD : 0)) * sizeof(float),
                         &ov);
    act = zt_u64_add(act, zt_tp_device_bytes(tp, tokens, &ov), &ov);
    if (ov)
        return zt_error(ZT_ERR_INVALID, "%s: the activations of a micro-batch of %d sequences of "
                        "model.block_size %d (model.n_embd %d, model.n_head %d, "
                        "model.intermediate_size %d, model.n_layer %d, model.vocab_size %d) are "
                        "more than a 64-bit size can hold", source, a->micro_batch,
                        s->block_size, s->n_embd, s->n_head, s->intermediate_size, s->n_layer,
                        s->vocab_size);
    const uint64_t n_tensors = blocks * layer_tensors + outer_tensors;
    *out = (zt_model_estimate){
        .params = params,
        .layer_params = layer,
        .outer_params = outer,
        .persistent_params = outer_small + blocks * layer_small,
        .n_tensors = n_tensors,
        .n_layer = (int)blocks,
        .activation_bytes = act,
        /* an RMSNorm's weight or the output bias (C), or the shard's query bias (Q) */
        .channel_sum_floats = d.qkv_bias && d.Q > d.C ? d.Q : d.C,
        .norm_sum_floats = d.C,
        .host_bytes = zt_llama_host_bytes(&d, (uint64_t)a->micro_batch) +
                      n_tensors * sizeof(zt_tensor_info) + pinned + zt_tp_host_bytes(tp, tokens),
    };
    return ZT_OK;
}

/* ---- The families ------------------------------------------------------------------------------ */

/* One table per default of qkv_bias, which is the only thing the families differ in. */
#define LLAMA_FIELDS(qkv_bias_default)                                                        \
    {ZT_MODEL_FIELD(n_layer), .required = true, .bound = ZT_BOUND_POSITIVE,                   \
     .meaning = "decoder layers (num_hidden_layers)"},                                        \
    {ZT_MODEL_FIELD(n_head), .required = true, .bound = ZT_BOUND_POSITIVE,                    \
     .meaning = "query heads per layer (num_attention_heads)"},                               \
    {ZT_MODEL_FIELD(n_embd), .required = true, .bound = ZT_BOUND_POSITIVE,                    \
     .meaning = "width of the residual stream (hidden_size)"},                                \
    {ZT_MODEL_FIELD(vocab_size), .required = true, .bound = ZT_BOUND_POSITIVE,                \
     .meaning = "rows of the token embedding and of the LM head"},                            \
    {ZT_MODEL_FIELD(block_size), .required = true, .bound = ZT_BOUND_POSITIVE,                \
     .meaning = "the longest sequence and the training sequence length"},                     \
    {ZT_MODEL_FIELD(init_from),                                                               \
     .meaning = "safetensors file with Hugging Face names to start from"},                    \
    {ZT_MODEL_FIELD(n_kv_head), .bound = ZT_BOUND_NONNEGATIVE,                                \
     .meaning = "key/value heads, a divisor of n_head (num_key_value_heads); 0: n_head"},     \
    {ZT_MODEL_FIELD(head_dim), .bound = ZT_BOUND_NONNEGATIVE,                                 \
     .meaning = "width of one head, even; 0: n_embd / n_head"},                               \
    {ZT_MODEL_FIELD(intermediate_size), .required = true, .bound = ZT_BOUND_POSITIVE,         \
     .meaning = "width of the SwiGLU MLP"},                                                   \
    {ZT_MODEL_FIELD(rms_norm_eps), .def = 1e-6, .bound = ZT_BOUND_POSITIVE,                   \
     .meaning = "epsilon of every RMSNorm"},                                                  \
    {ZT_MODEL_FIELD(rope_theta), .def = 10000.0, .bound = ZT_BOUND_POSITIVE,                  \
     .meaning = "base of the rotary frequencies"},                                            \
    {ZT_MODEL_STRING_FIELD(rope_scaling), .def_str = "",                                      \
     .meaning = "rotary scaling: \"\" (none), \"linear\" or \"llama3\" (rope_scaling.rope_type)"}, \
    {ZT_MODEL_FIELD(rope_factor), .def = 1.0, .bound = ZT_BOUND_POSITIVE,                     \
     .meaning = "rope_scaling.factor (positive)"},                                             \
    {ZT_MODEL_FIELD(rope_low_freq_factor), .def = 1.0, .bound = ZT_BOUND_POSITIVE,            \
     .meaning = "rope_scaling.low_freq_factor (llama3)"},                                     \
    {ZT_MODEL_FIELD(rope_high_freq_factor), .def = 4.0, .bound = ZT_BOUND_POSITIVE,           \
     .meaning = "rope_scaling.high_freq_factor (llama3)"},                                    \
    {ZT_MODEL_FIELD(rope_original_max_position), .def = 8192, .bound = ZT_BOUND_POSITIVE,     \
     .meaning = "rope_scaling.original_max_position_embeddings (llama3)"},                    \
    {ZT_MODEL_FIELD(max_position_embeddings), .bound = ZT_BOUND_NONNEGATIVE,                  \
     .meaning = "positions the model was made for, at least block_size; 0: block_size"},     \
    {ZT_MODEL_FIELD(tie_word_embeddings),                                                     \
     .meaning = "the LM head is the token embedding"},                                        \
    {ZT_MODEL_FIELD(qkv_bias), .def = qkv_bias_default,                                       \
     .meaning = "biases on the q, k and v projections"},                                      \
    {ZT_MODEL_FIELD(o_bias), .meaning = "a bias on the attention's output projection"},       \
    {ZT_MODEL_FIELD(sliding_window), .bound = ZT_BOUND_NONNEGATIVE,                           \
     .meaning = "a query sees at most this many positions, itself included; 0: all"},         \
    {0}

static const zt_model_field llama_fields[] = {LLAMA_FIELDS(0)};
static const zt_model_field qwen2_fields[] = {LLAMA_FIELDS(1)};

/* Older Llama checkpoints keep the rotary inverse frequencies as a buffer beside the weights. */
static const char *const llama_hf_ignored[] = {".rotary_emb.inv_freq", NULL};

/* A file of a tied model may still carry lm_head.weight: it must equal the embedding. */
#define LLAMA_HF_MAP                                                                          \
    {                                                                                         \
        .ignore_suffixes = llama_hf_ignored, .tied = "lm_head.weight",                        \
        .tied_to = "model.embed_tokens.weight",                                               \
    }

const zt_model_family zt_llama_family = {
    .name = "llama",
    .title = "Llama",
    .fields = llama_fields,
    .validate = llama_validate,
    .estimate = llama_estimate,
    .effective = llama_effective,
    .create = zt_llama_create,
    .hf = LLAMA_HF_MAP,
};

const zt_model_family zt_mistral_family = {
    .name = "mistral",
    .title = "Mistral",
    .fields = llama_fields,
    .validate = llama_validate,
    .estimate = llama_estimate,
    .effective = llama_effective,
    .create = zt_llama_create,
    .hf = LLAMA_HF_MAP,
};

const zt_model_family zt_qwen2_family = {
    .name = "qwen2",
    .title = "Qwen2",
    .fields = qwen2_fields,
    .validate = llama_validate,
    .estimate = llama_estimate,
    .effective = llama_effective,
    .create = zt_llama_create,
    .hf = LLAMA_HF_MAP,
};
