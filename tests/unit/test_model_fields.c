/* The value operations of model spec fields (engine/include/ztrain/model_fields.h) for every kind, on a struct
 * of this test's own: GPT-2 has only integers and a path, while other families (Llama's
 * rope_theta, tie_word_embeddings, rope scaling type) need floats, bools and strings, and those
 * must read, check, round-trip through meta.json, compare and print correctly before a family
 * uses them. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "ztrain/json_util.h"
#include "ztrain/model_fields.h"

typedef struct {
    int layers;
    int window;
    double theta;
    double eps;
    bool tie;
    char scaling[8];
    char *weights;
} rec_t;

static const zt_model_field fields[] = {
    {.key = "layers", .kind = ZT_FIELD_INT, .offset = offsetof(rec_t, layers), .size = sizeof(int),
     .required = true, .bound = ZT_BOUND_POSITIVE, .meaning = "blocks"},
    {.key = "window", .kind = ZT_FIELD_INT, .offset = offsetof(rec_t, window), .size = sizeof(int),
     .def = 4096, .bound = ZT_BOUND_NONNEGATIVE, .meaning = "sliding window, 0 for none"},
    {.key = "theta", .kind = ZT_FIELD_FLOAT, .offset = offsetof(rec_t, theta),
     .size = sizeof(double), .def = 10000.0, .bound = ZT_BOUND_POSITIVE, .meaning = "rope base"},
    {.key = "eps", .kind = ZT_FIELD_FLOAT, .offset = offsetof(rec_t, eps), .size = sizeof(double),
     .def = 1e-5, .bound = ZT_BOUND_NONNEGATIVE, .meaning = "norm epsilon"},
    {.key = "tie", .kind = ZT_FIELD_BOOL, .offset = offsetof(rec_t, tie), .size = sizeof(bool),
     .def = 1, .meaning = "tied head"},
    {.key = "scaling", .kind = ZT_FIELD_STRING, .offset = offsetof(rec_t, scaling),
     .size = sizeof ((rec_t *)0)->scaling, .def_str = "none", .meaning = "rope scaling"},
    {.key = "weights", .kind = ZT_FIELD_PATH, .offset = offsetof(rec_t, weights),
     .size = sizeof(char *), .meaning = "init weights"},
    {0},
};

enum { LAYERS, WINDOW, THETA, EPS, TIE, SCALING, WEIGHTS };

/* Reads every non-path field from the "model" object of `json` into r. */
static zt_status read_all(const char *json, rec_t *r) {
    cJSON *root = cJSON_Parse(json);
    ZT_ASSERT(root);
    zt_json_obj top, o;
    zt_json_obj_init(&top, root, "job.json", "");
    zt_status s = zt_json_child(&top, "model", &o);
    for (const zt_model_field *f = fields; s == ZT_OK && f->key; f++)
        if (f->kind != ZT_FIELD_PATH)
            s = zt_model_field_read_json(f, &o, r);
    cJSON_Delete(root);
    return s;
}

static void read_err_at(int line, const char *json, const char *msg) {
    rec_t r = {0};
    zt_status s = read_all(json, &r);
    check_error_is(__FILE__, line, "model", json, s, ZT_ERR_INVALID, msg, false);
}
#define READ_ERR(json, msg) read_err_at(__LINE__, json, msg)

static void test_read_json(void) {
    rec_t r;
    memset(&r, 0x5a, sizeof r);
    zt_status s = read_all("{\"model\": {\"layers\": 3}}", &r);
    CHECK(s == ZT_OK, "defaults: %s", zt_last_error());
    CHECK(r.layers == 3 && r.window == 4096 && r.theta == 10000.0 && r.eps == 1e-5 && r.tie,
          "defaults: %d %d %g %g %d", r.layers, r.window, r.theta, r.eps, r.tie);
    CHECK_STR(r.scaling, "none");

    s = read_all("{\"model\": {\"layers\": 2, \"window\": 0, \"theta\": 500000, \"eps\": 1e-6, "
                 "\"tie\": false, \"scaling\": \"llama3\"}}", &r);
    CHECK(s == ZT_OK, "values: %s", zt_last_error());
    CHECK(r.layers == 2 && r.window == 0 && r.theta == 500000.0 && r.eps == 1e-6 && !r.tie,
          "values: %d %d %g %g %d", r.layers, r.window, r.theta, r.eps, r.tie);
    CHECK_STR(r.scaling, "llama3");
    /* null means "absent", as everywhere in job files; "auto" is only the DeepSpeed config's
     * (docs/deepspeed.md): here it is a string like any other, and no number. */
    s = read_all("{\"model\": {\"layers\": 2, \"theta\": null, \"scaling\": \"auto\"}}", &r);
    CHECK(s == ZT_OK && r.theta == 10000.0, "null theta: %s", zt_last_error());
    CHECK_STR(r.scaling, "auto");
    READ_ERR("{\"model\": {\"layers\": 1, \"theta\": \"auto\"}}",
             "job.json: key 'model.theta' must be a number, got \"auto\" (\"auto\" is only for the "
             "DeepSpeed config keys the Hugging Face Trainer fills)");

    READ_ERR("{\"model\": {}}", "job.json: key 'model.layers' is required");
    READ_ERR("{\"model\": {\"layers\": 1.5}}",
             "job.json: key 'model.layers' must be an integer, got 1.5");
    READ_ERR("{\"model\": {\"layers\": 1, \"theta\": \"big\"}}",
             "job.json: key 'model.theta' must be a number, got \"big\"");
    READ_ERR("{\"model\": {\"layers\": 1, \"tie\": 1}}",
             "job.json: key 'model.tie' must be true or false, got 1");
    READ_ERR("{\"model\": {\"layers\": 1, \"scaling\": 8}}",
             "job.json: key 'model.scaling' must be a string, got 8");
    READ_ERR("{\"model\": {\"layers\": 1, \"scaling\": \"longrope\"}}",
             "job.json: key 'model.scaling' must be at most 7 bytes long, got \"longrope\"");
    s = read_all("{\"model\": {\"layers\": 1, \"scaling\": \"dynamic\"}}", &r);
    CHECK(s == ZT_OK, "7 bytes fit: %s", zt_last_error());
    CHECK_STR(r.scaling, "dynamic");
}

static void check_err_at(int line, const rec_t *r, int field, const char *msg) {
    zt_status s = zt_model_field_check(&fields[field], r, "src");
    check_error_is(__FILE__, line, "field", fields[field].key, s, ZT_ERR_INVALID, msg, false);
}
#define CHECK_ERR(r, field, msg) check_err_at(__LINE__, r, field, msg)

static void test_bounds(void) {
    rec_t r = {.layers = 1, .window = 0, .theta = 1e-300, .eps = 0.0, .tie = false,
               .scaling = "x"};
    for (int i = 0; fields[i].key; i++)
        CHECK(zt_model_field_check(&fields[i], &r, "src") == ZT_OK, "%s in bounds: %s",
              fields[i].key, zt_last_error());
    r.layers = 0;
    CHECK_ERR(&r, LAYERS, "src: model.layers must be a positive integer, got 0");
    r.layers = -2;
    CHECK_ERR(&r, LAYERS, "src: model.layers must be a positive integer, got -2");
    r.window = -1;
    CHECK_ERR(&r, WINDOW, "src: model.window must be a non-negative integer, got -1");
    r.theta = 0.0;
    CHECK_ERR(&r, THETA, "src: model.theta must be positive, got 0");
    r.theta = -1.5;
    CHECK_ERR(&r, THETA, "src: model.theta must be positive, got -1.5");
    r.theta = NAN;
    CHECK_ERR(&r, THETA, "src: model.theta must be a finite number, got nan");
    r.eps = -1e-9;
    CHECK_ERR(&r, EPS, "src: model.eps must be >= 0, got -1e-09");
    r.eps = INFINITY;
    CHECK_ERR(&r, EPS, "src: model.eps must be a finite number, got inf");
}

static void test_meta_round_trip(void) {
    rec_t a = {.layers = 7, .window = 0, .theta = 0.1 + 0.2, .eps = 1e-5, .tie = false,
               .scaling = "linear", .weights = "w.safetensors"};
    cJSON *o = cJSON_CreateObject();
    for (const zt_model_field *f = fields; f->key; f++)
        if (f->kind != ZT_FIELD_PATH)
            cJSON_AddItemToObject(o, f->key, zt_model_field_to_cjson(f, &a));
    /* Through text, as meta.json goes to disk. */
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    o = cJSON_Parse(text);
    CHECK_STR(text, "{\"layers\":7,\"window\":0,\"theta\":0.30000000000000004,\"eps\":1e-05,"
                    "\"tie\":false,\"scaling\":\"linear\"}");
    cJSON_free(text);
    rec_t b;
    memset(&b, 0, sizeof b);
    for (const zt_model_field *f = fields; f->key; f++) {
        if (f->kind == ZT_FIELD_PATH)
            continue;
        CHECK(zt_model_field_from_cjson(f, o, &b, "meta.json") == ZT_OK, "%s: %s", f->key,
              zt_last_error());
        CHECK(zt_model_field_equal(f, &a, &b), "%s survives meta.json", f->key);
    }
    cJSON_Delete(o);

    /* An older checkpoint without a field gets the default; a mistyped one is refused. */
    o = cJSON_Parse("{\"layers\": 2, \"tie\": \"yes\", \"window\": 2.5}");
    CHECK(zt_model_field_from_cjson(&fields[THETA], o, &b, "meta.json") == ZT_OK &&
          b.theta == 10000.0);
    CHECK(zt_model_field_from_cjson(&fields[SCALING], o, &b, "meta.json") == ZT_OK);
    CHECK_STR(b.scaling, "none");
    CHECK(zt_model_field_from_cjson(&fields[TIE], o, &b, "meta.json") == ZT_ERR_FORMAT);
    CHECK_STR(zt_last_error(), "meta.json: model.tie must be true or false");
    CHECK(zt_model_field_from_cjson(&fields[WINDOW], o, &b, "meta.json") == ZT_ERR_FORMAT);
    CHECK_STR(zt_last_error(), "meta.json: model.window must be an integer");
    cJSON_Delete(o);
}

static void test_equal_and_format(void) {
    rec_t a = {.layers = 12, .window = 0, .theta = 500000.0, .eps = 1e-5, .tie = true,
               .scaling = "llama3", .weights = NULL};
    const char *want[] = {"12", "0", "500000", "1e-05", "true", "llama3", "(none)"};
    for (int i = 0; fields[i].key; i++) {
        char buf[64];
        zt_model_field_format_value(&fields[i], &a, buf, sizeof buf);
        CHECK_STR(buf, want[i]);
        CHECK(zt_model_field_equal(&fields[i], &a, &a));
    }
    char buf[64];
    a.theta = 0.1 + 0.2;
    zt_model_field_format_value(&fields[THETA], &a, buf, sizeof buf);
    CHECK_STR(buf, "0.30000000000000004");

    /* Each change is seen by its own field and by no other. */
    rec_t b = a;
    b.window = 1;
    b.eps = 2e-5;
    b.scaling[0] = 'L';
    b.weights = "x";
    bool differs[] = {false, true, false, true, false, true, true};
    for (int i = 0; fields[i].key; i++)
        CHECK(zt_model_field_equal(&fields[i], &a, &b) == !differs[i], "%s", fields[i].key);
    /* An unset path equals an empty one. */
    b.weights = "";
    CHECK(zt_model_field_equal(&fields[WEIGHTS], &a, &b));
}

int main(void) {
    test_read_json();
    test_bounds();
    test_meta_round_trip();
    test_equal_and_format();
    return check_summary("test_model_fields");
}
