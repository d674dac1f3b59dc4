/* Encoding with a loaded tokenizer: the pipeline of Hugging Face's encode for one text (UTF-8
 * repair, added tokens, normalizers, pre-tokenizers, BPE, the post-processor's template), the
 * per-thread workers that hold its scratch space, and batches spread over threads. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

zt_status zt_tok_worker_create(const zt_tokenizer_t *t, zt_tok_worker_t **out) {
    zt_tok_worker_t *w = calloc(1, sizeof *w);
    if (w)
        w->md = pcre2_match_data_create(1, NULL);
    if (!w || !w->md) {
        free(w);
        return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory for a worker");
    }
    w->t = t;
    *out = w;
    return ZT_OK;
}

void zt_tok_worker_destroy(zt_tok_worker_t *w) {
    if (!w)
        return;
    pcre2_match_data_free(w->md);
    tok_pieces_free(&w->a);
    tok_pieces_free(&w->b);
    zt_strbuf_free(&w->text);
    zt_strbuf_free(&w->norm);
    zt_strbuf_free(&w->scratch);
    tok_cache_free(&w->cache);
    free(w->syms);
    free(w->heap);
    free(w->spans);
    free(w);
}

/* The text as valid UTF-8 in w->text, each maximal invalid subpart replaced by U+FFFD. */
static zt_status repair_utf8(zt_tok_worker_t *w, const char *s, size_t len, size_t *n_bad) {
    tok_buf_restart(&w->text);
    if (len == 0)
        return ZT_OK;
    bool ok = zt_strbuf_reserve(&w->text, len);
    size_t start = 0;
    for (size_t i = 0; i < len && ok;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t bad, v = tok_utf8_valid((const unsigned char *)s + i, len - i, &bad);
        if (v) {
            i += v;
            continue;
        }
        zt_strbuf_append(&w->text, s + start, i - start);
        zt_strbuf_append(&w->text, "\xef\xbf\xbd", 3);
        ok = !w->text.oom;
        (*n_bad)++;
        i += bad;
        start = i;
    }
    zt_strbuf_append(&w->text, s + start, len - start);
    return !w->text.oom ? ZT_OK : zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory for %zu bytes", len);
}

/* Pre-tokenizes and runs BPE on one stretch of normalized text without added tokens. */
static zt_status encode_plain(zt_tok_worker_t *w, const char *s, size_t len, bool first,
                              zt_tok_ids *out) {
    if (len == 0)
        return ZT_OK;
    tok_pieces *pieces;
    ZT_TRY(tok_pre_tokenize(w, s, len, first, &pieces));
    for (size_t i = 0; i < pieces->n; i++)
        ZT_TRY(tok_bpe_word(w, tok_piece_text(pieces, i), pieces->v[i].len, out));
    return ZT_OK;
}

/* Calls emit on the stretches between added tokens of one kind and pushes the tokens' ids. */
static zt_status split_added(zt_tok_worker_t *w, const char *s, size_t len, bool normalized,
                             bool first, zt_tok_ids *out,
                             zt_status (*emit)(zt_tok_worker_t *, const char *, size_t, bool,
                                               zt_tok_ids *)) {
    const zt_tokenizer_t *t = w->t;
    size_t start = 0;
    bool any = normalized ? t->any_norm_added : t->any_raw_added;
    for (size_t i = 0; any && i < len;) {
        const tok_added *a = tok_added_match(t, s + i, len - i, normalized);
        if (!a) {
            i++;
            continue;
        }
        if (a->id < 0)
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: the text holds \"%s\" (%s), which the "
                            "tokenizer lacks: transformers adds it as a new id past the "
                            "vocabulary, which the model has no embedding for; add it to "
                            "tokenizer.json's added_tokens with an id of the model's vocabulary, "
                            "or remove it from tokenizer_config.json",
                            t->path, a->s, a->origin);
        ZT_TRY(emit(w, s + start, i - start, first && start == 0, out));
        if (!tok_ids_push(out, a->id))
            return zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
        i += a->mlen;
        start = i;
    }
    return emit(w, s + start, len - start, first && start == 0, out);
}

/* A stretch of raw text between raw added tokens: normalized as a whole into w->norm (which
 * only this stage writes), then split on the normalized added tokens. */
static zt_status encode_segment(zt_tok_worker_t *w, const char *s, size_t len, bool first,
                                zt_tok_ids *out) {
    if (len == 0)
        return ZT_OK;
    if (w->t->n_norms == 0)
        return split_added(w, s, len, true, first, out, encode_plain);
    ZT_TRY(tok_normalize(w->t, s, len, &w->norm));
    return split_added(w, w->norm.data, w->norm.len, true, first, out, encode_plain);
}

zt_status zt_tok_encode(zt_tok_worker_t *w, const char *text, size_t len, bool add_special,
                        zt_tok_ids *out, size_t *invalid_utf8) {
    const zt_tokenizer_t *t = w->t;
    size_t n0 = out->n, bad = 0;
    zt_status s = repair_utf8(w, text, len, &bad);
    bool ok = true;
    if (s == ZT_OK && add_special)
        for (size_t i = 0; i < t->n_before; i++)
            ok &= tok_ids_push(out, t->tmpl_before[i]);
    if (s == ZT_OK && ok && w->text.len > 0) {
        /* The stages below write to the worker's other buffers, never to w->text, so the
         * repaired text is read in place. */
        s = split_added(w, w->text.data, w->text.len, false, true, out, encode_segment);
    }
    if (s == ZT_OK && add_special)
        for (size_t i = 0; i < t->n_after; i++)
            ok &= tok_ids_push(out, t->tmpl_after[i]);
    if (s == ZT_OK && !ok)
        s = zt_error(ZT_ERR_NOMEM, "tokenizer: out of memory");
    if (s != ZT_OK) {
        out->n = n0;
        return s;
    }
    if (invalid_utf8)
        *invalid_utf8 += bad;
    return ZT_OK;
}

typedef struct {
    const zt_tokenizer_t *t;
    const char *const *texts;
    const size_t *lens;
    size_t n;
    bool add_special;
    zt_tok_ids *outs;
    atomic_size_t next;
    atomic_size_t bad;
    atomic_int failed;
    pthread_mutex_t lock;
    zt_status status;
    char message[512];
} batch_job;

/* Each thread takes the next document until none is left; a failure stops every thread and its
 * message is kept for the caller's thread (zt_last_error is per thread). */
static void *batch_thread(void *arg) {
    batch_job *job = arg;
    zt_tok_worker_t *w = NULL;
    zt_status s = zt_tok_worker_create(job->t, &w);
    size_t bad = 0;
    while (s == ZT_OK && !atomic_load(&job->failed)) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->n)
            break;
        s = zt_tok_encode(w, job->texts[i], job->lens[i], job->add_special, &job->outs[i], &bad);
    }
    if (s != ZT_OK) {
        pthread_mutex_lock(&job->lock);
        if (!atomic_exchange(&job->failed, 1)) {
            job->status = s;
            snprintf(job->message, sizeof job->message, "%s", zt_last_error());
        }
        pthread_mutex_unlock(&job->lock);
    }
    atomic_fetch_add(&job->bad, bad);
    zt_tok_worker_destroy(w);
    return NULL;
}

zt_status zt_tokenizer_encode_batch(const zt_tokenizer_t *t, const char *const *texts,
                                    const size_t *lens, size_t n, bool add_special, int n_threads,
                                    zt_tok_ids *outs, size_t *invalid_utf8) {
    batch_job job = {.t = t, .texts = texts, .lens = lens, .n = n, .add_special = add_special,
                     .outs = outs, .status = ZT_OK};
    atomic_init(&job.next, 0);
    atomic_init(&job.bad, 0);
    atomic_init(&job.failed, 0);
    pthread_mutex_init(&job.lock, NULL);
    if (n_threads < 1)
        n_threads = 1;
    if ((size_t)n_threads > n)
        n_threads = n ? (int)n : 1;
    pthread_t tid[64];
    if (n_threads > 64)
        n_threads = 64;
    int started = 0;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&tid[started], NULL, batch_thread, &job) == 0)
            started++;
    batch_thread(&job);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&job.lock);
    if (atomic_load(&job.failed))
        return zt_error(job.status, "%s", job.message);
    if (invalid_utf8)
        *invalid_utf8 += atomic_load(&job.bad);
    return ZT_OK;
}
