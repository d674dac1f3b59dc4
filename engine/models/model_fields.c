/* Reading, checking, printing and comparing one model spec field through its table entry
 * (model_fields.h), so that every place a spec's fields travel through (job files, meta.json,
 * messages) handles each kind the same way. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/model_fields.h"

/* The member f describes inside rec. */
static void *member(const zt_model_field *f, void *rec) { return (char *)rec + f->offset; }

static const void *cmember(const zt_model_field *f, const void *rec) {
    return (const char *)rec + f->offset;
}

void zt_model_field_set_default(const zt_model_field *f, void *rec) {
    void *p = member(f, rec);
    switch (f->kind) {
    case ZT_FIELD_INT:
        *(int *)p = (int)f->def;
        break;
    case ZT_FIELD_FLOAT:
        *(double *)p = f->def;
        break;
    case ZT_FIELD_BOOL:
        *(bool *)p = f->def != 0.0;
        break;
    case ZT_FIELD_STRING:
        snprintf(p, f->size, "%s", f->def_str ? f->def_str : "");
        break;
    case ZT_FIELD_PATH:
        *(char **)p = NULL;
        break;
    }
}

zt_status zt_model_field_read_json(const zt_model_field *f, const zt_json_obj *o, void *rec) {
    ZT_ASSERT(f->kind != ZT_FIELD_PATH);
    if (f->required)
        ZT_TRY(zt_json_require(o, f->key));
    void *p = member(f, rec);
    bool found = false;
    switch (f->kind) {
    case ZT_FIELD_INT:
        ZT_TRY(zt_json_get_int(o, f->key, p, &found));
        break;
    case ZT_FIELD_FLOAT:
        ZT_TRY(zt_json_get_double(o, f->key, p, &found));
        break;
    case ZT_FIELD_BOOL:
        ZT_TRY(zt_json_get_bool(o, f->key, p, &found));
        break;
    case ZT_FIELD_STRING: {
        const char *v = NULL;
        ZT_TRY(zt_json_get_string(o, f->key, &v, &found));
        if (found && strlen(v) >= f->size)
            return zt_json_key_error(ZT_ERR_INVALID, o, f->key, "must be at most %zu bytes long, "
                                     "got \"%s\"", f->size - 1, v);
        if (found)
            memcpy(p, v, strlen(v) + 1);
        break;
    }
    case ZT_FIELD_PATH:
        break;
    }
    if (!found)
        zt_model_field_set_default(f, rec);
    return ZT_OK;
}

zt_status zt_model_field_check(const zt_model_field *f, const void *rec, const char *source) {
    const void *p = cmember(f, rec);
    if (f->kind == ZT_FIELD_INT) {
        int v = *(const int *)p;
        if (f->bound == ZT_BOUND_POSITIVE && v <= 0)
            return zt_error(ZT_ERR_INVALID, "%s: model.%s must be a positive integer, got %d",
                            source, f->key, v);
        if (f->bound == ZT_BOUND_NONNEGATIVE && v < 0)
            return zt_error(ZT_ERR_INVALID, "%s: model.%s must be a non-negative integer, got %d",
                            source, f->key, v);
    } else if (f->kind == ZT_FIELD_FLOAT) {
        double v = *(const double *)p;
        if (!isfinite(v))
            return zt_error(ZT_ERR_INVALID, "%s: model.%s must be a finite number, got %g", source,
                            f->key, v);
        if (f->bound == ZT_BOUND_POSITIVE && !(v > 0.0))
            return zt_error(ZT_ERR_INVALID, "%s: model.%s must be positive, got %g", source,
                            f->key, v);
        if (f->bound == ZT_BOUND_NONNEGATIVE && v < 0.0)
            return zt_error(ZT_ERR_INVALID, "%s: model.%s must be >= 0, got %g", source, f->key, v);
    }
    return ZT_OK;
}

cJSON *zt_model_field_to_cjson(const zt_model_field *f, const void *rec) {
    const void *p = cmember(f, rec);
    switch (f->kind) {
    case ZT_FIELD_INT:
        return cJSON_CreateNumber(*(const int *)p);
    case ZT_FIELD_FLOAT: {
        /* cJSON prints a double with 15 digits when that reads back within an epsilon, which
         * would change the value in meta.json; the field's own text reads back exactly. */
        char text[64];
        if (!isfinite(*(const double *)p))
            return cJSON_CreateNull();
        zt_model_field_format_value(f, rec, text, sizeof text);
        return cJSON_CreateRaw(text);
    }
    case ZT_FIELD_BOOL:
        return cJSON_CreateBool(*(const bool *)p);
    case ZT_FIELD_STRING:
        return cJSON_CreateString(p);
    case ZT_FIELD_PATH: {
        const char *s = *(char *const *)p;
        return s ? cJSON_CreateString(s) : cJSON_CreateNull();
    }
    }
    return NULL;
}

zt_status zt_model_field_from_cjson(const zt_model_field *f, const cJSON *obj, void *rec,
                                    const char *source) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, f->key);
    void *p = member(f, rec);
    if (!v || cJSON_IsNull(v)) {
        zt_model_field_set_default(f, rec);
        return ZT_OK;
    }
    const char *want = NULL;
    switch (f->kind) {
    case ZT_FIELD_INT:
        if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
            v->valuedouble >= INT_MIN && v->valuedouble <= INT_MAX)
            *(int *)p = (int)v->valuedouble;
        else
            want = "an integer";
        break;
    case ZT_FIELD_FLOAT:
        if (cJSON_IsNumber(v))
            *(double *)p = v->valuedouble;
        else
            want = "a number";
        break;
    case ZT_FIELD_BOOL:
        if (cJSON_IsBool(v))
            *(bool *)p = cJSON_IsTrue(v);
        else
            want = "true or false";
        break;
    case ZT_FIELD_STRING:
        if (cJSON_IsString(v) && strlen(v->valuestring) < f->size)
            memcpy(p, v->valuestring, strlen(v->valuestring) + 1);
        else
            want = "a string";
        break;
    case ZT_FIELD_PATH:
        /* The caller owns what a path points to, so a path is never read into a record here. */
        ZT_ASSERT(!"a path field is not read from meta.json");
    }
    if (want)
        return zt_error(ZT_ERR_FORMAT, "%s: model.%s must be %s", source, f->key, want);
    return ZT_OK;
}

bool zt_model_field_equal(const zt_model_field *f, const void *a, const void *b) {
    const void *pa = cmember(f, a), *pb = cmember(f, b);
    switch (f->kind) {
    case ZT_FIELD_INT:
        return *(const int *)pa == *(const int *)pb;
    case ZT_FIELD_FLOAT:
        return *(const double *)pa == *(const double *)pb;
    case ZT_FIELD_BOOL:
        return *(const bool *)pa == *(const bool *)pb;
    case ZT_FIELD_STRING:
        return strcmp(pa, pb) == 0;
    case ZT_FIELD_PATH: {
        const char *sa = *(char *const *)pa, *sb = *(char *const *)pb;
        return strcmp(sa ? sa : "", sb ? sb : "") == 0;
    }
    }
    return false;
}

void zt_model_field_format_value(const zt_model_field *f, const void *rec, char *buf,
                                 size_t size) {
    const void *p = cmember(f, rec);
    switch (f->kind) {
    case ZT_FIELD_INT:
        snprintf(buf, size, "%d", *(const int *)p);
        return;
    case ZT_FIELD_FLOAT: {
        double v = *(const double *)p;
        /* The shortest of %.15g and %.17g that reads back as v: 1e-05 rather than
         * 1.0000000000000001e-05. */
        snprintf(buf, size, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, size, "%.17g", v);
        return;
    }
    case ZT_FIELD_BOOL:
        snprintf(buf, size, "%s", *(const bool *)p ? "true" : "false");
        return;
    case ZT_FIELD_STRING:
        snprintf(buf, size, "%s", (const char *)p);
        return;
    case ZT_FIELD_PATH: {
        const char *s = *(char *const *)p;
        snprintf(buf, size, "%s", s ? s : "(none)");
        return;
    }
    }
}
