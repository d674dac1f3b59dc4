/* What a resumed job changes from the run its checkpoint continues, read from the checkpoint's
 * meta.json: the changes that keep it from continuing bit-exactly are legitimate (continued
 * training on other data, or in another precision) but said, one warning line each. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_changes.h"
#include "ckpt_shards.h"
#include "ztrain/checkpoint.h"

const char *zt_ckpt_precision_name(const zt_ds_config *ds) {
    return ds->fp16.enabled ? "fp16" : ds->bf16.enabled ? "bf16" : "fp32";
}

/* The "enabled" of section `name` of a saved DeepSpeed config: 1, 0 (false or absent), or -1
 * when it is not a boolean ("auto"). */
static int section_enabled(const cJSON *ds, const char *name) {
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(ds, name);
    const cJSON *on = cJSON_GetObjectItemCaseSensitive(sec, "enabled");
    if (!on)
        return 0;
    return cJSON_IsBool(on) ? cJSON_IsTrue(on) : -1;
}

const char *zt_ckpt_meta_precision(const cJSON *meta) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(meta, "precision");
    if (cJSON_IsString(p))
        return p->valuestring;
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(meta, "deepspeed");
    if (!cJSON_IsObject(ds))
        return NULL;
    int fp16 = section_enabled(ds, "fp16"), bf16 = section_enabled(ds, "bf16");
    if (fp16 < 0 || bf16 < 0)
        return NULL;
    return fp16 ? "fp16" : bf16 ? "bf16" : "fp32";
}

bool zt_ckpt_meta_dynamic_scaler(const cJSON *meta) {
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(meta, "loss_scaler");
    const cJSON *dynamic = cJSON_GetObjectItemCaseSensitive(sc, "dynamic");
    if (cJSON_IsBool(dynamic))
        return cJSON_IsTrue(dynamic);
    const char *precision = zt_ckpt_meta_precision(meta);
    if (!precision)
        return true;
    const cJSON *fp16 = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(meta, "deepspeed"), "fp16");
    const cJSON *fixed = cJSON_GetObjectItemCaseSensitive(fp16, "loss_scale");
    return strcmp(precision, "fp16") == 0 && !(cJSON_IsNumber(fixed) && fixed->valuedouble > 0);
}

cJSON *zt_ckpt_data_train_json(const zt_data_spec *d) {
    if (!d->train_mix)
        return d->train ? cJSON_CreateString(d->train) : cJSON_CreateNull();
    cJSON *mix = cJSON_CreateArray();
    for (int i = 0; i < d->n_train_mix; i++) {
        cJSON *src = cJSON_CreateObject();
        cJSON_AddStringToObject(src, "path", d->train_mix[i].path);
        cJSON_AddNumberToObject(src, "weight", d->train_mix[i].weight);
        cJSON_AddItemToArray(mix, src);
    }
    return mix;
}

static void warn(FILE *f, const char *tagdir, const char *key, const char *was, const char *now,
                 const char *consequence) {
    fprintf(f, "ztrain: warning: resume: %s changed from %s (checkpoint %s) to %s: %s\n", key,
            was, tagdir, now, consequence);
}

/* A value as a message shows it: a string as it is, anything else as one line of JSON. */
static char *shown(const cJSON *v) {
    return cJSON_IsString(v) ? strdup(v->valuestring) : cJSON_PrintUnformatted(v);
}

/* Warns when the job's value of `key` (now) differs from the checkpoint's (was; NULL: a
 * checkpoint that predates the key, not compared). */
static void compare_json(FILE *f, const char *tagdir, const char *key, const cJSON *was,
                         const cJSON *now) {
    if (!was || cJSON_Compare(was, now, true))
        return;
    char *a = shown(was), *b = shown(now);
    if (a && b)
        warn(f, tagdir, key, a, b, "the run does not continue bit-exactly");
    free(a);
    free(b);
}

/* Each data-parallel rank resumes at the same position of its share of the epoch, the samples
 * drawn divided by the ranks and rounded down (zt_ckpt_load): when another number of ranks cannot
 * split what the checkpoint's ranks drew, the few samples past the last full round are drawn
 * again. */
static void warn_redrawn(FILE *f, const char *tagdir, const cJSON *d, int ranks) {
    const cJSON *drawn = cJSON_GetObjectItemCaseSensitive(d, "global_position");
    const cJSON *epoch = cJSON_GetObjectItemCaseSensitive(d, "epoch");
    if (!cJSON_IsNumber(drawn) || !cJSON_IsNumber(epoch) || ranks < 1 || drawn->valuedouble < 0)
        return;
    long long n = (long long)drawn->valuedouble, again = n % ranks;
    if (again == 0)
        return;
    fprintf(f, "ztrain: warning: resume: the checkpoint %s had drawn %lld samples of epoch %lld, "
            "which %d data-parallel ranks cannot split evenly: they continue from sample %lld, "
            "drawing the last %lld of them again\n", tagdir, n, (long long)epoch->valuedouble,
            ranks, n - again, again);
}

void zt_ckpt_warn_changes(const char *dir, const char *tag, const zt_job_spec *job, FILE *f) {
    char tagdir[4096];
    cJSON *meta;
    if (!f || zt_ckpt_open_meta(dir, tag, tagdir, sizeof tagdir, &meta) != ZT_OK)
        return;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(meta, "data");
    if (cJSON_IsObject(d)) {
        cJSON *train = zt_ckpt_data_train_json(&job->data);
        compare_json(f, tagdir, "data.train", cJSON_GetObjectItemCaseSensitive(d, "train"), train);
        cJSON_Delete(train);
        char seed[32];
        snprintf(seed, sizeof seed, "%" PRIu64, job->train.seed);
        cJSON *now = cJSON_CreateString(seed);
        compare_json(f, tagdir, "train.seed", cJSON_GetObjectItemCaseSensitive(d, "seed"), now);
        cJSON_Delete(now);
        now = cJSON_CreateBool(job->data.shuffle);
        compare_json(f, tagdir, "data.shuffle", cJSON_GetObjectItemCaseSensitive(d, "shuffle"),
                     now);
        cJSON_Delete(now);
        if (!job->data.train_mix)
            warn_redrawn(f, tagdir, d, job->ds.world_size);
    }
    const char *was = zt_ckpt_meta_precision(meta), *now = zt_ckpt_precision_name(&job->ds);
    if (was && strcmp(was, now) != 0) {
        char why[160];
        /* The only scaler state a dynamic scaler takes is a dynamic scaler's (zt_ckpt_load). */
        if (job->ds.fp16.enabled && job->ds.fp16.loss_scale <= 0 &&
            !zt_ckpt_meta_dynamic_scaler(meta))
            snprintf(why, sizeof why, "the loss scale starts at 2^%d, as a fresh run's",
                     job->ds.fp16.initial_scale_power);
        else
            snprintf(why, sizeof why, "the run does not continue bit-exactly");
        warn(f, tagdir, "the precision", was, now, why);
    }
    cJSON_Delete(meta);
}
