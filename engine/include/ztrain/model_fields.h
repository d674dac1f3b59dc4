/* The value operations of one model spec field (zt_model_field, ztrain/model.h), shared by the
 * job-spec parser, the registry and checkpoints (internal to libztrain).
 *
 * They work on the struct a field table describes through `rec`, which is a zt_model_spec
 * everywhere except in tests/unit/test_model_fields.c, whose own struct exercises every kind. */
#ifndef ZTRAIN_MODEL_FIELDS_H
#define ZTRAIN_MODEL_FIELDS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "ztrain/json_util.h"
#include "ztrain/model.h"

/* Sets f in rec to its default (a PATH to NULL, without freeing what was there). */
void zt_model_field_set_default(const zt_model_field *f, void *rec);

/* Reads f from a job spec's model section `o` into rec. A required field that is absent and a
 * value of the wrong type are errors naming the key ("job.json: key 'model.n_layer' is
 * required"); an absent optional field takes its default. A PATH is the job spec's to read,
 * because it resolves paths against the job's directory. */
zt_status zt_model_field_read_json(const zt_model_field *f, const zt_json_obj *o, void *rec);

/* Checks f's bound (and that a FLOAT is finite): "SOURCE: model.n_head must be a positive
 * integer, got 0". */
zt_status zt_model_field_check(const zt_model_field *f, const void *rec, const char *source);

/* f's value as a new cJSON item, for meta.json; NULL when out of memory. */
cJSON *zt_model_field_to_cjson(const zt_model_field *f, const void *rec);

/* Reads f from the object `obj` (a meta.json model section) into rec. An absent key takes the
 * default, so checkpoints written before a field existed still load; a value of the wrong type is
 * ZT_ERR_FORMAT naming `source` and the key. */
zt_status zt_model_field_from_cjson(const zt_model_field *f, const cJSON *obj, void *rec,
                                    const char *source);

/* Whether f holds the same value in a and b (paths compare as strings, NULL as ""). */
bool zt_model_field_equal(const zt_model_field *f, const void *a, const void *b);

/* Writes f's value as text: "32", "1e-05", "true", "llama3", "(none)" for an unset path. A FLOAT
 * is written with as few digits as read back to the same double. */
void zt_model_field_format_value(const zt_model_field *f, const void *rec, char *buf,
                                 size_t size);

#endif
