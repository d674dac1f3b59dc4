/* Fuzz target: every reader of job-spec JSON text. The input is a job spec as a client would
 * send it, given to
 *   zt_job_spec_parse              the engine's parser (`ztrain run`, the workers),
 *   zt_spec_check                  ztraind's SubmitJob check: paths resolved inside the server's
 *                                  data and runs roots, then the engine's parser,
 *   zt_job_proto_spec_from_json    the CLI's mapping of a job file to a JobSpec message.
 * The roots are temporary directories holding a few data files and a symbolic link that leads
 * out of the data root. What ztraind accepts is checked against spec_check.h's promise: every
 * path of the parsed spec lies inside its root and climbs out with no "..". */
#include <limits.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "api/job_proto.h"
#include "daemon/spec_check.h"
#include "ztrain/job_spec.h"

static char data_root[PATH_MAX], runs_root[PATH_MAX];

static void make_roots(void) {
    char path[PATH_MAX + 64];
    const char *tmp = fuzz_tmpdir();
    snprintf(path, sizeof path, "%s/data", tmp);
    FUZZ_CHECK(mkdir(path, 0700) == 0, "cannot make %s", path);
    FUZZ_CHECK(realpath(path, data_root) != NULL, "cannot resolve %s", path);
    snprintf(path, sizeof path, "%s/runs", tmp);
    FUZZ_CHECK(mkdir(path, 0700) == 0, "cannot make %s", path);
    FUZZ_CHECK(realpath(path, runs_root) != NULL, "cannot resolve %s", path);
    snprintf(path, sizeof path, "%s/outside", tmp);
    FUZZ_CHECK(mkdir(path, 0700) == 0, "cannot make %s", path);
    snprintf(path, sizeof path, "%s/outside/secret.bin", tmp);
    fuzz_write_file(path, "secret", 6);
    static const char *const files[] = {"train.txt", "val.txt", "sub/more.txt", "init.safetensors",
                                        "ds.json"};
    snprintf(path, sizeof path, "%s/sub", data_root);
    FUZZ_CHECK(mkdir(path, 0700) == 0, "cannot make %s", path);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", data_root, files[i]);
        fuzz_write_file(path, "{\"train_batch_size\": 4}", 23);
    }
    /* data/escape -> ../outside: a path through it resolves outside the data root. */
    snprintf(path, sizeof path, "%s/escape", data_root);
    FUZZ_CHECK(symlink("../outside", path) == 0, "cannot link %s", path);
    snprintf(path, sizeof path, "%s/job-000001", runs_root);
    FUZZ_CHECK(mkdir(path, 0700) == 0, "cannot make %s", path);
}

/* A path ztraind accepted: inside root (or root itself) and with no ".." component. */
static void check_inside(const char *what, const char *path, const char *root) {
    if (!path)
        return;
    size_t n = strlen(root);
    FUZZ_CHECK(strncmp(path, root, n) == 0 && (path[n] == '/' || path[n] == '\0'),
               "%s '%s' is outside %s", what, path, root);
    for (const char *p = path; (p = strstr(p, "/..")); p += 3)
        FUZZ_CHECK(p[3] != '/' && p[3] != '\0', "%s '%s' climbs with ..", what, path);
}

static void server_check(const char *text) {
    zt_spec_limits lim = {.data_root = data_root, .runs_root = runs_root, .max_world_size = 8,
                          .max_ranks = 8, .max_nodes = 1};
    char *resolved;
    zt_job_spec job;
    if (zt_spec_check(text, "job-000002", &lim, &resolved, &job) != ZT_OK)
        return;
    check_inside("data.train", job.data.train, data_root);
    check_inside("data.val", job.data.val, data_root);
    check_inside("model.init_from", job.model.init_from, data_root);
    check_inside("train.checkpoint_dir", job.train.checkpoint_dir, runs_root);
    if (job.ds.zero.offload_optimizer.device == ZT_OFFLOAD_NVME)
        check_inside("offload_optimizer.nvme_path", job.ds.zero.offload_optimizer.nvme_path,
                     runs_root);
    if (job.ds.zero.offload_param.device == ZT_OFFLOAD_NVME)
        check_inside("offload_param.nvme_path", job.ds.zero.offload_param.nvme_path, runs_root);
    FUZZ_CHECK(job.world_size >= 1 && job.world_size <= lim.max_world_size,
               "world_size %d accepted", job.world_size);
    free(resolved);
    zt_job_spec_free(&job);
}

static void engine_parse(const char *text) {
    zt_job_spec job;
    if (zt_job_spec_parse(&job, text, "fuzz.json", data_root) != ZT_OK)
        return;
    FUZZ_CHECK(job.world_size >= 1 && job.nodes >= 1 && job.nodes <= job.world_size,
               "world_size %d, nodes %d", job.world_size, job.nodes);
    FUZZ_CHECK(zt_model_spec_validate(&job.model, "fuzz.json") == ZT_OK,
               "a parsed model fails validation: %s", zt_last_error());
    zt_job_spec_free(&job);
}

static void cli_mapping(const char *text) {
    Ztrain__V1__JobSpec *spec;
    if (zt_job_proto_spec_from_json(text, "fuzz.json", data_root, &spec) != ZT_OK)
        return;
    char *json;
    if (zt_job_proto_spec_to_json(spec, &json) == ZT_OK)
        free(json);
    protobuf_c_message_free_unpacked(&spec->base, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!data_root[0])
        make_roots();
    char *text = fuzz_cstr(data, size);
    engine_parse(text);
    server_check(text);
    cli_mapping(text);
    free(text);
    return 0;
}
