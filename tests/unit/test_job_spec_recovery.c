/* The job spec's keys for ztraind's recovery and forks: "max_restarts" (0..100, default 0) and
 * "fork_from" ({"job", "step"}, both required), and the messages for the usual mistakes. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ztrain/job_spec.h"

#define BASE "\"model\": {\"type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, " \
             "\"vocab_size\": 256, \"block_size\": 32}, \"data\": {\"train\": \"t.bin\"}, "    \
             "\"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2}"

static void err_at(int line, const char *json, const char *msg) {
    zt_job_spec job;
    zt_status s = zt_job_spec_parse(&job, json, "job.json", "/base");
    check_error_is(__FILE__, line, "job", json, s, ZT_ERR_INVALID, msg, false);
    if (s == ZT_OK)
        zt_job_spec_free(&job);
}
#define ERR(json, msg) err_at(__LINE__, json, msg)

static void test_defaults(void) {
    zt_job_spec job;
    zt_status s = zt_job_spec_parse(&job, "{" BASE "}", "job.json", "/base");
    CHECK(s == ZT_OK, "plain spec: %s", zt_last_error());
    if (s != ZT_OK)
        return;
    CHECK(job.max_restarts == 0, "max_restarts defaults to 0 (%d)", job.max_restarts);
    CHECK(job.fork_job == NULL, "no fork_from: fork_job is NULL");
    zt_job_spec_free(&job);
}

static void test_values(void) {
    zt_job_spec job;
    zt_status s = zt_job_spec_parse(&job, "{" BASE ", \"max_restarts\": 100, \"fork_from\": "
                                    "{\"job\": \"job-000007\", \"step\": 40}}", "job.json",
                                    "/base");
    CHECK(s == ZT_OK, "spec with both keys: %s", zt_last_error());
    if (s != ZT_OK)
        return;
    CHECK(job.max_restarts == 100, "max_restarts 100 (%d)", job.max_restarts);
    CHECK(job.fork_job && strcmp(job.fork_job, "job-000007") == 0, "fork_from.job (%s)",
          job.fork_job ? job.fork_job : "(null)");
    CHECK(job.fork_step == 40, "fork_from.step 40 (%lld)", (long long)job.fork_step);
    zt_job_spec_free(&job);
}

static void test_errors(void) {
    ERR("{" BASE ", \"max_restarts\": -1}",
        "job.json: key 'max_restarts' must be between 0 and 100, got -1");
    ERR("{" BASE ", \"max_restarts\": 101}",
        "job.json: key 'max_restarts' must be between 0 and 100, got 101");
    ERR("{" BASE ", \"max_restarts\": \"2\"}",
        "job.json: key 'max_restarts' must be an integer, got \"2\"");
    ERR("{" BASE ", \"fork_from\": \"job-000001\"}",
        "job.json: key 'fork_from' must be an object, got \"job-000001\"");
    ERR("{" BASE ", \"fork_from\": {\"job\": \"job-000001\"}}",
        "job.json: key 'fork_from.step' is required");
    ERR("{" BASE ", \"fork_from\": {\"step\": 4}}",
        "job.json: key 'fork_from.job' is required");
    ERR("{" BASE ", \"fork_from\": {\"job\": \"\", \"step\": 4}}",
        "job.json: key 'fork_from.job' must name a job (\"job-000042\")");
    ERR("{" BASE ", \"fork_from\": {\"job\": \"job-000001\", \"step\": -4}}",
        "job.json: key 'fork_from.step' must be >= 0, got -4");
}

int main(void) {
    test_defaults();
    test_values();
    test_errors();
    return check_summary("test_job_spec_recovery");
}
