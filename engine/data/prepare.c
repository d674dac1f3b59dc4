/* `ztrain prepare`: documents from text and JSONL files, encoded in batches on threads, split
 * into train and validation by a seeded hash, and written as llm.c token shards that are renamed
 * into place only once everything succeeded (see ztrain/prepare.h). */
#define _DEFAULT_SOURCE /* strdup */
#include "ztrain/prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ztrain/fsutil.h"
#include "ztrain/strbuf.h"
#include "ztrain/tmp_paths.h"
#include "prepare_internal.h"
#include "ztrain/data.h"
#include "ztrain/tokenizer.h"

#define BATCH_BYTES (8u << 20)
#define BATCH_DOCS 8192
#define DEFAULT_SHARD_TOKENS 100000000

/* One split's shards: tokens gather in buf until a shard is full, which is then written to its
 * temporary name. */
typedef struct {
    const char *split;
    bool u32;
    size_t shard_tokens;
    void *buf;
    size_t n;
    int index;
    char **tmps;
    int n_tmps;
    uint64_t tokens;
} shard_writer;

typedef struct {
    const zt_prepare_options *o;
    const char *name;
    shard_writer train, val;
} prep_run;

static char *shard_path(const prep_run *r, const char *split, int index, const char *suffix) {
    size_t len = strlen(r->o->out_dir) + strlen(r->name) + strlen(split) + 32;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s/%s_%s_%06d.bin%s", r->o->out_dir, r->name, split, index, suffix);
    return p;
}

static zt_status flush_shard(prep_run *r, shard_writer *w) {
    if (w->n == 0)
        return ZT_OK;
    char *tmp = shard_path(r, w->split, w->index, ".tmp");
    char **tmps = realloc(w->tmps, (size_t)(w->n_tmps + 1) * sizeof *tmps);
    if (!tmp || !tmps) {
        free(tmp);
        if (tmps)
            w->tmps = tmps;
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    w->tmps = tmps;
    w->tmps[w->n_tmps++] = tmp;
    zt_tmp_track(tmp);
    int32_t header[ZT_DATASET_HEADER_INTS];
    zt_dataset_header(header, w->u32, (int32_t)w->n);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    zt_status s = zt_write_all(fd, header, sizeof header, tmp);
    if (s == ZT_OK)
        s = zt_write_all(fd, w->buf, w->n * (w->u32 ? 4 : 2), tmp);
    if (s == ZT_OK && fsync(fd) != 0)
        s = zt_error(ZT_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == ZT_OK)
        s = zt_error(ZT_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    w->index++;
    w->n = 0;
    return s;
}

static zt_status append_tokens(prep_run *r, shard_writer *w, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (w->u32)
            ((uint32_t *)w->buf)[w->n++] = (uint32_t)ids[i];
        else
            ((uint16_t *)w->buf)[w->n++] = (uint16_t)ids[i];
        if (w->n == w->shard_tokens)
            ZT_TRY(flush_shard(r, w));
    }
    w->tokens += n;
    return ZT_OK;
}

static void discard_tmps(shard_writer *w) {
    for (int i = 0; i < w->n_tmps; i++) {
        unlink(w->tmps[i]);
        zt_tmp_untrack(w->tmps[i]);
        free(w->tmps[i]);
    }
    free(w->tmps);
    free(w->buf);
    memset(w, 0, sizeof *w);
}

/* Renames the temporary shards to their final names (after removing old shards of the same
 * name when overwriting). */
static zt_status publish(prep_run *r, shard_writer *w) {
    for (int i = 0; i < w->n_tmps; i++) {
        char *final = strdup(w->tmps[i]);
        if (!final)
            return zt_error(ZT_ERR_NOMEM, "out of memory");
        final[strlen(final) - 4] = '\0';
        if (zt_tmp_rename(w->tmps[i], final) != 0) {
            zt_status s = zt_error(ZT_ERR_IO, "%s: cannot rename %s into place: %s", final,
                                   w->tmps[i], strerror(errno));
            free(final);
            return s;
        }
        free(final);
    }
    return ZT_OK;
}

/* Existing shards of this name: an error naming one, or (overwrite) removed. */
static zt_status old_shards(prep_run *r, bool remove) {
    size_t len = strlen(r->o->out_dir) + strlen(r->name) + 32;
    char *pat = malloc(len);
    if (!pat)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    snprintf(pat, len, "%s/%s_*_[0-9]*.bin", r->o->out_dir, r->name);
    glob_t g;
    zt_status s = ZT_OK;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc && s == ZT_OK; i++) {
            if (!remove)
                s = zt_error(ZT_ERR_INVALID,
                             "%s already exists; prepare into another directory or name, or "
                             "pass --overwrite",
                             g.gl_pathv[i]);
            else if (unlink(g.gl_pathv[i]) != 0)
                s = zt_error(ZT_ERR_IO, "%s: cannot remove: %s", g.gl_pathv[i], strerror(errno));
        }
        globfree(&g);
    }
    free(pat);
    return s;
}

/* The family's document separator when the post-processor adds none. */
static zt_status find_separator(const zt_tokenizer_t *t, const char *name, int32_t *id,
                                const char *path) {
    if (name) {
        *id = zt_tokenizer_token_id(t, name);
        if (*id < 0)
            return zt_error(ZT_ERR_INVALID, "%s: the separator \"%s\" is not a token of it", path,
                            name);
        return ZT_OK;
    }
    const char *names[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*id = zt_tokenizer_token_id(t, names[i])) >= 0)
            return ZT_OK;
    return zt_error(ZT_ERR_INVALID,
                    "%s: the post-processor adds no BOS/EOS and the tokenizer has none of "
                    "<|endoftext|>, </s>, <|end_of_text|>, <eos>; name the document separator "
                    "with --separator TOKEN",
                    path);
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

typedef struct {
    zt_strbuf text; /* the documents one after another, without NULs between them */
    size_t *offs, *lens;
    const char **texts;
    zt_tok_ids *outs;
    size_t n;
} batch;

static zt_status batch_add(batch *b, const char *doc, size_t len) {
    b->offs[b->n] = b->text.len;
    zt_strbuf_append(&b->text, doc, len);
    if (b->text.oom)
        return zt_error(ZT_ERR_NOMEM, "out of memory for a document of %zu bytes", len);
    b->lens[b->n++] = len;
    return ZT_OK;
}

static zt_status encode_and_write(prep_run *r, const zt_tokenizer_t *t, batch *b, int32_t sep,
                                  uint64_t *doc_index, zt_prepare_stats *st) {
    const zt_prepare_options *o = r->o;
    for (size_t i = 0; i < b->n; i++) {
        b->texts[i] = b->text.data + b->offs[i];
        b->outs[i].n = 0;
    }
    ZT_TRY(zt_tokenizer_encode_batch(t, b->texts, b->lens, b->n, true, o->n_threads, b->outs,
                                     &st->invalid_utf8));
    for (size_t i = 0; i < b->n; i++) {
        uint64_t h = mix(o->seed ^ mix(*doc_index));
        bool val = o->val_fraction > 0 && (double)(h >> 11) * 0x1.0p-53 < o->val_fraction;
        shard_writer *w = val ? &r->val : &r->train;
        if (sep >= 0)
            ZT_TRY(append_tokens(r, w, &sep, 1));
        ZT_TRY(append_tokens(r, w, b->outs[i].ids, b->outs[i].n));
        st->documents++;
        st->bytes += b->lens[i];
        st->tokens += b->outs[i].n + (sep >= 0);
        if (val) {
            st->val_documents++;
            st->val_tokens += b->outs[i].n + (sep >= 0);
        }
        (*doc_index)++;
    }
    b->n = 0;
    zt_strbuf_clear(&b->text);
    return ZT_OK;
}

static zt_status read_all(prep_run *r, const zt_tokenizer_t *t, const prep_files *files,
                          int32_t sep, zt_prepare_stats *st) {
    const zt_prepare_options *o = r->o;
    batch b = {0};
    b.offs = malloc(BATCH_DOCS * sizeof *b.offs);
    b.lens = malloc(BATCH_DOCS * sizeof *b.lens);
    b.texts = malloc(BATCH_DOCS * sizeof *b.texts);
    b.outs = calloc(BATCH_DOCS, sizeof *b.outs);
    /* a batch's worth at once, so the first batch does not grow it by doubling */
    zt_strbuf_reserve(&b.text, BATCH_BYTES);
    zt_status s = b.offs && b.lens && b.texts && b.outs && !b.text.oom
                      ? ZT_OK
                      : zt_error(ZT_ERR_NOMEM, "out of memory");
    uint64_t doc_index = 0, bytes_done = 0;
    for (size_t f = 0; f < files->n && s == ZT_OK; f++) {
        prep_reader rd;
        s = prep_reader_open(&rd, files->paths[f], o->field ? o->field : "text", o->text_lines,
                             o->skip_bad_lines);
        while (s == ZT_OK) {
            const char *doc;
            size_t len;
            bool owned;
            s = prep_reader_next(&rd, &doc, &len, &owned, &st->bad_lines,
                                 &st->empty_documents);
            if (s != ZT_OK || !doc)
                break;
            s = batch_add(&b, doc, len);
            if (owned)
                free((char *)doc);
            if (s == ZT_OK && (b.n == BATCH_DOCS || b.text.len >= BATCH_BYTES)) {
                s = encode_and_write(r, t, &b, sep, &doc_index, st);
                if (s == ZT_OK && o->progress)
                    o->progress(o->progress_ctx, bytes_done + rd.pos, files->total_bytes,
                                st->tokens);
            }
        }
        bytes_done += rd.size;
        prep_reader_close(&rd);
    }
    if (s == ZT_OK && b.n)
        s = encode_and_write(r, t, &b, sep, &doc_index, st);
    if (s == ZT_OK && o->progress)
        o->progress(o->progress_ctx, files->total_bytes, files->total_bytes, st->tokens);
    for (size_t i = 0; b.outs && i < BATCH_DOCS; i++)
        free(b.outs[i].ids);
    free(b.outs);
    free(b.texts);
    free(b.offs);
    free(b.lens);
    zt_strbuf_free(&b.text);
    return s;
}

static zt_status writer_init(shard_writer *w, const char *split, bool u32, size_t shard_tokens) {
    memset(w, 0, sizeof *w);
    w->split = split;
    w->u32 = u32;
    w->shard_tokens = shard_tokens;
    w->buf = malloc(shard_tokens * (u32 ? 4 : 2));
    if (!w->buf)
        return zt_error(ZT_ERR_NOMEM, "out of memory for a shard of %zu tokens",
                        shard_tokens);
    return ZT_OK;
}

zt_status zt_prepare_run(const zt_prepare_options *o, zt_prepare_stats *st) {
    memset(st, 0, sizeof *st);
    if (o->format != ZT_PREPARE_TEXT)
        return zt_prepare_sft_run(o, st);
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return zt_error(ZT_ERR_INVALID, "the validation fraction %g is not in [0, 1)",
                        o->val_fraction);
    int64_t shard = o->shard_tokens ? o->shard_tokens : DEFAULT_SHARD_TOKENS;
    if (shard < 2 || shard > INT32_MAX)
        return zt_error(ZT_ERR_INVALID,
                        "the shard size %lld is not in [2, %d] tokens (the header "
                        "counts them in an int32)",
                        (long long)shard, INT32_MAX);
    prep_run r = {.o = o, .name = o->name ? o->name : "data"};
    if (strchr(r.name, '/'))
        return zt_error(ZT_ERR_INVALID, "the name \"%s\" may not contain '/'", r.name);
    zt_tokenizer_t *t;
    ZT_TRY(zt_tokenizer_load(o->tokenizer, &t));
    st->vocab_size = zt_tokenizer_vocab_size(t);
    zt_status s = ZT_OK;
    if (o->dtype == ZT_PREPARE_DTYPE_U16 && st->vocab_size > 65536)
        s = zt_error(ZT_ERR_INVALID,
                     "%s: a vocabulary of %d tokens does not fit uint16 token files (at most "
                     "65536); leave the token type to prepare (uint32 files)",
                     o->tokenizer, st->vocab_size);
    st->uint32_tokens = o->dtype == ZT_PREPARE_DTYPE_U32 ||
                        (o->dtype == ZT_PREPARE_DTYPE_AUTO && st->vocab_size > 65536);
    const int32_t *before, *after;
    size_t n_before, n_after;
    zt_tokenizer_template(t, &before, &n_before, &after, &n_after);
    int32_t sep = -1;
    if (s == ZT_OK && (o->separator || n_before + n_after == 0))
        s = find_separator(t, o->separator, &sep, o->tokenizer);
    prep_files files = {0};
    if (s == ZT_OK)
        s = prep_expand_inputs(o->inputs, o->n_inputs, o->out_dir, r.name, &files);
    if (s == ZT_OK)
        s = zt_mkdirs(o->out_dir);
    if (s == ZT_OK && !o->overwrite)
        s = old_shards(&r, false);
    if (s == ZT_OK)
        s = writer_init(&r.train, "train", st->uint32_tokens, (size_t)shard);
    if (s == ZT_OK && o->val_fraction > 0)
        s = writer_init(&r.val, "val", st->uint32_tokens, (size_t)shard);
    if (s == ZT_OK)
        s = read_all(&r, t, &files, sep, st);
    if (s == ZT_OK && st->documents == 0)
        s = zt_error(ZT_ERR_INVALID, "the inputs hold no documents");
    if (s == ZT_OK)
        s = flush_shard(&r, &r.train);
    if (s == ZT_OK && r.val.buf)
        s = flush_shard(&r, &r.val);
    if (s == ZT_OK && o->overwrite)
        s = old_shards(&r, true);
    if (s == ZT_OK)
        s = publish(&r, &r.train);
    if (s == ZT_OK)
        s = publish(&r, &r.val);
    if (s == ZT_OK)
        s = zt_sync_dir(o->out_dir);
    st->train_shards = r.train.n_tmps;
    st->val_shards = r.val.n_tmps;
    discard_tmps(&r.train);
    discard_tmps(&r.val);
    prep_files_free(&files);
    zt_tokenizer_destroy(t);
    return s;
}
