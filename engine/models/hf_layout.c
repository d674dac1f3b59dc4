/* config.json as transformers 4.x and 5.x write it (hf_layout.h).
 *
 * The rules are transformers 5's PreTrainedConfig.convert_rope_params_to_dict and
 * standardize_rope_params (modeling_rope_utils.py) and Qwen2Config.__post_init__, re-derived: a
 * truthy rope_scaling replaces rope_parameters, rope_theta comes from the rotary dict, else the
 * top-level key, else 10000, and llama3's original_max_position_embeddings in rope_parameters
 * defaults to max_position_embeddings. transformers 4.x reads only the top-level keys, and
 * refuses a rope_scaling without a member its type needs; so does ztrain, in both layouts
 * (check_required), except that one default of transformers 5. */
#define _POSIX_C_SOURCE 200809L
#include "hf_layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ztrain/json_util.h"

#define DEFAULT_THETA 10000.0

/* Keys no row reads that leave the training computation as it is. Token ids and generation
 * settings matter to sampling only; initializer_range to random initialisation, which a loaded
 * directory does not use; dtype notes to the loader, which converts what the shards hold. */
static const char *const common_keys[] = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "_name_or_path", "name_or_path", "bos_token_id", "eos_token_id", "pad_token_id",
    "sep_token_id", "decoder_start_token_id", "use_cache", "initializer_range", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "chunk_size_feed_forward", "id2label", "label2id", "problem_type", "finetuning_task",
    "tokenizer_class", "prefix", "task_specific_params", "max_length", "min_length",
    "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "_attn_implementation_autoset",
    "attn_implementation", "rope_parameters", NULL};

/* GPT-2's own: the summary_* keys configure GPT2DoubleHeadsModel's head, n_ctx is an old alias
 * of n_positions that nothing reads, and ztrain trains without dropout (docs/fine-tuning.md),
 * so the *_pdrop keys are accepted with any value and not applied. reorder_and_upcast_attn
 * changes only 16-bit rounding inside the attention, which ztrain computes in fp32. */
static const char *const gpt2_keys[] = {
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "n_ctx", "attn_pdrop", "embd_pdrop", "resid_pdrop",
    "reorder_and_upcast_attn", NULL};

/* Qwen2's window layout, checked by check_layer_types, and a head_dim, which transformers 5
 * reads and 4.x does not (check_qwen2_head_dim). */
static const char *const qwen2_keys[] = {"use_sliding_window", "max_window_layers", "layer_types",
                                         "head_dim", NULL};

static bool listed(const char *const *list, const char *key) {
    for (; *list; list++)
        if (strcmp(*list, key) == 0)
            return true;
    return false;
}

bool zt_hf_layout_key_known(const char *type, const char *key) {
    if (listed(common_keys, key))
        return true;
    if (strcmp(type, "gpt2") == 0)
        return listed(gpt2_keys, key);
    if (strcmp(type, "qwen2") == 0)
        return listed(qwen2_keys, key);
    return false;
}

/* Also whether a value counts as set the way Python's `or` reads it (rope_scaling or ...). */
static const char *rope_type_of(const cJSON *obj) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "rope_type");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : "default";
}

static zt_status theta_of(const cJSON *v, const char *path, const char *key, double *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
        char got[64];
        zt_json_repr(v, got, sizeof got);
        return zt_error(ZT_ERR_FORMAT, "%s: key '%s' must be a positive number, got %s", path,
                        key, got);
    }
    *out = v->valuedouble;
    return ZT_OK;
}

/* The members of a rotary dict (rope_parameters, or rope_scaling under `name`) ztrain knows;
 * partial_rotary_factor only at 1. */
static zt_status check_rope_dict(const cJSON *rp, const char *name, const char *path) {
    static const char *const known[] = {"rope_type", "type", "rope_theta", "factor",
                                        "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings",
                                        "partial_rotary_factor", NULL};
    if (!cJSON_IsObject(rp))
        return zt_error(ZT_ERR_FORMAT, "%s: key '%s' must be an object or null", path, name);
    const cJSON *m;
    cJSON_ArrayForEach(m, rp) {
        if (cJSON_IsObject(m) || cJSON_IsNull(m))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: key '%s.%s' gives rotary parameters per "
                            "layer type, which ztrain does not support (one rotary embedding "
                            "for every layer)", path, name, m->string);
        if (!listed(known, m->string))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: key '%s.%s' is not understood by ztrain",
                            path, name, m->string);
    }
    const cJSON *prf = cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor");
    if (prf && !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0)) {
        char got[64];
        zt_json_repr(prf, got, sizeof got);
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: key '%s.partial_rotary_factor' is %s; ztrain "
                        "rotates the whole head (1.0 only)", path, name, got);
    }
    const char *t = rope_type_of(rp);
    if (strcmp(t, "default") != 0 && strcmp(t, "linear") != 0 && strcmp(t, "llama3") != 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: key '%s.rope_type' is \"%s\", which ztrain "
                        "does not support (supported: \"default\", \"linear\", \"llama3\")",
                        path, name, t);
    return ZT_OK;
}

/* The members each scaling type must have: transformers (4.x's rope_config_validation, 5.x's
 * validate_rope) raises KeyError without them rather than assume a value. */
static zt_status check_required(const cJSON *rs, const char *name, const char *path) {
    static const char *const linear[] = {"factor", NULL};
    static const char *const llama3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings", NULL};
    const char *t = rope_type_of(rs);
    const char *const *need = strcmp(t, "linear") == 0   ? linear
                              : strcmp(t, "llama3") == 0 ? llama3
                                                         : NULL;
    for (; need && *need; need++) {
        if (cJSON_GetObjectItemCaseSensitive(rs, *need))
            continue;
        /* Only a config without max_position_embeddings gets here through rope_parameters. */
        if (strcmp(name, "rope_parameters") == 0 &&
            strcmp(*need, "original_max_position_embeddings") == 0)
            return zt_error(ZT_ERR_FORMAT, "%s: key 'rope_parameters.%s' is missing, and so is "
                            "'max_position_embeddings', which transformers 5 would take for it: "
                            "give one of them", path, *need);
        return zt_error(ZT_ERR_FORMAT, "%s: key '%s.%s' is missing: rope_type \"%s\" needs it "
                        "(transformers raises KeyError without it)", path, name, *need, t);
    }
    return ZT_OK;
}

/* The scaling members of rope_parameters, as the rope_scaling object rows read. */
static cJSON *scaling_from(const cJSON *rp, const cJSON *root) {
    cJSON *rs = cJSON_CreateObject();
    cJSON_AddStringToObject(rs, "rope_type", rope_type_of(rp));
    const cJSON *m;
    cJSON_ArrayForEach(m, rp) {
        if (strcmp(m->string, "rope_type") != 0 && strcmp(m->string, "type") != 0 &&
            strcmp(m->string, "rope_theta") != 0 && strcmp(m->string, "partial_rotary_factor"))
            cJSON_AddItemToObject(rs, m->string, cJSON_Duplicate(m, true));
    }
    /* transformers 5 fills llama3's pre-training length from max_position_embeddings. */
    const cJSON *mpe = cJSON_GetObjectItemCaseSensitive(root, "max_position_embeddings");
    if (strcmp(rope_type_of(rp), "llama3") == 0 &&
        !cJSON_GetObjectItemCaseSensitive(rs, "original_max_position_embeddings") && mpe)
        cJSON_AddItemToObject(rs, "original_max_position_embeddings", cJSON_Duplicate(mpe, true));
    return rs;
}

/* Both versions must scale the same way: a rope_parameters next to a set rope_scaling (which
 * transformers 5 prefers, and 4.x reads alone) must say the same. */
static zt_status check_same_scaling(const cJSON *rp, const cJSON *rs, const char *path) {
    if (strcmp(rope_type_of(rp), rope_type_of(rs)) != 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: keys 'rope_scaling' (type \"%s\") and "
                        "'rope_parameters' (type \"%s\") disagree: a file that states the scaling "
                        "twice, differently, is ambiguous", path,
                        rope_type_of(rs), rope_type_of(rp));
    const cJSON *m;
    cJSON_ArrayForEach(m, rp) {
        if (strcmp(m->string, "rope_type") == 0 || strcmp(m->string, "type") == 0 ||
            strcmp(m->string, "rope_theta") == 0)
            continue;
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(rs, m->string);
        if (!o || !cJSON_Compare(o, m, true))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: keys 'rope_parameters.%s' and "
                            "'rope_scaling.%s' disagree", path, m->string, m->string);
    }
    return ZT_OK;
}

/* The type of a rope_scaling that is there (not null). Older configs name it "type", newer ones
 * "rope_type", and the versions read a file with both differently: transformers 4's config
 * classes copy "type" over "rope_type" (LlamaConfig, Qwen2Config), 5's standardize_rope_params
 * prefers "rope_type". 4.x also fails, with a KeyError naming rope_type, on a rope_scaling that
 * names neither (even {}, which 5 reads as no scaling), and on one that is not an object. So a
 * scaling must be an object naming its type once, or twice alike; an old "type" alone is copied
 * to "rope_type", which the rows read. */
static zt_status read_scaling_type(cJSON *rs, const char *path) {
    char got[96];
    zt_json_repr(rs, got, sizeof got);
    if (!cJSON_IsObject(rs))
        return zt_error(ZT_ERR_FORMAT, "%s: key 'rope_scaling' must be an object or null, got "
                        "%s", path, got);
    const cJSON *old = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!old && !rt)
        return zt_error(ZT_ERR_FORMAT, "%s: key 'rope_scaling' (%s) names no 'rope_type': "
                        "transformers 4 raises KeyError without one; write \"rope_type\": "
                        "\"default\" or \"rope_scaling\": null for plain RoPE", path, got);
    if (old && rt && !cJSON_Compare(old, rt, true)) {
        char a[64], b[64];
        zt_json_repr(old, a, sizeof a);
        zt_json_repr(rt, b, sizeof b);
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: keys 'rope_scaling.type' (%s) and "
                        "'rope_scaling.rope_type' (%s) disagree: transformers 4 reads the first, "
                        "5 the second; keep one of them", path, a, b);
    }
    const cJSON *t = rt ? rt : old;
    if (!cJSON_IsString(t)) {
        zt_json_repr(t, got, sizeof got);
        return zt_error(ZT_ERR_FORMAT, "%s: key 'rope_scaling.%s' must be a string, got %s", path,
                        rt ? "rope_type" : "type", got);
    }
    if (!rt)
        cJSON_AddItemToObject(rs, "rope_type", cJSON_Duplicate(old, true));
    return ZT_OK;
}

static zt_status read_rope(cJSON *root, const char *type, const char *path) {
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs) && strcmp(type, "gpt2") != 0)
        ZT_TRY(read_scaling_type(rs, path));
    if (zt_json_truthy(rs) && strcmp(type, "gpt2") != 0) {
        ZT_TRY(check_rope_dict(rs, "rope_scaling", path));
        /* transformers 4 refuses a rope_scaling without llama3's pre-training length; 5 would
         * take max_position_embeddings: refused, as the versions disagree. */
        ZT_TRY(check_required(rs, "rope_scaling", path));
    }
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!rp || cJSON_IsNull(rp))
        return ZT_OK;
    if (strcmp(type, "gpt2") == 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: key 'rope_parameters' has no meaning for a "
                        "gpt2 model (learned positions)", path);
    ZT_TRY(check_rope_dict(rp, "rope_parameters", path));

    const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, "rope_theta");
    double theta4 = DEFAULT_THETA, theta5 = DEFAULT_THETA;
    if (top)
        ZT_TRY(theta_of(top, path, "rope_theta", &theta4));
    const cJSON *src5 = zt_json_truthy(rs) ? rs : rp;
    const cJSON *t5 = cJSON_GetObjectItemCaseSensitive(src5, "rope_theta");
    if (t5)
        ZT_TRY(theta_of(t5, path, src5 == rs ? "rope_scaling.rope_theta"
                                             : "rope_parameters.rope_theta", &theta5));
    else
        theta5 = theta4;
    if (top && theta4 != theta5)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: keys 'rope_theta' (%g) and '%s.rope_theta' (%g) "
                        "disagree: transformers 4 would read the first, 5 the second", path,
                        theta4, src5 == rs ? "rope_scaling" : "rope_parameters", theta5);
    if (!top)
        cJSON_AddNumberToObject(root, "rope_theta", theta5);

    if (strcmp(type, "mistral") == 0 && strcmp(rope_type_of(rp), "default") != 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: key 'rope_parameters.rope_type' is \"%s\"; "
                        "ztrain's mistral has no rotary scaling", path, rope_type_of(rp));
    if (zt_json_truthy(rs))
        return cJSON_IsObject(rs) ? check_same_scaling(rp, rs, path) : ZT_OK;
    cJSON_DeleteItemFromObjectCaseSensitive(root, "rope_scaling");
    if (strcmp(rope_type_of(rp), "default") == 0)
        return ZT_OK;
    cJSON *derived = scaling_from(rp, root);
    cJSON_AddItemToObject(root, "rope_scaling", derived);
    return check_required(derived, "rope_parameters", path);
}

static int int_or(const cJSON *root, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNumber(v) ? v->valueint : def;
}

/* Qwen2's windowed layers: transformers 4.x windows layer i when use_sliding_window and
 * i >= max_window_layers; 5.x windows the layers layer_types calls "sliding_attention" (and only
 * when use_sliding_window, since it drops the window otherwise). The two must agree. */
static zt_status check_layer_types(const cJSON *root, const char *path) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (!lt || cJSON_IsNull(lt))
        return ZT_OK;
    int n_layer = int_or(root, "num_hidden_layers", 32);
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n_layer)
        return zt_error(ZT_ERR_FORMAT, "%s: key 'layer_types' must be a list of "
                        "num_hidden_layers (%d) strings", path, n_layer);
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    bool use = zt_json_truthy(cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window")) &&
               sw && !cJSON_IsNull(sw);
    int mwl = int_or(root, "max_window_layers", 28);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, lt) {
        bool sliding = cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
        if (!sliding && !(cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: key 'layer_types[%d]' must be "
                            "\"full_attention\" or \"sliding_attention\"", path, i);
        if ((sliding && use) != (use && i >= mwl))
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: key 'layer_types[%d]' is \"%s\" but "
                            "use_sliding_window and max_window_layers (%d) make layer %d %s: "
                            "transformers 4 and 5 would build different models", path, i,
                            t->valuestring, mwl, i, use && i >= mwl ? "windowed" : "full");
        i++;
    }
    return ZT_OK;
}

/* Qwen2Attention of transformers 5 takes config.head_dim where there is one; 4.x always
 * divides hidden_size by the heads. Only a head_dim both agree on is accepted. */
static zt_status check_qwen2_head_dim(const cJSON *root, const char *path) {
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (!hd || cJSON_IsNull(hd))
        return ZT_OK;
    int heads = int_or(root, "num_attention_heads", 32);
    int want = heads > 0 ? int_or(root, "hidden_size", 4096) / heads : 0;
    if (!cJSON_IsNumber(hd) || hd->valuedouble != want)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: key 'head_dim' of a qwen2 model must be "
                        "hidden_size / num_attention_heads (%d): transformers 4 ignores it", path,
                        want);
    return ZT_OK;
}

/* rope_type "default" is plain RoPE in both versions (ROPE_INIT_FUNCTIONS["default"] reads no
 * member but rope_theta, and 4.x's rope_config_validation only warns about others): after the
 * checks above, a rope_scaling of that type reads as null, no scaling. */
static void drop_default_scaling(cJSON *root) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (cJSON_IsObject(rs) && zt_json_truthy(rs) && strcmp(rope_type_of(rs), "default") == 0)
        cJSON_ReplaceItemInObjectCaseSensitive(root, "rope_scaling", cJSON_CreateNull());
}

/* GPT2MLP's width is n_inner when set, else 4 * n_embd: an integer n_inner of exactly that is
 * the default spelled out (as some converters write it) and reads as null, the value the
 * n_inner row accepts. A float stays, for the row to refuse (transformers' Conv1D fails on it). */
static void drop_default_inner(cJSON *root) {
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    const cJSON *embd = cJSON_GetObjectItemCaseSensitive(root, "n_embd");
    double width = 4.0 * (embd ? (cJSON_IsNumber(embd) ? embd->valuedouble : -1) : 768);
    if (cJSON_IsNumber(inner) && !zt_json_is_float_literal(inner) &&
        inner->valuedouble == width)
        cJSON_ReplaceItemInObjectCaseSensitive(root, "n_inner", cJSON_CreateNull());
}

zt_status zt_hf_layout_read(cJSON *root, const char *type, const char *path) {
    if (strcmp(type, "gpt2") == 0)
        drop_default_inner(root);
    ZT_TRY(read_rope(root, type, path));
    if (strcmp(type, "gpt2") != 0)
        drop_default_scaling(root);
    if (strcmp(type, "qwen2") == 0) {
        ZT_TRY(check_layer_types(root, path));
        ZT_TRY(check_qwen2_head_dim(root, path));
    }
    return ZT_OK;
}

void zt_hf_layout_write(cJSON *root, const char *type) {
    if (strcmp(type, "gpt2") == 0)
        return;
    cJSON *rp = cJSON_CreateObject();
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (cJSON_IsObject(rs)) {
        const cJSON *m;
        cJSON_ArrayForEach(m, rs) cJSON_AddItemToObject(rp, m->string, cJSON_Duplicate(m, true));
    } else {
        cJSON_AddStringToObject(rp, "rope_type", "default");
    }
    const cJSON *theta = cJSON_GetObjectItemCaseSensitive(root, "rope_theta");
    cJSON_AddItemToObject(rp, "rope_theta", cJSON_Duplicate(theta, true));
    cJSON_AddItemToObject(root, "rope_parameters", rp);
    if (strcmp(type, "qwen2") == 0) {
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
        bool use = zt_json_truthy(cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window")) &&
                   sw && !cJSON_IsNull(sw);
        int n_layer = int_or(root, "num_hidden_layers", 32);
        int mwl = int_or(root, "max_window_layers", 28);
        cJSON *lt = cJSON_AddArrayToObject(root, "layer_types");
        for (int i = 0; i < n_layer; i++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(use && i >= mwl ? "sliding_attention"
                                                                        : "full_attention"));
    }
}
