/* The special tokens a Hugging Face directory names outside tokenizer.json's added_tokens:
 * tokenizer_config.json's bos/eos/unk/sep/pad/cls/mask_token, additional_special_tokens and
 * added_tokens_decoder, and the tokenizer class's defaults. transformers 4.46's
 * PreTrainedTokenizerFast.__init__ adds them to the backend tokenizer, so AutoTokenizer matches
 * each in text as one token and skips the special ones on decode; ztrain adds them the same way. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "tok_internal.h"

/* SpecialTokensMixin's attributes, in the order special_tokens_map_extended lists them. */
static const char *const KEYS[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                   "pad_token", "cls_token", "mask_token"};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

/* The defaults of each class's __init__ for the keys above (in KEYS' order; NULL: none). */
static const struct {
    const char *cls;
    const char *def[N_KEYS];
} DEFAULTS[] = {
    {"LlamaTokenizer", {"<s>", "</s>", "<unk>"}},
    {"CodeLlamaTokenizer", {"<s>", "</s>", "<unk>"}},
    {"GemmaTokenizer", {"<bos>", "<eos>", "<unk>", NULL, "<pad>"}},
    {"GPTNeoXTokenizer", {"<|endoftext|>", "<|endoftext|>", "<|endoftext|>"}},
    {"CohereTokenizer", {"<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<UNK>"}},
    {"GPT2Tokenizer", {"<|endoftext|>", "<|endoftext|>", "<|endoftext|>"}},
    {"Qwen2Tokenizer", {NULL, "<|endoftext|>", "<|endoftext|>", NULL, "<|endoftext|>"}},
};

/* CodeLlamaTokenizerFast appends its infilling tokens (these keys, these defaults) to
 * additional_special_tokens. */
static const char *const CODELLAMA_KEYS[] = {"prefix_token", "middle_token", "suffix_token",
                                             "eot_token"};
static const char *const CODELLAMA_DEFS[] = {"\xe2\x96\x81<PRE>", "\xe2\x96\x81<MID>",
                                             "\xe2\x96\x81<SUF>", "\xe2\x96\x81<EOT>"};

const char *tok_class_default(const char *cls, const char *key) {
    for (size_t i = 0; i < sizeof DEFAULTS / sizeof DEFAULTS[0]; i++)
        for (size_t k = 0; strcmp(cls, DEFAULTS[i].cls) == 0 && k < N_KEYS; k++)
            if (strcmp(key, KEYS[k]) == 0)
                return DEFAULTS[i].def[k];
    return NULL;
}

/* A token as transformers holds it: a string, or an AddedToken with its flags. `where` names
 * the key that gives it, for messages. */
typedef struct {
    const char *content;
    bool is_str, special, normalized;
    bool keyed;        /* given as one of KEYS (from_pretrained may swap it for an added token) */
    bool new_id;       /* added_tokens.json's text the tokenizer lacks, added as `id` */
    int32_t id;
    const char *strip; /* the first of lstrip, rstrip, single_word that is true, or NULL */
    const char *file;  /* the file that names it */
    char where[96];    /* and where in it */
} cfg_token;

typedef struct {
    cfg_token *v;
    size_t n, cap;
} cfg_list;

static bool list_push(cfg_list *l, cfg_token tk) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        cfg_token *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = tk;
    return true;
}

/* AddedToken(**obj): special defaults to false, normalized to not special, the rest to false. */
static void added_token(const cJSON *obj, cfg_token *tk) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(obj, "special");
    const cJSON *no = cJSON_GetObjectItemCaseSensitive(obj, "normalized");
    tk->is_str = false;
    tk->special = cJSON_IsTrue(sp);
    tk->normalized = cJSON_IsBool(no) ? cJSON_IsTrue(no) : !tk->special;
    tk->strip = NULL;
    const char *flags[] = {"lstrip", "rstrip", "single_word"};
    for (int f = 0; f < 3 && !tk->strip; f++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(obj, flags[f])))
            tk->strip = flags[f];
}

/* A special token key's value in `file` (string, AddedToken object, null or missing) into
 * *tk; false in *any when there is none (null, missing or empty: transformers sets no token).
 * special_tokens_map.json's AddedTokens are special whatever they say (`special`). */
static zt_status read_token(const cJSON *v, const char *file, const char *key, bool special,
                            cfg_token *tk, bool *any) {
    const char *text;
    ZT_TRY(zt_json_token_text(v, file, key, &text));
    *any = text && *text;
    if (!*any)
        return ZT_OK;
    *tk = (cfg_token){.content = text, .is_str = true, .file = file};
    snprintf(tk->where, sizeof tk->where, "%s", key);
    if (cJSON_IsObject(v)) {
        added_token(v, tk);
        if (special && !tk->special) {
            tk->special = true;
            if (!cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(v, "normalized")))
                tk->normalized = false;
        }
    }
    return ZT_OK;
}

/* Where a key's value comes from: special_tokens_map.json (`map`, NULL when it is not read)
 * overrides tokenizer_config.json, as from_pretrained's legacy branch has it. */
typedef struct {
    const cJSON *config, *map;
    const char *config_path, *map_path;
} sources;

/* A key's value: from the files when one has the key (null included), else the class default
 * (a string). */
static zt_status key_token(const sources *in, const char *key, const char *def, cfg_token *tk,
                           bool *any) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(in->map, key);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(in->config, key);
    if (m)
        return read_token(m, in->map_path, key, true, tk, any);
    if (c)
        return read_token(c, in->config_path, key, false, tk, any);
    *any = def != NULL;
    if (*any) {
        *tk = (cfg_token){.content = def, .is_str = true, .file = in->config_path};
        snprintf(tk->where, sizeof tk->where, "%s (the class default)", key);
    }
    return ZT_OK;
}

/* One file's additional_special_tokens, appended to *out. */
static zt_status extra_tokens(const cJSON *j, const char *file, bool special, cfg_list *out) {
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(j, "additional_special_tokens");
    if (extra && !cJSON_IsNull(extra) && !cJSON_IsArray(extra))
        return zt_error(ZT_ERR_FORMAT, "%s: additional_special_tokens must be a list of strings "
                        "or AddedToken objects", file);
    int i = 0;
    for (const cJSON *e = extra ? extra->child : NULL; e; e = e->next, i++) {
        char key[64];
        cfg_token tk;
        bool any;
        snprintf(key, sizeof key, "additional_special_tokens[%d]", i);
        ZT_TRY(read_token(e, file, key, special, &tk, &any));
        if (any && !list_push(out, tk))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", file);
    }
    return ZT_OK;
}

/* special_tokens_map_extended: the keys' tokens, then additional_special_tokens (the config's,
 * then special_tokens_map.json's, then CodeLlama's infilling tokens), each text once, the first
 * occurrence kept. */
static zt_status special_tokens(const sources *in, const char *cls, cfg_list *out) {
    cfg_token tk;
    bool any;
    cfg_list all = {0};
    zt_status s = ZT_OK;
    for (size_t k = 0; k < N_KEYS && s == ZT_OK; k++) {
        s = key_token(in, KEYS[k], tok_class_default(cls, KEYS[k]), &tk, &any);
        tk.keyed = true;
        if (s == ZT_OK && any && !list_push(&all, tk))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", in->config_path);
    }
    if (s == ZT_OK)
        s = extra_tokens(in->config, in->config_path, false, &all);
    if (s == ZT_OK && in->map)
        s = extra_tokens(in->map, in->map_path, true, &all);
    for (size_t k = 0; strcmp(cls, "CodeLlamaTokenizer") == 0 && k < 4 && s == ZT_OK; k++) {
        s = key_token(in, CODELLAMA_KEYS[k], CODELLAMA_DEFS[k], &tk, &any);
        if (s == ZT_OK && any && !list_push(&all, tk))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", in->config_path);
    }
    for (size_t a = 0; a < all.n && s == ZT_OK; a++) {
        bool seen = false;
        for (size_t b = 0; b < out->n && !seen; b++)
            seen = strcmp(out->v[b].content, all.v[a].content) == 0;
        if (!seen && !list_push(out, all.v[a]))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", in->config_path);
    }
    free(all.v);
    return s;
}

static int by_index(const void *a, const void *b) {
    long x = strtol((*(const cJSON *const *)a)->string, NULL, 10);
    long y = strtol((*(const cJSON *const *)b)->string, NULL, 10);
    return (x > y) - (x < y);
}

/* added_tokens_decoder's AddedTokens, by index (the indices themselves are not used: a token
 * takes the id its text has, as tokenizers' add_tokens gives it). */
static zt_status decoder_tokens(const cJSON *atd, const char *src, cfg_list *out) {
    if (!cJSON_IsObject(atd))
        return zt_error(ZT_ERR_FORMAT, "%s: added_tokens_decoder must be an object of index to "
                        "AddedToken", src);
    int n = cJSON_GetArraySize(atd), i = 0;
    const cJSON **v = calloc((size_t)n + 1, sizeof *v);
    if (!v)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    for (const cJSON *e = atd->child; e; e = e->next)
        v[i++] = e;
    qsort(v, (size_t)n, sizeof *v, by_index);
    zt_status s = ZT_OK;
    for (i = 0; i < n && s == ZT_OK; i++) {
        const char *content = tok_json_str(v[i], "content");
        cfg_token tk = {.content = content, .file = src};
        if (!content)
            s = zt_error(ZT_ERR_FORMAT, "%s: added_tokens_decoder[\"%s\"] needs a \"content\" "
                         "string", src, v[i]->string);
        added_token(v[i], &tk);
        snprintf(tk.where, sizeof tk.where, "added_tokens_decoder[\"%.60s\"]", v[i]->string);
        if (s == ZT_OK && *content && !list_push(out, tk))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    }
    free(v);
    return s;
}

/* Without added_tokens_decoder, from_pretrained hands tokenizer.json's added_tokens back to
 * __init__ in its place, so they too are added again (as special where a key names them). */
static zt_status json_tokens(const zt_tokenizer_t *t, cfg_list *out) {
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        cfg_token tk = {.content = a->s, .special = a->special, .normalized = a->normalized,
                        .file = t->path};
        snprintf(tk.where, sizeof tk.where, "added_tokens[%zu]", i);
        if (!list_push(out, tk))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->path);
    }
    return ZT_OK;
}

/* The flags add_tokens compares (AddedToken's equality is on all of them). */
static bool same_token(const cfg_token *a, const cfg_token *b) {
    return strcmp(a->content, b->content) == 0 && a->special == b->special &&
           a->normalized == b->normalized && !a->strip && !b->strip;
}

/* One token tokenizers' AddedVocabulary will match: the id its text has (an added token's,
 * else the model vocabulary's; added_tokens.json's new id for its new text), or -1 with the
 * message naming who names it. */
static zt_status match_token(zt_tokenizer_t *t, const cfg_token *tk) {
    if (tk->strip)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s (\"%s\"): %s true is not supported; set it "
                        "to false", tk->file, tk->where, tk->content, tk->strip);
    int32_t id = tk->new_id ? tk->id : zt_tokenizer_token_id(t, tk->content);
    if (tk->new_id)
        ZT_TRY(tok_set_added_text(t, id, tk->content, strlen(tk->content)));
    for (size_t i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].s, tk->content) == 0 && t->added[i].normalized == tk->normalized)
            return ZT_OK; /* matched so already */
    char origin[PATH_MAX + 128];
    snprintf(origin, sizeof origin, "%s of %s", tk->where, tk->file);
    return tok_add_token(t, tk->content, id, tk->normalized, origin);
}

/* A text's value in a table keyed by the texts (borrowed), or -1. */
static int32_t text_get(const tok_strmap *m, const char *text) {
    return tok_strmap_get(m, text, (uint32_t)strlen(text));
}

static bool text_put(tok_strmap *m, const char *text, int32_t v) {
    return tok_strmap_put(m, text, (uint32_t)strlen(text), v);
}

/* tokenizers' add_tokens on the batch: first each special token whose text is not yet special
 * is matched (the first such per text) and its text becomes special; then each token not equal
 * to one the vocabulary already holds takes its text's id, and is matched too unless its text
 * is special. A text matched twice (raw and normalized) is matched both ways, as tokenizers'
 * AddedVocabulary does. `held` is tokenizer.json's added tokens. */
static zt_status add_batch(zt_tokenizer_t *t, const cfg_list *batch, const cfg_list *held,
                           const char *src) {
    cfg_list now = {0};  /* the vocabulary's added tokens, as added_tokens_map_r has them */
    tok_strmap at = {0}; /* text -> its index in now */
    tok_strmap special = {0}; /* the special texts, as special_tokens_set */
    size_t cap = held->n + batch->n + 1;
    zt_status s = ZT_OK;
    if (!tok_strmap_init(&at, cap) || !tok_strmap_init(&special, cap))
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    for (size_t i = 0; i < held->n && s == ZT_OK; i++)
        if (!text_put(&at, held->v[i].content, (int32_t)now.n) || !list_push(&now, held->v[i]) ||
            (held->v[i].special && !text_put(&special, held->v[i].content, 1)))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    for (size_t i = 0; i < batch->n && s == ZT_OK; i++) {
        const cfg_token *tk = &batch->v[i];
        if (!tk->special || text_get(&special, tk->content) >= 0)
            continue;
        s = match_token(t, tk);
        if (s == ZT_OK && !text_put(&special, tk->content, 1))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
        int32_t id = zt_tokenizer_token_id(t, tk->content);
        if (s == ZT_OK && id >= 0)
            t->id_special[id] = true;
    }
    for (size_t i = 0; i < batch->n && s == ZT_OK; i++) {
        const cfg_token *tk = &batch->v[i];
        int32_t j = text_get(&at, tk->content);
        if (j >= 0 && same_token(&now.v[j], tk))
            continue;
        if (j >= 0)
            now.v[j] = *tk;
        else if (!text_put(&at, tk->content, (int32_t)now.n) || !list_push(&now, *tk))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
        if (s == ZT_OK && text_get(&special, tk->content) < 0)
            s = match_token(t, tk);
    }
    tok_strmap_free(&at);
    tok_strmap_free(&special);
    free(now.v);
    return s;
}

/* ---- added_tokens.json ---------------------------------------------------------------------- */

/* The value from_pretrained holds for a key: special_tokens_map.json's (the legacy branch
 * overwrites the config's with it) when the map has the key, else the config's; *from_map says
 * which. */
static const cJSON *held_value(const sources *in, const char *key, bool *from_map) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(in->map, key);
    *from_map = m != NULL;
    return m ? m : cJSON_GetObjectItemCaseSensitive(in->config, key);
}

/* What str() gives for a value held then: a string itself, an AddedToken its content, anything
 * else NULL (None is skipped; a dict's str() is no token's text). The map's objects are already
 * AddedTokens; the config's become so (`converted`) only where they say "__type": "AddedToken",
 * after added_tokens.json is read. */
static const char *held_text(const cJSON *v, bool from_map, bool converted) {
    if (cJSON_IsString(v))
        return v->valuestring;
    const char *type = tok_json_str(v, "__type");
    if (cJSON_IsObject(v) && (from_map || (converted && type && strcmp(type, "AddedToken") == 0)))
        return tok_json_str(v, "content");
    return NULL;
}

/* Whether from_pretrained's legacy branch makes added_tokens.json's `text` special: it is the
 * value of a key or an item of additional_special_tokens as from_pretrained holds them then
 * (the config's list with the map's items after it, or the map's value alone when that is not
 * a list). The class's defaults are not among them. */
static bool legacy_special(const sources *in, const char *text) {
    bool from_map = false;
    for (size_t k = 0; k < N_KEYS; k++) {
        const char *v = held_text(held_value(in, KEYS[k], &from_map), from_map, false);
        if (v && strcmp(v, text) == 0)
            return true;
    }
    const cJSON *list = held_value(in, "additional_special_tokens", &from_map);
    const cJSON *config_list = cJSON_GetObjectItemCaseSensitive(in->config,
                                                                "additional_special_tokens");
    for (const cJSON *e = from_map && cJSON_IsArray(list) && cJSON_IsArray(config_list)
                              ? config_list->child : NULL; e; e = e->next)
        if (cJSON_IsString(e) && strcmp(e->valuestring, text) == 0)
            return true;
    for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e; e = e->next) {
        const char *v = held_text(e, from_map, false);
        if (v && strcmp(v, text) == 0)
            return true;
    }
    return false;
}

/* tokenizer.json's added tokens by text and by id, so that a file of thousands of entries
 * beside thousands of added tokens is checked without comparing each with every other. */
typedef struct {
    tok_strmap by_text; /* text -> the first added token of it */
    int32_t *by_id;     /* id -> the last added token of it (as the decoder dict keeps), or -1 */
} added_index;

static zt_status index_added(const zt_tokenizer_t *t, added_index *ix) {
    ix->by_id = malloc(((size_t)t->n_ids + 1) * sizeof *ix->by_id);
    if (!ix->by_id || !tok_strmap_init(&ix->by_text, t->n_added + 1))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", t->path);
    for (int32_t id = 0; id < t->n_ids; id++)
        ix->by_id[id] = -1;
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (text_get(&ix->by_text, a->s) < 0)
            text_put(&ix->by_text, a->s, (int32_t)i);
        ix->by_id[a->id] = (int32_t)i;
    }
    return ZT_OK;
}

/* Whether tokenizer.json's added_tokens hold text. */
static bool json_added(const added_index *ix, const char *text) {
    return text_get(&ix->by_text, text) >= 0;
}

/* from_pretrained's legacy branch files each added_tokens.json entry under str(token), `token`
 * being a variable left over from an earlier loop: the last item of special_tokens_map.json's
 * additional_special_tokens, else its own `token` argument (None). The last entry stays filed
 * there, unless tokenizer.json has an added token of that text, and a key whose text it is then
 * takes that entry in its place. ztrain refuses where that changes the key's text. */
static zt_status check_misfiled(const added_index *ix, const sources *in, const char *path,
                                const char *last) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(in->map, "additional_special_tokens");
    int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
    const char *under = n ? held_text(cJSON_GetArrayItem(list, n - 1), true, true) : NULL;
    if (!under)
        under = "None";
    if (!last || strcmp(last, under) == 0 || json_added(ix, under))
        return ZT_OK;
    for (size_t k = 0; k < N_KEYS; k++) {
        bool from_map = false;
        const cJSON *v = held_value(in, KEYS[k], &from_map);
        const char *text = held_text(v, from_map, true);
        if (text && strcmp(text, under) == 0)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: transformers 4.46 reads %s \"%s\" (%s) as "
                            "this file's last entry \"%s\" (its from_pretrained files that entry "
                            "under the text of special_tokens_map.json's last "
                            "additional_special_tokens item, else \"None\"), which ztrain does not "
                            "reproduce; make \"%s\" the file's last entry, or add it to "
                            "tokenizer.json's added_tokens", path, KEYS[k], text,
                            from_map ? in->map_path : in->config_path, last, text);
    }
    return ZT_OK;
}

/* The id tokenizers gives the next text it lacks: past the vocabulary (model.vocab's size) and
 * the added tokens (whose largest id is `max`, -1 for none), as AddedVocabulary::add_tokens. */
static int32_t next_free(const zt_tokenizer_t *t, int32_t max) {
    int32_t vocab = (int32_t)t->vocab.n;
    return max < 0 ? vocab : max >= vocab || vocab == 0 ? max + 1 : vocab;
}

/* One entry (text s, id) as the token from_pretrained makes of it, unless tokenizer.json's
 * added token of that id replaces it (*skip), or it would not get its id: tokenizers gives a
 * text the id it has, else the next free one (*max the largest added id so far). */
static zt_status json_file_token(const zt_tokenizer_t *t, const added_index *ix,
                                 const sources *in, const char *path, const tok_json_added *e,
                                 int32_t *max, cfg_token *tk, bool *skip) {
    int32_t at = e->id < t->n_ids ? ix->by_id[e->id] : -1;
    *skip = at >= 0 && strcmp(t->added[at].s, e->s) == 0;
    if (*skip)
        return ZT_OK;
    if (at >= 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: \"%s\": %d: tokenizer.json's added_tokens "
                        "list gives id %d to \"%s\", so transformers drops this entry; remove it "
                        "or correct its id", path, e->s, e->id, e->id, t->added[at].s);
    int32_t added = text_get(&ix->by_text, e->s);
    int32_t have = added >= 0 ? t->added[added].id : text_get(&t->vocab, e->s);
    if (have >= 0 && have != e->id)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: \"%s\": %d: tokenizer.json's %s gives it id %d, "
                        "which transformers keeps; correct the entry's id to %d or remove it",
                        path, e->s, e->id,
                        added >= 0 ? "added_tokens list" : "model.vocab", have, have);
    int32_t next = next_free(t, *max);
    if (have < 0 && e->id < t->n_ids && t->id_text[e->id])
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: \"%s\": %d: id %d is tokenizer.json's \"%s\"; "
                        "transformers gives \"%s\" the next free id, %d; correct the entry's id "
                        "or remove it", path, e->s, e->id, e->id, t->id_text[e->id], e->s, next);
    if (have < 0 && e->id != next)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: \"%s\": %d: transformers gives this text the "
                        "tokenizer lacks the next free id, %d (the entries are added by id); "
                        "correct the entry's id to %d or remove it", path, e->s, e->id, next,
                        next);
    if (e->id > *max)
        *max = e->id;
    bool special = legacy_special(in, e->s);
    *tk = (cfg_token){.content = e->s, .special = special, .normalized = !special,
                      .new_id = have < 0, .id = e->id, .file = path};
    snprintf(tk->where, sizeof tk->where, "entry \"%.60s\": %d", e->s, e->id);
    return ZT_OK;
}

/* Without added_tokens_decoder, from_pretrained turns added_tokens.json's entries into
 * AddedTokens (special when a key or additional_special_tokens names the text, normalized when
 * not), which __init__ adds after tokenizer.json's, in the order of their ids: appended to
 * *batch. *root holds the parsed file the tokens borrow (the caller deletes it). */
static zt_status json_file_tokens(zt_tokenizer_t *t, const sources *in, char *path, size_t cap,
                                  cJSON **root, cfg_list *batch) {
    tok_json_added *v;
    size_t n;
    const char *last;
    ZT_TRY(tok_load_added_json(t->path, path, cap, root, &v, &n, &last));
    added_index ix = {0};
    zt_status s = n ? index_added(t, &ix) : ZT_OK;
    if (s == ZT_OK)
        s = check_misfiled(&ix, in, path, last);
    int32_t max = -1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max)
            max = t->added[i].id;
    for (size_t i = 0; i < n && s == ZT_OK; i++) {
        cfg_token tk;
        bool skip;
        s = json_file_token(t, &ix, in, path, &v[i], &max, &tk, &skip);
        if (s == ZT_OK && !skip && !list_push(batch, tk))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    tok_strmap_free(&ix.by_text);
    free(ix.by_id);
    free(v);
    return s;
}

/* special_tokens_map.json beside the file `beside` into *map, NULL when there is none. */
static zt_status load_map(const char *beside, char *path, size_t cap, cJSON **map) {
    *map = NULL;
    zt_path_beside(beside, "special_tokens_map.json", path, cap);
    if (!zt_path_exists(path))
        return ZT_OK;
    ZT_TRY(zt_json_load_file(path, map));
    if (cJSON_IsObject(*map))
        return ZT_OK;
    cJSON_Delete(*map);
    *map = NULL;
    return zt_error(ZT_ERR_FORMAT, "%s: not a JSON object", path);
}

zt_status tok_add_config_tokens(zt_tokenizer_t *t, const cJSON *config, const char *src,
                                const char *cls) {
    cfg_list batch = {0}, specials = {0}, held = {0};
    char map_path[PATH_MAX], json_path[PATH_MAX];
    cJSON *map = NULL, *json_file = NULL;
    const cJSON *atd = cJSON_GetObjectItemCaseSensitive(config, "added_tokens_decoder");
    /* from_pretrained reads special_tokens_map.json only when the config has no
     * added_tokens_decoder (its legacy branch). */
    zt_status s = atd ? ZT_OK : load_map(t->path, map_path, sizeof map_path, &map);
    sources in = {config, map, src, map_path};
    if (s == ZT_OK)
        s = json_tokens(t, &held);
    if (s == ZT_OK)
        s = atd ? decoder_tokens(atd, src, &batch) : json_tokens(t, &batch);
    if (s == ZT_OK)
        s = special_tokens(&in, cls, &specials);
    /* Without added_tokens_decoder, a key whose text is one of tokenizer.json's added tokens
     * takes that AddedToken (from_pretrained's added_tokens_map); with it, one of its entries. */
    for (size_t i = 0; i < specials.n && s == ZT_OK; i++) {
        cfg_token *tk = &specials.v[i];
        for (size_t j = 0; tk->keyed && j < batch.n; j++)
            if (strcmp(batch.v[j].content, tk->content) == 0) {
                cfg_token named = batch.v[j];
                snprintf(named.where, sizeof named.where, "%s", tk->where);
                named.file = tk->file;
                named.keyed = true;
                *tk = named;
                break;
            }
    }
    /* from_pretrained reads added_tokens.json, too, only without added_tokens_decoder; its
     * entries are filed under no text a key could take (check_misfiled). */
    if (s == ZT_OK && !atd)
        s = json_file_tokens(t, &in, json_path, sizeof json_path, &json_file, &batch);
    /* A string key is added unless an added token or the batch already has its text; an
     * AddedToken always is. Each token is special when it is or when a key names its text. */
    size_t n_decoder = batch.n;
    for (size_t i = 0; i < specials.n && s == ZT_OK; i++) {
        const cfg_token *tk = &specials.v[i];
        bool known = false;
        for (size_t j = 0; j < t->n_added && tk->is_str; j++)
            known |= strcmp(t->added[j].s, tk->content) == 0;
        for (size_t j = 0; j < n_decoder && tk->is_str; j++)
            known |= strcmp(batch.v[j].content, tk->content) == 0;
        if (!(tk->is_str && known) && !list_push(&batch, *tk))
            s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    }
    for (size_t i = 0; i < batch.n && s == ZT_OK; i++) {
        cfg_token *tk = &batch.v[i];
        for (size_t j = 0; j < specials.n && !tk->special; j++)
            tk->special = strcmp(specials.v[j].content, tk->content) == 0;
        if (tk->is_str)
            tk->normalized = !tk->special;
    }
    /* tokenizer.json's own tokens handed back change nothing unless a key made one special
     * (add_tokens finds each equal to itself), so they are left out of the batch: a tokenizer
     * with thousands of added tokens loads without comparing each with every other. */
    size_t kept = 0;
    for (size_t i = 0; i < batch.n && s == ZT_OK; i++)
        if (atd || i >= held.n || batch.v[i].special != t->added[i].special)
            batch.v[kept++] = batch.v[i];
    batch.n = kept;
    if (s == ZT_OK)
        s = add_batch(t, &batch, &held, src);
    free(batch.v);
    free(specials.v);
    free(held.v);
    cJSON_Delete(map);
    cJSON_Delete(json_file);
    return s;
}

/* ---- the special_tokens_map a chat template sees ------------------------------------------ */

/* Whether two of special_tokens_map.json's AddedTokens (made special) are equal, as AddedToken
 * compares them: on the content and every flag (normalized defaults to false for a special one). */
static bool same_added(const cJSON *a, const cJSON *b) {
    const char *flags[] = {"lstrip", "rstrip", "single_word", "normalized"};
    bool same = strcmp(tok_json_str(a, "content"), tok_json_str(b, "content")) == 0;
    for (int f = 0; f < 4 && same; f++)
        same = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, flags[f])) ==
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, flags[f]));
    return same;
}

/* Whether special_tokens_map.json's additional_special_tokens item e is already in the list
 * from_pretrained builds (`token not in additional_special_tokens`): a string equals a string
 * of the config's list or an earlier one of the map's; an AddedToken only an equal earlier
 * AddedToken of the map's (the config's are still plain dicts then, equal to nothing). */
static bool map_item_held(const cJSON *config_list, const cJSON *map_list, const cJSON *e) {
    for (const cJSON *c = cJSON_IsString(e) ? config_list : NULL; c; c = c->next)
        if (cJSON_IsString(c) && strcmp(c->valuestring, e->valuestring) == 0)
            return true;
    for (const cJSON *m = map_list; m && m != e; m = m->next)
        if (cJSON_IsString(e) ? cJSON_IsString(m) && strcmp(m->valuestring, e->valuestring) == 0
                              : cJSON_IsObject(m) && same_added(m, e))
            return true;
    return false;
}

/* One file's additional_special_tokens list (NULL: none), its texts appended to `list`; with
 * `from_map` those from_pretrained finds already there are left out. A null in the list is
 * refused, as SpecialTokensMixin asserts each item is a string or an AddedToken. */
static zt_status extra_texts(const cJSON *config_list, const cJSON *items, const char *file,
                             bool from_map, cJSON *list) {
    int i = 0;
    for (const cJSON *e = items; e; e = e->next, i++) {
        char key[64];
        const char *text;
        snprintf(key, sizeof key, "additional_special_tokens[%d]", i);
        ZT_TRY(zt_json_token_text(e, file, key, &text));
        if (!text)
            return zt_error(ZT_ERR_FORMAT, "%s: %s is null or has no \"content\" "
                            "(transformers refuses it); give a string or remove it", file, key);
        if (from_map && map_item_held(config_list, items, e))
            continue;
        if (!cJSON_AddItemToArray(list, cJSON_CreateString(text)))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", file);
    }
    return ZT_OK;
}

/* A file's additional_special_tokens: its first item, NULL when the list is missing, null or
 * empty; anything but a list is refused. */
static zt_status extra_list(const cJSON *j, const char *file, const cJSON **first) {
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(j, "additional_special_tokens");
    *first = cJSON_IsArray(extra) ? extra->child : NULL;
    if (extra && !cJSON_IsNull(extra) && !cJSON_IsArray(extra))
        return zt_error(ZT_ERR_FORMAT, "%s: additional_special_tokens must be a list of strings "
                        "or AddedToken objects", file);
    return ZT_OK;
}

/* The additional_special_tokens attribute: the config's list as it is, then the map's items
 * not already in it (from_pretrained's legacy branch), then CodeLlama's infilling tokens
 * (its __init__ appends them, duplicates and all). */
static zt_status extra_attribute(const sources *in, const char *cls, cJSON *list) {
    const cJSON *from_config, *from_map = NULL;
    ZT_TRY(extra_list(in->config, in->config_path, &from_config));
    if (in->map)
        ZT_TRY(extra_list(in->map, in->map_path, &from_map));
    ZT_TRY(extra_texts(NULL, from_config, in->config_path, false, list));
    ZT_TRY(extra_texts(from_config, from_map, in->map_path, true, list));
    for (size_t k = 0; strcmp(cls, "CodeLlamaTokenizer") == 0 && k < 4; k++) {
        cfg_token tk;
        bool any;
        ZT_TRY(key_token(in, CODELLAMA_KEYS[k], CODELLAMA_DEFS[k], &tk, &any));
        if (any && !cJSON_AddItemToArray(list, cJSON_CreateString(tk.content)))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", in->config_path);
    }
    return ZT_OK;
}

/* special_tokens_map: each key's text where it is not empty (the files' value, else the
 * class default: key_token, as the tokens added above), additional_special_tokens where the
 * list holds any. */
static zt_status tokens_map(const sources *in, const char *cls, cJSON *out) {
    for (size_t k = 0; k < N_KEYS; k++) {
        cfg_token tk;
        bool any;
        ZT_TRY(key_token(in, KEYS[k], tok_class_default(cls, KEYS[k]), &tk, &any));
        if (any && !cJSON_AddStringToObject(out, KEYS[k], tk.content))
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", in->config_path);
    }
    cJSON *list = cJSON_CreateArray();
    if (!list)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", in->config_path);
    zt_status s = extra_attribute(in, cls, list);
    if (s != ZT_OK || !list->child) {
        cJSON_Delete(list);
        return s;
    }
    if (cJSON_AddItemToObject(out, "additional_special_tokens", list))
        return ZT_OK;
    cJSON_Delete(list);
    return zt_error(ZT_ERR_NOMEM, "%s: out of memory", in->config_path);
}

zt_status tok_special_tokens_map(const cJSON *config, const char *src, const char *cls,
                                 cJSON **out) {
    char map_path[PATH_MAX] = "";
    cJSON *map = NULL;
    zt_status s = ZT_OK;
    *out = cJSON_CreateObject();
    if (!*out)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    /* special_tokens_map.json counts only where tokenizer_config.json has no
     * added_tokens_decoder, as for the tokens the tokenizer adds */
    if (!cJSON_GetObjectItemCaseSensitive(config, "added_tokens_decoder"))
        s = load_map(src, map_path, sizeof map_path, &map);
    sources in = {config, map, src, map_path};
    if (s == ZT_OK)
        s = tokens_map(&in, cls, *out);
    cJSON_Delete(map);
    if (s != ZT_OK) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return s;
}
