/* zt_job_check JOB.json [RUN_DIR]: validates a job as `ztrain run` does before any rank starts and
 * prints what its DeepSpeed config resolved to and its warnings on stderr, then (with RUN_DIR)
 * writes the effective config there. Exit 0, or 1 with "ztrain: <message>" on stderr. The config
 * corpus test (tests/cli/test_config_corpus.py) checks configs it need not run with it. */
#include <stdio.h>

#include "ztrain/job_spec.h"

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: zt_job_check JOB.json [RUN_DIR]\n");
        return 2;
    }
    zt_job_spec job;
    if (zt_job_spec_load(&job, argv[1]) != ZT_OK) {
        fprintf(stderr, "ztrain: %s\n", zt_last_error());
        return 1;
    }
    zt_status s = zt_job_spec_check_files(&job, argv[1]);
    if (s == ZT_OK)
        zt_job_spec_print_notes(&job, stderr);
    if (s == ZT_OK && argc == 3)
        s = zt_job_spec_write_effective(&job, argv[2]);
    if (s != ZT_OK)
        fprintf(stderr, "ztrain: %s\n", zt_last_error());
    zt_job_spec_free(&job);
    return s == ZT_OK ? 0 : 1;
}
