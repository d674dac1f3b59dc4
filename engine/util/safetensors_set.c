/* A model's weights as one safetensors file or as shards listed by an index (ztrain/
 * safetensors.h, zt_st_set). Every shard is opened by zt_st_open, so a shard is checked as
 * strictly as a single file; this file only reads model.safetensors.index.json and holds the
 * index and the shards to each other. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ztrain/fsutil.h"
#include "ztrain/json_util.h"
#include "ztrain/safetensors.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static zt_status alloc_refs(zt_st_set *set) {
    int n = 0;
    for (int i = 0; i < set->n_files; i++)
        n += set->files[i].n_tensors;
    set->tensors = calloc(n ? (size_t)n : 1, sizeof *set->tensors);
    if (!set->tensors)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", set->path);
    for (int i = 0; i < set->n_files; i++)
        for (int j = 0; j < set->files[i].n_tensors; j++)
            set->tensors[set->n_tensors++] = (zt_st_ref){&set->files[i], &set->files[i].tensors[j]};
    return ZT_OK;
}

static zt_status open_single(zt_st_set *set, const char *path) {
    set->files = calloc(1, sizeof *set->files);
    if (!set->files)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    ZT_TRY(zt_st_open(&set->files[0], path));
    set->n_files = 1;
    return alloc_refs(set);
}

/* A shard is named by a plain file name beside the index: a path could reach files outside
 * the model's directory (and outside a server's data root). */
static bool plain_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* The shards in the order the weight map first names them. */
static zt_status list_shards(const char *index, const cJSON *map, const char ***names, int *n) {
    int cap = cJSON_GetArraySize(map);
    *names = calloc(cap ? (size_t)cap : 1, sizeof **names);
    *n = 0;
    if (!*names)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", index);
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || !plain_name(e->valuestring)) {
            char got[96];
            zt_json_repr(e, got, sizeof got);
            return zt_error(ZT_ERR_FORMAT, "%s: weight_map['%s'] must be the file name of a "
                            "shard in the same directory, got %s", index, e->string, got);
        }
        bool seen = false;
        for (int i = 0; i < *n && !seen; i++)
            seen = strcmp((*names)[i], e->valuestring) == 0;
        if (!seen)
            (*names)[(*n)++] = e->valuestring;
    }
    return ZT_OK;
}

/* Every tensor the index lists is in its shard, and every tensor of a shard is listed there. */
static zt_status check_against_index(const zt_st_set *set, const cJSON *map, const char *dir,
                                     const char *const *names) {
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        int k = 0;
        while (strcmp(names[k], e->valuestring) != 0)
            k++;
        if (!zt_st_find(&set->files[k], e->string))
            return zt_error(ZT_ERR_FORMAT, "%s/%s: tensor '%s' is listed there by %s but the "
                            "shard does not hold it", dir, names[k], e->string, set->path);
    }
    for (int k = 0; k < set->n_files; k++) {
        const zt_st_file *f = &set->files[k];
        for (int j = 0; j < f->n_tensors; j++) {
            const cJSON *where = cJSON_GetObjectItemCaseSensitive(map, f->tensors[j].name);
            if (!where)
                return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is not listed in %s", f->path,
                                f->tensors[j].name, set->path);
            if (strcmp(where->valuestring, names[k]) != 0)
                return zt_error(ZT_ERR_FORMAT, "%s: tensor '%s' is also here, but %s places it "
                                "in %s", f->path, f->tensors[j].name, set->path,
                                where->valuestring);
        }
    }
    return ZT_OK;
}

static zt_status open_index(zt_st_set *set, const char *index) {
    cJSON *root;
    ZT_TRY(zt_json_load_file(index, &root));
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    zt_status s = ZT_OK;
    if (!cJSON_IsObject(map) || !map->child)
        s = zt_error(ZT_ERR_FORMAT, "%s: no \"weight_map\" object naming the shards", index);
    if (s == ZT_OK)
        s = zt_json_check_duplicates(map, index, "weight_map", "weight_map", NULL);
    const char **names = NULL;
    int n = 0;
    if (s == ZT_OK)
        s = list_shards(index, map, &names, &n);
    char *dir = strdup(index);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (s == ZT_OK && !dir)
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", index);
    if (dir && !slash)
        snprintf(dir, strlen(dir) + 1, ".");
    else if (slash)
        *slash = '\0';
    if (s == ZT_OK && !(set->files = calloc((size_t)n, sizeof *set->files)))
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", index);
    for (int k = 0; k < n && s == ZT_OK; k++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        s = zt_st_open(&set->files[k], path);
        if (s == ZT_OK) {
            set->n_files++;
            continue;
        }
        /* Name a tensor the missing shard should hold, so the message says what is lost. */
        const cJSON *e = map->child;
        while (strcmp(e->valuestring, names[k]) != 0)
            e = e->next;
        zt_error_prefix(s, "%s: shard %s (holding '%s'): ", index, names[k], e->string);
    }
    if (s == ZT_OK)
        s = check_against_index(set, map, dir, names);
    if (s == ZT_OK)
        s = alloc_refs(set);
    free(dir);
    free(names);
    cJSON_Delete(root);
    return s;
}

/* The error for a model directory without safetensors weights; one with PyTorch's pickled
 * weights (what save_pretrained writes with safe_serialization=False, and older Hub repos hold),
 * which from_pretrained would read, is told how to convert them. */
static zt_status no_safetensors(const char *dir) {
    static const char *const pickles[] = {"pytorch_model.bin", "pytorch_model.bin.index.json"};
    for (size_t i = 0; i < sizeof pickles / sizeof pickles[0]; i++) {
        char bin[4400];
        snprintf(bin, sizeof bin, "%s/%s", dir, pickles[i]);
        if (is_file(bin))
            return zt_error(ZT_ERR_IO, "%s: no " SINGLE_NAME " or " INDEX_NAME " in this "
                            "directory, only %s (PyTorch's pickle format, which ztrain does not "
                            "read): convert it with AutoModelForCausalLM.from_pretrained(dir)"
                            ".save_pretrained(new_dir) (safetensors is save_pretrained's default)",
                            dir, pickles[i]);
    }
    return zt_error(ZT_ERR_IO, "%s: no " SINGLE_NAME " or " INDEX_NAME " in this directory", dir);
}

zt_status zt_st_set_open(zt_st_set *set, const char *path) {
    memset(set, 0, sizeof *set);
    char index[4400], single[4400];
    const char *what = path;
    if (is_dir(path)) {
        snprintf(index, sizeof index, "%s/" INDEX_NAME, path);
        snprintf(single, sizeof single, "%s/" SINGLE_NAME, path);
        /* from_pretrained's order: a model.safetensors beside an index is what it loads (a
         * Hub repo can hold both, and a re-save into the same directory can leave both). */
        if (is_file(single))
            what = single;
        else if (is_file(index))
            what = index;
        else
            return no_safetensors(path);
    }
    set->path = strdup(what);
    if (!set->path)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(what);
    zt_status s = n > 5 && strcmp(what + n - 5, ".json") == 0 ? open_index(set, what)
                                                               : open_single(set, what);
    if (s != ZT_OK)
        zt_st_set_close(set);
    return s;
}

void zt_st_set_close(zt_st_set *set) {
    for (int i = 0; i < set->n_files; i++)
        zt_st_close(&set->files[i]);
    free(set->files);
    free(set->tensors);
    free(set->path);
    memset(set, 0, sizeof *set);
}

const zt_st_ref *zt_st_set_find(const zt_st_set *set, const char *name) {
    for (int i = 0; i < set->n_tensors; i++)
        if (strcmp(set->tensors[i].tensor->name, name) == 0)
            return &set->tensors[i];
    return NULL;
}
