/* A checkpoint written out as a Hugging Face model directory (zt_hf_export in
 * ztrain/hf_config.h): config.json, safetensors shards and their index, laid out as
 * save_pretrained lays them out, streamed tensor by tensor from the checkpoint. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ztrain/fsutil.h"
#include "ztrain/tmp_paths.h"
#include "ztrain/checkpoint.h"
#include "ztrain/hf_config.h"
#include "ztrain/json_util.h"
#include "ztrain/tokenizer.h"
#include "ztrain/safetensors.h"

/* One tensor as the directory names it, and where its values come from. */
typedef struct {
    char name[96];
    const zt_ckpt_tensor *t;
    zt_ckpt_weights *w;
    int index; /* in w */
    int shard;
} export_tensor;

static zt_status read_piece(void *ctx, size_t first, float *dst, size_t n) {
    const export_tensor *e = ctx;
    return zt_ckpt_weights_read(e->w, e->index, first, dst, n);
}

/* Whether out_dir may be written: absent, or an empty directory that the finished export can be
 * renamed over. A symbolic link (to an empty directory) or a mount point cannot be: rename()
 * fails on them, which would be found only once the whole model had been written. */
static zt_status check_target(const char *path) {
    /* "link/" would name the link's target: the name itself, without trailing slashes. */
    char out_dir[4200];
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    snprintf(out_dir, sizeof out_dir, "%.*s", (int)len, path);
    struct stat st, up;
    if (lstat(out_dir, &st) != 0)
        return errno == ENOENT ? ZT_OK
                               : zt_error(ZT_ERR_IO, "%s: %s", out_dir, strerror(errno));
    if (S_ISLNK(st.st_mode))
        return zt_error(ZT_ERR_IO, "%s: is a symbolic link, which export cannot replace with the "
                        "directory it writes: give a path that does not exist yet, such as "
                        "%s/model", out_dir, out_dir);
    if (!S_ISDIR(st.st_mode))
        return zt_error(ZT_ERR_IO, "%s: exists and is not a directory", out_dir);
    /* "/" has "/.." as its parent and "/model" as the example. */
    const char *base = len > 1 ? out_dir : "";
    char parent[sizeof out_dir + 4];
    snprintf(parent, sizeof parent, "%s/..", base);
    if (stat(parent, &up) == 0 && (up.st_dev != st.st_dev || up.st_ino == st.st_ino))
        return zt_error(ZT_ERR_IO, "%s: is a mount point, which export cannot replace with the "
                        "directory it writes: give a path inside it that does not exist yet, "
                        "such as %s/model", out_dir, base);
    DIR *d = opendir(out_dir);
    if (!d)
        return zt_error(ZT_ERR_IO, "%s: cannot read: %s", out_dir, strerror(errno));
    const struct dirent *de;
    bool empty = true;
    while (empty && (de = readdir(d)) != NULL)
        empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0;
    closedir(d);
    return empty ? ZT_OK
                 : zt_error(ZT_ERR_IO, "%s: exists and is not empty (export writes a new "
                            "directory)", out_dir);
}

/* Shards as save_pretrained cuts them: tensors in order, a new shard when the next tensor
 * would take the current one past the limit, so a larger tensor sits in a shard of its own. */
static int plan_shards(export_tensor *e, int n, uint64_t max_bytes) {
    int shard = 0;
    uint64_t used = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)e[i].t->numel * sizeof(float);
        if (used > 0 && used + bytes > max_bytes) {
            shard++;
            used = 0;
        }
        e[i].shard = shard;
        used += bytes;
    }
    return shard + 1;
}

static void shard_name(char *buf, size_t size, int k, int n) {
    if (n == 1)
        snprintf(buf, size, "model.safetensors");
    else
        snprintf(buf, size, "model-%05d-of-%05d.safetensors", k + 1, n);
}

static zt_status write_shard(const char *tmp, export_tensor *e, int n, int k, int n_shards) {
    zt_st_entry *entries = calloc((size_t)n, sizeof *entries);
    zt_st_source *sources = calloc((size_t)n, sizeof *sources);
    if (!entries || !sources) {
        free(entries);
        free(sources);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tmp);
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].shard != k)
            continue;
        entries[m] = (zt_st_entry){.name = e[i].name, .ndim = e[i].t->ndim,
                                   .shape = {e[i].t->shape[0], e[i].t->shape[1]}};
        sources[m] = (zt_st_source){read_piece, &e[i]};
        m++;
    }
    char name[64], path[4400];
    shard_name(name, sizeof name, k, n_shards);
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    const char *keys[] = {"format"}, *values[] = {"pt"};
    zt_status s = zt_st_write_sources(path, entries, sources, m, keys, values, 1);
    free(entries);
    free(sources);
    return s;
}

static zt_status write_index(const char *tmp, const export_tensor *e, int n, int n_shards,
                             uint64_t total) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < n; i++) {
        char name[64];
        shard_name(name, sizeof name, e[i].shard, n_shards);
        cJSON_AddStringToObject(map, e[i].name, name);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
    zt_status s = text ? zt_write_file_atomic(path, text, strlen(text))
                       : zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    cJSON_free(text);
    return s;
}

/* Writes the directory's files into tmp: config.json first, so that a spec it cannot describe
 * is refused before any tensor is read. */
static zt_status write_files(const char *tmp, const zt_model_spec *spec, zt_ckpt_weights *w,
                             uint64_t max_shard_bytes, zt_hf_export_result *res) {
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", tmp);
    ZT_TRY(zt_hf_config_write(spec, path));
    const zt_model_family *fam = zt_model_family_find(spec->type);
    const char *prefix = fam->hf.strip_prefix ? fam->hf.strip_prefix : "";
    int n = zt_ckpt_weights_count(w);
    export_tensor *e = calloc((size_t)n + 1, sizeof *e);
    if (!e)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", tmp);
    uint64_t total = 0;
    size_t params = 0;
    for (int i = 0; i < n; i++) {
        const zt_ckpt_tensor *t = zt_ckpt_weights_tensor(w, i);
        e[i] = (export_tensor){.t = t, .w = w, .index = i};
        /* Hugging Face files carry the prefix the loader drops ("transformer." for GPT-2). */
        snprintf(e[i].name, sizeof e[i].name, "%s%s", prefix, t->name);
        total += (uint64_t)t->numel * sizeof(float);
        params += t->numel;
    }
    int n_shards = plan_shards(e, n, max_shard_bytes);
    zt_status s = ZT_OK;
    for (int k = 0; k < n_shards && s == ZT_OK; k++)
        s = write_shard(tmp, e, n, k, n_shards);
    if (s == ZT_OK && n_shards > 1)
        s = write_index(tmp, e, n, n_shards, total);
    free(e);
    *res = (zt_hf_export_result){.n_shards = n_shards, .total_bytes = total, .n_params = params,
                                 .n_positions = strcmp(spec->type, "gpt2") == 0 ? spec->block_size
                                                                               : 0};
    return s;
}

/* The token string a tokenizer_config.json gives for key: a string, or an AddedToken's
 * "content"; NULL when absent. */
static const char *special_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The generation_config.json beside the source config.json src, if any, copied beside the
 * export's config.json. */
static zt_status copy_generation_config(const char *src, const char *config_path) {
    char from[4200], to[4400], *data;
    size_t len;
    zt_path_beside(src, "generation_config.json", from, sizeof from);
    if (access(from, F_OK) != 0)
        return ZT_OK;
    zt_path_beside(config_path, "generation_config.json", to, sizeof to);
    ZT_TRY(zt_read_file(from, &data, &len));
    zt_status s = zt_write_file_atomic(to, data, len);
    free(data);
    return s;
}

/* The config.json whose special token ids (add_token_ids) the export keeps, into
 * src ("" for none): that of the model directory the job started from (model.init_from), as
 * from_pretrained and then save_pretrained keep them, else the one beside the job's tokenizer
 * (data.tokenizer). Both are recorded in the checkpoint; a model directory that no longer has
 * its config.json goes into res->source_missing. */
static zt_status source_config(const char *dir, const char *tag, char *src, size_t cap,
                               zt_hf_export_result *res) {
    char *from = NULL;
    src[0] = '\0';
    ZT_TRY(zt_ckpt_read_hf_source(dir, tag, &from));
    if (from)
        snprintf(src, cap, "%s/config.json", from);
    if (src[0] && access(src, F_OK) != 0)
        snprintf(res->source_missing, sizeof res->source_missing, "%s", from);
    free(from);
    if (src[0] && !res->source_missing[0])
        return ZT_OK;
    src[0] = '\0';
    ZT_TRY(zt_ckpt_read_tokenizer(dir, tag, &from));
    if (from)
        zt_path_beside(from, "config.json", src, cap);
    free(from);
    if (src[0] && access(src, F_OK) != 0)
        src[0] = '\0';
    return ZT_OK;
}

/* The ids of the bos_token and eos_token of the tokenizer_config.json beside the job's
 * tokenizer, through the tokenizer, as keys[] of a config.json: a new object (NULL with
 * neither file). */
static zt_status ids_from_tokenizer_config(const char *dir, const char *tag, cJSON **ids) {
    char *tok_path = NULL, src[4200];
    *ids = NULL;
    ZT_TRY(zt_ckpt_read_tokenizer(dir, tag, &tok_path));
    if (!tok_path)
        return ZT_OK;
    zt_path_beside(tok_path, "tokenizer_config.json", src, sizeof src);
    cJSON *from = NULL;
    zt_tokenizer_t *tok = NULL;
    zt_status s = ZT_OK;
    if (access(src, F_OK) == 0 && (s = zt_json_load_file(src, &from)) == ZT_OK)
        s = zt_tokenizer_load(tok_path, &tok);
    if (s == ZT_OK && tok && !(*ids = cJSON_CreateObject()))
        s = zt_error(ZT_ERR_NOMEM, "out of memory");
    for (int i = 0; s == ZT_OK && *ids && i < 2; i++) {
        const char *text = special_token(from, i == 0 ? "bos_token" : "eos_token");
        int32_t id = text ? zt_tokenizer_token_id(tok, text) : -1;
        if (id >= 0)
            cJSON_AddNumberToObject(*ids, i == 0 ? "bos_token_id" : "eos_token_id", id);
    }
    cJSON_Delete(from);
    zt_tokenizer_destroy(tok);
    free(tok_path);
    return s;
}

/* The special token ids a model's config.json carries (bos_token_id, eos_token_id,
 * pad_token_id), which generation reads and the checkpoint does not hold: taken from
 * source_config's config.json, or else (bos and eos) from the tokenizer_config.json beside the
 * job's tokenizer through the tokenizer. With
 * neither, config.json stays without them (transformers' defaults). A generation_config.json
 * beside the source config.json comes along, as save_pretrained writes the one from_pretrained
 * read. */
static zt_status add_token_ids(const char *dir, const char *tag, const char *config_path,
                               zt_hf_export_result *res) {
    static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    char src[4200];
    ZT_TRY(source_config(dir, tag, src, sizeof src, res));
    cJSON *from = NULL, *out = NULL;
    zt_status s = src[0] ? zt_json_load_file(src, &from)
                         : ids_from_tokenizer_config(dir, tag, &from);
    if (s != ZT_OK || !from)
        return s;
    if (src[0])
        s = copy_generation_config(src, config_path);
    if (s == ZT_OK)
        s = zt_json_load_file(config_path, &out);
    for (size_t i = 0; s == ZT_OK && i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *given = cJSON_GetObjectItemCaseSensitive(from, keys[i]);
        if (given) {
            cJSON_DeleteItemFromObjectCaseSensitive(out, keys[i]);
            cJSON_AddItemToObject(out, keys[i], cJSON_Duplicate(given, true));
        }
    }
    char *text = s == ZT_OK ? zt_json_print(out, true) : NULL;
    if (s == ZT_OK)
        s = text ? zt_write_file_atomic(config_path, text, strlen(text))
                 : zt_error(ZT_ERR_NOMEM, "%s: out of memory", config_path);
    cJSON_free(text);
    cJSON_Delete(from);
    cJSON_Delete(out);
    return s;
}

/* The tokenizer, as save_pretrained writes one beside its model so that AutoTokenizer loads the
 * directory: the job's tokenizer (data.tokenizer, recorded in the checkpoint) as tokenizer.json,
 * and the files beside it that AutoTokenizer reads with it. Nothing without a recorded
 * tokenizer; a recorded one that no longer exists is left out and named in res. */
static zt_status copy_tokenizer(const char *dir, const char *tag, const char *tmp,
                                zt_hf_export_result *res) {
    static const char *const beside[] = {"tokenizer_config.json", "special_tokens_map.json",
                                         "added_tokens.json"};
    char *tok_path = NULL;
    ZT_TRY(zt_ckpt_read_tokenizer(dir, tag, &tok_path));
    if (!tok_path)
        return ZT_OK;
    zt_status s = ZT_OK;
    if (access(tok_path, F_OK) != 0) {
        snprintf(res->tokenizer_missing, sizeof res->tokenizer_missing, "%s", tok_path);
        free(tok_path);
        return ZT_OK;
    }
    for (int i = -1; i < (int)(sizeof beside / sizeof beside[0]) && s == ZT_OK; i++) {
        char src[4200], dst[4400], *data;
        size_t len;
        const char *name = i < 0 ? "tokenizer.json" : beside[i];
        if (i < 0)
            snprintf(src, sizeof src, "%s", tok_path);
        else
            zt_path_beside(tok_path, name, src, sizeof src);
        if (i >= 0 && access(src, F_OK) != 0)
            continue;
        snprintf(dst, sizeof dst, "%s/%s", tmp, name);
        s = zt_read_file(src, &data, &len);
        if (s == ZT_OK) {
            s = zt_write_file_atomic(dst, data, len);
            free(data);
            res->tokenizer_files++;
        }
    }
    free(tok_path);
    return s;
}

zt_status zt_hf_export(const char *dir, const char *tag, const char *out_dir,
                       uint64_t max_shard_bytes, zt_hf_export_result *res) {
    ZT_ASSERT(max_shard_bytes > 0);
    memset(res, 0, sizeof *res);
    ZT_TRY(check_target(out_dir));
    zt_model_spec spec;
    zt_ckpt_weights *w = NULL;
    ZT_TRY(zt_ckpt_weights_open(&w, dir, tag, ZT_CKPT_MASTER, &spec));
    zt_status s = ZT_OK;
    /* The temporary directory is a sibling: "out/" must not put it inside out. */
    char tmp[4200];
    size_t len = strlen(out_dir);
    while (len > 1 && out_dir[len - 1] == '/')
        len--;
    snprintf(tmp, sizeof tmp, "%.*s.tmp-%ld", (int)len, out_dir, (long)getpid());
    bool made = false;
    zt_tmp_track(tmp);
    if (s == ZT_OK)
        s = zt_remove_tree(tmp);
    if (s == ZT_OK && (s = zt_mkdirs(tmp)) == ZT_OK)
        made = true;
    if (s == ZT_OK)
        s = write_files(tmp, &spec, w, max_shard_bytes, res);
    if (s == ZT_OK) {
        char config[4400];
        snprintf(config, sizeof config, "%s/config.json", tmp);
        s = add_token_ids(dir, tag, config, res);
    }
    if (s == ZT_OK)
        s = copy_tokenizer(dir, tag, tmp, res);
    if (s == ZT_OK)
        s = zt_sync_dir(tmp);
    /* rename() replaces an empty directory, so an out_dir made beforehand is fine. */
    if (s == ZT_OK && zt_tmp_rename(tmp, out_dir) != 0)
        s = zt_error(ZT_ERR_IO, "%s: cannot rename %s into place: %s", out_dir, tmp,
                     strerror(errno));
    if (s == ZT_OK)
        s = zt_sync_parent_dir(out_dir);
    else if (made)
        zt_remove_tree(tmp);
    zt_tmp_untrack(tmp);
    zt_ckpt_weights_close(w);
    return s;
}
