/* Tests for the choice of transport (zt_comm_choose, zt_comm_for_nodes in ztrain/comm.h): every
 * launcher's way of saying where the ranks run, the job's "comm" and ZTRAIN_COMM over it, and a
 * bad ZTRAIN_COMM refused naming it. The expected choices follow the header's rules. */
#define _GNU_SOURCE /* setenv; before any header */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/comm.h"

static const char *const vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                   "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                   "SLURM_NNODES", "SLURM_NTASKS_PER_NODE",
                                   "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                   "SLURM_NODEID", "ZTRAIN_COMM", "MASTER_ADDR", NULL};

/* Clears the launcher variables, sets "NAME=value" entries, and returns the choice for ranks on
 * GPUs (cuda, with gpus visible) or on CPUs. */
static const char *choose_on(zt_comm_choice job, const char *const *set, bool cuda, int gpus,
                             char *why, size_t cap) {
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
    for (int i = 0; set[i]; i++) {
        char name[64];
        const char *eq = strchr(set[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - set[i]), set[i]);
        setenv(name, eq + 1, 1);
    }
    zt_dist_info d;
    if (zt_dist_from_env(&d) != ZT_OK)
        return zt_last_error();
    const char *name = NULL;
    zt_status st = cuda ? zt_comm_choose_on(&d, job, true, gpus, &name, why, cap)
                        : zt_comm_choose(&d, job, &name, why, cap);
    if (st != ZT_OK)
        return zt_last_error();
    return name;
}

static const char *choose(zt_comm_choice job, const char *const *set, char *why, size_t cap) {
    return choose_on(job, set, false, 0, why, cap);
}

int main(void) {
    char why[256];
    const char *torchrun_one[] = {"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1",
                                  "LOCAL_WORLD_SIZE=4", NULL};
    const char *torchrun_two[] = {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1",
                                  "LOCAL_WORLD_SIZE=2", NULL};
    const char *kubeflow[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=job-master-0", NULL};
    const char *slurm_two[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_LOCALID=0",
                               "SLURM_NNODES=2", "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                               "SLURM_NODEID=1", NULL};
    const char *slurm_one[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_LOCALID=2",
                               "SLURM_NNODES=1", "SLURM_STEP_TASKS_PER_NODE=4", NULL};
    const char *s = choose(ZT_COMM_AUTO, torchrun_one, why, sizeof why);
    CHECK(strcmp(s, "shm") == 0 && strstr(why, "all 4 ranks"), "%s (%s)", s, why);
    s = choose(ZT_COMM_AUTO, torchrun_two, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0 && strstr(why, "2 of the 4 ranks"), "%s (%s)", s, why);
    s = choose(ZT_COMM_AUTO, kubeflow, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0 && strstr(why, "1 of the 2 ranks"), "%s (%s)", s, why);
    s = choose(ZT_COMM_AUTO, slurm_two, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0, "%s (%s)", s, why);
    s = choose(ZT_COMM_AUTO, slurm_one, why, sizeof why);
    CHECK(strcmp(s, "shm") == 0, "%s (%s)", s, why);
    /* An empty WORLD_SIZE or RANK is unset, as zt_dist_from_env reads it: Slurm's variables
     * describe the ranks, and its SLURM_NNODES counts. */
    const char *slurm_two_empty[] = {"WORLD_SIZE=", "RANK=", "SLURM_PROCID=0", "SLURM_NTASKS=2",
                                     "SLURM_LOCALID=0", "SLURM_NNODES=2", "SLURM_NODEID=0",
                                     "SLURM_NTASKS_PER_NODE=2", NULL};
    s = choose(ZT_COMM_AUTO, slurm_two_empty, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0 && strstr(why, "SLURM_NNODES=2"), "%s (%s)", s, why);
    /* An empty ZTRAIN_COMM is unset too: the job's choice stands. */
    const char *env_empty[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "ZTRAIN_COMM=",
                               NULL};
    s = choose(ZT_COMM_GLOO, env_empty, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0 && strstr(why, "\"comm\""), "%s (%s)", s, why);

    /* The job's choice wins over auto, ZTRAIN_COMM over the job's; ZTRAIN_COMM=auto defers. */
    s = choose(ZT_COMM_GLOO, torchrun_one, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0 && strstr(why, "\"comm\""), "%s (%s)", s, why);
    s = choose(ZT_COMM_SHM, torchrun_two, why, sizeof why);
    CHECK(strcmp(s, "shm") == 0, "%s (%s)", s, why);
    const char *env_gloo[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
                              "ZTRAIN_COMM=gloo", NULL};
    s = choose(ZT_COMM_SHM, env_gloo, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0 && strstr(why, "ZTRAIN_COMM"), "%s (%s)", s, why);
    const char *env_auto[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=1",
                              "ZTRAIN_COMM=auto", NULL};
    s = choose(ZT_COMM_AUTO, env_auto, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0, "%s (%s)", s, why);
    const char *env_bad[] = {"RANK=0", "WORLD_SIZE=2", "ZTRAIN_COMM=mpi", NULL};
    s = choose(ZT_COMM_AUTO, env_bad, why, sizeof why);
    CHECK(strstr(s, "ZTRAIN_COMM='mpi' must be \"auto\", \"shm\", \"gloo\" or \"nccl\""), "%s", s);

    /* Ranks on GPUs: NCCL when each rank of a host has a GPU of its own, on one host or several
     * (Kubeflow: one rank per pod); a host transport, staging, when ranks must share one. */
    s = choose_on(ZT_COMM_AUTO, torchrun_one, true, 4, why, sizeof why);
    CHECK(strcmp(s, "nccl") == 0 && strstr(why, "4 GPU(s)"), "%s (%s)", s, why);
    s = choose_on(ZT_COMM_AUTO, torchrun_two, true, 8, why, sizeof why);
    CHECK(strcmp(s, "nccl") == 0, "%s (%s)", s, why);
    s = choose_on(ZT_COMM_AUTO, kubeflow, true, 1, why, sizeof why);
    CHECK(strcmp(s, "nccl") == 0, "%s (%s)", s, why);
    s = choose_on(ZT_COMM_AUTO, torchrun_one, true, 1, why, sizeof why);
    CHECK(strcmp(s, "shm") == 0 && strstr(why, "4 rank(s) share 1 GPU(s)"), "%s (%s)", s, why);
    s = choose_on(ZT_COMM_AUTO, torchrun_two, true, 1, why, sizeof why);
    CHECK(strcmp(s, "gloo") == 0 && strstr(why, "staged through host memory"), "%s (%s)", s,
          why);
    s = choose_on(ZT_COMM_SHM, torchrun_one, true, 4, why, sizeof why);
    CHECK(strcmp(s, "shm") == 0, "the job's shm on GPUs: %s (%s)", s, why);
    s = choose(ZT_COMM_NCCL, torchrun_one, why, sizeof why);
    CHECK(strcmp(s, "nccl") == 0 && strstr(why, "\"comm\""), "%s (%s)", s, why);
    const char *env_nccl[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
                              "ZTRAIN_COMM=nccl", NULL};
    s = choose(ZT_COMM_AUTO, env_nccl, why, sizeof why);
    CHECK(strcmp(s, "nccl") == 0 && strstr(why, "ZTRAIN_COMM"), "%s (%s)", s, why);

    zt_comm_choice c = ZT_COMM_SHM;
    CHECK(zt_comm_choice_parse("nccl", &c) && c == ZT_COMM_NCCL, "parse nccl");
    CHECK(strcmp(zt_comm_for_nodes(ZT_COMM_NCCL, 2), "nccl") == 0, "nccl, 2 nodes");
    CHECK(zt_comm_choice_parse("gloo", &c) && c == ZT_COMM_GLOO, "parse gloo");
    CHECK(!zt_comm_choice_parse("Gloo", &c) && c == ZT_COMM_GLOO, "parse is exact");
    CHECK(strcmp(zt_comm_for_nodes(ZT_COMM_AUTO, 1), "shm") == 0, "auto, 1 node");
    CHECK(strcmp(zt_comm_for_nodes(ZT_COMM_AUTO, 3), "gloo") == 0, "auto, 3 nodes");
    CHECK(strcmp(zt_comm_for_nodes(ZT_COMM_SHM, 3), "shm") == 0, "shm, 3 nodes");
    CHECK(strcmp(zt_comm_for_nodes(ZT_COMM_GLOO, 1), "gloo") == 0, "gloo, 1 node");
    return check_summary("test_comm_select");
}
