/* Job specs, jobs, metric records and log lines between ztrain's JSON and the proto messages
 * (job_proto.h).
 *
 * The job-spec keys are the proto's field names (model.n_embd is ModelSpec.n_embd), so both
 * directions walk the protobuf-c descriptors instead of listing every field twice: a field added
 * to the proto is known here at once. The one exception is "deepspeed" in JSON, which is
 * JobSpec.deepspeed_json in the proto. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "job_proto.h"
#include "ztrain/checkpoint.h"
#include "ztrain/json_util.h"
#include "ztrain/metrics.h"
#include "ztrain/model.h"

#define DEEPSPEED_KEY "deepspeed"
#define DEEPSPEED_FIELD "deepspeed_json"

/* Sections of the job file that the proto carries as JSON object text, as it does "deepspeed":
 * their rules belong to the engine's and the daemon's parsers, not to the proto. */
static const struct {
    const char *key, *field;
} text_sections[] = {{"events", "events_json"}, {"alerts", "alerts_json"}};
#define N_TEXT_SECTIONS (sizeof text_sections / sizeof text_sections[0])

/* The job-file key of a JobSpec field: "deepspeed" for deepspeed_json, "events" for
 * events_json, ...; the field's own name otherwise. */
static const char *top_key_of(const char *field) {
    if (strcmp(field, DEEPSPEED_FIELD) == 0)
        return DEEPSPEED_KEY;
    for (size_t i = 0; i < N_TEXT_SECTIONS; i++)
        if (strcmp(field, text_sections[i].field) == 0)
            return text_sections[i].key;
    return field;
}

/* Whether a top-level job-file key is one that the caller of fill_from_json reads itself. */
static bool is_text_key(const char *key) {
    if (strcmp(key, DEEPSPEED_KEY) == 0)
        return true;
    for (size_t i = 0; i < N_TEXT_SECTIONS; i++)
        if (strcmp(key, text_sections[i].key) == 0)
            return true;
    return false;
}

/* Keys whose zero the proto would read as "the default" although the job file forbids it. The
 * model's are its family's fields with a positive bound (must_be_positive). */
static const char *const positive_keys[] = {"world_size", "nodes", "train.epochs",
                                            "train.log_interval", "train.eval_steps",
                                            "training_args.per_device_train_batch_size",
                                            "training_args.gradient_accumulation_steps",
                                            "pipeline.stages", NULL};

/* ---- building heap-owned messages -------------------------------------------------------- */

/* Copies s; on failure records it in *ok and returns the empty string, which keeps the
 * message freeable, so builders check for out-of-memory once at the end. */
static char *dup_str(const char *s, bool *ok) {
    if (!s || !*s)
        return (char *)protobuf_c_empty_string;
    char *d = strdup(s);
    if (!d) {
        *ok = false;
        return (char *)protobuf_c_empty_string;
    }
    return d;
}

static ProtobufCMessage *new_message(const ProtobufCMessageDescriptor *desc) {
    ProtobufCMessage *m = malloc(desc->sizeof_message);
    if (m)
        protobuf_c_message_init(desc, m);
    return m;
}

static void free_message(void *m) {
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
}

Google__Protobuf__Timestamp *zt_job_proto_time(int64_t unix_ms, bool *ok) {
    if (unix_ms <= 0)
        return NULL;
    Google__Protobuf__Timestamp *t =
        (Google__Protobuf__Timestamp *)new_message(&google__protobuf__timestamp__descriptor);
    if (!t) {
        *ok = false;
        return NULL;
    }
    t->seconds = unix_ms / 1000;
    t->nanos = (int32_t)(unix_ms % 1000) * 1000000;
    return t;
}

int64_t zt_job_proto_time_ms(const Google__Protobuf__Timestamp *t) {
    return t ? t->seconds * 1000 + t->nanos / 1000000 : 0;
}

static Google__Protobuf__Duration *duration_ms(int64_t ms, bool *ok) {
    Google__Protobuf__Duration *d =
        (Google__Protobuf__Duration *)new_message(&google__protobuf__duration__descriptor);
    if (!d) {
        *ok = false;
        return NULL;
    }
    d->seconds = ms / 1000;
    d->nanos = (int32_t)(ms % 1000) * 1000000;
    return d;
}

static void *field_ptr(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    return (char *)m + f->offset;
}

static const void *field_cptr(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    return (const char *)m + f->offset;
}

static bool is_oneof(const ProtobufCFieldDescriptor *f) {
    return (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
}

/* ---- job-spec JSON -> JobSpec ------------------------------------------------------------ */

/* An unknown key, named by its dotted path, with the closest field name of its section as a
 * hint when there is one. */
static zt_status unknown_key(const zt_json_obj *o, const char *key,
                             const ProtobufCMessageDescriptor *desc, bool top) {
    const char *names[64];
    unsigned n = 0;
    for (unsigned i = 0; i < desc->n_fields && n + 1 < sizeof names / sizeof names[0]; i++)
        names[n++] = top ? top_key_of(desc->fields[i].name) : desc->fields[i].name;
    names[n] = NULL;
    char path[300], hint[320] = "";
    zt_json_key_path(o, key, path, sizeof path);
    const char *near = zt_json_suggest(key, names);
    if (near) {
        char near_path[300];
        zt_json_key_path(o, near, near_path, sizeof near_path);
        snprintf(hint, sizeof hint, " (did you mean '%s'?)", near_path);
    }
    zt_error(ZT_ERR_INVALID, "%s: unknown key '%s'%s", o->source, path, hint);
    return zt_error_field(ZT_ERR_INVALID, path);
}

/* Whether the key at this dotted path, a number of this kind, must be positive. A model key is
 * when any family's table bounds it so (the family is not looked up here: the server's parser
 * judges the spec as a whole). */
static bool must_be_positive(const char *path, zt_field_kind kind) {
    for (const char *const *k = positive_keys; *k; k++)
        if (kind == ZT_FIELD_INT && strcmp(*k, path) == 0)
            return true;
    if (strncmp(path, "model.", 6) != 0)
        return false;
    for (int i = 0; zt_model_family_at(i); i++) {
        const zt_model_field *f = zt_model_family_field(zt_model_family_at(i), path + 6);
        if (f && f->kind == kind && f->bound == ZT_BOUND_POSITIVE)
            return true;
    }
    return false;
}

static zt_status check_positive(const zt_json_obj *o, const char *key, int64_t v) {
    char path[300];
    zt_json_key_path(o, key, path, sizeof path);
    if (v < 1 && must_be_positive(path, ZT_FIELD_INT))
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be >= 1, got %lld", (long long)v);
    return ZT_OK;
}

/* A double the proto would send as "unset" (zero) or that the engine refuses anyway. */
static zt_status check_positive_double(const zt_json_obj *o, const char *key, double v) {
    char path[300];
    zt_json_key_path(o, key, path, sizeof path);
    if (!isfinite(v))
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be a finite number, got %g", v);
    if (!(v > 0.0) && must_be_positive(path, ZT_FIELD_FLOAT))
        return zt_json_key_error(ZT_ERR_INVALID, o, key, "must be positive, got %g", v);
    return ZT_OK;
}

static zt_status fill_from_json(ProtobufCMessage *msg, const zt_json_obj *o, bool top,
                                bool server_text, bool *ok);

/* An integer field given as a decimal string, the form the proto3 JSON mapping prints a 64-bit
 * integer in and which its parsers (json_format.Parse, protojson) read for any integer field:
 * an optional sign and ASCII digits, nothing else (no space, fraction, exponent or hex, as
 * json_format refuses them), within the field's type. Numbers above 2^53 are exact only in this
 * form, since a JSON number is read as a double. */
static zt_status int_from_string(const zt_json_obj *o, const ProtobufCFieldDescriptor *f,
                                 const char *text, void *p) {
    bool negative = text[0] == '-';
    const char *digits = text + (negative || text[0] == '+');
    bool ok = *digits != '\0';
    for (const char *c = digits; ok && *c; c++)
        ok = *c >= '0' && *c <= '9';
    errno = 0;
    long long v = 0;
    unsigned long long u = 0;
    if (ok && f->type == PROTOBUF_C_TYPE_UINT64)
        u = strtoull(digits, NULL, 10);
    else if (ok)
        v = strtoll(text, NULL, 10);
    ok = ok && errno != ERANGE;
    if (f->type == PROTOBUF_C_TYPE_UINT64)
        ok = ok && (!negative || u == 0);
    if (f->type == PROTOBUF_C_TYPE_INT32)
        ok = ok && v >= INT32_MIN && v <= INT32_MAX;
    if (!ok)
        return zt_json_key_error(ZT_ERR_INVALID, o, f->name, "must be an integer within %s, as "
                                 "a number or a decimal string (\"42\"), got \"%.40s\"",
                                 f->type == PROTOBUF_C_TYPE_INT32   ? "int32"
                                 : f->type == PROTOBUF_C_TYPE_INT64 ? "int64"
                                                                    : "uint64",
                                 text);
    if (f->type == PROTOBUF_C_TYPE_UINT64) {
        *(uint64_t *)p = u;
        return ZT_OK;
    }
    ZT_TRY(check_positive(o, f->name, v));
    if (f->type == PROTOBUF_C_TYPE_INT32)
        *(int32_t *)p = (int32_t)v;
    else
        *(int64_t *)p = v;
    return ZT_OK;
}

/* One key of a section into its field; absent values (null) leave the default. */
static zt_status field_from_json(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f,
                                 const zt_json_obj *o, bool server_text, bool *ok) {
    bool found = false;
    void *p = field_ptr(msg, f);
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *v;
        ZT_TRY(zt_json_get_string(o, f->name, &v, &found));
        /* The proto cannot tell "" from "unset". A client's file is told so; the server's own
         * text (the engine took "" for a name) maps "" to unset. */
        if (found && !*v && !server_text)
            return zt_json_key_error(ZT_ERR_INVALID, o, f->name, "must not be empty");
        if (found)
            *(char **)p = dup_str(v, ok);
        break;
    }
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT64: {
        int64_t v;
        const cJSON *it = zt_json_item(o, f->name);
        if (server_text && cJSON_IsString(it)) {
            ZT_TRY(int_from_string(o, f, it->valuestring, p));
            found = true;
            break;
        }
        ZT_TRY(zt_json_get_int64(o, f->name, &v, &found));
        if (!found)
            break;
        ZT_TRY(check_positive(o, f->name, v));
        if (f->type == PROTOBUF_C_TYPE_INT32 && (v < INT32_MIN || v > INT32_MAX))
            return zt_json_key_error(ZT_ERR_INVALID, o, f->name, "is out of range: %lld",
                                     (long long)v);
        if (f->type == PROTOBUF_C_TYPE_UINT64 && v < 0)
            return zt_json_key_error(ZT_ERR_INVALID, o, f->name, "must be >= 0, got %lld",
                                     (long long)v);
        if (f->type == PROTOBUF_C_TYPE_INT32)
            *(int32_t *)p = (int32_t)v;
        else if (f->type == PROTOBUF_C_TYPE_INT64)
            *(int64_t *)p = v;
        else
            *(uint64_t *)p = (uint64_t)v;
        break;
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double v;
        ZT_TRY(zt_json_get_double(o, f->name, &v, &found));
        if (!found)
            break;
        ZT_TRY(check_positive_double(o, f->name, v));
        *(double *)p = v;
        break;
    }
    case PROTOBUF_C_TYPE_BOOL: {
        bool v;
        ZT_TRY(zt_json_get_bool(o, f->name, &v, &found));
        if (found)
            *(protobuf_c_boolean *)p = v;
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        zt_json_obj child;
        ZT_TRY(zt_json_child(o, f->name, &child));
        if (!child.obj)
            break;
        ProtobufCMessage *sub = new_message(f->descriptor);
        if (!sub)
            return zt_error(ZT_ERR_NOMEM, "out of memory reading %s", o->source);
        *(ProtobufCMessage **)p = sub;
        return fill_from_json(sub, &child, false, server_text, ok);
    }
    default:
        return zt_json_key_error(ZT_ERR_INVALID, o, f->name, "has a type this client cannot send");
    }
    if (found && is_oneof(f))
        *(uint32_t *)((char *)msg + f->quantifier_offset) = f->id;
    return ZT_OK;
}

/* data.train given as a list, [{"path": P, "weight": W}, ...]: DataSpec.mixture. The engine's
 * parser judges the paths; this carries them, and refuses a weight the proto cannot carry. */
static zt_status mixture_from_json(Ztrain__V1__DataSpec *d, const zt_json_obj *o,
                                   const cJSON *list, bool *ok) {
    int n = cJSON_GetArraySize(list);
    d->mixture = calloc((size_t)n + 1, sizeof *d->mixture);
    if (!d->mixture)
        return zt_error(ZT_ERR_NOMEM, "out of memory reading %s", o->source);
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char path[64];
        snprintf(path, sizeof path, "data.train[%d]", i);
        if (!cJSON_IsObject(e))
            return zt_error(ZT_ERR_INVALID, "%s: key '%s' must be an object {\"path\", \"weight\"}",
                            o->source, path);
        Ztrain__V1__DataSource *src =
            (Ztrain__V1__DataSource *)new_message(&ztrain__v1__data_source__descriptor);
        if (!src)
            return zt_error(ZT_ERR_NOMEM, "out of memory reading %s", o->source);
        d->mixture[d->n_mixture++] = src;
        zt_json_obj so;
        zt_json_obj_init(&so, e, o->source, path);
        static const char *const keys[] = {"path", "weight", NULL};
        const char *p = NULL;
        ZT_TRY(zt_json_check_keys(&so, keys));
        ZT_TRY(zt_json_require(&so, "path"));
        ZT_TRY(zt_json_require(&so, "weight"));
        ZT_TRY(zt_json_get_string(&so, "path", &p, NULL));
        ZT_TRY(zt_json_get_double(&so, "weight", &src->weight, NULL));
        src->path = dup_str(p, ok);
        /* The proto cannot carry a weight of 0 (it reads as unset): say what is wrong now. */
        if (!(src->weight > 0))
            return zt_json_key_error(ZT_ERR_INVALID, &so, "weight", "must be > 0, got %g",
                                     src->weight);
    }
    return ZT_OK;
}

/* Every key of the object o into msg; "deepspeed" at the top is the caller's. */
static zt_status fill_from_json(ProtobufCMessage *msg, const zt_json_obj *o, bool top,
                                bool server_text, bool *ok) {
    for (const cJSON *c = o->obj->child; c; c = c->next) {
        if (top && is_text_key(c->string))
            continue;
        if (msg->descriptor == &ztrain__v1__data_spec__descriptor &&
            strcmp(c->string, "train") == 0 && cJSON_IsArray(c)) {
            ZT_TRY(mixture_from_json((Ztrain__V1__DataSpec *)msg, o, c, ok));
            continue;
        }
        /* The files a glob matched are the server's own note in its stored spec (spec_check.c),
         * not a field a client sends: the JobSpec shows the pattern. */
        if (server_text && msg->descriptor == &ztrain__v1__data_spec__descriptor &&
            (strcmp(c->string, "train_files") == 0 || strcmp(c->string, "val_files") == 0))
            continue;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, c->string);
        if (!f || (top && strcmp(top_key_of(f->name), f->name) != 0))
            return unknown_key(o, c->string, msg->descriptor, top);
        ZT_TRY(field_from_json(msg, f, o, server_text, ok));
    }
    return ZT_OK;
}

static char *join_path(const char *dir, const char *path) {
    if (path[0] == '/' || !dir[0])
        return strdup(path);
    size_t nd = strlen(dir), np = strlen(path);
    char *out = malloc(nd + np + 2);
    if (out)
        snprintf(out, nd + np + 2, "%s%s%s", dir, dir[nd - 1] == '/' ? "" : "/", path);
    return out;
}

/* "deepspeed": an object becomes its JSON text; a path is read relative to base_dir. */
static zt_status deepspeed_from_json(const zt_json_obj *top, const char *base_dir, char **out) {
    const cJSON *ds = zt_json_item(top, DEEPSPEED_KEY);
    if (!ds)
        return ZT_OK;
    if (cJSON_IsObject(ds)) {
        /* As written: 3.0 stays a float, which DeepSpeed's int checks refuse. */
        char *text = zt_json_print(ds, false);
        *out = text ? strdup(text) : NULL;
        cJSON_free(text);
        return *out ? ZT_OK : zt_error(ZT_ERR_NOMEM, "%s: out of memory", top->source);
    }
    if (!cJSON_IsString(ds) || !base_dir) {
        char got[96];
        zt_json_repr(ds, got, sizeof got);
        return zt_json_key_error(ZT_ERR_INVALID, top, DEEPSPEED_KEY, "must be %s, got %s",
                                 base_dir ? "an object or a path to a DeepSpeed config file"
                                          : "an object",
                                 got);
    }
    if (!ds->valuestring[0])
        return zt_json_key_error(ZT_ERR_INVALID, top, DEEPSPEED_KEY, "must not be an empty path");
    char *path = join_path(base_dir, ds->valuestring);
    if (!path)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", top->source);
    zt_status s = zt_json_read_config(path, out, NULL);
    free(path);
    if (s != ZT_OK)
        return zt_error_prefix(s, "%s: deepspeed: ", top->source);
    return ZT_OK;
}

static zt_status spec_from_tree(const cJSON *root, const char *source, const char *base_dir,
                                Ztrain__V1__JobSpec *spec, bool *ok) {
    if (!cJSON_IsObject(root)) {
        char got[64];
        zt_json_repr(root, got, sizeof got);
        return zt_error(ZT_ERR_INVALID, "%s: a job spec must be a JSON object, got %s", source, got);
    }
    ZT_TRY(zt_json_check_duplicates(root, source, "job spec", "", DEEPSPEED_KEY));
    ZT_TRY(zt_json_check_finite(root, source, "", DEEPSPEED_KEY));
    zt_json_obj top;
    zt_json_obj_init(&top, root, source, "");
    ZT_TRY(fill_from_json(&spec->base, &top, true, !base_dir, ok));
    char *ds = NULL;
    ZT_TRY(deepspeed_from_json(&top, base_dir, &ds));
    if (ds)
        spec->deepspeed_json = ds;
    for (size_t i = 0; i < N_TEXT_SECTIONS; i++) {
        const cJSON *sec = zt_json_item(&top, text_sections[i].key);
        if (!sec)
            continue;
        if (!cJSON_IsObject(sec)) {
            char got[96];
            zt_json_repr(sec, got, sizeof got);
            return zt_json_key_error(ZT_ERR_INVALID, &top, text_sections[i].key,
                                     "must be an object, got %s", got);
        }
        char *text = cJSON_PrintUnformatted(sec);
        char *copy = text ? strdup(text) : NULL;
        cJSON_free(text);
        if (!copy)
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
        if (i == 0)
            spec->events_json = copy;
        else
            spec->alerts_json = copy;
    }
    return ZT_OK;
}

zt_status zt_job_proto_spec_from_json(const char *json_text, const char *source,
                                      const char *base_dir, Ztrain__V1__JobSpec **out) {
    *out = NULL;
    cJSON *root;
    ZT_TRY(zt_json_parse(json_text, source, &root));
    Ztrain__V1__JobSpec *spec = (Ztrain__V1__JobSpec *)new_message(&ztrain__v1__job_spec__descriptor);
    if (!spec) {
        cJSON_Delete(root);
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
    }
    bool ok = true;
    zt_status s = spec_from_tree(root, source, base_dir, spec, &ok);
    cJSON_Delete(root);
    if (s == ZT_OK && !ok)
        s = zt_error(ZT_ERR_NOMEM, "%s: out of memory", source);
    if (s != ZT_OK) {
        free_message(spec);
        return s;
    }
    *out = spec;
    return ZT_OK;
}

/* ---- JobSpec -> job-spec JSON ------------------------------------------------------------ */

/* Integers as raw text, so 64-bit values (a seed) survive without going through a double. */
static cJSON *raw_int(long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return cJSON_CreateRaw(buf);
}

static cJSON *raw_uint(unsigned long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", v);
    return cJSON_CreateRaw(buf);
}

/* The JSON value of one field, or NULL when it is unset (zero, empty, or an unset oneof). */
static cJSON *field_to_json(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f);

/* A message's set fields; at the top of a JobSpec (top), without the JSON-text sections. */
static cJSON *message_to_json(const ProtobufCMessage *msg, bool top) {
    cJSON *obj = cJSON_CreateObject();
    if (!obj)
        return NULL;
    for (unsigned i = 0; i < msg->descriptor->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &msg->descriptor->fields[i];
        if ((top && strcmp(top_key_of(f->name), f->name) != 0) ||
            f->label == PROTOBUF_C_LABEL_REPEATED)
            continue;
        cJSON *v = field_to_json(msg, f);
        if (v)
            cJSON_AddItemToObject(obj, f->name, v);
    }
    /* DataSpec.mixture is the job file's "train" list. */
    if (msg->descriptor == &ztrain__v1__data_spec__descriptor) {
        const Ztrain__V1__DataSpec *d = (const Ztrain__V1__DataSpec *)msg;
        cJSON *list = d->n_mixture ? cJSON_CreateArray() : NULL;
        for (size_t i = 0; list && i < d->n_mixture; i++)
            cJSON_AddItemToArray(list, message_to_json(&d->mixture[i]->base, false));
        if (list) {
            cJSON_DeleteItemFromObjectCaseSensitive(obj, "train");
            cJSON_AddItemToObject(obj, "train", list);
        }
    }
    return obj;
}

static cJSON *field_to_json(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    const void *p = field_cptr(msg, f);
    bool present = false;
    if (is_oneof(f)) {
        if (*(const uint32_t *)((const char *)msg + f->quantifier_offset) != f->id)
            return NULL;
        present = true;
    }
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return s && *s ? cJSON_CreateString(s) : NULL;
    }
    case PROTOBUF_C_TYPE_INT32:
        return present || *(const int32_t *)p ? raw_int(*(const int32_t *)p) : NULL;
    case PROTOBUF_C_TYPE_INT64:
        return present || *(const int64_t *)p ? raw_int(*(const int64_t *)p) : NULL;
    case PROTOBUF_C_TYPE_UINT64:
        return present || *(const uint64_t *)p ? raw_uint(*(const uint64_t *)p) : NULL;
    case PROTOBUF_C_TYPE_BOOL:
        return present || *(const protobuf_c_boolean *)p
                   ? cJSON_CreateBool(*(const protobuf_c_boolean *)p)
                   : NULL;
    case PROTOBUF_C_TYPE_DOUBLE:
        return present || *(const double *)p ? cJSON_CreateNumber(*(const double *)p) : NULL;
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        return sub ? message_to_json(sub, false) : NULL;
    }
    default:
        return NULL;
    }
}

/* The spec as a cJSON tree with "deepspeed" parsed from deepspeed_json. */
static zt_status spec_to_tree(const Ztrain__V1__JobSpec *spec, cJSON **out) {
    *out = NULL;
    if (!spec) {
        *out = cJSON_CreateObject();
        return *out ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    cJSON *ds = NULL;
    if (spec->deepspeed_json && spec->deepspeed_json[0]) {
        ZT_TRY(zt_json_parse(spec->deepspeed_json, "spec.deepspeed_json", &ds));
        /* A string here would be taken for a path, and the server must never read files a
         * client names this way. */
        if (!cJSON_IsObject(ds)) {
            char got[64];
            zt_json_repr(ds, got, sizeof got);
            cJSON_Delete(ds);
            return zt_error(ZT_ERR_INVALID, "spec.deepspeed_json must hold a JSON object "
                                            "(a DeepSpeed config), got %s", got);
        }
        /* 1e400 parses as an infinity, which would print back as null: "absent". */
        zt_status s = zt_json_check_finite(ds, "spec", DEEPSPEED_KEY, NULL);
        if (s != ZT_OK) {
            cJSON_Delete(ds);
            return s;
        }
    }
    cJSON *obj = message_to_json(&spec->base, true);
    if (!obj) {
        cJSON_Delete(ds);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    if (ds)
        cJSON_AddItemToObject(obj, DEEPSPEED_KEY, ds);
    const char *texts[N_TEXT_SECTIONS] = {spec->events_json, spec->alerts_json};
    for (size_t i = 0; i < N_TEXT_SECTIONS; i++) {
        if (!texts[i] || !texts[i][0])
            continue;
        char source[64];
        snprintf(source, sizeof source, "spec.%s", text_sections[i].field);
        cJSON *sec;
        zt_status s = zt_json_parse(texts[i], source, &sec);
        if (s == ZT_OK && !cJSON_IsObject(sec)) {
            cJSON_Delete(sec);
            s = zt_error(ZT_ERR_INVALID, "%s must hold a JSON object", source);
        } else if (s == ZT_OK) {
            s = zt_json_check_finite(sec, "spec", text_sections[i].key, NULL);
            if (s != ZT_OK)
                cJSON_Delete(sec);
        }
        if (s != ZT_OK) {
            cJSON_Delete(obj);
            return s;
        }
        cJSON_AddItemToObject(obj, text_sections[i].key, sec);
    }
    *out = obj;
    return ZT_OK;
}

/* Prints a tree into malloc'd text and deletes it; numbers written as floats stay floats. */
static zt_status print_tree(cJSON *tree, bool pretty, char **out) {
    char *text = zt_json_print(tree, pretty);
    cJSON_Delete(tree);
    *out = text ? strdup(text) : NULL;
    cJSON_free(text);
    return *out ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory printing JSON");
}

zt_status zt_job_proto_spec_to_json(const Ztrain__V1__JobSpec *spec, char **json_text) {
    *json_text = NULL;
    cJSON *tree;
    ZT_TRY(spec_to_tree(spec, &tree));
    return print_tree(tree, false, json_text);
}

/* ---- jobs -------------------------------------------------------------------------------- */

/* The figures in RankStatus' fields, in zt_rank_figure_names' order; NaN when not reported. */
static void rank_figures_to_proto(const zt_rank_figures *f, Ztrain__V1__RankStatus *r) {
    double *dst[ZT_RANK_FIGURES] = {
        &r->step_time_ms, &r->data_ms, &r->fwd_ms, &r->bwd_ms, &r->step_ms, &r->comm_ms,
        &r->compute_ms, &r->cpu_util, &r->rss_bytes, &r->peak_rss_bytes, &r->gpu_util,
        &r->gpu_memory_used_bytes, &r->gpu_power_watts, &r->gpu_temperature_c,
    };
    for (int i = 0; i < ZT_RANK_FIGURES; i++)
        *dst[i] = f->reported ? f->v[i] : NAN;
}

static zt_status ranks_from_info(const zt_job_info *info, Ztrain__V1__Job *j) {
    if (info->world_size <= 0 || !info->ranks)
        return ZT_OK;
    j->ranks = calloc((size_t)info->world_size, sizeof *j->ranks);
    if (!j->ranks)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < info->world_size; i++) {
        Ztrain__V1__RankStatus *r =
            (Ztrain__V1__RankStatus *)new_message(&ztrain__v1__rank_status__descriptor);
        if (!r)
            return zt_error(ZT_ERR_NOMEM, "out of memory");
        j->ranks[j->n_ranks++] = r;
        r->rank = info->ranks[i].rank;
        r->pid = info->ranks[i].pid;
        r->running = info->ranks[i].running;
        r->exit_code = info->ranks[i].exit_code;
        r->signal = info->ranks[i].signal;
        r->exit_unknown = info->ranks[i].exit_unknown;
        rank_figures_to_proto(&info->ranks[i].figures, r);
    }
    return ZT_OK;
}

static zt_status attempts_from_info(const zt_job_info *info, Ztrain__V1__Job *j, bool *ok) {
    if (info->n_attempts <= 0)
        return ZT_OK;
    j->attempts = calloc((size_t)info->n_attempts, sizeof *j->attempts);
    if (!j->attempts)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < info->n_attempts; i++) {
        const zt_job_attempt *a = &info->attempts[i];
        Ztrain__V1__JobAttempt *m =
            (Ztrain__V1__JobAttempt *)new_message(&ztrain__v1__job_attempt__descriptor);
        if (!m)
            return zt_error(ZT_ERR_NOMEM, "out of memory");
        j->attempts[j->n_attempts++] = m;
        m->attempt = a->attempt;
        m->start_time = zt_job_proto_time(a->started_ms, ok);
        m->end_time = zt_job_proto_time(a->ended_ms, ok);
        m->step = a->step;
        m->rank = a->rank;
        m->exit_code = a->exit_code;
        m->signal = a->signal;
        m->reason = dup_str(a->reason, ok);
        m->failed = a->failed;
        m->resumed_from_step = a->resumed_from_step;
    }
    return ZT_OK;
}

static zt_status job_fill(const zt_job_info *info, int64_t now_ms, Ztrain__V1__Job *j,
                          bool *ok) {
    j->id = dup_str(info->id, ok);
    j->name = dup_str(info->name, ok);
    j->state = (Ztrain__V1__JobState)info->state;
    j->reason = dup_str(info->reason, ok);
    j->create_time = zt_job_proto_time(info->created_ms, ok);
    j->start_time = zt_job_proto_time(info->started_ms, ok);
    j->end_time = zt_job_proto_time(info->finished_ms, ok);
    if (info->started_ms > 0) {
        int64_t end = info->finished_ms > 0 ? info->finished_ms : now_ms;
        j->run_duration = duration_ms(end > info->started_ms ? end - info->started_ms : 0, ok);
    }
    j->step = info->step;
    j->max_steps = info->max_steps;
    /* NaN travels as NaN: 0 would read as a real loss, and hide one that went non-finite. */
    j->loss = info->loss;
    j->tokens_per_second = info->tokens_per_second;
    j->run_dir = dup_str(info->run_dir, ok);
    j->checkpoint_dir = dup_str(info->checkpoint_dir, ok);
    j->idempotency_key = dup_str(info->idempotency_key, ok);
    j->comm = dup_str(info->comm, ok);
    j->submitter = dup_str(info->submitter.identity, ok);
    j->submitter_scope = dup_str(info->submitter.scope, ok);
    Ztrain__V1__JobGrid *g = (Ztrain__V1__JobGrid *)new_message(&ztrain__v1__job_grid__descriptor);
    if (!g)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    g->dp = info->grid.dp;
    g->pp = info->grid.stages;
    g->tp = info->grid.tp;
    j->grid = g;
    ZT_TRY(ranks_from_info(info, j));
    ZT_TRY(attempts_from_info(info, j, ok));
    if (info->spec_json && info->spec_json[0]) {
        char source[64];
        snprintf(source, sizeof source, "the stored spec of %s", info->id);
        /* The stored spec passed the engine's parser, whose keys are the proto's, so one that
         * does not map is a server bug: the call fails naming the job rather than sending a
         * Job without its spec. */
        ZT_TRY(zt_job_proto_spec_from_json(info->spec_json, source, NULL, &j->spec));
    }
    return ZT_OK;
}

zt_status zt_job_proto_job_from_info(const zt_job_info *info, int64_t now_ms,
                                     Ztrain__V1__Job **out) {
    *out = NULL;
    Ztrain__V1__Job *j = (Ztrain__V1__Job *)new_message(&ztrain__v1__job__descriptor);
    if (!j)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    bool ok = true;
    zt_status s = job_fill(info, now_ms, j, &ok);
    if (s == ZT_OK && !ok)
        s = zt_error(ZT_ERR_NOMEM, "out of memory");
    if (s != ZT_OK) {
        free_message(j);
        return s;
    }
    *out = j;
    return ZT_OK;
}

/* ---- records and log lines --------------------------------------------------------------- */

/* A record's values, a value that was not finite (null in the record) as NaN: the step where
 * the loss went NaN is one to show, not to leave out. */
static zt_status record_fill(const cJSON *root, Ztrain__V1__MetricRecord *m, bool *ok) {
    size_t n = 0;
    double value;
    for (const cJSON *c = root->child; c; c = c->next)
        n += zt_metrics_value_of(c, &value);
    if (n == 0)
        return ZT_OK;
    m->values = calloc(n, sizeof *m->values);
    if (!m->values)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!zt_metrics_value_of(c, &value))
            continue;
        Ztrain__V1__MetricValue *v =
            (Ztrain__V1__MetricValue *)new_message(&ztrain__v1__metric_value__descriptor);
        if (!v)
            return zt_error(ZT_ERR_NOMEM, "out of memory");
        m->values[m->n_values++] = v;
        v->key = dup_str(c->string, ok);
        v->value = value;
    }
    return ZT_OK;
}

zt_status zt_job_proto_record_from_metric(const zt_metric_record *r, Ztrain__V1__MetricRecord **out) {
    *out = NULL;
    cJSON *root = cJSON_Parse(r->json ? r->json : "");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zt_error(ZT_ERR_FORMAT, "metric record at step %lld is not a JSON object",
                        (long long)r->step);
    }
    Ztrain__V1__MetricRecord *m =
        (Ztrain__V1__MetricRecord *)new_message(&ztrain__v1__metric_record__descriptor);
    zt_status s = m ? ZT_OK : zt_error(ZT_ERR_NOMEM, "out of memory");
    bool ok = true;
    if (m) {
        m->step = r->step;
        m->seq = r->seq;
        m->time = zt_job_proto_time(r->time_ms, &ok);
        s = record_fill(root, m, &ok);
    }
    cJSON_Delete(root);
    if (s == ZT_OK && !ok)
        s = zt_error(ZT_ERR_NOMEM, "out of memory");
    if (s != ZT_OK) {
        free_message(m);
        return s;
    }
    *out = m;
    return ZT_OK;
}

zt_status zt_job_proto_log_from_line(const zt_log_line *l, Ztrain__V1__LogLine **out) {
    *out = NULL;
    Ztrain__V1__LogLine *m = (Ztrain__V1__LogLine *)new_message(&ztrain__v1__log_line__descriptor);
    if (!m)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    bool ok = true;
    m->seq = l->seq;
    m->time = zt_job_proto_time(l->time_ms, &ok);
    m->rank = l->rank;
    m->stream = dup_str(l->stream, &ok);
    m->text = dup_str(l->text, &ok);
    if (!ok) {
        free_message(m);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    *out = m;
    return ZT_OK;
}

zt_status zt_job_proto_anomaly_from(const zt_anomaly *a, Ztrain__V1__AnomalyEvent **out) {
    *out = NULL;
    Ztrain__V1__AnomalyEvent *m =
        (Ztrain__V1__AnomalyEvent *)new_message(&ztrain__v1__anomaly_event__descriptor);
    if (!m)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    bool ok = true;
    m->seq = a->seq;
    m->step = a->step;
    m->time = zt_job_proto_time(a->time_ms, &ok);
    m->kind = dup_str(a->kind, &ok);
    m->policy = dup_str(a->policy, &ok);
    m->value = a->value;
    m->zscore = a->zscore;
    m->rank = a->rank;
    m->message = dup_str(a->message, &ok);
    if (!ok) {
        free_message(m);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    *out = m;
    return ZT_OK;
}

zt_status zt_job_proto_delivery_from(const zt_delivery *d, Ztrain__V1__WebhookDelivery **out) {
    *out = NULL;
    Ztrain__V1__WebhookDelivery *m =
        (Ztrain__V1__WebhookDelivery *)new_message(&ztrain__v1__webhook_delivery__descriptor);
    if (!m)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    bool ok = true;
    m->delivery_id = dup_str(d->delivery_id, &ok);
    m->url = dup_str(d->url, &ok);
    m->type = dup_str(d->type, &ok);
    m->attempt = d->attempt;
    m->time = zt_job_proto_time(d->time_ms, &ok);
    m->http_status = d->http_status;
    m->error = dup_str(d->error, &ok);
    m->outcome = dup_str(d->outcome, &ok);
    if (!ok) {
        free_message(m);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    *out = m;
    return ZT_OK;
}

/* Whether the job's list shows the entry: one it wrote, or one that records no writer (saved
 * by `ztrain run`, or before checkpoints recorded it). */
static bool own_checkpoint(const zt_ckpt_entry *e, const char *job_id) {
    return !e->job_id || !job_id || strcmp(e->job_id, job_id) == 0;
}

zt_status zt_job_proto_checkpoints(const char *job_id, const char *checkpoint_dir,
                                   Ztrain__V1__ListCheckpointsResponse **out) {
    *out = NULL;
    Ztrain__V1__ListCheckpointsResponse *m = (Ztrain__V1__ListCheckpointsResponse *)new_message(
        &ztrain__v1__list_checkpoints_response__descriptor);
    if (!m)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    zt_ckpt_list ck;
    zt_ckpt_list_dir(checkpoint_dir, &ck);
    bool ok = true;
    /* `latest` is left out when it names another job's checkpoint. */
    bool show_latest = ck.latest != NULL;
    for (int i = 0; show_latest && i < ck.n; i++)
        if (strcmp(ck.items[i].tag, ck.latest) == 0)
            show_latest = own_checkpoint(&ck.items[i], job_id);
    m->latest = dup_str(show_latest ? ck.latest : "", &ok);
    m->checkpoints = calloc((size_t)ck.n + 1, sizeof *m->checkpoints);
    ok = ok && m->checkpoints;
    for (int i = 0; ok && i < ck.n; i++) {
        if (!own_checkpoint(&ck.items[i], job_id))
            continue;
        Ztrain__V1__Checkpoint *c =
            (Ztrain__V1__Checkpoint *)new_message(&ztrain__v1__checkpoint__descriptor);
        if (!c) {
            ok = false;
            break;
        }
        m->checkpoints[m->n_checkpoints++] = c;
        c->tag = dup_str(ck.items[i].tag, &ok);
        c->step = ck.items[i].step;
        c->complete = ck.items[i].complete;
    }
    zt_ckpt_list_free(&ck);
    if (!ok) {
        free_message(m);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    *out = m;
    return ZT_OK;
}

static const char *const state_names[] = {"UNSPECIFIED", "QUEUED",    "STARTING", "RUNNING",
                                          "STOPPING",    "SUCCEEDED", "FAILED",   "CANCELLED"};

const char *zt_job_proto_state_name(Ztrain__V1__JobState s) {
    if ((int)s < 0 || (size_t)s >= sizeof state_names / sizeof state_names[0])
        return "UNKNOWN";
    return state_names[s];
}

Ztrain__V1__JobState zt_job_proto_state_parse(const char *s) {
    if (strncasecmp(s, "JOB_STATE_", 10) == 0)
        s += 10;
    for (size_t i = 1; i < sizeof state_names / sizeof state_names[0]; i++)
        if (strcasecmp(s, state_names[i]) == 0)
            return (Ztrain__V1__JobState)i;
    return ZTRAIN__V1__JOB_STATE__JOB_STATE_UNSPECIFIED;
}
