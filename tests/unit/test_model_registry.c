/* The model family registry: the registered families are findable and well formed, GPT-2's field
 * table is the job spec's documented model section, every field of every family exists in
 * proto/ztrain.proto's ModelSpec with a matching type (and every ModelSpec field belongs to some
 * family), and a spec's description and comparison go by its family's fields. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ztrain.pb-c.h"
#include "ztrain/model.h"

static void test_registry(void) {
    const zt_model_family *gpt2 = zt_model_family_find("gpt2");
    CHECK(gpt2 != NULL, "gpt2 is registered");
    CHECK(zt_model_family_find("mamba") == NULL);
    CHECK(zt_model_family_find("") == NULL);
    CHECK(zt_model_family_at(-1) == NULL);
    char names[256];
    zt_model_family_names(names, sizeof names);
    CHECK(strstr(names, "gpt2") != NULL, "names: %s", names);
    int n = 0;
    for (const zt_model_family *f; (f = zt_model_family_at(n)); n++) {
        CHECK(zt_model_family_find(f->name) == f, "%s finds itself", f->name);
        CHECK(strstr(names, f->name) != NULL, "%s in the names \"%s\"", f->name, names);
        CHECK(f->title && f->title[0] && f->fields && f->create, "%s: title, fields, create",
              f->name);
        CHECK(f->estimate, "%s: an estimate, which admission needs", f->name);
        CHECK(strlen(f->name) < sizeof ((zt_model_spec *)0)->type, "%s fits spec.type", f->name);
        CHECK((f->hf.tied == NULL) == (f->hf.tied_to == NULL), "%s: tied and tied_to together",
              f->name);
    }
    CHECK(n >= 1 && zt_model_family_at(n) == NULL);
    /* The names in registration order, ", " between them. */
    char want[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", i ? ", " : "",
                 zt_model_family_at(i)->name);
    CHECK_STR(names, want);
    CHECK(zt_model_family_find(zt_model_type_field.def_str) != NULL, "the default type %s is "
          "registered", zt_model_type_field.def_str);
}

/* Every entry of every table: a key unique in its family and not "type", a member inside the
 * struct of the size its kind needs, bounds only on numbers, defaults only on optional fields. */
static void test_tables_well_formed(void) {
    for (int i = 0; zt_model_family_at(i); i++) {
        const zt_model_family *fam = zt_model_family_at(i);
        int n = 0;
        for (const zt_model_field *f = fam->fields; f->key; f++, n++) {
            CHECK(strcmp(f->key, "type") != 0, "%s: 'type' is the registry's", fam->name);
            CHECK(zt_model_family_field(fam, f->key) == f, "%s.%s is unique", fam->name, f->key);
            CHECK(f->offset + f->size <= sizeof(zt_model_spec), "%s.%s inside the struct",
                  fam->name, f->key);
            size_t want = f->kind == ZT_FIELD_INT     ? sizeof(int)
                          : f->kind == ZT_FIELD_FLOAT ? sizeof(double)
                          : f->kind == ZT_FIELD_BOOL  ? sizeof(bool)
                          : f->kind == ZT_FIELD_PATH  ? sizeof(char *)
                                                      : f->size;
            CHECK(f->size == want && f->size > (f->kind == ZT_FIELD_STRING ? 1u : 0u),
                  "%s.%s: size %zu for its kind", fam->name, f->key, f->size);
            CHECK(f->bound == ZT_BOUND_NONE || f->kind == ZT_FIELD_INT || f->kind == ZT_FIELD_FLOAT,
                  "%s.%s: a bound on a number", fam->name, f->key);
            CHECK(!f->required || (f->def == 0.0 && !f->def_str), "%s.%s: required, no default",
                  fam->name, f->key);
            CHECK(f->meaning && f->meaning[0], "%s.%s has a meaning", fam->name, f->key);
        }
        CHECK(n > 0 && n <= ZT_MODEL_MAX_FIELDS, "%s: %d fields", fam->name, n);
    }
    CHECK_STR(zt_model_type_field.key, "type");
    CHECK(zt_model_type_field.kind == ZT_FIELD_STRING);
    CHECK_STR(zt_model_type_field.def_str, "gpt2");
}

/* GPT-2's model section as job files have always written it, in order. */
static void test_gpt2_fields(void) {
    const zt_model_family *fam = zt_model_family_find("gpt2");
    if (!fam)
        return;
    static const struct {
        const char *key;
        zt_field_kind kind;
        size_t offset;
        bool required;
    } want[] = {
        {"n_layer", ZT_FIELD_INT, offsetof(zt_model_spec, n_layer), true},
        {"n_head", ZT_FIELD_INT, offsetof(zt_model_spec, n_head), true},
        {"n_embd", ZT_FIELD_INT, offsetof(zt_model_spec, n_embd), true},
        {"vocab_size", ZT_FIELD_INT, offsetof(zt_model_spec, vocab_size), true},
        {"block_size", ZT_FIELD_INT, offsetof(zt_model_spec, block_size), true},
        {"init_from", ZT_FIELD_PATH, offsetof(zt_model_spec, init_from), false},
    };
    size_t n = 0;
    for (const zt_model_field *f = fam->fields; f->key; f++, n++) {
        if (n >= sizeof want / sizeof want[0])
            break;
        CHECK_STR(f->key, want[n].key);
        CHECK(f->kind == want[n].kind && f->offset == want[n].offset &&
                  f->required == want[n].required,
              "gpt2.%s: kind %d offset %zu required %d", f->key, f->kind, f->offset, f->required);
        CHECK(f->bound == (f->kind == ZT_FIELD_INT ? ZT_BOUND_POSITIVE : ZT_BOUND_NONE),
              "gpt2.%s: bound %d", f->key, f->bound);
    }
    CHECK(n == sizeof want / sizeof want[0], "gpt2 has %zu fields", n);
    CHECK_STR(fam->hf.strip_prefix, "transformer.");
    CHECK_STR(fam->hf.tied, "lm_head.weight");
    CHECK_STR(fam->hf.tied_to, "wte.weight");
    CHECK_STR(fam->hf.croppable, "wpe.weight");
}

/* The Llama family's tables, as the agreed names (llama_fields.md) give them: the same keys,
 * kinds and defaults in llama, mistral and qwen2, which differ only in qkv_bias's default, and the
 * Hugging Face map (full names, an lm_head tied to the embedding). */
static void test_llama_fields(void) {
    static const struct {
        const char *key;
        zt_field_kind kind;
        size_t offset;
        bool required;
        double def;
    } want[] = {
        {"n_layer", ZT_FIELD_INT, offsetof(zt_model_spec, n_layer), true, 0},
        {"n_head", ZT_FIELD_INT, offsetof(zt_model_spec, n_head), true, 0},
        {"n_embd", ZT_FIELD_INT, offsetof(zt_model_spec, n_embd), true, 0},
        {"vocab_size", ZT_FIELD_INT, offsetof(zt_model_spec, vocab_size), true, 0},
        {"block_size", ZT_FIELD_INT, offsetof(zt_model_spec, block_size), true, 0},
        {"init_from", ZT_FIELD_PATH, offsetof(zt_model_spec, init_from), false, 0},
        {"n_kv_head", ZT_FIELD_INT, offsetof(zt_model_spec, n_kv_head), false, 0},
        {"head_dim", ZT_FIELD_INT, offsetof(zt_model_spec, head_dim), false, 0},
        {"intermediate_size", ZT_FIELD_INT, offsetof(zt_model_spec, intermediate_size), true, 0},
        {"rms_norm_eps", ZT_FIELD_FLOAT, offsetof(zt_model_spec, rms_norm_eps), false, 1e-6},
        {"rope_theta", ZT_FIELD_FLOAT, offsetof(zt_model_spec, rope_theta), false, 10000},
        {"rope_scaling", ZT_FIELD_STRING, offsetof(zt_model_spec, rope_scaling), false, 0},
        {"rope_factor", ZT_FIELD_FLOAT, offsetof(zt_model_spec, rope_factor), false, 1},
        {"rope_low_freq_factor", ZT_FIELD_FLOAT, offsetof(zt_model_spec, rope_low_freq_factor),
         false, 1},
        {"rope_high_freq_factor", ZT_FIELD_FLOAT, offsetof(zt_model_spec, rope_high_freq_factor),
         false, 4},
        {"rope_original_max_position", ZT_FIELD_INT,
         offsetof(zt_model_spec, rope_original_max_position), false, 8192},
        {"max_position_embeddings", ZT_FIELD_INT,
         offsetof(zt_model_spec, max_position_embeddings), false, 0},
        {"tie_word_embeddings", ZT_FIELD_BOOL, offsetof(zt_model_spec, tie_word_embeddings), false,
         0},
        {"qkv_bias", ZT_FIELD_BOOL, offsetof(zt_model_spec, qkv_bias), false, -1},
        {"o_bias", ZT_FIELD_BOOL, offsetof(zt_model_spec, o_bias), false, 0},
        {"sliding_window", ZT_FIELD_INT, offsetof(zt_model_spec, sliding_window), false, 0},
    };
    const char *names[] = {"llama", "mistral", "qwen2"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const zt_model_family *fam = zt_model_family_find(names[k]);
        if (!check_at(__FILE__, __LINE__, fam != NULL, "%s is registered", names[k]))
            continue;
        size_t n = 0;
        for (const zt_model_field *f = fam->fields; f->key; f++, n++) {
            if (n >= sizeof want / sizeof want[0])
                break;
            CHECK_STR(f->key, want[n].key);
            double def = want[n].def >= 0 ? want[n].def : strcmp(names[k], "qwen2") == 0;
            CHECK(f->kind == want[n].kind && f->offset == want[n].offset &&
                      f->required == want[n].required && f->def == def,
                  "%s.%s: kind %d offset %zu required %d default %g", names[k], f->key, f->kind,
                  f->offset, f->required, f->def);
        }
        CHECK(n == sizeof want / sizeof want[0], "%s has %zu fields", names[k], n);
        CHECK(fam->hf.strip_prefix == NULL, "%s: no prefix stripped", names[k]);
        CHECK_STR(fam->hf.tied, "lm_head.weight");
        CHECK_STR(fam->hf.tied_to, "model.embed_tokens.weight");
        CHECK(fam->hf.croppable == NULL, "%s: nothing croppable", names[k]);
        CHECK(fam->validate && fam->estimate, "%s: validate and estimate", names[k]);
    }
    const zt_model_field *sc = zt_model_family_field(zt_model_family_find("llama"), "rope_scaling");
    CHECK(sc && sc->size == 16 && sc->def_str && sc->def_str[0] == '\0', "rope_scaling: char[16], "
          "default \"\"");
}

/* The proto type a field of this kind travels as. */
static ProtobufCType proto_type(zt_field_kind k) {
    switch (k) {
    case ZT_FIELD_INT: return PROTOBUF_C_TYPE_INT32;
    case ZT_FIELD_FLOAT: return PROTOBUF_C_TYPE_DOUBLE;
    case ZT_FIELD_BOOL: return PROTOBUF_C_TYPE_BOOL;
    default: return PROTOBUF_C_TYPE_STRING;
    }
}

static void check_in_proto(const char *family, const zt_model_field *f) {
    const ProtobufCMessageDescriptor *d = &ztrain__v1__model_spec__descriptor;
    const ProtobufCFieldDescriptor *p = protobuf_c_message_descriptor_get_field_by_name(d, f->key);
    if (!check_at(__FILE__, __LINE__, p != NULL, "%s.%s has no ModelSpec field of that name",
                  family, f->key))
        return;
    CHECK(p->type == proto_type(f->kind), "%s.%s: ModelSpec.%s has protobuf-c type %d, want %d",
          family, f->key, f->key, p->type, proto_type(f->kind));
    CHECK(p->label != PROTOBUF_C_LABEL_REPEATED, "%s.%s: ModelSpec.%s is repeated", family, f->key,
          f->key);
    /* The proto reads a zero as "unset": a field whose zero is a valid value other than its
     * default needs presence, which protoc-c gives a scalar through a oneof. */
    bool zero_allowed = f->kind == ZT_FIELD_BOOL ||
                        ((f->kind == ZT_FIELD_INT || f->kind == ZT_FIELD_FLOAT) &&
                         f->bound != ZT_BOUND_POSITIVE);
    if (zero_allowed && !f->required && f->def != 0.0)
        CHECK((p->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0,
              "%s.%s: default %g but 0 is allowed, so ModelSpec.%s needs a oneof", family, f->key,
              f->def, f->key);
}

static void test_proto_matches(void) {
    check_in_proto("(every family)", &zt_model_type_field);
    for (int i = 0; zt_model_family_at(i); i++)
        for (const zt_model_field *f = zt_model_family_at(i)->fields; f->key; f++)
            check_in_proto(zt_model_family_at(i)->name, f);
    /* And the other way: a ModelSpec field no family reads would pass the service's mapping and
     * then fail as an unknown key in the engine. */
    const ProtobufCMessageDescriptor *d = &ztrain__v1__model_spec__descriptor;
    for (unsigned j = 0; j < d->n_fields; j++) {
        const char *name = d->fields[j].name;
        bool known = strcmp(name, zt_model_type_field.key) == 0;
        for (int i = 0; !known && zt_model_family_at(i); i++)
            known = zt_model_family_field(zt_model_family_at(i), name) != NULL;
        CHECK(known, "ModelSpec.%s is no family's field", name);
    }
}

static void test_describe_and_compare(void) {
    zt_model_spec a = {.type = "gpt2", .n_layer = 2, .n_head = 4, .n_embd = 32, .vocab_size = 256,
                       .block_size = 64, .init_from = "a.safetensors"};
    char buf[256];
    zt_model_spec_describe(&a, buf, sizeof buf);
    CHECK_STR(buf, "GPT-2 (n_layer 2, n_head 4, n_embd 32, vocab_size 256, block_size 64)");
    /* Truncation keeps a NUL-terminated prefix. */
    zt_model_spec_describe(&a, buf, 12);
    CHECK_STR(buf, "GPT-2 (n_la");
    zt_model_spec u = {.type = "mamba"};
    zt_model_spec_describe(&u, buf, sizeof buf);
    CHECK_STR(buf, "mamba");

    zt_model_spec b = a;
    b.init_from = NULL;
    CHECK(zt_model_spec_difference(&a, &b) == NULL, "paths are not part of the architecture");
    b.block_size = 128;
    const zt_model_field *f = zt_model_spec_difference(&a, &b);
    CHECK(f && strcmp(f->key, "block_size") == 0, "block_size differs: %s", f ? f->key : "none");
    if (f) {
        zt_model_field_format(f, &b, buf, sizeof buf);
        CHECK_STR(buf, "128");
    }
    b.n_head = 8;
    f = zt_model_spec_difference(&a, &b);
    CHECK(f && strcmp(f->key, "n_head") == 0, "the first difference is n_head: %s",
          f ? f->key : "none");
    CHECK(zt_model_spec_difference(&a, &u) == &zt_model_type_field);
    CHECK(zt_model_spec_difference(&u, &u) == NULL);
    zt_model_field_format(&zt_model_type_field, &a, buf, sizeof buf);
    CHECK_STR(buf, "gpt2");
    zt_model_field_format(zt_model_family_field(zt_model_family_find("gpt2"), "init_from"), &b, buf,
                          sizeof buf);
    CHECK_STR(buf, "(none)");
}

int main(void) {
    test_registry();
    test_tables_well_formed();
    test_gpt2_fields();
    test_llama_fields();
    test_proto_matches();
    test_describe_and_compare();
    return check_summary("test_model_registry");
}
