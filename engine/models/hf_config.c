/* config.json of a Hugging Face model directory <-> the model spec (ztrain/hf_config.h).
 *
 * One table says, per model_type, which config key fills which spec field, with Hugging Face's
 * own default for a key the file leaves out (save_pretrained drops keys equal to the defaults,
 * GPT-2's tie_word_embeddings for one), and which keys must hold a value ztrain can represent.
 * Reading and writing both walk it, so a key is mapped once. Fields are found by name through
 * the family's table (zt_model_family_field): a family that is not registered in this build
 * is refused by name, and its rows cost nothing until it is. */
#define _POSIX_C_SOURCE 200809L
#include "ztrain/hf_config.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "ztrain/model_fields.h"
#include "ztrain/safetensors.h"

#include "hf_layout.h"

typedef enum {
    ROW_FIELD, /* config key <-> spec field */
    ROW_CONST, /* a spec field this model_type fixes, with no key (Qwen2's q/k/v biases) */
    ROW_FIXED, /* a key that must hold one of `allowed` (written as the first of them) */
} row_kind;

typedef struct {
    const char *types;   /* the model_types it applies to, space-separated */
    row_kind kind;
    const char *key;     /* config.json key; "a.b" is member b of the object under a */
    const char *field;   /* the spec field (FIELD, CONST) */
    /* JSON text of Hugging Face's default for an absent key ("null" is the field's own
     * default); for CONST the value. */
    const char *def;
    const char *allowed; /* JSON array text of the values ztrain can represent, or NULL */
    /* The row applies only where this holds of the config: "key" (present, not null, not
     * false) or "key=value" for a string. Otherwise the field takes its default. */
    const char *when;
    /* On export, what a 0 in the field stands for: another field, or "a/b" for their
     * quotient (head_dim 0 is n_embd / n_head). */
    const char *zero_is;
    bool positions;      /* the value bounds model.block_size (n_positions) */
    /* The value sizes a tensor or counts layers: transformers passes it to torch as it is, and
     * from_pretrained fails (TypeError) on a float, even a whole one ("4.0"). The other integer
     * keys (max_position_embeddings, sliding_window, ...) load as floats and are read as ints. */
    bool int_only;
} hf_row;

#define LLAMA_LIKE "llama mistral qwen2"
#define FIELD(t, k, f, d, ...)                                                                \
    {.types = t, .kind = ROW_FIELD, .key = k, .field = f, .def = d, __VA_ARGS__}
#define FIXED(t, k, d, a) {.types = t, .kind = ROW_FIXED, .key = k, .def = d, .allowed = a}
#define CONST(t, f, d) {.types = t, .kind = ROW_CONST, .field = f, .def = d}

static const hf_row rows[] = {
    /* GPT-2 (GPT2LMHeadModel). n_positions is the length of the position table, which the
     * loader crops to block_size; export writes block_size. */
    FIELD("gpt2", "n_layer", "n_layer", "12", .int_only = true),
    FIELD("gpt2", "n_head", "n_head", "12", .int_only = true),
    FIELD("gpt2", "n_embd", "n_embd", "768", .int_only = true),
    FIELD("gpt2", "vocab_size", "vocab_size", "50257", .int_only = true),
    FIELD("gpt2", "n_positions", NULL, "1024", .positions = true, .int_only = true),
    FIXED("gpt2", "n_inner", "null", "[null]"),
    /* transformers' ACT2FN computes all four with GELU's tanh approximation (gelu_fast writes
     * sqrt(2/pi) as 0.7978845608, 3e-11 from it). */
    FIXED("gpt2", "activation_function", "\"gelu_new\"",
          "[\"gelu_new\", \"gelu_pytorch_tanh\", \"gelu_fast\", \"gelu_accurate\"]"),
    FIXED("gpt2", "layer_norm_epsilon", "1e-05", "[1e-05]"),
    FIXED("gpt2", "scale_attn_weights", "true", "[true]"),
    FIXED("gpt2", "scale_attn_by_inverse_layer_idx", "false", "[false]"),
    FIXED("gpt2", "add_cross_attention", "false", "[false]"),
    FIXED("gpt2", "tie_word_embeddings", "true", "[true]"),

    /* The Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM), with the
     * defaults of transformers' LlamaConfig, MistralConfig and Qwen2Config. */
    FIELD(LLAMA_LIKE, "num_hidden_layers", "n_layer", "32", .int_only = true),
    FIELD(LLAMA_LIKE, "num_attention_heads", "n_head", "32", .int_only = true),
    FIELD(LLAMA_LIKE, "hidden_size", "n_embd", "4096", .int_only = true),
    FIELD("llama mistral", "vocab_size", "vocab_size", "32000", .int_only = true),
    FIELD("qwen2", "vocab_size", "vocab_size", "151936", .int_only = true),
    FIELD("llama", "num_key_value_heads", "n_kv_head", "null", .zero_is = "n_head",
          .int_only = true),
    FIELD("mistral", "num_key_value_heads", "n_kv_head", "8", .zero_is = "n_head",
          .int_only = true),
    FIELD("qwen2", "num_key_value_heads", "n_kv_head", "32", .zero_is = "n_head",
          .int_only = true),
    /* Qwen2Config has no head_dim: its heads are always hidden_size / num_attention_heads. */
    FIELD("llama mistral", "head_dim", "head_dim", "null", .zero_is = "n_embd/n_head",
          .int_only = true),
    FIELD("llama", "intermediate_size", "intermediate_size", "11008", .int_only = true),
    FIELD("mistral", "intermediate_size", "intermediate_size", "14336", .int_only = true),
    FIELD("qwen2", "intermediate_size", "intermediate_size", "22016", .int_only = true),
    FIELD(LLAMA_LIKE, "rms_norm_eps", "rms_norm_eps", "1e-06"),
    FIELD(LLAMA_LIKE, "rope_theta", "rope_theta", "10000.0"),
    FIELD("llama", "max_position_embeddings", "max_position_embeddings", "2048",
          .zero_is = "block_size", .positions = true),
    FIELD("mistral", "max_position_embeddings", "max_position_embeddings", "131072",
          .zero_is = "block_size", .positions = true),
    FIELD("qwen2", "max_position_embeddings", "max_position_embeddings", "32768",
          .zero_is = "block_size", .positions = true),
    FIELD(LLAMA_LIKE, "tie_word_embeddings", "tie_word_embeddings", "false"),
    /* transformers' ACT2FN maps both names to nn.SiLU. */
    FIXED(LLAMA_LIKE, "hidden_act", "\"silu\"", "[\"silu\", \"swish\"]"),
    /* ztrain has no dropout; the published Llama, Mistral and Qwen2 configs have none. */
    FIXED(LLAMA_LIKE, "attention_dropout", "0.0", "[0.0]"),
    /* transformers 4.x splits the projections into pretraining_tp slices when it is above 1. */
    FIXED("llama", "pretraining_tp", "1", "[1]"),
    FIELD("llama", "attention_bias", "qkv_bias", "false"),
    FIELD("llama", "attention_bias", "o_bias", "false"),
    FIXED("llama", "mlp_bias", "false", "[false]"),
    CONST("mistral", "qkv_bias", "false"),
    CONST("qwen2", "qkv_bias", "true"),
    CONST("mistral qwen2", "o_bias", "false"),
    FIELD("mistral", "sliding_window", "sliding_window", "4096"),
    FIELD("qwen2", "sliding_window", "sliding_window", "4096", .when = "use_sliding_window"),
    /* rope_scaling is an object, or null for none; rope_type "default" reads as null
     * (zt_hf_layout_read), and a type outside these is refused there first. */
    FIELD("llama qwen2", "rope_scaling.rope_type", "rope_scaling", "null",
          .allowed = "[\"linear\", \"llama3\"]", .when = "rope_scaling"),
    /* transformers has no defaults for these: a scaling type without one of its members is
     * refused by zt_hf_layout_read before the rows are read. */
    FIELD("llama qwen2", "rope_scaling.factor", "rope_factor", "null", .when = "rope_scaling"),
    FIELD("llama qwen2", "rope_scaling.low_freq_factor", "rope_low_freq_factor", "null",
          .when = "rope_scaling.rope_type=llama3"),
    FIELD("llama qwen2", "rope_scaling.high_freq_factor", "rope_high_freq_factor", "null",
          .when = "rope_scaling.rope_type=llama3"),
    FIELD("llama qwen2", "rope_scaling.original_max_position_embeddings",
          "rope_original_max_position", "null", .when = "rope_scaling.rope_type=llama3"),
};

/* The class from_pretrained builds for each model_type (config.json's "architectures"). */
static const struct {
    const char *type, *architecture;
} architectures[] = {
    {"gpt2", "GPT2LMHeadModel"},
    {"llama", "LlamaForCausalLM"},
    {"mistral", "MistralForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
};

static const char *architecture_of(const char *type) {
    for (size_t i = 0; i < sizeof architectures / sizeof architectures[0]; i++)
        if (strcmp(architectures[i].type, type) == 0)
            return architectures[i].architecture;
    return NULL;
}

static bool row_applies(const hf_row *r, const char *type) {
    size_t n = strlen(type);
    for (const char *p = r->types; (p = strstr(p, type)) != NULL; p += n)
        if ((p == r->types || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

/* The item under a dotted key ("rope_scaling.factor"), or NULL. */
static const cJSON *lookup(const cJSON *root, const char *key) {
    const char *dot = strchr(key, '.');
    if (!dot)
        return cJSON_GetObjectItemCaseSensitive(root, key);
    char head[64];
    snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, head);
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, dot + 1) : NULL;
}

static bool when_holds(const hf_row *r, const cJSON *root) {
    if (!r->when)
        return true;
    const char *eq = strchr(r->when, '=');
    char key[96];
    snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - r->when) : (int)strlen(r->when), r->when);
    const cJSON *v = lookup(root, key);
    if (eq)
        return cJSON_IsString(v) && strcmp(v->valuestring, eq + 1) == 0;
    /* transformers tests it with `if config.key:` (use_sliding_window, rope_scaling). */
    return zt_json_truthy(v);
}

/* The row's value in the config: the key, its alias, or Hugging Face's default (parsed into
 * *owned, which the caller deletes). NULL only when out of memory. */
static const cJSON *row_value(const hf_row *r, const cJSON *root, cJSON **owned) {
    *owned = NULL;
    const cJSON *v = r->key ? lookup(root, r->key) : NULL;
    if (!v)
        v = *owned = cJSON_Parse(r->def);
    return v;
}

/* A row whose key is a boolean to transformers: its allowed values are true or false. */
static bool boolean_row(const hf_row *r) {
    return r->allowed && (strncmp(r->allowed, "[true", 5) == 0 ||
                          strncmp(r->allowed, "[false", 6) == 0);
}

/* Whether v is one of the row's allowed values; for a boolean key, whether its truth (as
 * transformers reads it: 0 and null are false, 1 is true) is. */
static bool allowed_value(const hf_row *r, const cJSON *v) {
    cJSON *allowed = cJSON_Parse(r->allowed);
    bool ok = false;
    const cJSON *a;
    cJSON_ArrayForEach(a, allowed) {
        if (cJSON_Compare(a, v, true) ||
            (cJSON_IsBool(a) && boolean_row(r) && cJSON_IsTrue(a) == zt_json_truthy(v)))
            ok = true;
    }
    cJSON_Delete(allowed);
    return ok;
}

/* Sets field f of spec from a config value; null leaves the field's default. */
static zt_status set_field(const zt_model_field *f, zt_model_spec *spec, const cJSON *v,
                           const char *path, const char *key) {
    void *p = (char *)spec + f->offset;
    char got[96];
    zt_json_repr(v, got, sizeof got);
    /* transformers stores a boolean key as given and tests it with `if`: any value reads by
     * its truth, null and 0 as false (tie_word_embeddings 0 is an untied model). */
    if (f->kind == ZT_FIELD_BOOL) {
        *(bool *)p = zt_json_truthy(v);
        return ZT_OK;
    }
    if (cJSON_IsNull(v)) {
        zt_model_field_set_default(f, spec);
        return ZT_OK;
    }
    switch (f->kind) {
    case ZT_FIELD_INT:
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
            break;
        if (v->valuedouble < INT_MIN || v->valuedouble > INT_MAX)
            return zt_error(ZT_ERR_FORMAT, "%s: key '%s' (for model.%s) is %s, out of range: "
                            "ztrain holds it in a 32-bit integer (at most %d)", path, key,
                            f->key, got, INT_MAX);
        *(int *)p = (int)v->valuedouble;
        return ZT_OK;
    case ZT_FIELD_FLOAT:
        if (!cJSON_IsNumber(v))
            break;
        *(double *)p = v->valuedouble;
        return ZT_OK;
    case ZT_FIELD_BOOL:
        if (!cJSON_IsBool(v))
            break;
        *(bool *)p = cJSON_IsTrue(v);
        return ZT_OK;
    case ZT_FIELD_STRING:
        if (!cJSON_IsString(v) || strlen(v->valuestring) >= f->size)
            break;
        memcpy(p, v->valuestring, strlen(v->valuestring) + 1);
        return ZT_OK;
    case ZT_FIELD_PATH:
        break;
    }
    static const char *const kinds[] = {"an integer", "a number", "true or false", "a string",
                                        "a path"};
    return zt_error(ZT_ERR_FORMAT, "%s: key '%s' must be %s (for model.%s), got %s", path, key,
                    kinds[f->kind], f->key, got);
}

/* Qwen2 applies its sliding window only from layer max_window_layers on (transformers 4's flash
 * attention, 5's layer_types; hf_layout.c's rule): a max_window_layers at or past the last
 * layer windows none, and the model has no window. ztrain's window is the same in every layer,
 * so a window that leaves some layers out is refused. */
static zt_status check_qwen2(const cJSON *root, zt_hf_config *c) {
    const cJSON *use = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    const cJSON *mwl = cJSON_GetObjectItemCaseSensitive(root, "max_window_layers");
    if (mwl && !cJSON_IsNull(mwl) &&
        !(cJSON_IsNumber(mwl) && mwl->valuedouble == floor(mwl->valuedouble)))
        return zt_error(ZT_ERR_FORMAT, "%s: key 'max_window_layers' must be an integer",
                        c->path);
    double layers = cJSON_IsNumber(mwl) ? mwl->valuedouble : 28;
    if (zt_json_truthy(use) && layers >= c->spec.n_layer) {
        const zt_model_field *f = zt_model_family_field(c->family, "sliding_window");
        if (f)
            *(int *)((char *)&c->spec + f->offset) = 0;
        return ZT_OK;
    }
    if (zt_json_truthy(use) && layers > 0 && layers < c->spec.n_layer)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: key 'max_window_layers' (%d) is below "
                        "num_hidden_layers (%d) with use_sliding_window: ztrain applies one "
                        "sliding window to every layer, not to some", c->path, (int)layers,
                        c->spec.n_layer);
    return ZT_OK;
}

/* A window transformers applies (Mistral's; Qwen2's with use_sliding_window) that is 0 or
 * negative masks every key, the diagonal included: its eager attention then spreads each row
 * evenly over all positions, future ones too (NaN in float64). ztrain's 0 means no window,
 * which config.json says with null; such a value is refused rather than read as that. */
static zt_status check_window(const cJSON *root, const char *type, const char *path) {
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    bool applied = strcmp(type, "mistral") == 0 ||
                   (strcmp(type, "qwen2") == 0 &&
                    zt_json_truthy(cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window")));
    if (applied && cJSON_IsNumber(sw) && sw->valuedouble <= 0) {
        char got[64];
        zt_json_repr(sw, got, sizeof got);
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: key 'sliding_window' is %s: transformers then "
                        "masks every key, so attention spreads over all positions, future ones "
                        "too; write null for no window", path, got);
    }
    return ZT_OK;
}

/* ztrain's 0 in n_kv_head and head_dim means "the default" (n_head; n_embd / n_head), but a 0
 * in config.json is not transformers' default: num_key_value_heads 0 divides the heads by zero
 * (ZeroDivisionError), and LlamaConfig keeps head_dim 0 (only None means the default), building
 * zero-width projections. Such a value is refused rather than read as the default. MistralConfig
 * reads head_dim with `or`, so its 0 is the default, as ztrain reads it. */
static zt_status check_zero_sizes(const cJSON *root, const char *type, const char *path) {
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads");
    if (cJSON_IsNumber(kv) && kv->valuedouble == 0)
        return zt_error(ZT_ERR_FORMAT, "%s: key 'num_key_value_heads' is 0: transformers divides "
                        "num_attention_heads by it (ZeroDivisionError); write null or "
                        "num_attention_heads for one key/value head per query head", path);
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (strcmp(type, "llama") == 0 && cJSON_IsNumber(hd) && hd->valuedouble == 0)
        return zt_error(ZT_ERR_FORMAT, "%s: key 'head_dim' is 0: transformers' LlamaConfig keeps "
                        "it and builds projections of width 0; write null for hidden_size / "
                        "num_attention_heads", path);
    return ZT_OK;
}

static zt_status apply_row(const hf_row *r, const cJSON *root, zt_hf_config *c) {
    const zt_model_family *fam = c->family;
    const zt_model_field *f = r->field ? zt_model_family_field(fam, r->field) : NULL;
    if (r->field && !f)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: this build's %s has no model.%s field, which "
                        "key '%s' needs", c->path, fam->title, r->field, r->key ? r->key : "");
    if (f && !when_holds(r, root)) {
        zt_model_field_set_default(f, &c->spec);
        c->given[f - fam->fields] = true;
        c->given_key[f - fam->fields] = r->key;
        return ZT_OK;
    }
    cJSON *owned = NULL;
    const cJSON *v = r->kind == ROW_CONST ? (owned = cJSON_Parse(r->def))
                                          : row_value(r, root, &owned);
    if (!v)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", c->path);
    zt_status s = ZT_OK;
    if (r->int_only && cJSON_IsNumber(v) && zt_json_is_float_literal(v) &&
        v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 1e15)
        s = zt_error(ZT_ERR_FORMAT, "%s: key '%s' is %.0f.0, a float: transformers sizes the "
                     "model with it and from_pretrained fails on a float (TypeError); write it "
                     "as an integer, %.0f", c->path, r->key, v->valuedouble, v->valuedouble);
    /* A boolean key's null is false to transformers, not its default. */
    if (s == ZT_OK && r->allowed && (!cJSON_IsNull(v) || boolean_row(r)) &&
        !allowed_value(r, v)) {
        char got[96], truth[64] = "";
        zt_json_repr(v, got, sizeof got);
        if (boolean_row(r) && !cJSON_IsBool(v))
            snprintf(truth, sizeof truth, " (%s to transformers, which reads it by its truth)",
                     zt_json_truthy(v) ? "true" : "false");
        s = zt_error(ZT_ERR_UNSUPPORTED, "%s: key '%s' is %s%s, which ztrain's %s does not "
                     "support (supported: %s)", c->path, r->key, got, truth, fam->title,
                     r->allowed);
    }
    if (s == ZT_OK && f) {
        s = set_field(f, &c->spec, v, c->path, r->key ? r->key : r->field);
        c->given[f - fam->fields] = true;
        c->given_key[f - fam->fields] = r->key;
    }
    if (s == ZT_OK && r->positions) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > INT_MAX ||
            v->valuedouble != floor(v->valuedouble)) {
            char got[96];
            zt_json_repr(v, got, sizeof got);
            bool big = cJSON_IsNumber(v) && v->valuedouble > INT_MAX;
            s = zt_error(ZT_ERR_FORMAT, "%s: key '%s' must be a positive integer%s, got %s",
                         c->path, r->key, big ? " of at most 2147483647 (out of range)" : "",
                         got);
        } else {
            c->max_positions = (int)v->valuedouble;
            c->max_positions_key = r->key;
        }
    }
    cJSON_Delete(owned);
    return s;
}

bool zt_hf_is_dir(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The weights as far as they can be judged without the model: the index and every shard open,
 * their headers agree, and every tensor is of a dtype that converts to fp32. Only headers are
 * read (the shards are mapped, not read), so a missing shard or an I64 tensor is one error when
 * the job is read, before any rank starts; names and shapes are the loader's to check. */
static zt_status check_weights(const char *dir) {
    zt_st_set set;
    ZT_TRY(zt_st_set_open(&set, dir));
    zt_status s = ZT_OK;
    for (int i = 0; i < set.n_tensors && s == ZT_OK; i++) {
        const zt_st_tensor *t = set.tensors[i].tensor;
        if (t->dtype != ZT_ST_F32 && t->dtype != ZT_ST_F16 && t->dtype != ZT_ST_BF16 &&
            strcmp(t->dtype_name, "F64") != 0)
            s = zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, not a float type ztrain "
                         "reads (F32, F16, BF16, F64)", set.tensors[i].file->path, t->name,
                         t->dtype_name);
    }
    zt_st_set_close(&set);
    return s;
}

/* A key that no row reads and that is not known to leave the computation alone is refused:
 * transformers would build the model from it, ztrain cannot tell whether the model differs.
 * A null value is the key's absence to transformers. */
static zt_status check_known_keys(const cJSON *root, const char *type, const char *path) {
    const cJSON *m;
    cJSON_ArrayForEach(m, root) {
        if (cJSON_IsNull(m) || zt_hf_layout_key_known(type, m->string))
            continue;
        bool read = false;
        for (size_t i = 0; i < sizeof rows / sizeof rows[0] && !read; i++) {
            const char *k = rows[i].key;
            size_t n = strlen(m->string);
            read = k && row_applies(&rows[i], type) && strncmp(k, m->string, n) == 0 &&
                   (k[n] == '\0' || k[n] == '.');
        }
        if (!read)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: key '%s' is not understood by ztrain for "
                            "model_type \"%s\" (it may change the model, so it is not ignored)",
                            path, m->string, type);
    }
    return ZT_OK;
}

static zt_status read_config(cJSON *root, const char *dir, zt_hf_config *c) {
    if (!cJSON_IsObject(root))
        return zt_error(ZT_ERR_FORMAT, "%s: not a JSON object", c->path);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt))
        return zt_error(ZT_ERR_FORMAT, "%s: key 'model_type' is missing or not a string",
                        c->path);
    const char *type = mt->valuestring;
    if (!architecture_of(type)) {
        char known[128] = "";
        for (size_t i = 0; i < sizeof architectures / sizeof architectures[0]; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                     architectures[i].type);
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported by ztrain "
                        "(supported: %s)", c->path, type, known);
    }
    c->family = zt_model_family_find(type);
    if (!c->family) {
        char known[256];
        zt_model_family_names(known, sizeof known);
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not available in this "
                        "build (model families: %s)", c->path, type, known);
    }
    snprintf(c->spec.type, sizeof c->spec.type, "%s", type);
    ZT_TRY(zt_hf_layout_read(root, type, c->path));
    ZT_TRY(check_known_keys(root, type, c->path));
    ZT_TRY(check_window(root, type, c->path));
    ZT_TRY(check_zero_sizes(root, type, c->path));
    for (const zt_model_field *f = c->family->fields; f->key; f++)
        zt_model_field_set_default(f, &c->spec);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (row_applies(&rows[i], type))
            ZT_TRY(apply_row(&rows[i], root, c));
    if (strcmp(type, "qwen2") == 0)
        ZT_TRY(check_qwen2(root, c));
    /* A field no key of this model_type sets stays at its default: the config describes the
     * whole model, and a job may not change what transformers would not see (a Mistral with
     * rope scaling). The sequence length is the job's. */
    for (const zt_model_field *f = c->family->fields; f->key; f++)
        if (f->kind != ZT_FIELD_PATH && strcmp(f->key, "block_size") != 0)
            c->given[f - c->family->fields] = true;
    return check_weights(dir);
}

/* A key an object holds twice keeps its last value, as Python's json (and so transformers)
 * reads it; cJSON would find the first. */
static void keep_last(cJSON *node) {
    cJSON *c = node->child;
    while (c) {
        cJSON *next = c->next;
        if (cJSON_IsObject(c) || cJSON_IsArray(c))
            keep_last(c);
        bool later = false;
        for (const cJSON *o = next; o && cJSON_IsObject(node) && c->string && !later; o = o->next)
            later = o->string && strcmp(o->string, c->string) == 0;
        if (later)
            cJSON_Delete(cJSON_DetachItemViaPointer(node, c));
        c = next;
    }
}

zt_status zt_hf_config_read(const char *dir, zt_hf_config *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s/config.json", dir);
    cJSON *root;
    ZT_TRY(zt_json_load_file(out->path, &root));
    keep_last(root);
    zt_status s = read_config(root, dir, out);
    cJSON_Delete(root);
    return s;
}

/* ---- writing ------------------------------------------------------------------------------ */

static int int_field(const zt_model_family *fam, const zt_model_spec *spec, const char *key) {
    const zt_model_field *f = zt_model_family_field(fam, key);
    ZT_ASSERT(f && f->kind == ZT_FIELD_INT);
    return *(const int *)((const char *)spec + f->offset);
}

/* The field's value as config.json holds it, with a 0 that stands for another value replaced by
 * that value. */
static cJSON *field_json(const zt_model_family *fam, const zt_model_field *f, const hf_row *r,
                         const zt_model_spec *spec) {
    if (f->kind == ZT_FIELD_STRING) {
        const char *s = (const char *)spec + f->offset;
        return s[0] ? cJSON_CreateString(s) : cJSON_CreateNull();
    }
    const int *ip = f->kind == ZT_FIELD_INT ? (const int *)((const char *)spec + f->offset) : NULL;
    if (ip && r->zero_is && *ip == 0) {
        const char *slash = strchr(r->zero_is, '/');
        if (!slash)
            return cJSON_CreateNumber(int_field(fam, spec, r->zero_is));
        char a[32];
        snprintf(a, sizeof a, "%.*s", (int)(slash - r->zero_is), r->zero_is);
        return cJSON_CreateNumber(int_field(fam, spec, a) / int_field(fam, spec, slash + 1));
    }
    /* No window is null in Mistral's and Qwen2's configs. */
    if (ip && *ip == 0 && strcmp(r->key, "sliding_window") == 0)
        return cJSON_CreateNull();
    /* A float field holds a JSON float even when it is whole ("factor": 8.0, as save_pretrained
     * writes it): transformers checks isinstance(factor, float) and warns on an integer. */
    if (f->kind == ZT_FIELD_FLOAT) {
        double v = *(const double *)((const char *)spec + f->offset);
        if (isfinite(v) && v == floor(v) && fabs(v) < 1e15) {
            char text[32];
            snprintf(text, sizeof text, "%.1f", v);
            return cJSON_CreateRaw(text);
        }
    }
    return zt_model_field_to_cjson(f, spec);
}

/* Puts v under a dotted key, making the object the first part names (replacing a null). */
static void put(cJSON *root, const char *key, cJSON *v) {
    const char *dot = strchr(key, '.');
    if (!dot) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, key);
        cJSON_AddItemToObject(root, key, v);
        return;
    }
    char head[64];
    snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
    cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, head);
    if (!cJSON_IsObject(obj)) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, head);
        obj = cJSON_AddObjectToObject(root, head);
    }
    cJSON_AddItemToObject(obj, dot + 1, v);
}

static cJSON *config_json(const zt_model_spec *spec, const zt_model_family *fam) {
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(architecture_of(spec->type)));
    cJSON_AddStringToObject(root, "model_type", spec->type);
    /* What the Qwen2 rows' `when` reads: a window in the spec is a window on every layer. */
    if (strcmp(spec->type, "qwen2") == 0) {
        const zt_model_field *sw = zt_model_family_field(fam, "sliding_window");
        bool use = sw && *(const int *)((const char *)spec + sw->offset) > 0;
        cJSON_AddBoolToObject(root, "use_sliding_window", use);
        cJSON_AddNumberToObject(root, "max_window_layers", 0);
    }
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const hf_row *r = &rows[i];
        if (!row_applies(r, spec->type) || r->kind == ROW_CONST)
            continue;
        if (r->kind == ROW_FIXED) {
            cJSON *allowed = cJSON_Parse(r->allowed);
            const cJSON *v = cJSON_GetArrayItem(allowed, 0);
            /* A float as its default is spelled (0.0, 1e-05), which cJSON would print as 0. */
            bool spelled = cJSON_IsNumber(v) && strpbrk(r->def, ".eE");
            put(root, r->key, spelled ? cJSON_CreateRaw(r->def) : cJSON_Duplicate(v, true));
            cJSON_Delete(allowed);
            continue;
        }
        if (!r->field) {
            put(root, r->key, cJSON_CreateNumber(spec->block_size));
            continue;
        }
        const zt_model_field *f = zt_model_family_field(fam, r->field);
        ZT_ASSERT(f);
        /* Inside an object (rope_scaling), a string field names its type and makes the object
         * when it is set; the other rows follow their `when` on what is written so far. Without
         * the object the config has "rope_scaling": null, Hugging Face's default. */
        if (strchr(r->key, '.')) {
            bool named = f->kind == ZT_FIELD_STRING && ((const char *)spec + f->offset)[0];
            if (f->kind == ZT_FIELD_STRING ? !named : !when_holds(r, root))
                continue;
        }
        put(root, r->key, field_json(fam, f, r, spec));
    }
    cJSON_AddStringToObject(root, "torch_dtype", "float32");
    zt_hf_layout_write(root, spec->type);
    return root;
}

static bool written_by_row(const char *type, const char *field) {
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].kind == ROW_FIELD && rows[i].field && strcmp(rows[i].field, field) == 0 &&
            row_applies(&rows[i], type))
            return true;
    return false;
}

/* What config.json cannot say must be what transformers assumes: a field no key of the
 * model_type writes holds its default, or the value the model_type fixes (Qwen2's q/k/v
 * biases), else the directory would load as another model. */
static zt_status check_representable(const zt_model_spec *spec, const zt_model_family *fam,
                                     const char *path) {
    zt_model_spec fixed;
    memset(&fixed, 0, sizeof fixed);
    snprintf(fixed.type, sizeof fixed.type, "%s", spec->type);
    for (const zt_model_field *f = fam->fields; f->key; f++)
        zt_model_field_set_default(f, &fixed);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const hf_row *r = &rows[i];
        if (r->kind != ROW_CONST || !row_applies(r, spec->type))
            continue;
        cJSON *v = cJSON_Parse(r->def);
        zt_status s = set_field(zt_model_family_field(fam, r->field), &fixed, v, path, r->field);
        cJSON_Delete(v);
        ZT_TRY(s);
    }
    for (const zt_model_field *f = fam->fields; f->key; f++) {
        if (f->kind == ZT_FIELD_PATH || strcmp(f->key, "block_size") == 0 ||
            written_by_row(spec->type, f->key) || zt_model_field_equal(f, spec, &fixed))
            continue;
        char have[64], want[64];
        zt_model_field_format(f, spec, have, sizeof have);
        zt_model_field_format(f, &fixed, want, sizeof want);
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: model.%s is %s, but a %s config.json has no "
                        "key for it (transformers would build the model with %s)", path, f->key,
                        have, spec->type, want);
    }
    return ZT_OK;
}

zt_status zt_hf_config_write(const zt_model_spec *spec, const char *path) {
    const zt_model_family *fam = zt_model_family_find(spec->type);
    if (!fam || !architecture_of(spec->type))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: no Hugging Face architecture for model.type "
                        "\"%s\"", path, spec->type);
    /* Llama's attention_bias covers every projection: a model with biases on q, k, v alone is
     * a Qwen2 and has no Llama config. */
    const zt_model_field *qkv = zt_model_family_field(fam, "qkv_bias");
    const zt_model_field *o = zt_model_family_field(fam, "o_bias");
    if (strcmp(spec->type, "llama") == 0 && qkv && o &&
        *(const bool *)((const char *)spec + qkv->offset) !=
            *(const bool *)((const char *)spec + o->offset))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: a llama model with qkv_bias and o_bias "
                        "different has no Hugging Face config (attention_bias sets both)", path);
    ZT_TRY(check_representable(spec, fam, path));
    cJSON *root = config_json(spec, fam);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    zt_status s = zt_write_file_atomic(path, text, strlen(text));
    cJSON_free(text);
    return s;
}

bool zt_hf_parse_size(const char *text, uint64_t *bytes) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || !(v > 0))
        return false;
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},          {"B", 1},          {"KB", 1e3},       {"MB", 1e6},
                 {"GB", 1e9},      {"TB", 1e12},      {"KiB", 1024.0},   {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            double b = floor(v * units[i].scale);
            /* transformers' convert_file_size_to_int: a lowercase final b of KB, MB or GB is
             * bits ("5Gb" is 625000000 bytes), rounded down. */
            if (strlen(end) == 2 && end[1] == 'b')
                b = floor(b / 8);
            if (!(b >= 1 && b < 1.8e19))
                return false;
            *bytes = (uint64_t)b;
            return true;
        }
    }
    return false;
}
