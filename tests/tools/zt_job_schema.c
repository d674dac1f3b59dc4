/* zt_job_schema: prints docs/job.schema.json, the JSON Schema of ztrain's job files, built from
 * the tables the job-spec parser itself checks against: the keys of every section
 * (zt_job_spec_keys) and the model families' field tables (kind, bound, required, default,
 * meaning) from the registry. Editors use it to complete and check job files;
 * tests/cli/test_job_schema.py regenerates it, compares it with the committed file and judges
 * sample specs with it and with the parser.
 *
 *   build/zt_job_schema > docs/job.schema.json
 *
 * Every key's type is stated: the model's from its family's field table, the others' from the
 * parser's type table (zt_job_spec_key_type), null allowed where the parser reads null as the
 * key's absence. What the tables do not describe is left open rather than guessed: the insides
 * of the DeepSpeed config, "events" and "alerts", which have parsers of their own. A key without
 * a type makes this program fail, so the test that runs it fails too. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ztrain/job_spec.h"
#include "ztrain/model.h"

static bool missing_type;

/* The schema of a key's value as the parser's type table states it, null included (the parser
 * reads null as the key's absence). Objects and lists get their insides from the caller. */
static cJSON *key_schema(const char *section, const char *key) {
    cJSON *s = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(s, "type");
    const char *names[2] = {NULL, NULL};
    switch (zt_job_spec_key_type(section, key)) {
    case ZT_JOB_KEY_OBJECT: names[0] = "object"; break;
    case ZT_JOB_KEY_INTEGER: names[0] = "integer"; break;
    case ZT_JOB_KEY_NUMBER: names[0] = "number"; break;
    case ZT_JOB_KEY_BOOLEAN: names[0] = "boolean"; break;
    case ZT_JOB_KEY_STRING: names[0] = "string"; break;
    case ZT_JOB_KEY_STRING_OR_LIST: names[0] = "string", names[1] = "array"; break;
    case ZT_JOB_KEY_STRING_LIST:
        names[0] = "array";
        cJSON_AddItemToObject(s, "items", cJSON_CreateRaw("{\"type\": \"string\"}"));
        break;
    case ZT_JOB_KEY_OBJECT_OR_STRING: names[0] = "object", names[1] = "string"; break;
    case ZT_JOB_KEY_UNKNOWN:
        fprintf(stderr, "zt_job_schema: %s%s%s has no type in the parser's table\n", section,
                *section ? "." : "", key);
        missing_type = true;
        break;
    }
    for (int i = 0; i < 2 && names[i]; i++)
        cJSON_AddItemToArray(t, cJSON_CreateString(names[i]));
    cJSON_AddItemToArray(t, cJSON_CreateString("null"));
    const char *meaning = zt_job_spec_key_meaning(section, key);
    if (meaning)
        cJSON_AddStringToObject(s, "description", meaning);
    return s;
}

/* An object schema with the section's keys, typed, and nothing else allowed. */
static cJSON *section(const char *name) {
    cJSON *o = cJSON_CreateObject(), *props = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "object");
    for (const char *const *k = zt_job_spec_keys(name); *k; k++)
        cJSON_AddItemToObject(props, *k, key_schema(name, *k));
    cJSON_AddItemToObject(o, "properties", props);
    cJSON_AddFalseToObject(o, "additionalProperties");
    return o;
}

static cJSON *field_schema(const zt_model_field *f) {
    cJSON *s = cJSON_CreateObject();
    switch (f->kind) {
    case ZT_FIELD_INT:
        cJSON_AddStringToObject(s, "type", "integer");
        if (f->bound != ZT_BOUND_NONE)
            cJSON_AddNumberToObject(s, "minimum", f->bound == ZT_BOUND_POSITIVE ? 1 : 0);
        break;
    case ZT_FIELD_FLOAT:
        cJSON_AddStringToObject(s, "type", "number");
        if (f->bound == ZT_BOUND_POSITIVE)
            cJSON_AddNumberToObject(s, "exclusiveMinimum", 0);
        else if (f->bound == ZT_BOUND_NONNEGATIVE)
            cJSON_AddNumberToObject(s, "minimum", 0);
        break;
    case ZT_FIELD_BOOL:
        cJSON_AddStringToObject(s, "type", "boolean");
        break;
    case ZT_FIELD_STRING:
        cJSON_AddStringToObject(s, "type", "string");
        cJSON_AddNumberToObject(s, "maxLength", (double)f->size - 1);
        break;
    case ZT_FIELD_PATH: {
        /* A path, or null for none (the design's examples write "init_from": null). */
        cJSON *t = cJSON_AddArrayToObject(s, "type");
        cJSON_AddItemToArray(t, cJSON_CreateString("string"));
        cJSON_AddItemToArray(t, cJSON_CreateString("null"));
        break;
    }
    }
    if (f->meaning)
        cJSON_AddStringToObject(s, "description", f->meaning);
    if (!f->required && f->kind == ZT_FIELD_BOOL)
        cJSON_AddBoolToObject(s, "default", f->def != 0);
    else if (!f->required && (f->kind == ZT_FIELD_INT || f->kind == ZT_FIELD_FLOAT))
        cJSON_AddNumberToObject(s, "default", f->def);
    else if (!f->required && f->kind == ZT_FIELD_STRING && f->def_str)
        cJSON_AddStringToObject(s, "default", f->def_str);
    return s;
}

/* "model": its "type", and per family (by "type", absent meaning the default family) that
 * family's fields as its table has them, no other key, and its required ones. */
static cJSON *model_schema(void) {
    cJSON *m = cJSON_CreateObject(), *props = cJSON_CreateObject(), *all_of = cJSON_CreateArray();
    cJSON *types = cJSON_CreateArray();
    cJSON_AddStringToObject(m, "type", "object");
    for (int i = 0; zt_model_family_at(i); i++)
        cJSON_AddItemToArray(types, cJSON_CreateString(zt_model_family_at(i)->name));
    cJSON *type = cJSON_CreateObject();
    cJSON_AddStringToObject(type, "type", "string");
    cJSON_AddItemToObject(type, "enum", types);
    if (zt_model_type_field.meaning)
        cJSON_AddStringToObject(type, "description", zt_model_type_field.meaning);
    if (zt_model_type_field.def_str)
        cJSON_AddStringToObject(type, "default", zt_model_type_field.def_str);
    cJSON_AddItemToObject(props, zt_model_type_field.key, type);
    for (int i = 0; zt_model_family_at(i); i++) {
        const zt_model_family *fam = zt_model_family_at(i);
        cJSON *own = cJSON_CreateObject(), *required = cJSON_CreateArray();
        cJSON_AddItemToObject(own, zt_model_type_field.key, cJSON_CreateObject());
        for (const zt_model_field *f = fam->fields; f->key; f++) {
            cJSON_AddItemToObject(own, f->key, field_schema(f));
            if (f->required)
                cJSON_AddItemToArray(required, cJSON_CreateString(f->key));
        }
        /* if type is this family's name (or, for the default family, absent) then only its
         * own keys, and its required ones. */
        cJSON *rule = cJSON_CreateObject(), *cond = cJSON_CreateObject();
        cJSON *cond_props = cJSON_CreateObject(), *is = cJSON_CreateObject();
        cJSON_AddStringToObject(is, "const", fam->name);
        cJSON_AddItemToObject(cond_props, zt_model_type_field.key, is);
        cJSON_AddItemToObject(cond, "properties", cond_props);
        bool is_default = zt_model_type_field.def_str &&
                          strcmp(zt_model_type_field.def_str, fam->name) == 0;
        if (!is_default) {
            cJSON *req = cJSON_AddArrayToObject(cond, "required");
            cJSON_AddItemToArray(req, cJSON_CreateString(zt_model_type_field.key));
        }
        cJSON *then = cJSON_CreateObject();
        cJSON_AddItemToObject(then, "properties", own);
        cJSON_AddFalseToObject(then, "additionalProperties");
        cJSON_AddItemToObject(then, "required", required);
        cJSON_AddItemToObject(rule, "if", cond);
        cJSON_AddItemToObject(rule, "then", then);
        cJSON_AddItemToArray(all_of, rule);
    }
    cJSON_AddItemToObject(m, "properties", props);
    cJSON_AddItemToObject(m, "allOf", all_of);
    return m;
}

int main(void) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "$schema", "https://json-schema.org/draft/2020-12/schema");
    cJSON_AddStringToObject(s, "$id", "urn:ztrain:job-spec");
    cJSON_AddStringToObject(s, "title", "ztrain job file");
    cJSON_AddStringToObject(s, "description",
                            "A job file of ztrain (docs/api.md, DESIGN.md section 3). Generated by "
                            "tests/tools/zt_job_schema.c from the job-spec parser's own key "
                            "tables and model field tables: do not edit by hand.");
    cJSON_AddStringToObject(s, "type", "object");
    cJSON *props = cJSON_CreateObject();
    for (const char *const *k = zt_job_spec_keys(""); *k; k++) {
        cJSON *p;
        if (strcmp(*k, "model") == 0) {
            p = model_schema();
        } else if (zt_job_spec_keys(*k)) {
            p = section(*k);
        } else {
            /* "deepspeed" (inline or a path), "events", "alerts": typed, insides open. */
            p = key_schema("", *k);
        }
        if (strcmp(*k, "data") == 0) {
            /* data.train: one path, or a mixture of {path, weight} entries. */
            cJSON *train = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(p, "properties"), "train");
            cJSON_AddItemToObject(train, "items", section("data.train[]"));
        }
        cJSON_AddItemToObject(props, *k, p);
    }
    cJSON_AddItemToObject(s, "properties", props);
    cJSON_AddFalseToObject(s, "additionalProperties");
    if (missing_type)
        return 1;
    char *text = cJSON_Print(s);
    if (!text) {
        fprintf(stderr, "zt_job_schema: out of memory\n");
        return 1;
    }
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(s);
    return 0;
}
