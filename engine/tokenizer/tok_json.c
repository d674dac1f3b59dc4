/* Loading a Hugging Face tokenizer.json: the file is parsed with cJSON and each component handed
 * to the file that implements it; what ztrain does not implement is refused by name. Also the
 * tokenizer's accessors and its release. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdlib.h>
#include <string.h>

#include "ztrain/json_util.h"
#include "tok_internal.h"

const char *tok_json_str(const cJSON *j, const char *key) {
    const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static zt_status load_tree(zt_tokenizer_t *t, const cJSON *root, const char *src) {
    if (!cJSON_IsObject(root))
        return zt_error(ZT_ERR_FORMAT, "%s: a tokenizer.json is a JSON object", src);
    const char *absent_only[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, absent_only[i]);
        if (v && !cJSON_IsNull(v))
            return zt_error(ZT_ERR_UNSUPPORTED,
                            "%s: %s is set; ztrain's tokenizer does not apply it (make it null)",
                            src, absent_only[i]);
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!model)
        return zt_error(ZT_ERR_FORMAT, "%s: no model", src);
    ZT_TRY(tok_parse_bpe(t, model, src));
    ZT_TRY(tok_parse_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), src));
    ZT_TRY(tok_parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), src));
    ZT_TRY(tok_prepare_added(t, src));
    ZT_TRY(tok_parse_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                                   src));
    ZT_TRY(tok_parse_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                                    src));
    return tok_parse_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), src);
}

zt_status zt_tokenizer_load(const char *path, zt_tokenizer_t **out) {
    *out = NULL;
    tok_bytes_init();
    zt_tokenizer_t *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    }
    cJSON *root = NULL;
    zt_status s = zt_json_load_file(path, &root);
    if (s == ZT_OK)
        s = load_tree(t, root, path);
    if (s == ZT_OK)
        s = tok_apply_class(t, root);
    cJSON_Delete(root);
    if (s != ZT_OK) {
        zt_tokenizer_destroy(t);
        return s;
    }
    *out = t;
    return ZT_OK;
}

void zt_tokenizer_destroy(zt_tokenizer_t *t) {
    if (!t)
        return;
    for (int32_t i = 0; t->id_text && i < t->n_ids; i++)
        free(t->id_text[i]);
    free(t->id_text);
    for (size_t i = 0; i < t->n_retired; i++)
        free(t->retired[i]);
    free(t->retired);
    free(t->id_len);
    free(t->id_special);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].m != t->added[i].s)
            free(t->added[i].m);
        free(t->added[i].s);
        free(t->added[i].origin);
    }
    free(t->added);
    for (size_t i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    free(t->norms);
    for (size_t i = 0; i < t->n_pres; i++)
        pcre2_code_free(t->pres[i].re);
    free(t->pres);
    for (size_t i = 0; i < t->n_decs; i++) {
        free(t->decs[i].a);
        free(t->decs[i].b);
    }
    free(t->decs);
    free(t->tmpl_before);
    free(t->tmpl_after);
    free(t->path);
    free(t);
}

int32_t zt_tokenizer_vocab_size(const zt_tokenizer_t *t) { return t->n_ids; }

int32_t zt_tokenizer_token_id(const zt_tokenizer_t *t, const char *token) {
    size_t len = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id >= 0 && t->added[i].len == len &&
            memcmp(t->added[i].s, token, len) == 0)
            return t->added[i].id;
    return tok_strmap_get(&t->vocab, token, (uint32_t)len);
}

const char *zt_tokenizer_id_token(const zt_tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->id_text[id] : NULL;
}

bool zt_tokenizer_is_special(const zt_tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->id_special[id];
}

void zt_tokenizer_template(const zt_tokenizer_t *t, const int32_t **before, size_t *n_before,
                           const int32_t **after, size_t *n_after) {
    *before = t->tmpl_before;
    *n_before = t->n_before;
    *after = t->tmpl_after;
    *n_after = t->n_after;
}
