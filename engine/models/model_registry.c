/* The list of model families, and what works on a model spec through its family's field table:
 * validation, sizing, a description for people, and comparison (ztrain/model.h). */
#include <stdio.h>
#include <string.h>

#include "ztrain/model_fields.h"
#include "ztrain/model.h"

/* The families, each defined in engine/models/<family>.c. A new family is one declaration and
 * one entry here; nothing else in the engine or the service names a family. */
extern const zt_model_family zt_gpt2_family;
extern const zt_model_family zt_llama_family;
extern const zt_model_family zt_mistral_family;
extern const zt_model_family zt_qwen2_family;

static const zt_model_family *const families[] = {
    &zt_gpt2_family,
    &zt_llama_family,
    &zt_mistral_family,
    &zt_qwen2_family,
};

const zt_model_field zt_model_type_field = {
    ZT_MODEL_STRING_FIELD(type),
    .def_str = "gpt2",
    .meaning = "the model family, one of the registered names",
};

const zt_model_family *zt_model_family_at(int i) {
    if (i < 0 || (size_t)i >= sizeof families / sizeof families[0])
        return NULL;
    return families[i];
}

const zt_model_family *zt_model_family_find(const char *name) {
    for (int i = 0; zt_model_family_at(i); i++)
        if (strcmp(families[i]->name, name) == 0)
            return families[i];
    return NULL;
}

void zt_model_family_names(char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; zt_model_family_at(i) && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", families[i]->name);
}

const zt_model_field *zt_model_family_field(const zt_model_family *fam, const char *key) {
    for (const zt_model_field *f = fam->fields; f->key; f++)
        if (strcmp(f->key, key) == 0)
            return f;
    return NULL;
}

zt_status zt_model_spec_validate(const zt_model_spec *m, const char *source) {
    const zt_model_family *fam = zt_model_family_find(m->type);
    if (!fam) {
        char known[256];
        zt_model_family_names(known, sizeof known);
        return zt_error(ZT_ERR_INVALID, "%s: model.type \"%s\" is not supported (known types: %s)",
                        source, m->type, known);
    }
    for (const zt_model_field *f = fam->fields; f->key; f++)
        ZT_TRY(zt_model_field_check(f, m, source));
    return fam->validate ? fam->validate(m, source) : ZT_OK;
}

zt_status zt_model_estimate_spec(const zt_model_spec *spec, const zt_model_estimate_args *args,
                                 const char *source, zt_model_estimate *out) {
    ZT_TRY(zt_model_spec_validate(spec, source));
    const zt_model_family *fam = zt_model_family_find(spec->type);
    ZT_ASSERT(fam->estimate && args->micro_batch >= 1 && args->act_size >= 1);
    memset(out, 0, sizeof *out);
    return fam->estimate(spec, args, source, out);
}

void zt_model_spec_describe(const zt_model_spec *spec, char *buf, size_t size) {
    const zt_model_family *fam = zt_model_family_find(spec->type);
    if (!fam) {
        snprintf(buf, size, "%s", spec->type);
        return;
    }
    zt_model_spec built = *spec;
    if (fam->effective)
        fam->effective(&built);
    size_t used = (size_t)snprintf(buf, size, "%s (", fam->title);
    const char *sep = "";
    for (const zt_model_field *f = fam->fields; f->key && used < size; f++) {
        if (f->kind == ZT_FIELD_PATH)
            continue;
        char value[64];
        zt_model_field_format_value(f, &built, value, sizeof value);
        used += (size_t)snprintf(buf + used, size - used, "%s%s %s", sep, f->key, value);
        sep = ", ";
    }
    if (used < size)
        snprintf(buf + used, size - used, ")");
}

const zt_model_field *zt_model_spec_difference(const zt_model_spec *a, const zt_model_spec *b) {
    if (!zt_model_field_equal(&zt_model_type_field, a, b))
        return &zt_model_type_field;
    const zt_model_family *fam = zt_model_family_find(a->type);
    if (!fam)
        return NULL;
    for (const zt_model_field *f = fam->fields; f->key; f++)
        if (f->kind != ZT_FIELD_PATH && !zt_model_field_equal(f, a, b))
            return f;
    return NULL;
}

void zt_model_field_format(const zt_model_field *f, const zt_model_spec *spec, char *buf,
                           size_t size) {
    zt_model_field_format_value(f, spec, buf, size);
}
