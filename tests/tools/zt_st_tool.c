/* zt_st_tool: drives the safetensors reader and writer from tests/reference/test_safetensors_io.py.
 *
 *   zt_st_tool dump FILE OUTDIR    every tensor as raw fp32 in OUTDIR/<i>.f32, plus
 *                                  OUTDIR/manifest.json {"metadata", "tensors": [{name, dtype,
 *                                  shape, offset, file}]}
 *   zt_st_tool write FILE SPEC     writes the tensors listed in SPEC, a JSON file
 *                                  {"metadata": {k: v}, "tensors": [{name, shape, file, dtype}]}
 *                                  whose files hold raw little-endian fp32; dtype (optional,
 *                                  default "F32") "F16" or "BF16" stores them rounded
 *   zt_st_tool check FILE          opens FILE; prints "ok N" or the error
 *
 * Exit status: 0 success, 1 the library refused the file or the write, 2 usage or tool error. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/safetensors.h"

static int fail(zt_status s) {
    fprintf(stderr, "%s: %s\n", zt_status_name(s), zt_last_error());
    return 1;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)len + 1);
        if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    if (buf) {
        buf[len] = 0;
        *n = (size_t)len;
    }
    return buf;
}

static int cmd_dump(const char *path, const char *outdir) {
    zt_st_file f;
    zt_status s = zt_st_open(&f, path);
    if (s != ZT_OK)
        return fail(s);
    cJSON *man = cJSON_CreateObject();
    cJSON_AddItemToObject(man, "metadata",
                          f.metadata_json ? cJSON_Parse(f.metadata_json) : cJSON_CreateNull());
    cJSON *list = cJSON_AddArrayToObject(man, "tensors");
    int rc = 0;
    for (int i = 0; i < f.n_tensors && rc == 0; i++) {
        const zt_st_tensor *t = &f.tensors[i];
        size_t n = (size_t)zt_st_numel(t);
        float *buf = malloc(n ? n * sizeof *buf : 1);
        s = zt_st_read_f32(&f, t, buf, n);
        if (s != ZT_OK) {
            rc = fail(s);
            free(buf);
            break;
        }
        char name[64], file[4096];
        snprintf(name, sizeof name, "%d.f32", i);
        snprintf(file, sizeof file, "%s/%s", outdir, name);
        FILE *o = fopen(file, "wb");
        if (!o || (n && fwrite(buf, sizeof *buf, n, o) != n) || fclose(o) != 0) {
            perror(file);
            rc = 2;
        }
        free(buf);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddStringToObject(e, "dtype", t->dtype_name);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddNumberToObject(e, "offset", (double)t->offset);
        cJSON_AddStringToObject(e, "file", name);
        cJSON_AddItemToArray(list, e);
    }
    if (rc == 0) {
        char *text = cJSON_Print(man);
        char file[4096];
        snprintf(file, sizeof file, "%s/manifest.json", outdir);
        FILE *o = fopen(file, "w");
        if (!o || fputs(text, o) < 0 || fclose(o) != 0) {
            perror(file);
            rc = 2;
        }
        cJSON_free(text);
    }
    cJSON_Delete(man);
    zt_st_close(&f);
    return rc;
}

static int cmd_write(const char *path, const char *spec_path) {
    size_t n;
    char *text = slurp(spec_path, &n);
    cJSON *spec = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!spec) {
        fprintf(stderr, "%s: cannot read the spec\n", spec_path);
        return 2;
    }
    const cJSON *meta = cJSON_GetObjectItem(spec, "metadata");
    const cJSON *tensors = cJSON_GetObjectItem(spec, "tensors");
    int nt = cJSON_GetArraySize(tensors), nm = cJSON_IsObject(meta) ? cJSON_GetArraySize(meta) : 0;
    zt_st_entry *e = calloc((size_t)nt + 1, sizeof *e);
    zt_st_dtype *types = calloc((size_t)nt + 1, sizeof *types);
    const char **mk = calloc((size_t)nm + 1, sizeof *mk), **mv = calloc((size_t)nm + 1, sizeof *mv);
    int rc = 0, i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, tensors) {
        e[i].name = cJSON_GetObjectItem(it, "name")->valuestring;
        const cJSON *shape = cJSON_GetObjectItem(it, "shape"), *d;
        size_t want = 1;
        cJSON_ArrayForEach(d, shape) {
            e[i].shape[e[i].ndim++] = (int64_t)d->valuedouble;
            want *= (size_t)d->valuedouble;
        }
        size_t got = 0;
        char *data = slurp(cJSON_GetObjectItem(it, "file")->valuestring, &got);
        if (!data || got != want * sizeof(float)) {
            fprintf(stderr, "%s: tensor %s: data file has the wrong size\n", spec_path, e[i].name);
            rc = 2;
        }
        e[i].data = (const float *)data;
        const cJSON *dt = cJSON_GetObjectItem(it, "dtype");
        const char *dts = cJSON_IsString(dt) ? dt->valuestring : "F32";
        types[i] = strcmp(dts, "F16") == 0 ? ZT_ST_F16 : strcmp(dts, "BF16") == 0 ? ZT_ST_BF16
                                                                                 : ZT_ST_F32;
        i++;
    }
    i = 0;
    cJSON_ArrayForEach(it, meta) {
        mk[i] = it->string;
        mv[i] = it->valuestring;
        i++;
    }
    if (rc == 0) {
        zt_status s = zt_st_write_typed(path, e, NULL, types, nt, mk, mv, nm);
        if (s != ZT_OK)
            rc = fail(s);
    }
    for (i = 0; i < nt; i++)
        free((void *)e[i].data);
    free(e);
    free(types);
    free(mk);
    free(mv);
    cJSON_Delete(spec);
    return rc;
}

static int cmd_check(const char *path) {
    zt_st_file f;
    zt_status s = zt_st_open(&f, path);
    if (s != ZT_OK)
        return fail(s);
    printf("ok %d\n", f.n_tensors);
    zt_st_close(&f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "dump") == 0)
        return cmd_dump(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "write") == 0)
        return cmd_write(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "check") == 0)
        return cmd_check(argv[2]);
    fprintf(stderr, "usage: zt_st_tool dump FILE OUTDIR | write FILE SPEC | check FILE\n");
    return 2;
}
