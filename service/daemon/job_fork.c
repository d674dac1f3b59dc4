/* Forks (job_manager.h): a job submitted with fork_from {job, step} starts from that job's
 * complete checkpoint of that step with its own config. At submit the checkpoint is checked (it
 * exists, it is complete, its model is the new spec's) and put into the new job's checkpoint
 * directory, hard-linked where the file system allows, and the new job's spec resumes from it. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ztrain/ckpt_dir.h"
#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "job_manager_internal.h"
#include "ztrain/checkpoint.h"
#include "ztrain/ckpt_tp.h"
#include "ztrain/model.h"

zt_status zt_jm_fork_resume(char **text) {
    cJSON *top = cJSON_Parse(*text);
    cJSON *train = cJSON_GetObjectItemCaseSensitive(top, "train");
    if (!cJSON_IsObject(train) || !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(top,
                                                                                "fork_from"))) {
        cJSON_Delete(top);
        return ZT_OK;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(train, "resume");
    cJSON_AddBoolToObject(train, "resume", true);
    char *out = cJSON_PrintUnformatted(top);
    cJSON_Delete(top);
    if (!out)
        return zt_error(ZT_ERR_NOMEM, "out of memory writing a fork's spec");
    free(*text);
    *text = out;
    return ZT_OK;
}

/* Copies one file's bytes, a buffer at a time (when a hard link cannot be made: another file
 * system). */
static zt_status copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return zt_error(ZT_ERR_IO, "fork: cannot open %s: %s", from, strerror(errno));
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        close(in);
        return zt_error(ZT_ERR_IO, "fork: cannot create %s: %s", to, strerror(errno));
    }
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    zt_status s = buf ? ZT_OK : zt_error(ZT_ERR_NOMEM, "fork: out of memory copying %s", from);
    ssize_t n;
    while (s == ZT_OK && (n = read(in, buf, CHUNK)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            s = zt_error(ZT_ERR_IO, "fork: cannot read %s: %s", from, strerror(errno));
        else
            s = zt_write_all(out, buf, (size_t)n, to);
    }
    if (s == ZT_OK && fsync(out) != 0)
        s = zt_error(ZT_ERR_IO, "fork: cannot sync %s: %s", to, strerror(errno));
    free(buf);
    close(in);
    close(out);
    return s;
}

/* Puts the files of the complete checkpoint in `from` into the directory `to` (made here):
 * hard links, since a checkpoint's files are never written again once it is complete, or copies
 * across file systems. DONE comes last, as when a checkpoint is saved. */
static zt_status link_checkpoint(const char *from, const char *to) {
    ZT_TRY(zt_mkdirs(to));
    DIR *d = opendir(from);
    if (!d)
        return zt_error(ZT_ERR_IO, "fork: cannot read %s: %s", from, strerror(errno));
    zt_status s = ZT_OK;
    bool has_done = false;
    struct dirent *e;
    char a[2 * PATH_MAX], b[2 * PATH_MAX];
    while (s == ZT_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (strcmp(e->d_name, "DONE") == 0) {
            has_done = true;
            continue;
        }
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        if (link(a, b) != 0 && errno != EEXIST)
            s = copy_file(a, b);
    }
    closedir(d);
    if (s == ZT_OK && has_done) {
        snprintf(a, sizeof a, "%s/DONE", from);
        snprintf(b, sizeof b, "%s/DONE", to);
        s = copy_file(a, b);
    }
    if (s == ZT_OK)
        s = zt_sync_dir(to);
    return s;
}

/* The parent's complete checkpoint of `step`: its tag, into tag[size]. A checkpoint another job
 * wrote into a directory it shares with the parent is not the parent's (as its list shows:
 * zt_job_proto_checkpoints). Errors list the parent's complete checkpoints. */
static zt_status find_step(const char *dir, const char *parent, int64_t step, char *tag,
                           size_t size) {
    zt_ckpt_list l;
    zt_ckpt_list_dir(dir, &l);
    char have[1024] = "";
    size_t at = 0;
    bool found = false;
    for (int i = 0; i < l.n; i++) {
        if (!l.items[i].complete || (l.items[i].job_id && strcmp(l.items[i].job_id, parent)))
            continue;
        if (l.items[i].step == step && !found) {
            snprintf(tag, size, "%s", l.items[i].tag);
            found = true;
        }
        if (at < sizeof have)
            at += (size_t)snprintf(have + at, sizeof have - at, "%s%lld", at ? ", " : "",
                                   (long long)l.items[i].step);
    }
    zt_ckpt_list_free(&l);
    if (found)
        return ZT_OK;
    return zt_error(ZT_ERR_INVALID, "fork_from.step: jobs/%s has no complete checkpoint at step "
                    "%lld (complete checkpoints at step%s %s in %s)", parent, (long long)step,
                    strchr(have, ',') ? "s" : "", have[0] ? have : "(none)", dir);
}

/* Puts the parent's checkpoint `tag` of one directory (the whole checkpoint, or one
 * tensor-parallel shard's) into the fork's directory `dir`, with a `latest` naming it. */
static zt_status place_checkpoint(const char *tag_dir, const char *dir, const char *tag) {
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, tag);
    ZT_TRY(link_checkpoint(tag_dir, path));
    snprintf(path, sizeof path, "%s/latest", dir);
    return zt_write_file_atomic(path, tag, strlen(tag));
}

zt_status zt_jm_prepare_fork(zt_jobs *jm, const zt_job_spec *spec, bool place) {
    char parent_dir[PATH_MAX];
    int stages = 1;
    pthread_mutex_lock(&jm->mu);
    const job *p = zt_jm_find_job(jm, spec->fork_job);
    if (p) {
        snprintf(parent_dir, sizeof parent_dir, "%s", p->info.checkpoint_dir);
        stages = p->info.grid.stages;
    }
    pthread_mutex_unlock(&jm->mu);
    if (!p)
        return zt_error(ZT_ERR_INVALID, "fork_from.job: jobs/%s not found", spec->fork_job);
    /* A pipelined parent saved each stage's layers in a directory of its own; a fork would have
     * to gather them, which it does not. */
    if (stages > 1)
        return zt_error(ZT_ERR_UNSUPPORTED, "fork_from.job: jobs/%s trains in %d pipeline stages, "
                        "whose checkpoints are saved per stage; forks of pipelined jobs are not "
                        "supported", spec->fork_job, stages);
    /* A tensor-parallel parent saved each shard as a checkpoint directory of its own beside
     * tp.json (ckpt_tp.h): the step is looked up in shard 0's, and every shard of the TP size
     * that tag was saved at (which a later save at another size does not change) must have it. */
    int tp = zt_ckpt_tp_size(parent_dir);
    char first[PATH_MAX + 16];
    if (tp > 0)
        zt_ckpt_tp_shard_dir(first, sizeof first, parent_dir, 0);
    else
        snprintf(first, sizeof first, "%s", parent_dir);
    char tag[256], tag_dir[PATH_MAX + 300];
    ZT_TRY(find_step(first, spec->fork_job, spec->fork_step, tag, sizeof tag));
    if (tp > 0)
        tp = zt_ckpt_tag_tp_size(parent_dir, tag);
    if (!zt_ckpt_tag_dir(first, tag, tag_dir, sizeof tag_dir))
        return zt_error(ZT_ERR_INVALID, "fork_from.step: %s/%s is no longer complete",
                        first, tag);
    char shard[PATH_MAX + 16];
    for (int r = 1; r < tp; r++) {
        zt_ckpt_tp_shard_dir(shard, sizeof shard, parent_dir, r);
        if (!zt_ckpt_tag_dir(shard, tag, tag_dir, sizeof tag_dir))
            return zt_error(ZT_ERR_INVALID, "fork_from.step: jobs/%s's tensor-parallel shard %d "
                            "of %d has no complete checkpoint at step %lld (%s)", spec->fork_job,
                            r, tp, (long long)spec->fork_step, tag_dir);
    }

    zt_model_spec saved;
    ZT_TRY(zt_ckpt_read_model_spec(first, tag, &saved));
    const zt_model_field *differs = zt_model_spec_difference(&saved, &spec->model);
    char held[1024], want[256];
    zt_model_spec_describe(&saved, held, sizeof held);
    if (differs)
        zt_model_field_format(differs, &spec->model, want, sizeof want);
    free(saved.init_from);
    if (differs)
        return zt_error(ZT_ERR_INVALID, "fork_from: jobs/%s's checkpoint at step %lld holds a %s "
                        "model, but this spec's model has %s %s", spec->fork_job,
                        (long long)spec->fork_step, held, differs->key, want);

    const char *dir = spec->train.checkpoint_dir;
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/latest", dir);
    bool used = zt_path_exists(path);
    snprintf(path, sizeof path, "%s/tp.json", dir);
    if (used || zt_path_exists(path))
        return zt_error(ZT_ERR_INVALID, "fork_from: train.checkpoint_dir %s already holds "
                        "checkpoints; a fork starts in a directory of its own", dir);
    if (!place)
        return ZT_OK;
    if (tp == 0) {
        zt_ckpt_tag_dir(first, tag, tag_dir, sizeof tag_dir);
        return place_checkpoint(tag_dir, dir, tag);
    }
    /* The shards, then the layout that makes the directory a tensor-parallel one: the fork
     * resumes them at its own TP size, resharded when it differs (zt_ckpt_tp_load). */
    char to[PATH_MAX + 16];
    for (int r = 0; r < tp; r++) {
        zt_ckpt_tp_shard_dir(shard, sizeof shard, parent_dir, r);
        zt_ckpt_tp_shard_dir(to, sizeof to, dir, r);
        zt_ckpt_tag_dir(shard, tag, tag_dir, sizeof tag_dir);
        ZT_TRY(place_checkpoint(tag_dir, to, tag));
    }
    /* Written whole or not at all (a temporary file renamed): a torn tp.json would mark the
     * directory tensor-parallel yet unreadable, and a retry would find it "already holding
     * checkpoints". */
    char from[PATH_MAX + 16], *text = NULL;
    size_t len = 0;
    snprintf(from, sizeof from, "%s/tp.json", parent_dir);
    zt_status s = zt_json_read_file(from, &text, &len);
    if (s == ZT_OK)
        s = zt_write_file_atomic(path, text, len);
    free(text);
    return s;
}
