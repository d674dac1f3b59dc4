/* The digits json_util keeps of an integer literal past a double's exact range
 * (zt_json_int_digits), against the literals as written: kept by zt_json_parse and
 * zt_json_mark_floats for an integer of more than 15 digits only (not a float, a string or a
 * shorter integer), copied by cJSON_Duplicate, and without effect on what the other users of a
 * parsed tree print: zt_json_print writes the same text as cJSON does of a tree cJSON parsed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/json_util.h"

static const char *TEXT =
    "{\"a\": 12345678901234567891, \"b\": [-9223372036854775809, 9007199254740993, "
    "9007199254740992.0, 123456789012345, 1e30, -0, 18446744073709551616], "
    "\"c\": \"9007199254740993\", \"d\": {\"e\": -100000000000000000000000000000}}";

/* The digits of the tree's numbers in document order, as zt_json_int_digits gives them ("" for
 * none), each followed by a space. */
static void digits_of(const cJSON *node, char *out, size_t n) {
    for (const cJSON *c = node; c; c = c->next) {
        if (cJSON_IsNumber(c) || cJSON_IsString(c)) {
            const char *d = zt_json_int_digits(c);
            size_t len = strlen(out);
            snprintf(out + len, n - len, "%s ", d ? d : "");
        }
        if (c->child)
            digits_of(c->child, out, n);
    }
}

static const char *WANT = "12345678901234567891 -9223372036854775809 9007199254740993     "
                          "18446744073709551616  -100000000000000000000000000000 ";

static void check_parse(void) {
    cJSON *root;
    CHECK(zt_json_parse(TEXT, "t.json", &root) == ZT_OK, "parse: %s", zt_last_error());
    char got[512] = "";
    digits_of(root, got, sizeof got);
    CHECK_STR(got, WANT);
    cJSON *copy = cJSON_Duplicate(root, true);
    got[0] = '\0';
    digits_of(copy, got, sizeof got);
    CHECK_STR(got, WANT);
    cJSON_Delete(copy);
    cJSON_Delete(root);
}

static void check_mark(void) {
    cJSON *root = cJSON_Parse(TEXT);
    CHECK(zt_json_mark_floats(root, TEXT, strlen(TEXT)), "mark_floats failed");
    char got[512] = "";
    digits_of(root, got, sizeof got);
    CHECK_STR(got, WANT);
    CHECK(zt_json_is_float_literal(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "b"), 2)),
          "9007199254740992.0 not marked as a float");
    cJSON_Delete(root);
}

/* A DeepSpeed config or job spec printed back reads as cJSON prints it, digits or not. */
static void check_print_unchanged(void) {
    const char *text = "{\"seed\": 12345678901234567891, \"x\": [-9223372036854775809, "
                       "9007199254740993, 7]}";
    cJSON *ours, *theirs = cJSON_Parse(text);
    CHECK(zt_json_parse(text, "t.json", &ours) == ZT_OK, "parse: %s", zt_last_error());
    char *a = zt_json_print(ours, false), *b = cJSON_PrintUnformatted(theirs);
    CHECK_STR(a, b);
    cJSON_free(a);
    cJSON_free(b);
    cJSON_Delete(ours);
    cJSON_Delete(theirs);
}

int main(void) {
    check_parse();
    check_mark();
    check_print_unchanged();
    return check_summary("test_json_digits");
}
