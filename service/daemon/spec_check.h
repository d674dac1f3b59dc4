/* Checking a job spec submitted to ztraind (job_manager.c's first step of SubmitJob). */
#ifndef ZTRAIN_SPEC_CHECK_H
#define ZTRAIN_SPEC_CHECK_H

#include <stdint.h>

#include "ztrain/job_spec.h"
#include "ztrain/status.h"

typedef struct {
    const char *data_root;    /* absolute and resolved: data.train, data.val, model.init_from */
    const char *runs_root;    /* absolute and resolved: train.checkpoint_dir, nvme_path */
    int max_world_size;
    int max_ranks;            /* a larger world_size could never start */
    int max_nodes;            /* 1: the ranks run on this host (the local launcher); 0: any */
    /* Admission (ztrain/admission.h); a 0 is no limit. */
    uint64_t max_rank_bytes;  /* --max-rank-memory */
    uint64_t max_job_bytes;   /* --max-job-memory */
    uint64_t host_bytes;      /* the memory of the host the ranks share (local launcher) */
    const char *host_name;    /* how messages call it: "this host's memory (MemTotal)" */
    uint64_t max_device_bytes; /* --max-device-memory: one rank of a "cuda" job on its GPU */
    uint64_t gpu_bytes;       /* the smallest GPU handed out (local launcher); 0: not judged */
    const char *gpu_name;     /* how messages call it */
    int gpus;                 /* GPUs the server hands out (--gpus); -1: not its to judge */
    const struct zt_webhook_policy_s *webhooks; /* what job webhooks may do; NULL: none */
} zt_spec_limits;

/* Resolves the spec's paths inside the roots (following symlinks; "..", absolute paths and
 * links that leave a root are refused; for a Hugging Face directory as model.init_from, so are
 * links in it to a config.json, an index or a shard outside the data root), sets train.checkpoint_dir to RUNS/<id>/ckpt when absent,
 * parses the result with zt_job_spec_parse, and admits it: a job whose estimated memory is above
 * a limit is refused (zt_admission_check's message names the estimate and the limit). On success *text is the resolved spec as JSON
 * (heap, the caller frees it) and *spec its parsed form (zt_job_spec_free). On failure nothing
 * needs freeing and zt_last_error() names the field: "data.train: '../x' is outside the server's
 * data root /data", "spec: model.n_embd (250) must be divisible by model.n_head (4)", or
 * DeepSpeed's own text. */
zt_status zt_spec_check(const char *spec_json, const char *id, const zt_spec_limits *lim,
                        char **text, zt_job_spec *spec);

#endif
