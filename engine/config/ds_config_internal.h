/* What the DeepSpeed config parser's files (ds_config.c, ds_config_optim.c, ds_config_zero.c,
 * ds_config_monitor.c) share with each other; internal to them, not part of libztrain's API. */
#ifndef ZTRAIN_DS_CONFIG_INTERNAL_H
#define ZTRAIN_DS_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/json_util.h"
#include "ztrain/ds_config.h"

/* Rules every section follows, stricter than DeepSpeed on purpose where it gave no answer:
 * - Unknown keys inside any section are an error naming the key, also in sections DeepSpeed reads
 *   with dict.get (optimizer, scheduler, their params, data_types).
 * - JSON null and the string "auto" mean "absent", so the default applies, except where DeepSpeed
 *   fails on None or reads it otherwise (zt_ds_check_nulls, and the scheduler's few).
 * - Integers must be integral numbers (5e8 and 2.0 are fine); bools must be true/false. */

/* Records "ztrain: warning: SOURCE: " and the message as one line in the warnings of the config
 * being parsed on this thread (stderr outside a parse); a line already recorded is not repeated. */
void zt_ds_warn(const char *source, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records the formatted message as zt_error does and the key it is about as the failure's field
 * (zt_error_field: o's path and key, or o's own path when key is NULL), so that the service
 * names the exact key of a refusal whose text is DeepSpeed's own rather than "key '...'". */
zt_status zt_ds_fail(zt_status s, const zt_json_obj *o, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Writes v as Python's str() prints the value json.load made of it (3 for an int, 3.0 for a
 * float literal, True, None, a string without quotes), for DeepSpeed's "got ..." texts. */
void zt_ds_py_str(const cJSON *v, char *buf, size_t n);

/* Whether name is in the NULL-terminated list (case-sensitive). */
bool zt_ds_name_in(const char *name, const char *const *list);

/* Table-driven sections: the pydantic models (zero, offload, fp16, bf16) are lists of typed,
 * range-checked keys, so they are read from tables. */

typedef enum { FT_BOOL, FT_INT, FT_INT64, FT_DOUBLE, FT_OBJECT } field_type;

typedef struct {
    const char *key;
    field_type type;
    ptrdiff_t off; /* offset into the section's struct, or NOSTORE: validated, then dropped */
    double lo, hi; /* inclusive range, checked when lo <= hi */
} field;

#define NOSTORE ((ptrdiff_t)-1)
#define ANYVAL 1, 0
#define NONNEG 0, 1e300
#define POSITIVE 1, 1e300
#define FLD(T, m) offsetof(T, m)
#define NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* Reads each of the n fields present in o into base (the section's struct), in table order,
 * checking types and ranges; an absent field leaves its default. */
zt_status zt_ds_read_fields(const zt_json_obj *o, const field *fields, size_t n, void *base);

/* DeepSpeed reads the sections above, the monitors, comms_logger, hybrid_engine, compile,
 * timers.throughput and tensor_parallel through pydantic models in lax mode, which convert a value to the field's type: strings ("2" to
 * 2 for zero_optimization.stage, "128" to 128.0 for fp16.loss_scale, "true"/"yes"/"on"/"1" to
 * true), 0 and 1 to bools, bools to 0 and 1. The sections it reads with dict.get (the top level,
 * optimizer, scheduler, and the switches flops_profiler, autotuning, torch_autocast and
 * expert_parallel) convert nothing. zt_ds_coerce_model_strings converts, in place, each value
 * under a typed field of those model sections as pydantic would (ds_config_lax.c); a value
 * pydantic refuses is left for the reader to refuse. */
void zt_ds_coerce_model_strings(cJSON *root);
/* Its parts: zero_optimization with its offload sections, fp16 and bf16 by their tables
 * (ds_config_zero.c); one key, or every field of a table, of a section (NULL or not an object:
 * nothing). `strict`: a DeepSpeed validator that calls int() or float() first, so "2.0" stays
 * refused as an int and a bool is not a number. */
void zt_ds_coerce_zero_sections(cJSON *root);
void zt_ds_coerce_key(cJSON *sec, const char *key, field_type type, bool strict);
void zt_ds_coerce_fields(cJSON *sec, const field *fields, size_t n);
/* A bool as a pydantic model reads it: true/false, 0/1, or one of its strings ("yes", "off",
 * ...); false when v is none of those. */
bool zt_ds_lax_bool(const cJSON *v, bool *out);
/* An int as a pydantic model reads it: a number, a bool (1 or 0), or a string of one ("2",
 * " 2_000 ", "2.0"); false when v is none of those or not a whole number within int. */
bool zt_ds_lax_int(const cJSON *v, int *out);

/* The allowed keys of a table section are its fields plus a few read by hand (`extra`, NULL or
 * NULL-terminated). */
zt_status zt_ds_check_table_keys(const zt_json_obj *o, const field *fields, size_t n,
                                 const char *const *extra);

/* The section parsers, called by zt_ds_config_from_json in this order: zero, precision, (batch
 * triple), optimizer, scheduler. Each reads its section of `top` into cfg; precision reads the ZeRO
 * stage and the scheduler reads the optimizer, so the order matters. */
zt_status zt_ds_parse_zero(zt_ds_config *cfg, const zt_json_obj *top);
zt_status zt_ds_parse_precision(zt_ds_config *cfg, const zt_json_obj *top);
zt_status zt_ds_parse_optimizer(zt_ds_config *cfg, const zt_json_obj *top);
zt_status zt_ds_parse_scheduler(zt_ds_config *cfg, const zt_json_obj *top);
/* The tensor_parallel section (ds_config_tp.c), before the batch triple: sets cfg->tp_size and
 * divides cfg->world_size by it. */
zt_status zt_ds_parse_tensor_parallel(zt_ds_config *cfg, const zt_json_obj *top);
/* The monitor sections (ds_config_monitor.c): tensorboard, csv_monitor, wandb, comet, and the
 * timers, refused where DeepSpeed fails on them. */
zt_status zt_ds_parse_monitor(zt_ds_config *cfg, const zt_json_obj *top);

/* The switches of DeepSpeed features ztrain lacks (ds_config_switches.c): ZT_ERR_UNSUPPORTED
 * naming the key where DeepSpeed would turn one on, ZT_ERR_INVALID where it would fail on the
 * value. */
zt_status zt_ds_check_switches(const zt_json_obj *top);

/* The checkpoint section's values that DeepSpeed checks although ztrain does not act on them
 * (ds_config_checkpoint.c): tag_validation, parallel_write.pipeline_stage, writer.type and
 * writer.data_parallel, refused by key where DeepSpeed fails. */
zt_status zt_ds_check_checkpoint(const zt_json_obj *top);

/* JSON null where DeepSpeed does not read it as absent (ds_config_null.c): refused by key, with
 * how DeepSpeed fails on it. Runs before the section parsers. */
zt_status zt_ds_check_nulls(const zt_json_obj *top);

/* The key table's two passes (ds_config_keys.c). The first refuses a key that is not in the table
 * inside any section it describes (warns at the top level); the second, after the section parsers,
 * refuses every set key whose fate is a refusal (ZT_ERR_UNSUPPORTED naming the key, its value and
 * the row's note) and warns for every set key whose fate is a warning, or that is honoured only
 * at other ZeRO stages than cfg's. Rows marked ZT_DS_KEY_BY_HAND are left to their section's
 * parser. */
zt_status zt_ds_check_known_keys(const zt_json_obj *o);
/* DeepSpeed 0.19's first check of a config: a key of a feature it removed (ZT_DS_KEY_REMOVED rows,
 * at the top level and in zero_optimization) is ZT_ERR_INVALID naming the key, whatever its value. */
zt_status zt_ds_check_removed(const zt_json_obj *top);
zt_status zt_ds_apply_fates(const zt_ds_config *cfg, const zt_json_obj *o);

#endif
