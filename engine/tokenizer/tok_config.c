/* The tokenizer class of a Hugging Face directory and what it does to tokenizer.json's template:
 * AutoTokenizer picks a class (tokenizer_config.json's tokenizer_class, else config.json's, else
 * the class of config.json's model_type), and some classes (transformers 4.46's
 * update_post_processor) replace the post-processor with one built from add_bos_token and
 * add_eos_token, so a Llama-2 directory's "add_eos_token": true ends every sequence with </s>. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "tok_internal.h"

/* The classes whose __init__ rebuilds the template as "[bos] $A [eos]", with their defaults for
 * a flag the config leaves out (their default tokens are tok_class_default's). */
typedef struct {
    const char *name;
    bool add_bos, add_eos;
} rebuilding_class;

static const rebuilding_class REBUILDING[] = {
    {"LlamaTokenizer", true, false},   {"CodeLlamaTokenizer", true, false},
    {"GemmaTokenizer", true, false},   {"GPTNeoXTokenizer", false, false},
    {"CohereTokenizer", true, false},
};

/* The classes that keep tokenizer.json's post-processor: PreTrainedTokenizerFast itself, the
 * classes of the other families ztrain trains, and transformers 5's TokenizersBackend (the base
 * class 5.x writes as tokenizer_class; from_pretrained in 5.x drops add_bos_token and
 * add_eos_token whenever a tokenizer.json is there, so tokenizer.json's template is the one). */
static const char *const FOLLOWING[] = {"PreTrainedTokenizer", "GPT2Tokenizer",
                                        "Qwen2Tokenizer", "TokenizersBackend"};

/* AutoTokenizer's class for a config.json model_type, for the families above. */
static const struct {
    const char *model_type, *cls;
} BY_MODEL_TYPE[] = {
    {"llama", "LlamaTokenizer"},    {"mistral", "LlamaTokenizer"},
    {"mixtral", "LlamaTokenizer"},  {"gemma", "GemmaTokenizer"},
    {"gemma2", "GemmaTokenizer"},   {"gpt_neox", "GPTNeoXTokenizer"},
    {"cohere", "CohereTokenizer"},  {"gpt2", "GPT2Tokenizer"},
    {"qwen2", "Qwen2Tokenizer"},
};

/* dir/name beside the tokenizer.json, parsed into *out (NULL when the file does not exist). */
static zt_status load_beside(const char *tok_path, const char *name, char *path, size_t cap,
                             cJSON **out) {
    *out = NULL;
    zt_path_beside(tok_path, name, path, cap);
    if (!zt_path_exists(path))
        return ZT_OK;
    ZT_TRY(zt_json_load_file(path, out));
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return zt_error(ZT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return ZT_OK;
}

/* A special token's text as transformers reads it: a string or an AddedToken object's content;
 * *present is false when the key is missing (the class default applies), and the text NULL when
 * it is given as null. */
static zt_status token_text(const cJSON *config, const char *key, const char *src,
                            bool *present, const char **text) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    *present = v != NULL;
    return zt_json_token_text(v, src, key, text);
}

/* One side of the rebuilt template: the token's id when the flag is on, as update_post_processor
 * builds it (and raises when the token is None). */
static zt_status side(zt_tokenizer_t *t, const cJSON *config, const char *src,
                      const rebuilding_class *c, bool bos, int32_t **ids, size_t *n) {
    const char *flag = bos ? "add_bos_token" : "add_eos_token";
    const char *key = bos ? "bos_token" : "eos_token";
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(config, flag);
    if (f && !cJSON_IsBool(f) && !cJSON_IsNull(f))
        return zt_error(ZT_ERR_FORMAT, "%s: %s must be true or false", src, flag);
    bool on = f ? cJSON_IsTrue(f) : bos ? c->add_bos : c->add_eos;
    bool present;
    const char *text;
    ZT_TRY(token_text(config, key, src, &present, &text));
    if (!present)
        text = tok_class_default(c->name, key);
    free(*ids);
    *ids = NULL;
    *n = 0;
    if (!on)
        return ZT_OK;
    if (!text)
        return zt_error(ZT_ERR_INVALID, "%s: %s is true but %s is null (transformers' %sFast "
                        "raises \"%s = True but %s = None\"); give %s or set %s to false",
                        src, flag, key, c->name, flag, key, key, flag);
    int32_t id = zt_tokenizer_token_id(t, text);
    /* transformers would add a token the tokenizer lacks as a new one, past the vocabulary. */
    if (id < 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s \"%s\" (which %s puts in every sequence, "
                        "%s) is not a token of %s; name one of its tokens as %s", src, key, text,
                        flag, present ? "given here" : "the class default", t->path, key);
    if (!(*ids = malloc(sizeof **ids)))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    (*ids)[0] = id;
    *n = 1;
    return ZT_OK;
}

/* tokenizer_config.json's add_prefix_space, which some classes' __init__ applies to the
 * tokenizer.json they read and ztrain does not: refused where it would change the encoding.
 * LlamaTokenizerFast converts from the sentencepiece tokenizer.model when it is set at all;
 * GPT2 and GPTNeoX rewrite a top-level pre-tokenizer's add_prefix_space that differs from it
 * (default false); Cohere turns every add_prefix_space false into true when it is true. */
static zt_status prefix_space(const cJSON *config, const cJSON *pre, const char *cls,
                              const char *src) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(config, "add_prefix_space");
    const cJSON *has = cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space");
    const char *value = !a ? "missing (false)" : cJSON_IsTrue(a) ? "true"
                      : cJSON_IsFalse(a) ? "false" : "null";
    if (strcmp(cls, "LlamaTokenizer") == 0 && a && !cJSON_IsNull(a))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: add_prefix_space %s makes transformers' "
                        "LlamaTokenizerFast convert tokenizer.model with sentencepiece instead of "
                        "reading tokenizer.json, which ztrain does not; remove the key", src,
                        value);
    if ((strcmp(cls, "GPT2Tokenizer") == 0 || strcmp(cls, "GPTNeoXTokenizer") == 0) &&
        cJSON_IsBool(has) && cJSON_IsTrue(has) != cJSON_IsTrue(a))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: add_prefix_space %s makes transformers' %sFast "
                        "rewrite tokenizer.json's pre_tokenizer (add_prefix_space %s), which "
                        "ztrain does not; set add_prefix_space to %s", src, value, cls,
                        cJSON_IsTrue(has) ? "true" : "false", cJSON_IsTrue(has) ? "true" : "false");
    if (strcmp(cls, "CohereTokenizer") == 0 && cJSON_IsTrue(a))
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: add_prefix_space true makes transformers' "
                        "CohereTokenizerFast rewrite tokenizer.json's pre_tokenizer and decoder, "
                        "which ztrain does not; remove the key", src);
    return ZT_OK;
}

/* The class name without "Fast": AutoTokenizer takes "LlamaTokenizer" and "LlamaTokenizerFast"
 * alike to the fast class. */
static void base_name(const char *cls, char *out, size_t cap) {
    size_t n = strlen(cls);
    if (n > 4 && strcmp(cls + n - 4, "Fast") == 0)
        n -= 4;
    snprintf(out, cap, "%.*s", (int)n, cls);
}

/* The class AutoTokenizer picks, into cls (empty when nothing names one), and where it is named. */
static zt_status pick_class(const cJSON *tc, const char *tc_path, const cJSON *mc,
                            const char *mc_path, char *cls, size_t cap, const char **named_in) {
    cls[0] = '\0';
    const char *name = tc ? tok_json_str(tc, "tokenizer_class") : NULL;
    *named_in = tc_path;
    if (!name && mc) {
        name = tok_json_str(mc, "tokenizer_class");
        *named_in = mc_path;
    }
    if (name) {
        base_name(name, cls, cap);
        return ZT_OK;
    }
    const char *type = mc ? tok_json_str(mc, "model_type") : NULL;
    if (!type)
        return ZT_OK;
    for (size_t i = 0; i < sizeof BY_MODEL_TYPE / sizeof BY_MODEL_TYPE[0]; i++)
        if (strcmp(type, BY_MODEL_TYPE[i].model_type) == 0) {
            snprintf(cls, cap, "%s", BY_MODEL_TYPE[i].cls);
            return ZT_OK;
        }
    return zt_error(ZT_ERR_UNSUPPORTED, "%s: model_type \"%s\" picks a tokenizer class ztrain "
                    "does not know (it knows those of llama, mistral, mixtral, gemma, gemma2, "
                    "gpt_neox, cohere, gpt2, qwen2); name the class as tokenizer_class in "
                    "tokenizer_config.json (PreTrainedTokenizerFast keeps tokenizer.json's "
                    "post-processor)", mc_path, type);
}

/* Whether ztrain knows the class (by its name without "Fast"); *c is its entry when it rebuilds
 * the template, NULL when it keeps tokenizer.json's. */
static bool known_class(const char *cls, const rebuilding_class **c) {
    *c = NULL;
    for (size_t i = 0; i < sizeof REBUILDING / sizeof REBUILDING[0]; i++)
        if (strcmp(cls, REBUILDING[i].name) == 0) {
            *c = &REBUILDING[i];
            return true;
        }
    for (size_t i = 0; i < sizeof FOLLOWING / sizeof FOLLOWING[0]; i++)
        if (strcmp(cls, FOLLOWING[i]) == 0)
            return true;
    return false;
}

/* The class AutoTokenizer picks for the directory of tc (tokenizer_config.json at tc_path, NULL
 * when there is none) and config.json beside it, into cls ("" for none), refused when ztrain
 * does not know it; *c as known_class gives it. */
static zt_status dir_class(const cJSON *tc, const char *tc_path, char *cls, size_t cap,
                           const rebuilding_class **c) {
    char mc_path[PATH_MAX];
    cJSON *mc = NULL;
    const char *named_in = NULL;
    *c = NULL;
    zt_status s = load_beside(tc_path, "config.json", mc_path, sizeof mc_path, &mc);
    if (s == ZT_OK)
        s = pick_class(tc, tc_path, mc, mc_path, cls, cap, &named_in);
    if (s == ZT_OK && cls[0] && !known_class(cls, c))
        s = zt_error(ZT_ERR_UNSUPPORTED, "%s: tokenizer_class %sFast is not one ztrain knows "
                     "(Llama, CodeLlama, Gemma, GPTNeoX and Cohere rebuild the template from "
                     "add_bos_token/add_eos_token; PreTrainedTokenizerFast, GPT2, Qwen2 and "
                     "transformers 5's TokenizersBackend keep tokenizer.json's); name PreTrainedTokenizerFast to keep tokenizer.json's "
                     "post-processor", named_in, cls);
    cJSON_Delete(mc);
    return s;
}

zt_status zt_tokenizer_special_tokens_map(const char *tokenizer_config, const cJSON *config,
                                          cJSON **out) {
    char cls[128] = "";
    const rebuilding_class *c;
    *out = NULL;
    ZT_TRY(dir_class(config, tokenizer_config, cls, sizeof cls, &c));
    return tok_special_tokens_map(config, tokenizer_config, cls, out);
}

zt_status tok_apply_class(zt_tokenizer_t *t, const cJSON *root) {
    char tc_path[PATH_MAX], cls[128] = "";
    cJSON *tc = NULL;
    zt_status s = load_beside(t->path, "tokenizer_config.json", tc_path, sizeof tc_path, &tc);
    const rebuilding_class *c = NULL;
    if (s == ZT_OK)
        s = dir_class(tc, tc_path, cls, sizeof cls, &c);
    /* The flags and tokens are read from tokenizer_config.json alone (an empty one when it is
     * missing and config.json names the class), as from_pretrained passes them. */
    cJSON *empty = NULL;
    const cJSON *config = tc;
    if (s == ZT_OK && c && !tc && !(config = empty = cJSON_CreateObject()))
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->path);
    /* without tokenizer_config.json, config.json is what names the class */
    char mc_path[PATH_MAX];
    zt_path_beside(t->path, "config.json", mc_path, sizeof mc_path);
    const char *src = tc ? tc_path : mc_path;
    if (s == ZT_OK && cls[0])
        s = prefix_space(tc, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), cls, src);
    if (s == ZT_OK && c)
        s = side(t, config, src, c, true, &t->tmpl_before, &t->n_before);
    if (s == ZT_OK && c)
        s = side(t, config, src, c, false, &t->tmpl_after, &t->n_after);
    /* The special tokens are the class's and the config's whatever the class does with the
     * template; with neither file, AutoTokenizer has no class and adds none. An added_tokens.json
     * there is read as PreTrainedTokenizerFast.from_pretrained reads it (with an empty config),
     * rather than left aside. */
    char json_path[PATH_MAX];
    zt_path_beside(t->path, "added_tokens.json", json_path, sizeof json_path);
    bool add = tc || cls[0] || zt_path_exists(json_path);
    if (s == ZT_OK && add && !config && !(config = empty = cJSON_CreateObject()))
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->path);
    if (s == ZT_OK && add)
        s = tok_add_config_tokens(t, config, src, cls);
    cJSON_Delete(empty);
    cJSON_Delete(tc);
    return s;
}
