/* The Slurm launcher's reading of srun's output (service/ranks/slurm_launch.c), on lines copied from
 * Slurm 22.05.8's srun and slurmstepd as they ran the two-node test cluster of tests/slurm/, and
 * the srun and scancel command lines it builds. No cluster needed. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ranks/slurm_launch.h"

static void labels(void) {
    int rank = -1;
    const char *text = NULL;
    CHECK(zt_slurm_split_label("3: boom", 4, &rank, &text) && rank == 3 &&
          strcmp(text, "boom") == 0);
    CHECK(zt_slurm_split_label(" 7: step 10 loss 2.5", 12, &rank, &text) && rank == 7 &&
          strcmp(text, "step 10 loss 2.5") == 0);
    CHECK(zt_slurm_split_label("0:", 4, &rank, &text) && rank == 0 && strcmp(text, "") == 0,
          "an empty line of rank 0");
    CHECK(zt_slurm_split_label("0: slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT "
                               "2026-11-23T16:58:40 ***", 4, &rank, &text) && rank == 0);
    CHECK(!zt_slurm_split_label("4: out of range", 4, &rank, &text), "rank 4 of 4 is no label");
    CHECK(!zt_slurm_split_label("srun: error: n2: task 3: Exited with exit code 3", 4, &rank,
                                &text));
    CHECK(!zt_slurm_split_label("12:30 is a time", 100, &rank, &text));
}

static void task_exits(void) {
    zt_srun_line l;
    zt_slurm_parse_srun("srun: error: n2: task 3: Exited with exit code 3", &l);
    CHECK(l.kind == ZT_SRUN_TASK_EXIT && l.exit_code == 3 && l.signal == 0);
    CHECK_STR(l.host, "n2");
    CHECK_STR(l.tasks, "3");

    zt_slurm_parse_srun("srun: error: n1: task 1: Killed", &l);
    CHECK(l.kind == ZT_SRUN_TASK_EXIT && l.signal == SIGKILL, "signal %d", l.signal);
    CHECK_STR(l.host, "n1");

    zt_slurm_parse_srun("srun: error: n1: tasks 0-1: Terminated", &l);
    CHECK(l.kind == ZT_SRUN_TASK_EXIT && l.signal == SIGTERM);
    CHECK_STR(l.tasks, "0-1");

    zt_slurm_parse_srun("srun: error: n1: tasks 0-1: Exited with exit code 130", &l);
    CHECK(l.kind == ZT_SRUN_TASK_EXIT && l.exit_code == 130 && l.signal == 0);

    zt_slurm_parse_srun("srun: error: node7: task 5: Segmentation fault (core dumped)", &l);
    CHECK(l.kind == ZT_SRUN_TASK_EXIT && l.signal == SIGSEGV && l.core_dumped);

    zt_slurm_parse_srun("srun: error: n1: task 2: Something new", &l);
    CHECK(l.kind == ZT_SRUN_ERROR, "an unknown ending is not taken for a signal");

    int ids[8];
    CHECK(zt_slurm_task_ids("0-1,3", 4, ids, 8) == 3 && ids[0] == 0 && ids[1] == 1 && ids[2] == 3);
    CHECK(zt_slurm_task_ids("[2-3]", 4, ids, 8) == 2 && ids[0] == 2 && ids[1] == 3);
    CHECK(zt_slurm_task_ids("5", 4, ids, 8) == -1, "a task beyond the world size");
    CHECK(zt_slurm_task_ids("1-x", 4, ids, 8) == -1);
    CHECK(zt_slurm_task_ids("", 4, ids, 8) == -1);
}

static void scheduler_lines(void) {
    zt_srun_line l;
    zt_slurm_parse_srun("srun: job 3 queued and waiting for resources", &l);
    CHECK(l.kind == ZT_SRUN_QUEUED && l.job_id == 3);
    zt_slurm_parse_srun("srun: job 3 has been allocated resources", &l);
    CHECK(l.kind == ZT_SRUN_ALLOCATED && l.job_id == 3);
    zt_slurm_parse_srun("srun: error: Node failure on n2", &l);
    CHECK(l.kind == ZT_SRUN_NODE_FAIL);
    CHECK_STR(l.host, "n2");
    zt_slurm_parse_srun("srun: error: Unable to allocate resources: Requested node configuration "
                        "is not available", &l);
    CHECK(l.kind == ZT_SRUN_ERROR);
    zt_slurm_parse_srun("srun: launch/slurm: _step_signal: Terminating StepId=2.0", &l);
    CHECK(l.kind == ZT_SRUN_OTHER);
    zt_slurm_parse_srun("srun: Force Terminated StepId=2.0", &l);
    CHECK(l.kind == ZT_SRUN_OTHER);

    zt_slurm_parse_task("slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT "
                        "2026-11-23T16:58:40 ***", &l);
    CHECK(l.kind == ZT_SRUN_CANCELLED && l.job_id == 7 && l.due[0] == '\0');
    CHECK_STR(l.host, "n1");
    zt_slurm_parse_task("slurmstepd-n1: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-23T17:00:51 "
                        "DUE TO TIME LIMIT ***", &l);
    CHECK(l.kind == ZT_SRUN_CANCELLED && l.job_id == 12);
    CHECK_STR(l.due, "TIME LIMIT");
    zt_slurm_parse_task("slurmstepd-n2: error: *** STEP 9.0 ON n2 CANCELLED AT 2026-11-23T17:00:51 "
                        "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", &l);
    CHECK(l.kind == ZT_SRUN_CANCELLED);
    CHECK_STR(l.due, "NODE FAILURE");
    zt_slurm_parse_task("*** STEP 9.0 ON n2 CANCELLED AT now *** printed by the job itself", &l);
    CHECK(l.kind == ZT_SRUN_OTHER, "a banner is slurmstepd's only");

    zt_slurm_parse_task("ztrain-worker: rank 2 of 4 on n2, pid 4242", &l);
    CHECK(l.kind == ZT_SRUN_PLACED && l.rank == 2 && l.pid == 4242);
    CHECK_STR(l.host, "n2");
    zt_slurm_parse_task("ztrain-worker: rank 2 of 4 on n2, pid 4242 and more", &l);
    CHECK(l.kind == ZT_SRUN_OTHER);
    zt_slurm_parse_task("step 10: loss 2.5", &l);
    CHECK(l.kind == ZT_SRUN_OTHER);
}

static void joined(char *const *argv, char *out, size_t size) {
    size_t n = 0;
    out[0] = '\0';
    for (char *const *a = argv; *a && n < size; a++)
        n += (size_t)snprintf(out + n, size - n, "%s%s", n ? " " : "", *a);
}

static void command_lines(void) {
    zt_slurm_config cfg = {.srun = "/usr/bin/srun", .scancel = "/usr/bin/scancel",
                           .setpriv = "/usr/bin/setpriv", .partition = "debug",
                           .metrics_host = "127.0.0.1"};
    zt_slurm_job job = {.cfg = &cfg, .job_name = "ztrain-0badf00d-job-000001", .nodes = 2,
                        .ntasks = 4, .cpus_per_task = 2};
    char *worker[] = {"/opt/ztrain-worker", "/runs/job-000001/job.json", "--out",
                      "/runs/job-000001", NULL};
    char **argv = zt_slurm_srun_argv(&job, worker);
    char line[2048];
    joined(argv, line, sizeof line);
    CHECK_STR(line, "/usr/bin/setpriv --pdeathsig TERM -- /usr/bin/srun "
                    "--job-name=ztrain-0badf00d-job-000001 --nodes=2 --ntasks=4 --label "
                    "--kill-on-bad-exit=0 --wait=0 --mpi=none --cpus-per-task=2 --partition=debug "
                    "/opt/ztrain-worker /runs/job-000001/job.json --out /runs/job-000001");
    zt_slurm_argv_free(argv);

    cfg.setpriv = NULL;
    cfg.partition = "";
    job.cpus_per_task = 0;
    argv = zt_slurm_srun_argv(&job, worker);
    CHECK_STR(argv[0], "/usr/bin/srun");
    joined(argv, line, sizeof line);
    CHECK(!strstr(line, "--partition") && !strstr(line, "--cpus-per-task"), "%s", line);
    zt_slurm_argv_free(argv);

    argv = zt_slurm_scancel_argv(&cfg, "ztrain-x-job-000002", "TERM", "RUNNING");
    joined(argv, line, sizeof line);
    CHECK_STR(line, "/usr/bin/scancel --signal=TERM --state=RUNNING --name=ztrain-x-job-000002");
    zt_slurm_argv_free(argv);
    argv = zt_slurm_scancel_argv(&cfg, "ztrain-x-job-000002", NULL, NULL);
    joined(argv, line, sizeof line);
    CHECK_STR(line, "/usr/bin/scancel --name=ztrain-x-job-000002");
    zt_slurm_argv_free(argv);
}

static void signal_names(void) {
    CHECK(zt_slurm_signal_from_text("Killed") == SIGKILL);
    CHECK(zt_slurm_signal_from_text("Terminated") == SIGTERM);
    CHECK(zt_slurm_signal_from_text("Aborted") == SIGABRT);
    CHECK(zt_slurm_signal_from_text("Bus error") == SIGBUS);
    CHECK(zt_slurm_signal_from_text("Exited") == 0);
}

int main(void) {
    labels();
    task_exits();
    scheduler_lines();
    command_lines();
    signal_names();
    return check_summary("test_slurm_lines");
}
