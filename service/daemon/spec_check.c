/* Checking a submitted job spec: paths resolved inside the server's roots, a default checkpoint
 * directory, the engine's own parser as the judge of everything else (its messages, and
 * DeepSpeed's texts, go back to the client as they are), and admission against the memory. */
#define _GNU_SOURCE
#include "spec_check.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api_error.h"
#include "job_manager.h"
#include "webhooks.h"
#include "ztrain/admission.h"
#include "ztrain/gpu.h"
#include "ztrain/hf_config.h"
#include "ztrain/json_util.h"
#include "ztrain/safetensors.h"

/* Whether `path` (absolute, resolved) lies inside `root` (absolute, resolved). */
static bool inside(const char *root, const char *path) {
    size_t n = strlen(root);
    return strncmp(root, path, n) == 0 && (path[n] == '/' || path[n] == '\0' || n == 1);
}

static zt_status resolve_in_root(cJSON *parent, const char *key, const char *field,
                                 const char *root, bool must_exist);

/* A file the job will read must be a regular file or a directory. stat never opens, so a FIFO,
 * socket or device named by a spec is refused here without the submit ever waiting on it (an
 * open of a FIFO for reading blocks until a writer comes: issue 34's wedge). */
static zt_status plain_file(const char *field, const char *shown, const char *resolved) {
    struct stat st;
    if (stat(resolved, &st) != 0)
        return zt_error(ZT_ERR_INVALID, "%s: %s: %s", field, shown, strerror(errno));
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
        return ZT_OK;
    return zt_error(ZT_ERR_INVALID, "%s: %s is a %s, not a regular file", field, shown,
                    S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket"
                    : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "device" : "special file");
}

/* A data path that may be a glob of shards (a pattern in its file name only): its directory is
 * resolved inside the data root, every match must resolve inside it too, and at least one must
 * exist. The resolved matches go into the spec as files_key (data.train_files, val_files), which
 * the ranks open instead of expanding the pattern again: a file or symlink added while the job
 * waits is not read (issue 34, defect 8), and each listed file is re-checked at open
 * (zt_dataset_open_files). files_key NULL: no list (a mixture's source). A plain path goes to
 * resolve_in_root. */
static zt_status resolve_data_path(cJSON *parent, const char *key, const char *field,
                                   const char *root, const char *files_key) {
    cJSON *item = cJSON_GetObjectItemCaseSensitive(parent, key);
    if (!cJSON_IsString(item) || !item->valuestring[0])
        return resolve_in_root(parent, key, field, root, true);
    const char *v = item->valuestring, *slash = strrchr(v, '/');
    const char *base = slash ? slash + 1 : v;
    char *joined = NULL;
    if (asprintf(&joined, "%s%s%s", v[0] == '/' ? "" : root, v[0] == '/' ? "" : "/", v) < 0)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    char resolved[PATH_MAX];
    const char *glob_char = strpbrk(v, "*?[");
    if (!glob_char || realpath(joined, resolved)) {
        free(joined);
        return resolve_in_root(parent, key, field, root, true);
    }
    zt_status s = ZT_OK;
    if (glob_char < base) {
        s = zt_error(ZT_ERR_INVALID, "%s: '%s': only the file name may be a pattern", field, v);
    } else {
        char *dir = strndup(joined, (size_t)(strrchr(joined, '/') - joined));
        if (!dir || !realpath(dir, resolved) || !inside(root, resolved))
            s = zt_error(ZT_ERR_INVALID, "%s: '%s' is not in a directory under the data root %s",
                         field, v, root);
        free(dir);
    }
    glob_t g;
    int rc = s == ZT_OK ? glob(joined, 0, NULL, &g) : GLOB_ABORTED;
    cJSON *files = files_key ? cJSON_CreateArray() : NULL;
    if (s == ZT_OK && rc != 0)
        s = zt_error(ZT_ERR_INVALID, "%s: no file under the data root matches '%s'", field, v);
    for (size_t i = 0; rc == 0 && s == ZT_OK && i < g.gl_pathc; i++) {
        char match[PATH_MAX];
        if (!realpath(g.gl_pathv[i], match) || !inside(root, match))
            s = zt_error(ZT_ERR_INVALID, "%s: '%s' matches %s, outside the server's data root %s",
                         field, v, g.gl_pathv[i], root);
        else
            s = plain_file(field, g.gl_pathv[i], match);
        if (s == ZT_OK && files)
            cJSON_AddItemToArray(files, cJSON_CreateString(match));
    }
    if (rc == 0)
        globfree(&g);
    if (s == ZT_OK) {
        char *pattern = NULL;
        if (asprintf(&pattern, "%s/%s", resolved, base) < 0)
            s = zt_error(ZT_ERR_NOMEM, "out of memory");
        else
            cJSON_ReplaceItemInObjectCaseSensitive(parent, key, cJSON_CreateString(pattern));
        free(pattern);
    }
    if (s == ZT_OK && files) {
        cJSON_DeleteItemFromObjectCaseSensitive(parent, files_key);
        cJSON_AddItemToObject(parent, files_key, files);
    } else {
        cJSON_Delete(files);
    }
    free(joined);
    return s;
}

/* data.train as a path or glob, or as a mixture list whose every path is resolved so. */
static zt_status resolve_train(cJSON *data, const char *root) {
    cJSON *train = cJSON_GetObjectItemCaseSensitive(data, "train");
    if (!cJSON_IsArray(train))
        return resolve_data_path(data, "train", "data.train", root, "train_files");
    int i = 0;
    for (cJSON *e = train->child; e; e = e->next, i++) {
        char field[64];
        snprintf(field, sizeof field, "data.train[%d].path", i);
        if (!cJSON_IsObject(e))
            return zt_error(ZT_ERR_INVALID, "data.train[%d] must be an object", i);
        ZT_TRY(resolve_data_path(e, "path", field, root, NULL));
    }
    return ZT_OK;
}

/* Resolves `value` against root and checks that it stays inside it, following symlinks. The
 * file must exist when must_exist; otherwise its nearest existing ancestor is checked. The
 * resolved path goes back into the JSON. */
static zt_status resolve_in_root(cJSON *parent, const char *key, const char *field,
                                 const char *root, bool must_exist) {
    cJSON *item = cJSON_GetObjectItemCaseSensitive(parent, key);
    if (!item || cJSON_IsNull(item))
        return ZT_OK;
    if (!cJSON_IsString(item) || !item->valuestring[0])
        return zt_error(ZT_ERR_INVALID, "%s must be a non-empty path", field);
    const char *v = item->valuestring;
    char *joined = NULL;
    if (asprintf(&joined, "%s%s%s", v[0] == '/' ? "" : root, v[0] == '/' ? "" : "/", v) < 0)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    char resolved[PATH_MAX];
    zt_status s = ZT_OK;
    if (realpath(joined, resolved)) {
        if (!inside(root, resolved))
            s = zt_error(ZT_ERR_INVALID, "%s: '%s' is outside the server's %s root %s", field, v,
                         must_exist ? "data" : "runs", root);
        else if (must_exist)
            s = plain_file(field, v, resolved);
    } else if (must_exist) {
        s = zt_error(ZT_ERR_INVALID, "%s: '%s' does not exist under the data root %s (%s)", field,
                     v, root, strerror(errno));
    } else {
        /* A directory to be made: its nearest existing ancestor must be inside, and the rest of
         * the path may not climb out with "..". */
        char probe[PATH_MAX];
        snprintf(probe, sizeof probe, "%s", joined);
        char *slash;
        while (!realpath(probe, resolved) && (slash = strrchr(probe, '/')) && slash != probe)
            *slash = '\0';
        const char *rest = joined + strlen(probe);
        if (strstr(rest, "/..") || !inside(root, resolved))
            s = zt_error(ZT_ERR_INVALID, "%s: '%s' is outside the server's runs root %s", field,
                         v, root);
        else
            snprintf(resolved + strlen(resolved), sizeof resolved - strlen(resolved), "%s", rest);
    }
    if (s == ZT_OK)
        cJSON_ReplaceItemInObjectCaseSensitive(parent, key, cJSON_CreateString(resolved));
    free(joined);
    return s;
}

/* A Hugging Face directory as init_from: the files the engine will read in it (config.json, the
 * index and every shard it names, or model.safetensors) must resolve inside the data root too,
 * so that a link in the directory cannot reach a file the server would not give a job. A file
 * that is missing is the engine's to report. */
static zt_status hf_files_inside(const char *root, const char *dir) {
    if (!zt_hf_is_dir(dir))
        return ZT_OK;
    char path[PATH_MAX + 32], resolved[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (realpath(path, resolved) && !inside(root, resolved))
        return zt_error(ZT_ERR_INVALID, "model.init_from: %s is outside the server's data root "
                        "%s", path, root);
    if (realpath(path, resolved))
        ZT_TRY(plain_file("model.init_from", path, resolved));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (realpath(path, resolved))
        ZT_TRY(plain_file("model.init_from", path, resolved));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (realpath(path, resolved))
        ZT_TRY(plain_file("model.init_from", path, resolved));
    zt_st_set set;
    if (zt_st_set_open(&set, dir) != ZT_OK)
        return ZT_OK;
    const char *outside = NULL;
    if (realpath(set.path, resolved) && !inside(root, resolved))
        outside = set.path;
    zt_status s = ZT_OK;
    for (int k = 0; k < set.n_files && !outside && s == ZT_OK; k++) {
        if (realpath(set.files[k].path, resolved) && !inside(root, resolved))
            outside = set.files[k].path;
        else if (realpath(set.files[k].path, resolved))
            s = plain_file("model.init_from", set.files[k].path, resolved);
    }
    if (outside)
        s = zt_error(ZT_ERR_INVALID, "model.init_from: %s is outside the server's data root %s",
                     outside, root);
    zt_st_set_close(&set);
    return s;
}

static cJSON *section(cJSON *top, const char *key) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(top, key);
    return cJSON_IsObject(o) ? o : NULL;
}

/* A DeepSpeed monitor writes in os.path.join(output_path, job_name), which DeepSpeed takes from
 * its launch directory; a job's is its run directory. That directory is resolved inside the runs
 * root like the checkpoints, and written back as output_path with an empty job_name. Values of
 * the wrong type are left for the config parser to report. */
static zt_status resolve_monitor_dir(cJSON *ds, const char *key, const char *runs_root,
                                     const char *id) {
    cJSON *mon = section(ds, key);
    if (!mon)
        return ZT_OK;
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(mon, "output_path");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(mon, "job_name");
    if ((op && !cJSON_IsNull(op) && !cJSON_IsString(op)) || (jn && !cJSON_IsNull(jn) && !cJSON_IsString(jn)))
        return ZT_OK;
    const char *path = cJSON_IsString(op) ? op->valuestring : "";
    const char *name = cJSON_IsString(jn) ? jn->valuestring : "DeepSpeedJobName";
    char dir[PATH_MAX];
    if (name[0] == '/' || !path[0])
        snprintf(dir, sizeof dir, "%s", name);
    else
        snprintf(dir, sizeof dir, "%s/%s", path, name);
    char *rooted = NULL;
    int n = dir[0] == '/' ? asprintf(&rooted, "%s", dir)
                          : asprintf(&rooted, "%s/%s/%s", runs_root, id, dir);
    if (n < 0)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(mon, "output_path");
    cJSON_DeleteItemFromObjectCaseSensitive(mon, "job_name");
    cJSON_AddStringToObject(mon, "output_path", rooted);
    cJSON_AddStringToObject(mon, "job_name", "");
    free(rooted);
    char field[64];
    snprintf(field, sizeof field, "deepspeed.%s output_path/job_name", key);
    return resolve_in_root(mon, "output_path", field, runs_root, false);
}

/* fork_from.job names the parent by its id or, as every job operand of the API may, by its
 * resource name "jobs/ID": the spec keeps the id, which the parser looks up and Job.spec shows.
 * A value of another type is left for the parser to report. */
static void fork_parent_id(cJSON *top) {
    cJSON *job = cJSON_GetObjectItemCaseSensitive(section(top, "fork_from"), "job");
    if (cJSON_IsString(job) && strncmp(job->valuestring, "jobs/", 5) == 0)
        memmove(job->valuestring, job->valuestring + 5, strlen(job->valuestring + 5) + 1);
}

/* The spec with its paths resolved, a default checkpoint directory and a fork's parent by its
 * id; *text is heap-owned. */
static zt_status canonical_spec(const zt_spec_limits *lim, const char *spec_json, const char *id,
                                char **text) {
    /* zt_json_parse and zt_json_print keep a number written as a float one (3.0), which
     * DeepSpeed's int checks refuse. */
    cJSON *top = NULL;
    if (zt_json_parse(spec_json, "spec", &top) != ZT_OK)
        top = NULL;
    if (!cJSON_IsObject(top)) {
        cJSON_Delete(top);
        return zt_error(ZT_ERR_INVALID, "spec: not a JSON object");
    }
    zt_status s = ZT_OK;
    cJSON *ds = cJSON_GetObjectItemCaseSensitive(top, "deepspeed");
    if (ds && !cJSON_IsObject(ds))
        s = zt_error(ZT_ERR_INVALID, "deepspeed: the service takes the DeepSpeed config as JSON "
                                     "text (deepspeed_json), not as a path on the server");
    cJSON *data = section(top, "data"), *model = section(top, "model");
    cJSON *train = section(top, "train");
    /* The lists of a glob's files are the server's to write, from what it checked. */
    for (int i = 0; s == ZT_OK && data && i < 2; i++)
        if (cJSON_GetObjectItemCaseSensitive(data, i ? "val_files" : "train_files"))
            s = zt_error(ZT_ERR_INVALID, "data.%s: the server writes this list itself (the "
                         "files a glob matched when the job was checked); give the pattern in "
                         "data.%s", i ? "val_files" : "train_files", i ? "val" : "train");
    if (s == ZT_OK && data)
        s = resolve_train(data, lim->data_root);
    if (s == ZT_OK && data)
        s = resolve_data_path(data, "val", "data.val", lim->data_root, "val_files");
    if (s == ZT_OK && data)
        s = resolve_in_root(data, "tokenizer", "data.tokenizer", lim->data_root, true);
    if (s == ZT_OK && model)
        s = resolve_in_root(model, "init_from", "model.init_from", lim->data_root, true);
    const cJSON *from = model ? cJSON_GetObjectItemCaseSensitive(model, "init_from") : NULL;
    if (s == ZT_OK && cJSON_IsString(from))
        s = hf_files_inside(lim->data_root, from->valuestring);
    if (s == ZT_OK && !train) {
        train = cJSON_AddObjectToObject(top, "train");
    }
    if (s == ZT_OK) {
        cJSON *ckpt = cJSON_GetObjectItemCaseSensitive(train, "checkpoint_dir");
        if (!ckpt || cJSON_IsNull(ckpt)) {
            char dflt[PATH_MAX];
            snprintf(dflt, sizeof dflt, "%s/%s/ckpt", lim->runs_root, id);
            cJSON_DeleteItemFromObjectCaseSensitive(train, "checkpoint_dir");
            cJSON_AddStringToObject(train, "checkpoint_dir", dflt);
        } else {
            s = resolve_in_root(train, "checkpoint_dir", "train.checkpoint_dir",
                                lim->runs_root, false);
        }
    }
    /* Offload files are the job's to write: they stay inside the runs root like checkpoints. */
    cJSON *zero = ds ? section(ds, "zero_optimization") : NULL;
    static const char *const offload[] = {"offload_optimizer", "offload_param"};
    for (int i = 0; s == ZT_OK && zero && i < 2; i++) {
        cJSON *o = section(zero, offload[i]);
        char field[96];
        snprintf(field, sizeof field, "deepspeed.zero_optimization.%s.nvme_path", offload[i]);
        if (o)
            s = resolve_in_root(o, "nvme_path", field, lim->runs_root, false);
    }
    for (int i = 0; s == ZT_OK && ds && i < 2; i++)
        s = resolve_monitor_dir(ds, i ? "csv_monitor" : "tensorboard", lim->runs_root, id);
    fork_parent_id(top);
    if (s == ZT_OK && !(*text = zt_json_print(top, false)))
        s = zt_error(ZT_ERR_NOMEM, "out of memory");
    cJSON_Delete(top);
    return s;
}

/* The engine's own parser is the judge of a spec: the same messages as `ztrain run`, DeepSpeed's
 * texts included. Paths are already absolute, so the base directory does not matter. */
static zt_status validate_spec(const zt_spec_limits *lim, const char *text, zt_job_spec *spec) {
    ZT_TRY(zt_job_spec_parse(spec, text, "spec", lim->runs_root));
    zt_status s = ZT_OK;
    if (spec->world_size > lim->max_world_size)
        s = zt_error(ZT_ERR_LIMIT, "spec: world_size %d is above this server's limit of %d",
                     spec->world_size, lim->max_world_size);
    else if (spec->world_size > lim->max_ranks)
        s = zt_error(ZT_ERR_PRECONDITION, "spec: world_size %d can never run: the server runs at most "
                     "%d rank(s) at once (--max-ranks)", spec->world_size, lim->max_ranks);
    else if (spec->device == ZT_DEVICE_CUDA && lim->gpus == 0)
        s = zt_error(ZT_ERR_PRECONDITION, "spec: device \"cuda\": this server has no GPUs to give "
                     "(--gpus 0%s); use \"device\": \"cpu\"",
                     zt_gpu_built() ? ", or none visible" : "; built without CUDA");
    else if (lim->max_nodes > 0 && spec->nodes > lim->max_nodes)
        s = zt_error(ZT_ERR_PRECONDITION, "spec: nodes %d needs a server started with --launcher slurm: "
                     "this one runs every rank on its own host", spec->nodes);
    /* The webhooks' secrets must be in this daemon's environment now, not when the job ends. */
    zt_webhook_list hooks;
    if (s == ZT_OK && (s = zt_webhook_list_from_spec(&hooks, text, "spec", lim->webhooks)) == ZT_OK)
        zt_webhook_list_free(&hooks);
    /* The files are judged here, once, rather than by every rank after it has started. */
    if (s == ZT_OK)
        s = zt_job_spec_check_files(spec, "spec");
    /* The ranks' own directories only where they run on this host. */
    if (s == ZT_OK && lim->max_nodes > 0)
        s = zt_job_spec_check_rank_dirs(spec, "spec");
    if (s == ZT_OK) {
        zt_admission_limits al = {.rank_bytes = lim->max_rank_bytes,
                                  .rank_name = "this server's --max-rank-memory",
                                  .job_bytes = lim->max_job_bytes,
                                  .job_name = "this server's --max-job-memory",
                                  .host_bytes = lim->host_bytes, .host_name = lim->host_name,
                                  .device_bytes = lim->max_device_bytes,
                                  .device_name = "this server's --max-device-memory",
                                  .gpu_bytes = lim->gpu_bytes, .gpu_name = lim->gpu_name,
                                  .gpus = lim->gpus > 0 ? lim->gpus : 0};
        /* A spec whose estimate fails is invalid anywhere; one whose estimate is above this
         * server's memory is valid but does not fit here (FAILED_PRECONDITION). */
        zt_memory_estimate est;
        s = zt_memory_estimate_job(spec, "spec", &est);
        if (s == ZT_OK && (s = zt_admission_check(spec, &al, "spec", NULL)) != ZT_OK) {
            char *why = strdup(zt_last_error());
            s = zt_error(ZT_ERR_PRECONDITION, "%s", why ? why : "spec: the job does not fit");
            free(why);
        }
    }
    if (s != ZT_OK)
        zt_job_spec_free(spec);
    return s;
}

zt_status zt_spec_check(const char *spec_json, const char *id, const zt_spec_limits *lim,
                        char **text, zt_job_spec *spec) {
    *text = NULL;
    zt_status s = canonical_spec(lim, spec_json, id, text);
    if (s == ZT_OK)
        s = validate_spec(lim, *text, spec);
    if (s != ZT_OK) {
        free(*text);
        *text = NULL;
    }
    return s;
}
