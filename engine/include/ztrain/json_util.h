/* Reading JSON config files with messages that point at the fault (internal to libztrain).
 *
 * A thin layer over cJSON for the DeepSpeed config and the job spec: strict RFC 8259 parsing that
 * reports "line L, column C" and a Python-json-style reason, duplicate-key detection, typed getters
 * and an allowed-keys check whose messages name the source, the dotted key path and the offending
 * value. Every message is left in zt_last_error(). */
#ifndef ZTRAIN_JSON_UTIL_H
#define ZTRAIN_JSON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ztrain/status.h"

/* A JSON object being read, with what messages need to name it. `obj` is NULL when the section is
 * absent: every getter then reports "absent" and the caller's default stands. The struct borrows
 * obj and source; it is valid while the cJSON tree and the source string are. */
typedef struct {
    const cJSON *obj;
    const char *source; /* the document, e.g. "ds.json" or "job.json: deepspeed" */
    char path[256];     /* dotted path of obj from the document root; "" for the root itself */
} zt_json_obj;

/* Reads a whole file into a NUL-terminated heap buffer the caller frees (*len, if not NULL,
 * excludes the NUL). A missing file is ZT_ERR_IO "PATH: cannot open: No such file or directory";
 * a file with a NUL byte in it is ZT_ERR_FORMAT. */
zt_status zt_json_read_file(const char *path, char **text, size_t *len);

/* The most a job file or DeepSpeed config may hold. */
#define ZT_JSON_CONFIG_MAX_BYTES ((size_t)64 << 20)

/* zt_json_read_file for a job file or a DeepSpeed config: the path must be a regular file (a
 * FIFO or a device such as /dev/zero is ZT_ERR_IO "PATH: not a regular file (...)", never
 * read) of at most ZT_JSON_CONFIG_MAX_BYTES ("PATH: larger than 64 MiB, ..."). */
zt_status zt_json_read_config(const char *path, char **text, size_t *len);

/* Parses strict JSON text (no comments, no trailing commas, no leading zeros, no \u0000 in a
 * string, which C strings would end at). On a syntax error
 * returns ZT_ERR_FORMAT with "SOURCE: line L, column C: Expecting ',' delimiter"-style messages;
 * columns count characters from 1, as Python's json module does. *out is the caller's to
 * cJSON_Delete. */
zt_status zt_json_parse(const char *text, const char *source, cJSON **out);

/* Whether a number of a tree from zt_json_parse was written with a fraction or an exponent
 * ("3.0", "1e3"), which Python's json module reads as a float where "3" is an int: DeepSpeed
 * checks some keys with isinstance(value, int). The mark is a bit of the node's type above
 * cJSON's own (cJSON_IsNumber still holds, cJSON_Duplicate keeps it); numbers made with
 * cJSON_CreateNumber and trees printed and parsed back by cJSON read as ints when integral. */
#define ZT_JSON_FLOAT_LITERAL (1 << 12)
bool zt_json_is_float_literal(const cJSON *item);

/* The decimal text of an integer of a tree from zt_json_parse written with more than 15 digits
 * ("-12345678901234567891", as written: JSON has no leading zeros, so it is also Python's str()
 * of json.loads's int), or NULL for any other node. cJSON holds every number as a double, which
 * past 2**53 is rounded (and past 64 bits beyond any integer type), while Python's json keeps the
 * integer exact. The text is the node's valuestring (cJSON_IsNumber still holds; cJSON_Delete
 * frees it, cJSON_Duplicate copies it, cJSON_Print still prints the double); it lives as long as
 * the node. */
const char *zt_json_int_digits(const cJSON *item);

/* Marks the numbers written as floats and keeps the digits of long integers
 * (zt_json_int_digits) in a tree another parser made of `text` (len bytes, one JSON value that
 * parser accepted), as zt_json_parse does with its own. False when out of memory: some
 * integers may then be left without their digits. */
bool zt_json_mark_floats(cJSON *root, const char *text, size_t len);

/* cJSON_Print (formatted) or cJSON_PrintUnformatted of item, except that a whole number marked
 * as written as a float prints as one ("3.0", not "3"), so text printed from a parsed tree reads
 * back the same way. NULL when out of memory; the caller frees the text with cJSON_free(). */
char *zt_json_print(const cJSON *item, bool formatted);

/* Reads and parses a file; messages are prefixed with the path. */
zt_status zt_json_load_file(const char *path, cJSON **out);
/* The same through zt_json_read_config: for a job file or a DeepSpeed config. */
zt_status zt_json_load_config(const char *path, cJSON **out);

/* Rejects an object (at any depth below `node`) that holds the same key twice, as DeepSpeed's
 * duplicate-key hook does: "SOURCE: Duplicate keys in WHAT: ['lr'] (in optimizer.params)".
 * `path` is node's dotted path ("" for a root). A direct child of `node` named `skip_key` is not
 * descended into (the job spec hands its "deepspeed" object to the DeepSpeed parser, which checks
 * it under its own name); NULL skips nothing. */
zt_status zt_json_check_duplicates(const cJSON *node, const char *source, const char *what,
                                   const char *path, const char *skip_key);

/* Rejects a number at or below `node` that is not finite: cJSON reads one beyond a double's
 * range (1e999) as an infinity, which would train with lr inf or print back as null. ZT_ERR_INVALID
 * "SOURCE: key 'optimizer.params.lr' is not a finite number (...)", with the key as the error's
 * field. `path` and `skip_key` as for zt_json_check_duplicates. The typed getters below refuse
 * such a number the same way. */
zt_status zt_json_check_finite(const cJSON *node, const char *source, const char *path,
                               const char *skip_key);

/* Starts reading `root` (which may be NULL). `path` is the root's dotted path, usually "". */
void zt_json_obj_init(zt_json_obj *o, const cJSON *root, const char *source, const char *path);

/* Writes "path.key" (or "key" at the root) into buf. */
void zt_json_key_path(const zt_json_obj *o, const char *key, char *buf, size_t n);

/* The value under key, or NULL when the key is absent or JSON null. Keys match case-sensitively.
 * "auto" is a string like any other here: the DeepSpeed parser removes it first at the keys where
 * it means something (zt_ds_strip_auto), and a getter of another type refuses it by key. */
const cJSON *zt_json_item(const zt_json_obj *o, const char *key);

/* Opens the object under key as *child; an absent key gives child->obj == NULL. Any other
 * non-object value is an error naming the key. */
zt_status zt_json_child(const zt_json_obj *o, const char *key, zt_json_obj *child);

/* Typed getters. When the key is absent (see zt_json_item) they leave *out untouched and set
 * *found (if not NULL) to false. A value of the wrong type is ZT_ERR_INVALID:
 * "SOURCE: key 'section.key' must be an integer, got \"abc\"". Integers are accepted in any JSON
 * number form whose value is integral (5e8, 2.0). The string getter returns a pointer into the
 * tree. */
zt_status zt_json_get_int(const zt_json_obj *o, const char *key, int *out, bool *found);
zt_status zt_json_get_int64(const zt_json_obj *o, const char *key, int64_t *out, bool *found);
zt_status zt_json_get_double(const zt_json_obj *o, const char *key, double *out, bool *found);
zt_status zt_json_get_bool(const zt_json_obj *o, const char *key, bool *out, bool *found);
zt_status zt_json_get_string(const zt_json_obj *o, const char *key, const char **out, bool *found);

/* ZT_ERR_INVALID "SOURCE: key 'section.key' is required" unless the key is present. */
zt_status zt_json_require(const zt_json_obj *o, const char *key);

/* Fails on the first key of the object not in `allowed` (NULL-terminated):
 * "SOURCE: unknown key 'stag' in zero_optimization (did you mean 'stage'?); allowed keys: ...". */
zt_status zt_json_check_keys(const zt_json_obj *o, const char *const *allowed);

/* The closest name in `names` (NULL-terminated) to `word` within a small edit distance, ignoring
 * case, or NULL. Used for "did you mean" hints. */
const char *zt_json_suggest(const char *word, const char *const *names);

/* Records "SOURCE: key 'section.key' " followed by the formatted text and returns s, for value
 * checks made by the caller ("must be >= 0, got -1"). */
zt_status zt_json_key_error(zt_status s, const zt_json_obj *o, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Whether a value is true the way Python reads it (`if v:`): 0, 0.0, null, "", [] and {} are
 * false, 1, -1, "false", "no" and [0] true; NULL (absent) is false. transformers reads every
 * boolean key of a config so (its config classes keep the value as given), and DeepSpeed the
 * switches it fetches with dict.get. */
bool zt_json_truthy(const cJSON *v);

/* A special token as tokenizer_config.json gives it: a string, or an AddedToken object's
 * "content". *text is NULL when v is absent or null (or its content null); any other value is
 * ZT_ERR_FORMAT naming source and key. *text points into v. */
zt_status zt_json_token_text(const cJSON *v, const char *source, const char *key,
                             const char **text);

/* Writes a short JSON rendering of item into buf for "got ..." messages (truncated with "..."). */
void zt_json_repr(const cJSON *item, char *buf, size_t n);

/* strdup that reports ZT_ERR_NOMEM by returning NULL; NULL in gives NULL out. */
char *zt_json_strdup(const char *s);

#endif
