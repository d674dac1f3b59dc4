/* The BPE model: the vocabulary and rank-ordered merges of a tokenizer.json, and the encoding of
 * one pre-token as Hugging Face's BPE does it: characters (or their <0xNN> byte tokens, or the
 * unknown token) as symbols, then merges applied lowest rank first, leftmost first among equal
 * ranks, through a binary heap; results for short pre-tokens are cached per worker. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* HF caches words shorter than this (in bytes here; it counts characters, which only makes our
 * cache hold fewer long words). */
#define CACHE_MAX_WORD 256
#define CACHE_ENTRIES 32768
#define CACHE_KEY_BYTES (2u << 20)
#define CACHE_IDS (256u << 10)

struct tok_sym {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes of text it covers; 0 once merged into its left neighbour */
};

struct tok_merge {
    int32_t rank;
    int32_t new_id;
    uint32_t pos;
};

/* ---- loading ---------------------------------------------------------------------------------- */

static zt_status set_id_text(zt_tokenizer_t *t, int32_t id, const char *s, size_t len) {
    char *copy = malloc(len + 1);
    if (!copy)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the vocabulary", t->path);
    memcpy(copy, s, len);
    copy[len] = '\0';
    if (t->id_text[id]) {
        /* The vocabulary map keys on the text an added token now replaces: keep it alive. */
        char **r = realloc(t->retired, (t->n_retired + 1) * sizeof *r);
        if (!r) {
            free(copy);
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the vocabulary", t->path);
        }
        t->retired = r;
        t->retired[t->n_retired++] = t->id_text[id];
    }
    t->id_text[id] = copy;
    t->id_len[id] = (uint32_t)len;
    return ZT_OK;
}

/* Splits a merge entry ("a b" or ["a", "b"]) into its two tokens. */
static bool merge_parts(const cJSON *m, const char **a, size_t *alen, const char **b, size_t *blen) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return false;
        *a = s;
        *alen = (size_t)(sp - s);
        *b = sp + 1;
        *blen = strlen(sp + 1);
        return true;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *alen = strlen(*a);
        *b = m->child->next->valuestring;
        *blen = strlen(*b);
        return true;
    }
    return false;
}

static zt_status parse_merges(zt_tokenizer_t *t, const cJSON *merges, const char *src) {
    if (!cJSON_IsArray(merges))
        return zt_error(ZT_ERR_FORMAT, "%s: model.merges must be an array", src);
    int n = cJSON_GetArraySize(merges);
    if (!tok_pairmap_init(&t->merges, (size_t)n))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for %d merges", src, n);
    char *joined = NULL;
    size_t cap = 0;
    int rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a, *b;
        size_t alen, blen;
        if (!merge_parts(m, &a, &alen, &b, &blen)) {
            free(joined);
            return zt_error(ZT_ERR_FORMAT,
                            "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", src, rank);
        }
        if (alen + blen > cap) {
            cap = 2 * (alen + blen);
            char *p = realloc(joined, cap);
            if (!p) {
                free(joined);
                return zt_error(ZT_ERR_NOMEM, "%s: out of memory", src);
            }
            joined = p;
        }
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        int32_t ia = tok_strmap_get(&t->vocab, a, (uint32_t)alen);
        int32_t ib = tok_strmap_get(&t->vocab, b, (uint32_t)blen);
        int32_t ij = tok_strmap_get(&t->vocab, joined, (uint32_t)(alen + blen));
        if (ia < 0 || ib < 0 || ij < 0) {
            free(joined);
            return zt_error(ZT_ERR_FORMAT,
                            "%s: model.merges[%d] (\"%.*s\" + \"%.*s\") uses a token that is not "
                            "in model.vocab",
                            src, rank, (int)alen, a, (int)blen, b);
        }
        tok_pairmap_put(&t->merges, ia, ib, rank, ij);
    }
    free(joined);
    return ZT_OK;
}

static bool json_flag(const cJSON *j, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, key));
}

zt_status tok_parse_bpe(zt_tokenizer_t *t, const cJSON *model, const char *src) {
    const char *type = tok_json_str(model, "type");
    if (!cJSON_IsObject(model))
        return zt_error(ZT_ERR_FORMAT, "%s: model must be an object", src);
    if (type && strcmp(type, "BPE") != 0)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: model type %s is not supported (only BPE)", src,
                        type);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0.0)
        return zt_error(ZT_ERR_UNSUPPORTED,
                        "%s: model.dropout %g is not supported (encoding would be random)", src,
                        dropout->valuedouble);
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *v = tok_json_str(model, affix[i]);
        if (v && *v)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: model.%s \"%s\" is not supported", src,
                            affix[i], v);
    }
    t->fuse_unk = json_flag(model, "fuse_unk");
    t->byte_fallback = json_flag(model, "byte_fallback");
    t->ignore_merges = json_flag(model, "ignore_merges");

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return zt_error(ZT_ERR_FORMAT, "%s: model.vocab must be an object of token: id", src);
    int32_t max_id = -1;
    int n = cJSON_GetArraySize(vocab);
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= TOK_MAX_ID ||
            v->valuedouble != (double)(int32_t)v->valuedouble)
            return zt_error(ZT_ERR_FORMAT, "%s: model.vocab[\"%s\"] must be an id in [0, %d)",
                            src, v->string, TOK_MAX_ID);
        if ((int32_t)v->valuedouble > max_id)
            max_id = (int32_t)v->valuedouble;
    }
    t->n_ids = max_id + 1;
    t->id_text = calloc((size_t)t->n_ids + 1, sizeof *t->id_text);
    t->id_len = calloc((size_t)t->n_ids + 1, sizeof *t->id_len);
    t->id_special = calloc((size_t)t->n_ids + 1, sizeof *t->id_special);
    if (!t->id_text || !t->id_len || !t->id_special || !tok_strmap_init(&t->vocab, (size_t)n))
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for %d tokens", src, n);
    for (const cJSON *v = vocab->child; v; v = v->next) {
        int32_t id = (int32_t)v->valuedouble;
        /* Two tokens of one id would decode ambiguously (and the map keeps the first's text). */
        if (t->id_text[id])
            return zt_error(ZT_ERR_FORMAT, "%s: model.vocab gives id %d to both \"%s\" and \"%s\"",
                            src, id, t->id_text[id], v->string);
        ZT_TRY(set_id_text(t, id, v->string, strlen(v->string)));
        tok_strmap_put(&t->vocab, t->id_text[id], t->id_len[id], id);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = tok_strmap_get(&t->vocab, name, 6);
    }
    t->unk_id = -1;
    const char *unk = tok_json_str(model, "unk_token");
    if (unk) {
        t->unk_id = tok_strmap_get(&t->vocab, unk, (uint32_t)strlen(unk));
        if (t->unk_id < 0)
            return zt_error(ZT_ERR_FORMAT, "%s: model.unk_token \"%s\" is not in model.vocab", src,
                            unk);
    }
    return parse_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), src);
}

/* Gives an id above the model's vocabulary (an added token) a slot in the id tables. */
zt_status tok_grow_ids(zt_tokenizer_t *t, int32_t id) {
    if (id < t->n_ids)
        return ZT_OK;
    size_t n = (size_t)id + 1;
    char **text = realloc(t->id_text, n * sizeof *text);
    if (text)
        t->id_text = text;
    uint32_t *len = realloc(t->id_len, n * sizeof *len);
    if (len)
        t->id_len = len;
    bool *special = realloc(t->id_special, n * sizeof *special);
    if (special)
        t->id_special = special;
    if (!text || !len || !special)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for added token %d", t->path, id);
    for (size_t i = (size_t)t->n_ids; i < n; i++) {
        t->id_text[i] = NULL;
        t->id_len[i] = 0;
        t->id_special[i] = false;
    }
    t->n_ids = (int32_t)n;
    return ZT_OK;
}

zt_status tok_set_added_text(zt_tokenizer_t *t, int32_t id, const char *s, size_t len) {
    ZT_TRY(tok_grow_ids(t, id));
    return set_id_text(t, id, s, len);
}

/* ---- encoding one pre-token ------------------------------------------------------------------- */

static bool heap_less(const struct tok_merge *a, const struct tok_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct tok_merge *h, size_t *n, struct tok_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&m, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct tok_merge heap_pop(struct tok_merge *h, size_t *n) {
    struct tok_merge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static bool add_sym(zt_tok_worker_t *w, size_t *n, int32_t id, uint32_t len) {
    if (*n == w->cap_syms) {
        size_t cap = w->cap_syms ? 2 * w->cap_syms : 256;
        struct tok_sym *s = realloc(w->syms, cap * sizeof *s);
        struct tok_merge *h = realloc(w->heap, cap * 2 * sizeof *h);
        if (s)
            w->syms = s;
        if (h)
            w->heap = h;
        if (!s || !h)
            return false;
        w->cap_syms = cap;
        w->cap_heap = 2 * cap;
    }
    w->syms[*n] = (struct tok_sym){id, (int32_t)*n - 1, -1, len};
    if (*n > 0)
        w->syms[*n - 1].next = (int32_t)*n;
    (*n)++;
    return true;
}

/* The word's characters as symbols (HF's merge_word): a character in the vocabulary is its id;
 * one that is not becomes its <0xNN> byte tokens under byte_fallback when all exist, else the
 * unknown token (consecutive ones fused under fuse_unk), else nothing. */
static bool word_symbols(zt_tok_worker_t *w, const char *s, size_t len, size_t *n_syms) {
    const zt_tokenizer_t *t = w->t;
    size_t n = 0;
    uint32_t unk_len = 0; /* a pending unknown run, 0 when none */
    for (size_t i = 0; i < len;) {
        size_t clen;
        tok_utf8_decode((const unsigned char *)s + i, &clen);
        int32_t id = tok_strmap_get(&t->vocab, s + i, (uint32_t)clen);
        if (id >= 0) {
            if (unk_len && !add_sym(w, &n, t->unk_id, unk_len))
                return false;
            unk_len = 0;
            if (!add_sym(w, &n, id, (uint32_t)clen))
                return false;
        } else {
            bool all_bytes = t->byte_fallback;
            for (size_t k = 0; all_bytes && k < clen; k++)
                all_bytes = t->byte_ids[(unsigned char)s[i + k]] >= 0;
            if (all_bytes) {
                for (size_t k = 0; k < clen; k++)
                    if (!add_sym(w, &n, t->byte_ids[(unsigned char)s[i + k]], 1))
                        return false;
            } else if (t->unk_id >= 0) {
                if (unk_len && !t->fuse_unk) {
                    if (!add_sym(w, &n, t->unk_id, unk_len))
                        return false;
                    unk_len = 0;
                }
                unk_len += (uint32_t)clen;
            }
        }
        i += clen;
    }
    if (unk_len && !add_sym(w, &n, t->unk_id, unk_len))
        return false;
    *n_syms = n;
    return true;
}

/* Applies the merges as HF's Word::merge_all does, including its staleness test: a queued merge
 * still applies when the pair now at its position merges into the same id. */
static void merge_all(zt_tok_worker_t *w, size_t n) {
    const zt_tokenizer_t *t = w->t;
    struct tok_sym *sy = w->syms;
    struct tok_merge *h = w->heap;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const tok_pair *p = tok_pairmap_get(&t->merges, sy[i].id, sy[i + 1].id);
        if (p)
            heap_push(h, &hn, (struct tok_merge){p->rank, p->id, (uint32_t)i});
    }
    while (hn > 0) {
        struct tok_merge top = heap_pop(h, &hn);
        struct tok_sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        struct tok_sym *right = &sy[cur->next];
        const tok_pair *p = tok_pairmap_get(&t->merges, cur->id, right->id);
        if (!p || p->id != top.new_id)
            continue;
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0)
            sy[cur->next].prev = (int32_t)top.pos;
        /* Each merge removes a symbol and queues at most two pairs, so the heap never holds
         * more than twice the symbols. */
        if (cur->prev >= 0) {
            const tok_pair *q = tok_pairmap_get(&t->merges, sy[cur->prev].id, cur->id);
            if (q)
                heap_push(h, &hn, (struct tok_merge){q->rank, q->id, (uint32_t)cur->prev});
        }
        if (cur->next >= 0) {
            const tok_pair *q = tok_pairmap_get(&t->merges, cur->id, sy[cur->next].id);
            if (q)
                heap_push(h, &hn, (struct tok_merge){q->rank, q->id, top.pos});
        }
    }
}

static void cache_reset(tok_cache *c) {
    memset(c->map.slots, 0, (c->map.mask + 1) * sizeof *c->map.slots);
    c->map.n = 0;
    c->n_keys = 0;
    c->n_ids = 0;
    c->n = 0;
}

static bool cache_ready(tok_cache *c) {
    if (c->map.slots)
        return true;
    if (!tok_strmap_init(&c->map, CACHE_ENTRIES) || !(c->keys = malloc(CACHE_KEY_BYTES)))
        return false;
    c->cap_keys = CACHE_KEY_BYTES;
    c->ids = malloc(CACHE_IDS * sizeof *c->ids);
    c->starts = malloc(CACHE_ENTRIES * sizeof *c->starts);
    c->counts = malloc(CACHE_ENTRIES * sizeof *c->counts);
    c->cap_ids = CACHE_IDS;
    c->cap = CACHE_ENTRIES;
    return c->ids && c->starts && c->counts;
}

/* Remembers a word's ids; the key and ids buffers never move (they are allocated once), so the
 * table's borrowed keys stay valid until the whole cache is emptied when one of them fills. */
static void cache_put(tok_cache *c, const char *s, size_t len, const int32_t *ids, size_t n) {
    if (c->n == c->cap || c->n_keys + len > c->cap_keys || c->n_ids + n > c->cap_ids)
        cache_reset(c);
    char *key = c->keys + c->n_keys;
    memcpy(key, s, len);
    c->n_keys += len;
    c->starts[c->n] = (uint32_t)c->n_ids;
    c->counts[c->n] = (uint32_t)n;
    memcpy(c->ids + c->n_ids, ids, n * sizeof *ids);
    c->n_ids += n;
    if (!tok_strmap_put(&c->map, key, (uint32_t)len, (int32_t)c->n))
        return;
    c->n++;
}

void tok_cache_free(tok_cache *c) {
    tok_strmap_free(&c->map);
    free(c->keys);
    free(c->ids);
    free(c->starts);
    free(c->counts);
    memset(c, 0, sizeof *c);
}

zt_status tok_bpe_word(zt_tok_worker_t *w, const char *s, size_t len, zt_tok_ids *out) {
    const zt_tokenizer_t *t = w->t;
    if (len == 0)
        return ZT_OK;
    tok_cache *c = &w->cache;
    bool cacheable = len < CACHE_MAX_WORD && cache_ready(c);
    if (cacheable) {
        int32_t e = tok_strmap_get(&c->map, s, (uint32_t)len);
        if (e >= 0) {
            for (uint32_t i = 0; i < c->counts[e]; i++)
                if (!tok_ids_push(out, c->ids[c->starts[e] + i]))
                    return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
            return ZT_OK;
        }
    }
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, s, (uint32_t)len);
        if (id >= 0)
            return tok_ids_push(out, id) ? ZT_OK : zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t n;
    if (!word_symbols(w, s, len, &n))
        return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory for a word of %zu bytes", len);
    merge_all(w, n);
    size_t first = out->n;
    for (size_t i = 0; i < n; i++)
        if (w->syms[i].len && !tok_ids_push(out, w->syms[i].id))
            return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
    if (cacheable)
        cache_put(c, s, len, out->ids + first, out->n - first);
    return ZT_OK;
}
