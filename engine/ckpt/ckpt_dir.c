/* The checkpoint directory (ckpt_dir.h, layout in ztrain/checkpoint.h): `latest` and the tags,
 * what a resume starts from, the last step of a save, which puts a finished checkpoint under its
 * tag without a moment in which `latest` leads nowhere, and the repair of what a killed save left
 * behind. */
#include "ztrain/ckpt_dir.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ztrain/ckpt_pipeline.h"
#include "ztrain/ckpt_tp.h"
#include "ztrain/fault_inject.h"
#include "ztrain/fsutil.h"
#include "ztrain/checkpoint.h"
#include "ckpt_tp_weights.h"

#define PATH_BYTES 4200

void zt_ckpt_aside_name(char *out, size_t size, const char *dir, const char *tag,
                        const char *suffix) {
    snprintf(out, size, "%s/.%s%s", dir, tag, suffix);
}

static bool has_done(const char *tagdir) {
    char path[PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/DONE", tagdir);
    return zt_path_exists(path);
}

bool zt_ckpt_tag_dir(const char *dir, const char *tag, char *path, size_t size) {
    static const char *const aside[] = {ZT_CKPT_TMP_SUFFIX, ZT_CKPT_OLD_SUFFIX};
    snprintf(path, size, "%s/%s", dir, tag);
    if (has_done(path))
        return true;
    for (int i = 0; i < 2; i++) {
        char alt[PATH_BYTES];
        zt_ckpt_aside_name(alt, sizeof alt, dir, tag, aside[i]);
        if (has_done(alt)) {
            snprintf(path, size, "%s", alt);
            return true;
        }
    }
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* latest and the tags                                                                         */

typedef enum { LATEST_MISSING, LATEST_EMPTY, LATEST_TAG } latest_state;

/* dir/latest: missing, empty (or only a line break), or naming a tag; a file that cannot be read
 * or holds a name too long for a tag is an error. */
static zt_status read_latest(const char *dir, char *tag, size_t size, latest_state *state) {
    char path[PATH_BYTES], *text;
    snprintf(path, sizeof path, "%s/latest", dir);
    tag[0] = '\0';
    *state = LATEST_MISSING;
    if (!zt_path_exists(path))
        return ZT_OK;
    ZT_TRY(zt_read_file(path, &text, NULL));
    text[strcspn(text, "\r\n")] = '\0';
    size_t n = strlen(text);
    zt_status s = ZT_OK;
    if (n >= size || strchr(text, '/'))
        s = zt_error(ZT_ERR_FORMAT, "%s: does not hold a valid tag", path);
    else
        snprintf(tag, size, "%s", text);
    *state = n ? LATEST_TAG : LATEST_EMPTY;
    free(text);
    return s;
}

zt_status zt_ckpt_latest(const char *dir, char *tag, size_t size) {
    /* A pipeline's checkpoints are its stages' (ckpt_pipeline.h): the first stage's latest. */
    if (zt_ckpt_pipeline_stages(dir) > 0) {
        char stage_dir[4200];
        zt_ckpt_stage_dir(stage_dir, sizeof stage_dir, dir, 0);
        return zt_ckpt_latest(stage_dir, tag, size);
    }
    /* A tensor-parallel job's are its shards' (ckpt_tp.h): shard 0's latest. */
    if (zt_ckpt_tp_size(dir) > 0) {
        char shard_dir[4200];
        zt_ckpt_tp_shard_dir(shard_dir, sizeof shard_dir, dir, 0);
        return zt_ckpt_latest(shard_dir, tag, size);
    }
    latest_state state;
    ZT_TRY(read_latest(dir, tag, size, &state));
    if (state == LATEST_MISSING)
        return zt_error(ZT_ERR_IO, "%s: no checkpoint (no 'latest' file)", dir);
    if (state == LATEST_EMPTY)
        return zt_error(ZT_ERR_FORMAT, "%s/latest: does not hold a valid tag", dir);
    return ZT_OK;
}

static int64_t tag_step(const char *tag) {
    size_t n = strlen(tag), i = n;
    while (i > 0 && isdigit((unsigned char)tag[i - 1]))
        i--;
    if (i == n || n - i > 18)
        return -1;
    return strtoll(tag + i, NULL, 10);
}

static int entry_cmp(const void *a, const void *b) {
    const zt_ckpt_entry *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->tag, y->tag);
}

int zt_ckpt_tag_tp_size(const char *dir, const char *tag) {
    const int fallback = zt_ckpt_tp_size(dir);
    if (fallback == 0)
        return 0;
    char shard0[PATH_BYTES + 16], path[PATH_BYTES + 300], *text;
    zt_ckpt_tp_shard_dir(shard0, sizeof shard0, dir, 0);
    snprintf(path, sizeof path, "%s/%s/meta.json", shard0, tag);
    if (!zt_path_exists(path) || zt_read_file(path, &text, NULL) != ZT_OK)
        return fallback;
    cJSON *meta = cJSON_Parse(text);
    free(text);
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(meta, "tensor_parallel"), "tp");
    int out = cJSON_IsNumber(tp) && tp->valuedouble >= 1 && tp->valuedouble <= ZT_MAX_WORLD
                  ? (int)tp->valuedouble : fallback;
    cJSON_Delete(meta);
    return out;
}

/* A pipeline's checkpoints (or a tensor-parallel job's): the first stage's (shard's) tags,
 * complete when every stage (shard) has finished saving that tag, and a stage that is a
 * tensor-parallel directory when all its shards have: those of the TP size the tag was saved
 * at, which a later save at another may have changed tp.json's `parts` from. */
static void list_parts(const char *dir, int parts, bool tp, zt_ckpt_list *out) {
    char part_dir[4200];
    if (tp)
        zt_ckpt_tp_shard_dir(part_dir, sizeof part_dir, dir, 0);
    else
        zt_ckpt_stage_dir(part_dir, sizeof part_dir, dir, 0);
    zt_ckpt_list_dir(part_dir, out);
    int *need = calloc((size_t)(out->n ? out->n : 1), sizeof *need), most = parts;
    for (int i = 0; need && i < out->n; i++) {
        need[i] = tp ? zt_ckpt_tag_tp_size(dir, out->items[i].tag) : parts;
        most = need[i] > most ? need[i] : most;
    }
    for (int p = 1; p < most; p++) {
        if (tp)
            zt_ckpt_tp_shard_dir(part_dir, sizeof part_dir, dir, p);
        else
            zt_ckpt_stage_dir(part_dir, sizeof part_dir, dir, p);
        zt_ckpt_list other;
        zt_ckpt_list_dir(part_dir, &other);
        for (int i = 0; i < out->n; i++) {
            if (need && p >= need[i])
                continue;
            bool done = false;
            for (int k = 0; k < other.n; k++)
                if (strcmp(other.items[k].tag, out->items[i].tag) == 0)
                    done = other.items[k].complete;
            out->items[i].complete = out->items[i].complete && done;
        }
        zt_ckpt_list_free(&other);
    }
    free(need);
}

/* The "job_id" meta.json records for the checkpoint dir/tag (heap), or NULL: none recorded
 * (written by `ztrain run`, or before checkpoints recorded it), or no meta.json to read. */
static char *written_by(const char *dir, const char *tag) {
    char path[PATH_BYTES], *text;
    snprintf(path, sizeof path, "%s/%s/meta.json", dir, tag);
    if (!zt_path_exists(path) || zt_read_file(path, &text, NULL) != ZT_OK)
        return NULL;
    cJSON *meta = cJSON_Parse(text);
    free(text);
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "job_id"));
    char *out = id && *id ? strdup(id) : NULL;
    cJSON_Delete(meta);
    return out;
}

void zt_ckpt_list_dir(const char *dir, zt_ckpt_list *out) {
    memset(out, 0, sizeof *out);
    int stages = dir && *dir ? zt_ckpt_pipeline_stages(dir) : 0;
    if (stages > 0) {
        list_parts(dir, stages, false, out);
        return;
    }
    int shards = dir && *dir ? zt_ckpt_tp_size(dir) : 0;
    if (shards > 0) {
        list_parts(dir, shards, true, out);
        return;
    }
    DIR *d = dir && *dir ? opendir(dir) : NULL;
    if (!d)
        return;
    int dfd = dirfd(d), cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && out->n < 10000) {
        struct stat st;
        if (e->d_name[0] == '.' || fstatat(dfd, e->d_name, &st, 0) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (out->n == cap) {
            int ncap = cap ? cap * 2 : 8;
            zt_ckpt_entry *p = realloc(out->items, sizeof *p * (size_t)ncap);
            if (!p)
                break;
            out->items = p;
            cap = ncap;
        }
        char done[NAME_MAX + 8];
        snprintf(done, sizeof done, "%s/DONE", e->d_name);
        zt_ckpt_entry *c = &out->items[out->n];
        if (!(c->tag = strdup(e->d_name)))
            break;
        c->step = tag_step(e->d_name);
        c->complete = faccessat(dfd, done, F_OK, 0) == 0;
        c->job_id = written_by(dir, e->d_name);
        out->n++;
    }
    closedir(d);
    char latest[256];
    if (zt_ckpt_latest(dir, latest, sizeof latest) == ZT_OK)
        out->latest = strdup(latest);
    if (out->n > 1)
        qsort(out->items, (size_t)out->n, sizeof *out->items, entry_cmp);
}

void zt_ckpt_list_free(zt_ckpt_list *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->items[i].tag);
        free(c->items[i].job_id);
    }
    free(c->items);
    free(c->latest);
    memset(c, 0, sizeof *c);
}

/* "global_step3, global_step6 (no DONE)" for messages: the tags found, at most 8 named. */
static void describe_tags(const zt_ckpt_list *l, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < l->n && used < size; i++) {
        int k = i < 8 ? snprintf(buf + used, size - used, "%s%s%s", i ? ", " : "",
                                 l->items[i].tag, l->items[i].complete ? "" : " (no DONE)")
                      : snprintf(buf + used, size - used, " and %d more", l->n - 8);
        used += k > 0 ? (size_t)k : 0;
        if (i >= 8)
            break;
    }
}

/* The first part of a checkpoint saved in parts into out[size]: a pipeline's first stage, or a
 * tensor-parallel checkpoint's shard 0. False for a directory of one part. */
static bool first_part(const char *dir, char *out, size_t size) {
    if (zt_ckpt_pipeline_stages(dir) > 0)
        zt_ckpt_stage_dir(out, size, dir, 0);
    else if (zt_ckpt_tp_size(dir) > 0)
        zt_ckpt_tp_shard_dir(out, size, dir, 0);
    else
        return false;
    return true;
}

/* Whether some part of dir (every stage of a pipeline, every shard of the TP size tag was saved
 * at, and so on down) has no complete copy of tag, as zt_ckpt_tag_dir finds one; the first such
 * part's tag directory then goes into where[size]. */
static bool part_without(const char *dir, const char *tag, char *where, size_t size) {
    int stages = zt_ckpt_pipeline_stages(dir);
    int parts = stages > 0 ? stages : zt_ckpt_tag_tp_size(dir, tag);
    if (parts == 0)
        return !zt_ckpt_tag_dir(dir, tag, where, size);
    for (int p = 0; p < parts; p++) {
        char part[PATH_BYTES];
        if (stages > 0)
            zt_ckpt_stage_dir(part, sizeof part, dir, p);
        else
            zt_ckpt_tp_shard_dir(part, sizeof part, dir, p);
        if (part_without(part, tag, where, size))
            return true;
    }
    return false;
}

/* The words of a note: what chooses the tag ("resume", or a reader such as "export") [0], and
 * what it then does with the one chosen ("resuming from", "reading") [1]. */
static const char *verb_word(const char *reader, int i) {
    if (!reader)
        return i ? "resuming from" : "resume";
    return i ? "reading" : reader;
}

/* A checkpoint in parts resumes from a tag every part has: the first part's choice (tag), else,
 * when a save that did not finish on every part left it only on some (a job killed while its
 * stages or shards were saving), the newest tag that all parts have, said in note. */
static zt_status agree_on_parts(const char *dir, const char *reader, char *tag, size_t size,
                                char *note, size_t note_size) {
    char where[PATH_BYTES], alt[PATH_BYTES];
    if (!part_without(dir, tag, where, sizeof where))
        return ZT_OK;
    zt_ckpt_list l;
    zt_ckpt_list_dir(dir, &l);
    const char *newest = NULL;
    for (int i = l.n - 1; i >= 0 && !newest; i--)
        if (strcmp(l.items[i].tag, tag) != 0 && l.items[i].step >= 0 &&
            !part_without(dir, l.items[i].tag, alt, sizeof alt))
            newest = l.items[i].tag;
    zt_status s = ZT_OK;
    if (newest && strlen(newest) < size) {
        char *was = strdup(note);
        snprintf(note, note_size, "%s: %s: %s is not complete in every part (no complete %s: "
                 "a save that did not finish there): %s the newest checkpoint complete in all "
                 "of them, %s%s%s", verb_word(reader, 0), dir, tag, where, verb_word(reader, 1),
                 newest, was && *was ? "; before that, " : "", was ? was : "");
        free(was);
        snprintf(tag, size, "%s", newest);
    } else {
        s = zt_error(ZT_ERR_FORMAT, "%s: %s is not complete in every part (no complete %s: a "
                     "save that did not finish there), and no other checkpoint is: %s", dir, tag,
                     where, reader ? "nothing to read" : "nothing to resume from; restore the "
                     "missing part, or remove the checkpoint to start from step 0");
        tag[0] = '\0';
    }
    zt_ckpt_list_free(&l);
    return s;
}

/* A layout marker that is there but cannot be read (a damaged pipeline.json or tp.json) would
 * have the parts' directories taken for the tags of a plain checkpoint: the run would start over
 * from step 0 and save over them. */
static zt_status check_markers(const char *dir) {
    char path[PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/pipeline.json", dir);
    if (zt_path_exists(path) && zt_ckpt_pipeline_stages(dir) == 0)
        return zt_error(ZT_ERR_FORMAT, "%s: not a pipeline layout this build reads (damaged?): "
                        "the stages' checkpoints beside it cannot be resumed without it",
                        path);
    snprintf(path, sizeof path, "%s/tp.json", dir);
    if (!zt_path_exists(path))
        return ZT_OK;
    zt_ckpt_tp_layout layout;
    zt_status s = zt_ckpt_tp_layout_read(dir, &layout);
    if (s != ZT_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", zt_last_error());
        return zt_error(s, "%s (the tensor-parallel shards' checkpoints beside it cannot be "
                        "resumed without it)", why);
    }
    zt_ckpt_tp_layout_free(&layout);
    return ZT_OK;
}

/* zt_ckpt_find_resume, and zt_ckpt_find_default for reader (NULL: a resume), which names
 * itself and what it does in the notes (verb_word). */
static zt_status find_tag(const char *dir, const char *reader, char *tag, size_t size,
                          char *note, size_t note_size) {
    tag[0] = note[0] = '\0';
    ZT_TRY(check_markers(dir));
    /* A pipeline resumes each stage from its own directory, a tensor-parallel job each shard
     * from its own: the first part's choice, if every other part has it too. */
    char part0[PATH_BYTES];
    if (first_part(dir, part0, sizeof part0)) {
        ZT_TRY(find_tag(part0, reader, tag, size, note, note_size));
        return tag[0] ? agree_on_parts(dir, reader, tag, size, note, note_size) : ZT_OK;
    }
    if (!zt_path_exists(dir)) {
        snprintf(note, note_size, "resume: %s does not exist: no checkpoint to resume from, "
                 "starting from step 0", dir);
        return ZT_OK;
    }
    /* Else a file there would be taken for an empty checkpoint directory, and the run would
     * say it starts over before the first save fails on it. */
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return zt_error(ZT_ERR_IO, "%s: exists and is not a directory", dir);
    char named[256], path[PATH_BYTES];
    latest_state state;
    ZT_TRY(read_latest(dir, named, sizeof named, &state));
    if (state == LATEST_TAG && zt_ckpt_tag_dir(dir, named, path, sizeof path)) {
        if (strlen(named) >= size)
            return zt_error(ZT_ERR_INVALID, "%s/latest: the tag '%s' is too long", dir, named);
        snprintf(tag, size, "%s", named);
        return ZT_OK;
    }
    zt_ckpt_list l;
    zt_ckpt_list_dir(dir, &l);
    const zt_ckpt_entry *newest = NULL;
    int n_complete = 0;
    for (int i = 0; i < l.n; i++)
        if (l.items[i].complete) {
            n_complete++;
            newest = &l.items[i];   /* sorted by step: the last complete one is the newest */
        }
    char found[1200], why[PATH_BYTES + 1600];
    describe_tags(&l, found, sizeof found);
    if (state == LATEST_MISSING)
        snprintf(why, sizeof why, "%s/latest is missing", dir);
    else if (state == LATEST_EMPTY)
        snprintf(why, sizeof why, "%s/latest is empty", dir);
    else
        snprintf(why, sizeof why, "%s/latest names '%s', but %s %s", dir, named, path,
                 zt_path_exists(path) ? "has no DONE marker" : "does not exist");
    zt_status s = ZT_OK;
    if (newest && newest->step < 0 && n_complete > 1) {
        s = zt_error(ZT_ERR_FORMAT, "%s, and its complete checkpoints (%s) carry no step number "
                     "that tells the newest: write the tag to resume from into %s/latest", why,
                     found, dir);
    } else if (newest && strlen(newest->tag) >= size) {
        s = zt_error(ZT_ERR_INVALID, "%s/%s: the tag is too long", dir, newest->tag);
    } else if (newest) {
        snprintf(tag, size, "%s", newest->tag);
        snprintf(note, note_size, "%s: %s: %s the newest complete checkpoint, %s",
                 verb_word(reader, 0), why, verb_word(reader, 1), tag);
    } else if (state == LATEST_TAG) {
        /* latest says a checkpoint was written: starting over would hide that it is gone. */
        char advice[PATH_BYTES + 100] = "nothing to read";
        if (!reader)
            snprintf(advice, sizeof advice, "nothing to resume from; restore the checkpoint, or "
                     "remove %s/latest to start from step 0", dir);
        s = zt_error(ZT_ERR_FORMAT, "%s, and %s holds no complete checkpoint%s%s%s: %s", why,
                     dir, l.n ? " (found: " : "", found, l.n ? ")" : "", advice);
    } else {
        snprintf(note, note_size, "resume: no checkpoint in %s%s%s%s: starting from step 0", dir,
                 l.n ? " (ignoring " : "", found, l.n ? ")" : "");
    }
    zt_ckpt_list_free(&l);
    return s;
}

zt_status zt_ckpt_find_resume(const char *dir, char *tag, size_t size, char *note,
                              size_t note_size) {
    return find_tag(dir, NULL, tag, size, note, note_size);
}

zt_status zt_ckpt_find_default(const char *dir, const char *reader, char *tag, size_t size,
                               char *note, size_t note_size) {
    ZT_TRY(find_tag(dir, reader, tag, size, note, note_size));
    if (tag[0])
        return ZT_OK;
    note[0] = '\0';
    return zt_error(ZT_ERR_IO, "%s: no checkpoint (%s)", dir,
                    zt_path_exists(dir) ? "no 'latest' file, and no complete tag"
                                        : "the directory does not exist");
}

bool zt_ckpt_tag_is_name(const char *tag) {
    return tag[0] && !strchr(tag, '/') && strcmp(tag, ".") != 0 && strcmp(tag, "..") != 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Saving: the last step, and the repair of killed saves                                       */

/* Gives tag a complete copy under its own name again if a killed save left it without one, then
 * removes the tag's .tmp and .old directories. */
static zt_status repair_tag(const char *dir, const char *tag) {
    char final[PATH_BYTES], tmp[PATH_BYTES], old[PATH_BYTES];
    snprintf(final, sizeof final, "%s/%s", dir, tag);
    zt_ckpt_aside_name(tmp, sizeof tmp, dir, tag, ZT_CKPT_TMP_SUFFIX);
    zt_ckpt_aside_name(old, sizeof old, dir, tag, ZT_CKPT_OLD_SUFFIX);
    if (!has_done(final)) {
        const char *from = has_done(tmp) ? tmp : has_done(old) ? old : NULL;
        if (from) {
            ZT_TRY(zt_remove_tree(final));
            if (rename(from, final) != 0)
                return zt_error(ZT_ERR_IO, "%s: cannot rename %s back into place: %s", final,
                                from, strerror(errno));
            ZT_TRY(zt_sync_dir(dir));
        }
    }
    ZT_TRY(zt_remove_tree(tmp));
    return zt_remove_tree(old);
}

/* The tag of a leftover entry name (".global_step3.tmp" -> "global_step3"), or false. */
_Static_assert(sizeof ZT_CKPT_TMP_SUFFIX == sizeof ZT_CKPT_OLD_SUFFIX,
               "leftover_tag strips suffixes of one length");
static bool leftover_tag(const char *name, char *tag, size_t size) {
    size_t n = strlen(name), k = strlen(ZT_CKPT_TMP_SUFFIX);
    if (name[0] != '.' || n <= k + 1 || n - k - 1 >= size)
        return false;
    if (strcmp(name + n - k, ZT_CKPT_TMP_SUFFIX) != 0 &&
        strcmp(name + n - k, ZT_CKPT_OLD_SUFFIX) != 0)
        return false;
    memcpy(tag, name + 1, n - k - 1);
    tag[n - k - 1] = '\0';
    return true;
}

zt_status zt_ckpt_recover(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? ZT_OK : zt_error(ZT_ERR_IO, "%s: cannot read the directory: %s",
                                                  dir, strerror(errno));
    /* The names are gathered first: repairs rename entries of the directory being read. */
    char (*tags)[NAME_MAX + 1] = NULL;
    int n = 0, cap = 0;
    zt_status s = ZT_OK;
    struct dirent *e;
    while (s == ZT_OK && (e = readdir(d)) != NULL) {
        char tag[NAME_MAX + 1];
        if (!leftover_tag(e->d_name, tag, sizeof tag))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            void *p = realloc(tags, sizeof *tags * (size_t)cap);
            if (!p)
                s = zt_error(ZT_ERR_NOMEM, "%s: out of memory listing leftovers", dir);
            else
                tags = p;
        }
        if (s == ZT_OK)
            memcpy(tags[n++], tag, sizeof tag);
    }
    closedir(d);
    for (int i = 0; i < n && s == ZT_OK; i++)
        s = repair_tag(dir, tags[i]);
    free(tags);
    return s;
}

zt_status zt_ckpt_install(const char *dir, const char *tag, const char *tmp, int64_t step) {
    char final[PATH_BYTES], old[PATH_BYTES], latest[PATH_BYTES];
    snprintf(final, sizeof final, "%s/%s", dir, tag);
    zt_ckpt_aside_name(old, sizeof old, dir, tag, ZT_CKPT_OLD_SUFFIX);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    ZT_TRY(zt_sync_dir(tmp));
    zt_inject_ckpt_kill(step, "written", 0);
    /* The copy that is replaced, removed once `latest` is written: after an exchange it is
     * under tmp's name, after two renames under old's. */
    const char *replaced = NULL;
    if (zt_path_exists(final)) {
        zt_status s = zt_inject_no_rename_exchange() ? ZT_ERR_UNSUPPORTED
                                                     : zt_rename_exchange(tmp, final);
        if (s != ZT_OK && s != ZT_ERR_UNSUPPORTED)
            return s;
        if (s == ZT_OK) {
            replaced = tmp;
        } else {
            ZT_TRY(zt_remove_tree(old));
            if (rename(final, old) != 0)
                return zt_error(ZT_ERR_IO, "%s: cannot move the checkpoint it replaces aside: "
                                "%s", final, strerror(errno));
            zt_inject_ckpt_kill(step, "aside", 0);
            replaced = old;
        }
    }
    if (replaced != tmp && rename(tmp, final) != 0) {
        int err = errno;
        if (replaced == old)
            rename(old, final);
        return zt_error(ZT_ERR_IO, "%s: cannot rename the checkpoint into place: %s", final,
                        strerror(err));
    }
    ZT_TRY(zt_sync_dir(dir));
    zt_inject_ckpt_kill(step, "placed", 0);
    ZT_TRY(zt_write_file_atomic(latest, tag, strlen(tag)));
    zt_inject_ckpt_kill(step, "latest", 0);
    return replaced ? zt_remove_tree(replaced) : ZT_OK;
}
