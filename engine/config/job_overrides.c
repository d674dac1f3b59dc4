/* `--set key.path=value` overrides of a job file (ztrain/job_overrides.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ztrain/job_overrides.h"
#include "ztrain/json_util.h"

/* The value of one override: JSON when it parses as JSON, else the text as a string, so that
 * `--set name=run-2` needs no quotes while `--set train.max_steps=30` stays a number. A number
 * beyond a double's range (1e999) is refused by key: it would print back as null, which means
 * "absent". */
static zt_status override_value(const char *set, const char *key_path, const char *text,
                                cJSON **out) {
    /* Parsed as a job file is, so that 3.0 stays a number written as a float. */
    cJSON *v = NULL;
    if (zt_json_parse(text, "--set", &v) != ZT_OK)
        v = NULL;
    if (!v)
        v = cJSON_CreateString(text);
    if (!v)
        return zt_error(ZT_ERR_NOMEM, "--set: out of memory");
    char source[600];
    snprintf(source, sizeof source, "--set '%.500s'", set);
    zt_status s = zt_json_check_finite(v, source, key_path, NULL);
    if (s != ZT_OK) {
        cJSON_Delete(v);
        return s;
    }
    *out = v;
    return ZT_OK;
}

/* Replaces a "deepspeed" file path by the file's object, read relative to base_dir. */
static zt_status inline_deepspeed(cJSON *root, cJSON *ds, const char *source,
                                  const char *base_dir) {
    const char *file = cJSON_GetStringValue(ds);
    char *path = NULL;
    if (file[0] == '/' || !base_dir) {
        path = strdup(file);
    } else {
        size_t n = strlen(base_dir) + strlen(file) + 2;
        path = malloc(n);
        if (path)
            snprintf(path, n, "%s/%s", base_dir, file);
    }
    if (!path)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
    cJSON *obj = NULL;
    zt_status s = zt_json_load_config(path, &obj);
    free(path);
    if (s != ZT_OK)
        return s;
    if (!cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        return zt_error(ZT_ERR_INVALID, "%s: deepspeed: the file %s does not hold a JSON object",
                        source, file);
    }
    /* Printed back as text below, where an infinity would become null. */
    s = zt_json_check_finite(obj, file, "", NULL);
    if (s != ZT_OK) {
        cJSON_Delete(obj);
        return s;
    }
    cJSON_ReplaceItemInObjectCaseSensitive(root, "deepspeed", obj);
    return ZT_OK;
}

static zt_status apply_one(cJSON *root, const char *set, const char *source,
                           const char *base_dir) {
    const char *eq = strchr(set, '=');
    if (!eq || eq == set)
        return zt_error(ZT_ERR_INVALID, "--set '%s': expected KEY.PATH=VALUE "
                        "(train.max_steps=30)", set);
    char path[512];
    size_t plen = (size_t)(eq - set);
    if (plen >= sizeof path)
        return zt_error(ZT_ERR_INVALID, "--set '%.40s...': the key path is longer than %zu bytes",
                        set, sizeof path - 1);
    memcpy(path, set, plen);
    path[plen] = '\0';
    char key_path[512];
    memcpy(key_path, path, plen + 1);

    cJSON *node = root;
    char *key = path;
    for (;;) {
        char *dot = strchr(key, '.');
        if (dot)
            *dot = '\0';
        if (!*key)
            return zt_error(ZT_ERR_INVALID, "--set '%s': an empty key in the path", set);
        if (!dot) {
            cJSON *v = NULL;
            ZT_TRY(override_value(set, key_path, eq + 1, &v));
            if (cJSON_GetObjectItemCaseSensitive(node, key))
                cJSON_ReplaceItemInObjectCaseSensitive(node, key, v);
            else
                cJSON_AddItemToObject(node, key, v);
            return ZT_OK;
        }
        cJSON *child = cJSON_GetObjectItemCaseSensitive(node, key);
        if (node == root && strcmp(key, "deepspeed") == 0 && cJSON_IsString(child)) {
            ZT_TRY(inline_deepspeed(root, child, source, base_dir));
            child = cJSON_GetObjectItemCaseSensitive(node, key);
        }
        if (!child || cJSON_IsNull(child)) {
            child = cJSON_CreateObject();
            if (!child)
                return zt_error(ZT_ERR_NOMEM, "--set: out of memory");
            if (cJSON_GetObjectItemCaseSensitive(node, key))
                cJSON_ReplaceItemInObjectCaseSensitive(node, key, child);
            else
                cJSON_AddItemToObject(node, key, child);
        } else if (!cJSON_IsObject(child)) {
            /* The path up to this key, from the override's own text (path's dots are cut). */
            int upto = (int)(dot - path);
            return zt_error(ZT_ERR_INVALID, "--set '%s': %.*s in %s is not an object, so it has "
                            "no key '%s'", set, upto, set, source, dot + 1);
        }
        node = child;
        key = dot + 1;
    }
}

zt_status zt_job_overrides_apply(const char *text, const char *source, const char *base_dir,
                                 const char *const *sets, size_t n, char **out) {
    *out = NULL;
    if (n == 0) {
        *out = strdup(text);
        return *out ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    cJSON *root = NULL;
    ZT_TRY(zt_json_parse(text, source, &root));
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zt_error(ZT_ERR_INVALID, "%s: a job file holds a JSON object", source);
    }
    /* Printed back as text below, where an infinity would become null. */
    zt_status s = zt_json_check_finite(root, source, "", NULL);
    for (size_t i = 0; i < n && s == ZT_OK; i++)
        s = apply_one(root, sets[i], source, base_dir);
    if (s == ZT_OK) {
        *out = zt_json_print(root, true);
        if (!*out)
            s = zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    cJSON_Delete(root);
    return s;
}

zt_status zt_job_overrides_load(zt_job_spec *job, const char *path, const char *const *sets,
                                size_t n) {
    if (n == 0)
        return zt_job_spec_load(job, path);
    memset(job, 0, sizeof *job);
    char *text = NULL, *applied = NULL;
    ZT_TRY(zt_json_read_config(path, &text, NULL));
    /* The job file's directory, absolute, as zt_job_spec_load anchors relative paths. */
    char *dir = strdup(path);
    if (!dir) {
        free(text);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    char *abs = realpath(dir, NULL);
    const char *base = abs ? abs : dir;
    zt_status s = zt_job_overrides_apply(text, path, base, sets, n, &applied);
    if (s == ZT_OK)
        s = zt_job_spec_parse(job, applied, path, base);
    free(applied);
    free(abs);
    free(dir);
    free(text);
    return s;
}
