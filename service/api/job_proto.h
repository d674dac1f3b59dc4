/* The mapping between ztrain's JSON (the job-spec file of DESIGN.md §3, metric records, the job
 * manager's zt_job_info) and the messages of proto/ztrain.proto.
 *
 * Ownership: every message these functions build is heap-owned all the way down (strings,
 * sub-messages, arrays), so one protobuf_c_message_free_unpacked(&msg->base, NULL) releases it,
 * exactly like a message that came off the wire. JSON text they return is malloc'd (free()). */
#ifndef ZTRAIN_JOB_PROTO_H
#define ZTRAIN_JOB_PROTO_H

#include "daemon/event_store.h"
#include "daemon/job_manager.h"
#include "ztrain.pb-c.h"
#include "ztrain/status.h"

/* Reads job-spec JSON text into a JobSpec. Keys and value types are checked here, because a
 * JobSpec cannot carry what the proto does not know: an unknown key is ZT_ERR_INVALID
 * "SOURCE: unknown key 'model.n_embed' (did you mean 'model.n_embd'?)". Values are otherwise
 * left for the server to judge, except that a zero the proto would read as "the default" (a
 * world_size or n_layer of 0) is refused here rather than silently replaced.
 *
 * "deepspeed" is an object (sent as its JSON text) or a path to a DeepSpeed config file, read
 * relative to base_dir and sent unchanged; with base_dir NULL a path is an error, so text that
 * came from elsewhere (a server's stored spec, an HTTP body) never makes this code read a file;
 * it also maps an empty string to "unset" instead of refusing it, and takes an integer as the
 * proto3 JSON mapping also writes one, a decimal string ("3000000000"): an HTTP body is that
 * mapping's JSON. `source` names the text in messages ("job.json"). */
zt_status zt_job_proto_spec_from_json(const char *json_text, const char *source,
                                      const char *base_dir, Ztrain__V1__JobSpec **out);

/* A JobSpec as job-spec JSON text for the job manager: zero or empty fields are left out so
 * the defaults apply, and "deepspeed" is the object parsed from deepspeed_json, which must be a
 * JSON object (ZT_ERR_INVALID naming "spec.deepspeed_json" otherwise; ZT_ERR_FORMAT with line
 * and column for text that is not JSON). A NULL spec is the empty object. */
zt_status zt_job_proto_spec_to_json(const Ztrain__V1__JobSpec *spec, char **json_text);

/* A Job message for a job manager snapshot, spec included (parsed from info->spec_json; one that
 * does not map is an error naming the job). A loss or tokens/s still NaN is sent as NaN. now_ms
 * (the server's wall clock) ends run_duration of a job still running. */
zt_status zt_job_proto_job_from_info(const zt_job_info *info, int64_t now_ms,
                                     Ztrain__V1__Job **out);

/* A heap-owned Timestamp for milliseconds since the epoch, or NULL (the field unset) for 0 or
 * less, which the job manager uses for "not yet"; NULL with *ok false when out of memory. */
Google__Protobuf__Timestamp *zt_job_proto_time(int64_t unix_ms, bool *ok);
/* Milliseconds since the epoch of t; 0 when t is NULL (unset). */
int64_t zt_job_proto_time_ms(const Google__Protobuf__Timestamp *t);

/* A MetricRecord for one record of the job manager: every numeric value of r->json, keys in
 * the record's order; null and non-numeric values are left out. ZT_ERR_FORMAT when r->json is
 * not a JSON object. */
zt_status zt_job_proto_record_from_metric(const zt_metric_record *r, Ztrain__V1__MetricRecord **out);

zt_status zt_job_proto_log_from_line(const zt_log_line *l, Ztrain__V1__LogLine **out);
/* An anomaly event (event_store.h) as its message; free with protobuf_c_message_free_unpacked. */
zt_status zt_job_proto_anomaly_from(const zt_anomaly *a, Ztrain__V1__AnomalyEvent **out);

/* A webhook delivery attempt (event_store.h) as its message; free as above. */
zt_status zt_job_proto_delivery_from(const zt_delivery *d, Ztrain__V1__WebhookDelivery **out);

/* The ListCheckpointsResponse of job job_id's checkpoint directory (zt_ckpt_list_dir: the
 * entries, complete or not, sorted by step, and what `latest` names), as ListCheckpoints and
 * the HTTP /checkpoints route both answer. Jobs may share a directory: an entry whose meta.json
 * records another job as its writer is left out, and so is `latest` when it names one; entries
 * that record none are shown to every job. Free as above. */
zt_status zt_job_proto_checkpoints(const char *job_id, const char *checkpoint_dir,
                                   Ztrain__V1__ListCheckpointsResponse **out);

/* Name of a proto JobState ("RUNNING"); "UNSPECIFIED" for 0. */
const char *zt_job_proto_state_name(Ztrain__V1__JobState s);
/* The state named by s ("running", "RUNNING" or "JOB_STATE_RUNNING"), or UNSPECIFIED. */
Ztrain__V1__JobState zt_job_proto_state_parse(const char *s);

#endif
