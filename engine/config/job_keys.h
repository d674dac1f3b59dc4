/* The value types of the job file's keys outside "model" (job_keys.c), checked by the parser
 * with each section's keys. */
#ifndef ZTRAIN_JOB_KEYS_H
#define ZTRAIN_JOB_KEYS_H

#include "ztrain/json_util.h"
#include "ztrain/status.h"

/* Refuses a key of `section` (as zt_job_spec_keys names sections) that the parser does not know,
 * then a value whose JSON type is not the key's (zt_job_spec_key_type): "SOURCE: key
 * 'train.max_steps' must be an integer, got \"ten\"". A null value stands for an absent key, as
 * the typed getters read it, and passes; "auto" is a string like any other (only the DeepSpeed
 * config gives it a meaning). */
zt_status zt_job_keys_check(const zt_json_obj *o, const char *section);

#endif
