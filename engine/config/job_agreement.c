/* What every rank of a job must agree on, as text that the ranks compare at their rendezvous
 * (ztrain/job_spec.h: zt_job_spec_agreement_text), and the first key in which two such texts
 * differ, for the message that names it.
 *
 * Paths are left out: nodes may mount the same files at different places, and a job file in
 * another directory resolves its relative paths to other absolute ones. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/strbuf.h"

/* Appends the line "key=value\n" to the text. */
static void add(zt_strbuf *l, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add(zt_strbuf *l, const char *key, const char *fmt, ...) {
    zt_strbuf_printf(l, "%s=", key);
    size_t start = l->len;
    va_list ap;
    va_start(ap, fmt);
    zt_strbuf_vprintf(l, fmt, ap); /* whole: ranks differing past any cut must not agree */
    va_end(ap);
    /* A value is one line: a newline inside a string would split it. */
    for (size_t i = start; i < l->len; i++)
        if (l->data[i] == '\n')
            l->data[i] = ' ';
    zt_strbuf_putc(l, '\n');
}

/* Whether a DeepSpeed key names a file or directory (nvme_path, a monitor's output_path). */
static bool is_path_key(const char *key) {
    size_t n = strlen(key);
    return n >= 4 && strcmp(key + n - 4, "path") == 0;
}

/* The effective DeepSpeed config flattened into "deepspeed.a.b=value" lines (arrays by index). */
static void add_json(zt_strbuf *l, const char *prefix, const cJSON *node) {
    char key[512];
    if (cJSON_IsObject(node) || cJSON_IsArray(node)) {
        int i = 0;
        for (const cJSON *c = node->child; c; c = c->next, i++) {
            if (cJSON_IsObject(node)) {
                if (is_path_key(c->string))
                    continue;
                snprintf(key, sizeof key, "%s.%s", prefix, c->string);
            } else {
                snprintf(key, sizeof key, "%s[%d]", prefix, i);
            }
            add_json(l, key, c);
        }
        return;
    }
    char *text = cJSON_PrintUnformatted(node);
    if (!text) {
        l->oom = true;
        return;
    }
    add(l, prefix, "%s", text);
    cJSON_free(text);
}

char *zt_job_spec_agreement_text(const zt_job_spec *job) {
    zt_strbuf l = {0};
    add(&l, "world_size", "%d", job->world_size);
    add(&l, "device", "%d", (int)job->device);
    add(&l, "pipeline.stages", "%d", job->pipeline.stages);
    add(&l, "pipeline.partition", "%s", job->pipeline.partition);
    add(&l, "pipeline.activation_checkpoint_interval", "%d",
        job->pipeline.activation_checkpoint_interval);

    add(&l, "model.type", "%s", job->model.type);
    const zt_model_family *fam = zt_model_family_find(job->model.type);
    for (const zt_model_field *f = fam ? fam->fields : NULL; f && f->key; f++) {
        if (f->kind == ZT_FIELD_PATH)
            continue;
        char key[160], value[256];
        snprintf(key, sizeof key, "model.%s", f->key);
        zt_model_field_format(f, &job->model, value, sizeof value);
        add(&l, key, "%s", value);
    }
    add(&l, "model.checkpoint_interval", "%d", job->model.checkpoint_interval);
    add(&l, "model.checkpoint_cpu", "%d", job->model.checkpoint_cpu);

    const zt_data_spec *d = &job->data;
    add(&l, "data.train_sources", "%d", d->train_mix ? d->n_train_mix : 1);
    for (int i = 0; d->train_mix && i < d->n_train_mix; i++) {
        char key[64];
        snprintf(key, sizeof key, "data.train[%d].weight", i);
        add(&l, key, "%.17g", d->train_mix[i].weight);
    }
    add(&l, "data.val", "%s", d->val ? "set" : "(none)");
    add(&l, "data.shuffle", "%d", d->shuffle);
    add(&l, "data.format", "%d", (int)d->format);
    add(&l, "data.packing", "%d", (int)d->packing);
    add(&l, "data.sample_tokens", "%d", d->sample_tokens);

    const zt_train_spec *t = &job->train;
    add(&l, "train.max_steps", "%lld", (long long)t->max_steps);
    add(&l, "train.epochs", "%d", t->epochs);
    add(&l, "train.log_interval", "%d", t->log_interval);
    add(&l, "train.eval_interval", "%d", t->eval_interval);
    add(&l, "train.eval_steps", "%d", t->eval_steps);
    add(&l, "train.checkpoint_dir", "%s", t->checkpoint_dir ? "set" : "(none)");
    add(&l, "train.checkpoint_interval", "%d", t->checkpoint_interval);
    add(&l, "train.resume", "%d", t->resume);
    add(&l, "train.bench_steps", "%d", t->bench_steps);
    add(&l, "train.warmup_steps", "%d", t->warmup_steps);
    add(&l, "train.seed", "%llu", (unsigned long long)t->seed);
    add(&l, "train.activation_checkpointing", "%d", t->activation_checkpointing);
    add(&l, "train.activation_checkpoint_interval", "%d", t->activation_checkpoint_interval);

    /* The effective config is ztrain's own JSON: cJSON fails on it only for lack of memory. */
    cJSON *ds = job->ds_effective_json ? cJSON_Parse(job->ds_effective_json) : NULL;
    if (ds)
        add_json(&l, "deepspeed", ds);
    else if (job->ds_effective_json)
        l.oom = true;
    cJSON_Delete(ds);
    return zt_strbuf_take(&l, NULL);
}

/* The value of `key` ("key=") in text, as a pointer to its start and its length; NULL when the
 * text has no such line. */
static const char *find_value(const char *text, const char *key, size_t klen, size_t *vlen) {
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            *vlen = n - klen - 1;
            return p + klen + 1;
        }
        p += n + (end ? 1 : 0);
    }
    return NULL;
}

/* The first line of `a` whose key b lacks or holds another value. */
static bool first_difference(const char *a, const char *b, char *key, size_t kcap, char *va,
                             size_t vacap, char *vb, size_t vbcap) {
    for (const char *p = a; *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        if (eq) {
            size_t klen = (size_t)(eq - p), alen = n - klen - 1, blen = 0;
            const char *bv = find_value(b, p, klen, &blen);
            if (!bv || blen != alen || memcmp(bv, eq + 1, alen) != 0) {
                snprintf(key, kcap, "%.*s", (int)klen, p);
                snprintf(va, vacap, "%.*s", (int)alen, eq + 1);
                snprintf(vb, vbcap, "%.*s", bv ? (int)blen : 8, bv ? bv : "(absent)");
                return true;
            }
        }
        p += n + (end ? 1 : 0);
    }
    return false;
}

bool zt_job_spec_agreement_diff(const char *a, const char *b, char *key, size_t kcap, char *va,
                                size_t vacap, char *vb, size_t vbcap) {
    if (first_difference(a, b, key, kcap, va, vacap, vb, vbcap))
        return true;
    /* A key that only b has. */
    return first_difference(b, a, key, kcap, vb, vbcap, va, vacap);
}
