/* Added tokens and the post-processor of a tokenizer.json: the tokens matched in the text before
 * the model sees it (special tokens such as <|endoftext|>), the template that puts BOS/EOS
 * around an encoded sequence (TemplateProcessing), and the added_tokens.json a slow tokenizer
 * leaves beside it. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "tok_internal.h"

zt_status tok_parse_added(zt_tokenizer_t *t, const cJSON *j, const char *src) {
    if (!j || cJSON_IsNull(j))
        return ZT_OK;
    if (!cJSON_IsArray(j))
        return zt_error(ZT_ERR_FORMAT, "%s: added_tokens must be an array", src);
    int n = cJSON_GetArraySize(j);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
    int i = 0;
    for (const cJSON *a = j->child; a; a = a->next, i++) {
        const char *content = tok_json_str(a, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!content || !*content || !cJSON_IsNumber(id) || id->valuedouble < 0 ||
            id->valuedouble >= TOK_MAX_ID || id->valuedouble != (double)(int32_t)id->valuedouble)
            return zt_error(ZT_ERR_FORMAT,
                            "%s: added_tokens[%d] needs a non-empty \"content\" and an \"id\" "
                            "in [0, %d)",
                            src, i, TOK_MAX_ID);
        const char *flags[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, flags[f])))
                return zt_error(ZT_ERR_UNSUPPORTED,
                                "%s: added_tokens[%d] (\"%s\"): %s true is not supported", src, i,
                                content, flags[f]);
        tok_added *ad = &t->added[t->n_added];
        ad->len = strlen(content);
        ad->s = malloc(ad->len + 1);
        if (!ad->s)
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
        memcpy(ad->s, content, ad->len + 1);
        ad->id = (int32_t)id->valuedouble;
        ad->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"));
        ad->normalized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "normalized"));
        t->n_added++;
        ZT_TRY(tok_set_added_text(t, ad->id, ad->s, ad->len));
        t->id_special[ad->id] = ad->special;
    }
    return ZT_OK;
}

/* HF (AddedVocabulary) splits the raw text on the tokens with normalized false, normalizes each
 * stretch between them, and matches the normalized tokens there, by their content normalized the
 * same way (under Llama 2's Prepend("▁") and Replace(" ", "▁"), "hello world" is matched as
 * "▁hello▁world"). `what` names the token in messages. */
static zt_status prepare_one(zt_tokenizer_t *t, tok_added *a, zt_strbuf *norm, const char *what) {
    a->m = a->s;
    a->mlen = a->len;
    if (a->normalized && t->n_norms > 0) {
        ZT_TRY(tok_normalize(t, a->s, a->len, norm));
        if (norm->len == 0)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s (\"%s\"): normalized true and the normalizer "
                            "leaves nothing of it, which ztrain does not match", what, a->s);
        if (!(a->m = malloc(norm->len))) {
            a->m = a->s;
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", what);
        }
        memcpy(a->m, norm->data, norm->len);
        a->mlen = norm->len;
    }
    if (a->normalized)
        t->any_norm_added = true;
    else
        t->any_raw_added = true;
    t->added_first[(unsigned char)a->m[0]] |= a->normalized ? 2 : 1;
    return ZT_OK;
}

zt_status tok_prepare_added(zt_tokenizer_t *t, const char *src) {
    zt_strbuf norm = {0};
    zt_status s = ZT_OK;
    char what[PATH_MAX + 32];
    for (size_t i = 0; i < t->n_added && s == ZT_OK; i++) {
        snprintf(what, sizeof what, "%s: added_tokens[%zu]", src, i);
        s = prepare_one(t, &t->added[i], &norm, what);
    }
    zt_strbuf_free(&norm);
    return s;
}

zt_status tok_add_token(zt_tokenizer_t *t, const char *s, int32_t id, bool normalized,
                        const char *origin) {
    tok_added *v = realloc(t->added, (t->n_added + 1) * sizeof *v);
    if (!v)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", origin);
    t->added = v;
    tok_added *a = &v[t->n_added];
    *a = (tok_added){.len = strlen(s), .id = id, .normalized = normalized};
    a->s = malloc(a->len + 1);
    if (!a->s || (id < 0 && !(a->origin = malloc(strlen(origin) + 1)))) {
        free(a->s);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", origin);
    }
    memcpy(a->s, s, a->len + 1);
    if (a->origin)
        memcpy(a->origin, origin, strlen(origin) + 1);
    t->n_added++;
    zt_strbuf norm = {0};
    zt_status st = prepare_one(t, a, &norm, origin);
    zt_strbuf_free(&norm);
    return st;
}

const tok_added *tok_added_match(const zt_tokenizer_t *t, const char *s, size_t len,
                                 bool normalized) {
    if (!(t->added_first[(unsigned char)s[0]] & (normalized ? 2 : 1)))
        return NULL;
    const tok_added *best = NULL;
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->normalized == normalized && a->mlen <= len && (!best || a->mlen > best->mlen) &&
            memcmp(a->m, s, a->mlen) == 0)
            best = a;
    }
    return best;
}

/* ---- post-processor ------------------------------------------------------------------------- */

static zt_status template_ids(zt_tokenizer_t *t, const cJSON *special, const char *name,
                              int32_t **ids, size_t *n, const char *src) {
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(special, name);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(tok, "ids");
    if (!cJSON_IsArray(list))
        return zt_error(ZT_ERR_FORMAT,
                        "%s: post_processor.special_tokens has no ids for \"%s\" of the template",
                        src, name);
    for (const cJSON *v = list->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= t->n_ids)
            return zt_error(ZT_ERR_FORMAT,
                            "%s: post_processor.special_tokens[\"%s\"] has an id outside the "
                            "vocabulary",
                            src, name);
        int32_t *p = realloc(*ids, (*n + 1) * sizeof *p);
        if (!p)
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
        *ids = p;
        p[(*n)++] = (int32_t)v->valuedouble;
    }
    return ZT_OK;
}

static zt_status parse_template(zt_tokenizer_t *t, const cJSON *j, const char *src) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *special = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    if (!cJSON_IsArray(single))
        return zt_error(ZT_ERR_FORMAT, "%s: post_processor TemplateProcessing needs \"single\"",
                        src);
    bool seen_seq = false;
    for (const cJSON *p = single->child; p; p = p->next) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(p, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(p, "SpecialToken");
        if (seq) {
            const char *id = tok_json_str(seq, "id");
            if (seen_seq || !id || strcmp(id, "A") != 0)
                return zt_error(ZT_ERR_UNSUPPORTED,
                                "%s: post_processor TemplateProcessing: a single template with "
                                "other than one $A sequence is not supported",
                                src);
            seen_seq = true;
        } else if (sp) {
            const char *name = tok_json_str(sp, "id");
            if (!name)
                return zt_error(ZT_ERR_FORMAT, "%s: post_processor SpecialToken without an id",
                                src);
            ZT_TRY(template_ids(t, special, name, seen_seq ? &t->tmpl_after : &t->tmpl_before,
                                seen_seq ? &t->n_after : &t->n_before, src));
        } else {
            return zt_error(ZT_ERR_FORMAT,
                            "%s: post_processor TemplateProcessing: a piece is neither Sequence "
                            "nor SpecialToken",
                            src);
        }
    }
    if (!seen_seq)
        return zt_error(ZT_ERR_FORMAT, "%s: post_processor TemplateProcessing: single has no $A",
                        src);
    return ZT_OK;
}

zt_status tok_parse_post_processor(zt_tokenizer_t *t, const cJSON *j, const char *src) {
    if (!j || cJSON_IsNull(j))
        return ZT_OK;
    const char *type = tok_json_str(j, "type");
    if (!type)
        return zt_error(ZT_ERR_FORMAT, "%s: post_processor has no type", src);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "processors");
        if (!cJSON_IsArray(list))
            return zt_error(ZT_ERR_FORMAT, "%s: post_processor Sequence needs processors", src);
        for (const cJSON *p = list->child; p; p = p->next)
            ZT_TRY(tok_parse_post_processor(t, p, src));
        return ZT_OK;
    }
    /* ByteLevel's post-processing trims offsets only; the ids are untouched. */
    if (strcmp(type, "ByteLevel") == 0)
        return ZT_OK;
    if (strcmp(type, "TemplateProcessing") == 0) {
        if (t->n_before || t->n_after)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: post_processor: two templates", src);
        return parse_template(t, j, src);
    }
    return zt_error(ZT_ERR_UNSUPPORTED, "%s: post_processor type %s is not supported", src, type);
}

/* ---- added_tokens.json ---------------------------------------------------------------------- */

static int by_id(const void *a, const void *b) {
    int32_t x = ((const tok_json_added *)a)->id, y = ((const tok_json_added *)b)->id;
    return (x > y) - (x < y);
}

/* One entry's id: an integer in [0, TOK_MAX_ID). transformers takes a negative id too (it only
 * orders the entries) and raises on a string; ztrain refuses any but a plain id. */
static zt_status entry_id(const cJSON *e, const char *path, int32_t *id) {
    if (!*e->string)
        return zt_error(ZT_ERR_FORMAT, "%s: an entry has an empty text (transformers skips it); "
                        "remove it", path);
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= TOK_MAX_ID ||
        e->valuedouble != (double)(int32_t)e->valuedouble)
        return zt_error(ZT_ERR_FORMAT, "%s: \"%s\" must map to an id, an integer in [0, %d)",
                        path, e->string, TOK_MAX_ID);
    *id = (int32_t)e->valuedouble;
    return ZT_OK;
}

/* A text or an id given twice: json.load keeps a text's last id, and two texts of one id leave
 * one of them out of from_pretrained's added_tokens_decoder. */
static zt_status distinct(tok_json_added *v, size_t n, const char *path) {
    tok_strmap seen = {0};
    if (!tok_strmap_init(&seen, n + 1))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    zt_status s = ZT_OK;
    for (size_t i = 0; i < n && s == ZT_OK; i++) {
        uint32_t len = (uint32_t)strlen(v[i].s);
        if (tok_strmap_get(&seen, v[i].s, len) >= 0)
            s = zt_error(ZT_ERR_FORMAT, "%s: \"%s\" is given twice; keep one entry", path,
                         v[i].s);
        tok_strmap_put(&seen, v[i].s, len, (int32_t)i);
    }
    tok_strmap_free(&seen);
    if (s != ZT_OK)
        return s;
    qsort(v, n, sizeof *v, by_id);
    for (size_t i = 1; i < n; i++)
        if (v[i].id == v[i - 1].id)
            return zt_error(ZT_ERR_FORMAT, "%s: \"%s\" and \"%s\" are both given id %d (one "
                            "would be dropped); give each its own id or remove one", path,
                            v[i - 1].s, v[i].s, v[i].id);
    return ZT_OK;
}

zt_status tok_load_added_json(const char *beside, char *path, size_t cap, cJSON **root,
                              tok_json_added **out, size_t *n, const char **last) {
    *root = NULL;
    *out = NULL;
    *n = 0;
    *last = NULL;
    zt_path_beside(beside, "added_tokens.json", path, cap);
    if (!zt_path_exists(path))
        return ZT_OK;
    ZT_TRY(zt_json_load_file(path, root));
    zt_status s = ZT_OK;
    if (!cJSON_IsObject(*root))
        s = zt_error(ZT_ERR_FORMAT, "%s: not a JSON object of token text to id", path);
    size_t count = s == ZT_OK ? (size_t)cJSON_GetArraySize(*root) : 0;
    if (s == ZT_OK && !(*out = calloc(count + 1, sizeof **out)))
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    for (const cJSON *e = s == ZT_OK ? (*root)->child : NULL; e && s == ZT_OK; e = e->next) {
        s = entry_id(e, path, &(*out)[*n].id);
        (*out)[(*n)++].s = e->string;
        *last = e->string;
    }
    if (s == ZT_OK)
        s = distinct(*out, *n, path);
    if (s != ZT_OK) {
        cJSON_Delete(*root);
        free(*out);
        *root = NULL;
        *out = NULL;
        *n = 0;
        *last = NULL;
    }
    return s;
}
