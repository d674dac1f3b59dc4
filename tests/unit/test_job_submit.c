/* The job manager's admission under concurrent submits (service/daemon/job_manager.c), called from many
 * threads at once as its header allows: --max-jobs is never exceeded, one idempotency key makes
 * one job, which a submit with another spec does not get, and every job taken can be found by its
 * id, and a refused spec takes no id (they stay dense). Ranks are a stand-in worker that sleeps, so that every accepted job stays queued or running
 * while the submits race. The counts are checked against the limit and the threads' own tally. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tiny_models.h"
#include "api/api_error.h"
#include "daemon/job_manager.h"
#include "ztrain/backend.h"

#define THREADS 16
#define MAX_JOBS 3
#define ROUNDS 10

static const char spec_fmt[] =
    "{\"name\": \"%s\", \"world_size\": 1, \"device\": \"cpu\","
    " \"model\": " TINY_GPT2_1L ", \"data\": {\"train\": \"train.txt\"},"
    " \"train\": {\"max_steps\": %d}, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}}}";

typedef struct {
    zt_jobs *jm;
    pthread_barrier_t *start;
    char spec[1024];
    const char *key;
    zt_status status;
    char id[32];
    char message[512];
} submitter;

static void *submit_one(void *arg) {
    submitter *s = arg;
    zt_job_info info;
    pthread_barrier_wait(s->start);
    s->status = zt_jobs_submit(s->jm, s->spec, s->key, &info);
    if (s->status == ZT_OK) {
        snprintf(s->id, sizeof s->id, "%s", info.id);
        zt_job_info_free(&info);
    } else {
        snprintf(s->message, sizeof s->message, "%s", zt_last_error());
    }
    return NULL;
}

/* Runs THREADS submits at once, all with `key` (NULL: none): the even ones ask for steps_a
 * steps, the odd ones for steps_b. */
static void race(zt_jobs *jm, submitter *subs, const char *key, int steps_a, int steps_b) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        char name[32];
        snprintf(name, sizeof name, key ? "keyed" : "job%d", i);
        subs[i] = (submitter){.jm = jm, .start = &start, .key = key};
        snprintf(subs[i].spec, sizeof subs[i].spec, spec_fmt, name, i % 2 ? steps_b : steps_a);
        pthread_create(&t[i], NULL, submit_one, &subs[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
}

static int live(zt_jobs *jm) {
    int count[ZT_JOB_CANCELLED + 1];
    zt_jobs_count_states(jm, count);
    return count[ZT_JOB_QUEUED] + count[ZT_JOB_STARTING] + count[ZT_JOB_RUNNING] +
           count[ZT_JOB_STOPPING];
}

static zt_jobs *open_manager_with(const char *dir, int max_jobs, const zt_slurm_config *slurm) {
    char path[3][PATH_MAX + 32];
    snprintf(path[0], sizeof path[0], "%s/data-%d", dir, max_jobs);
    snprintf(path[1], sizeof path[1], "%s/runs-%d", dir, max_jobs);
    snprintf(path[2], sizeof path[2], "%s/state-%d.db", dir, max_jobs);
    mkdir(path[0], 0755);
    char train[PATH_MAX + 64];
    snprintf(train, sizeof train, "%s/train.txt", path[0]);
    static const char text[] = "It was the best of times, it was the worst of times. ";
    check_write_file(train, text, sizeof text - 1);
    zt_jobs_config cfg = {.data_root = path[0], .runs_root = path[1], .db_path = path[2],
                          .worker_path = (char *)check_tmp_path("sleeper"), .max_ranks = 1,
                          .max_world_size = 1, .max_jobs = max_jobs, .threads_per_rank = 1,
                          .default_grace_s = 5, .slurm = slurm};
    zt_jobs *jm = NULL;
    zt_status s = zt_jobs_create(&jm, &cfg);
    if (s != ZT_OK) {
        fprintf(stderr, "zt_jobs_create: %s\n", zt_last_error());
        exit(2);
    }
    return jm;
}

static zt_jobs *open_manager(const char *dir, int max_jobs) {
    return open_manager_with(dir, max_jobs, NULL);
}

/* Cancels every job and waits until none is queued or running, so that the next round starts
 * from an empty server and zt_jobs_destroy has no queue to drain. */
/* Every job, newest first (the manager lists them in pages). */
static void all_jobs(zt_jobs *jm, zt_job_info **jobs, int *n) {
    bool more;
    if (zt_jobs_list(jm, 0, NULL, 1 << 20, jobs, n, &more) != ZT_OK) {
        fprintf(stderr, "test_job_submit: %s\n", zt_last_error());
        exit(2);
    }
}

static void cancel_all(zt_jobs *jm) {
    zt_job_info *jobs;
    int n;
    all_jobs(jm, &jobs, &n);
    for (int i = 0; i < n; i++) {
        zt_jobs_cancel(jm, jobs[i].id, true, 0, NULL);
        zt_job_info_free(&jobs[i]);
    }
    free(jobs);
    for (int waited = 0; live(jm) > 0 && waited < 3000; waited++)
        usleep(10000);
    if (live(jm) == 0) {
        check_count++;
        return;
    }
    CHECK(false, "%d jobs still live 30 s after a force-cancel", live(jm));
    all_jobs(jm, &jobs, &n);
    for (int i = 0; i < n; i++) {
        if (!zt_job_state_terminal(jobs[i].state))
            fprintf(stderr, "  %s: %s (%s), rank 0 pid %d%s\n", jobs[i].id,
                    zt_job_state_name(jobs[i].state), jobs[i].reason, jobs[i].ranks[0].pid,
                    jobs[i].ranks[0].running ? " running" : "");
        zt_job_info_free(&jobs[i]);
    }
    free(jobs);
}

/* More submits than --max-jobs at once: exactly MAX_JOBS are taken, the rest are told why. The
 * race is run a few times, since two cores do not always interleave the threads the same way. */
static void check_max_jobs(const char *dir) {
    zt_jobs *jm = open_manager(dir, MAX_JOBS);
    for (int round = 0; round < ROUNDS; round++) {
        submitter subs[THREADS];
        race(jm, subs, NULL, 1000000, 1000000);
        int ok = 0;
        for (int i = 0; i < THREADS; i++) {
            if (subs[i].status == ZT_OK) {
                /* Numbers are taken in one order and jobs inserted in another: each must still
                 * be found by its id. */
                zt_job_info info;
                zt_status found = zt_jobs_get(jm, subs[i].id, &info);
                CHECK(found == ZT_OK, "round %d: job %s was taken but is not found: %s", round,
                      subs[i].id, zt_last_error());
                if (found == ZT_OK)
                    zt_job_info_free(&info);
                ok++;
                continue;
            }
            CHECK(subs[i].status == ZT_ERR_LIMIT, "submit %d: %s", i, subs[i].message);
            CHECK(strstr(subs[i].message, "3 queued or running jobs") != NULL, "%s",
                  subs[i].message);
        }
        CHECK(ok == MAX_JOBS, "round %d: %d of %d concurrent submits were taken with --max-jobs "
              "%d", round, ok, THREADS, MAX_JOBS);
        CHECK(live(jm) == MAX_JOBS, "round %d: %d jobs queued or running, limit %d", round,
              live(jm), MAX_JOBS);
        cancel_all(jm);
    }
    zt_jobs_destroy(jm);
}

/* One key, two specs, submitted at once: one job; every submit of its spec gets it, every
 * submit of the other spec is a conflict naming the key and the job. */
static void check_one_key(const char *dir) {
    zt_jobs *jm = open_manager(dir, 100);
    submitter subs[THREADS];
    race(jm, subs, "retry-7", 1000000, 2000000);
    const char *winner = NULL;
    int winner_parity = -1;
    for (int i = 0; i < THREADS; i++)
        if (subs[i].status == ZT_OK && !winner) {
            winner = subs[i].id;
            winner_parity = i % 2;
        }
    CHECK(winner != NULL, "no submit was taken");
    for (int i = 0; winner && i < THREADS; i++) {
        if (i % 2 == winner_parity) {
            CHECK(subs[i].status == ZT_OK && strcmp(subs[i].id, winner) == 0,
                  "submit %d with the winning spec: status %d, id %s (%s), want %s", i,
                  subs[i].status, subs[i].id, subs[i].message, winner);
        } else {
            CHECK(subs[i].status == ZT_ERR_CONFLICT, "submit %d with the other spec: status %d, "
                  "id %s", i, subs[i].status, subs[i].id);
            CHECK(strstr(subs[i].message, "retry-7") && strstr(subs[i].message, winner),
                  "the conflict names neither the key nor %s: %s", winner, subs[i].message);
        }
    }
    zt_job_info *jobs;
    int n;
    all_jobs(jm, &jobs, &n);
    CHECK(n == 1, "%d jobs for one idempotency key", n);
    for (int i = 0; i < n; i++)
        zt_job_info_free(&jobs[i]);
    free(jobs);
    cancel_all(jm);
    zt_jobs_destroy(jm);
}

/* Issue 27, defect 11: whether a host has GPUs is the business of what runs the ranks. A daemon
 * that runs them itself (the local launcher) with no GPUs to give refuses a cuda job at submit,
 * saying so; one that hands them to Slurm takes it, whatever GPUs its own host has. Without the
 * CUDA backend in the build both refuse it, naming the build. */
static void check_gpu_jobs(const char *dir) {
    static const char spec[] =
        "{\"name\": \"gpu\", \"world_size\": 1, \"device\": \"cuda\","
        " \"model\": " TINY_GPT2_1L ", \"data\": {\"train\": \"train.txt\"},"
        " \"train\": {\"max_steps\": 1}, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1,"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}}}";
    zt_slurm_config slurm = {.srun = "/bin/false", .scancel = "/bin/true",
                             .metrics_host = "127.0.0.1"};
    for (int use_slurm = 0; use_slurm < 2; use_slurm++) {
        zt_jobs *jm = open_manager_with(dir, 10 + use_slurm, use_slurm ? &slurm : NULL);
        zt_job_info info;
        zt_status s = zt_jobs_submit(jm, spec, NULL, &info);
        const char *msg = s == ZT_OK ? "" : zt_last_error();
        if (!zt_backend_available(ZT_DEVICE_CUDA))
            CHECK(s != ZT_OK && strstr(msg, "device \"cuda\"") && strstr(msg, "-DZT_CUDA=ON"),
                  "%s launcher, no CUDA build: %s", use_slurm ? "slurm" : "local", msg);
        else if (use_slurm)
            CHECK(s == ZT_OK, "the slurm launcher takes a cuda job on a host without GPUs: %s",
                  msg);
        else
            CHECK(s == ZT_ERR_PRECONDITION && strstr(msg, "device \"cuda\"") &&
                      strstr(msg, "no GPUs to give"),
                  "the local launcher with no GPUs refuses a cuda job at submit: %s", msg);
        if (s == ZT_OK)
            zt_job_info_free(&info);
        cancel_all(jm);
        zt_jobs_destroy(jm);
    }
}

/* Ids stay dense: a refused spec takes no number, alone or racing accepted ones. Alternate
 * submits at once ask for a negative max_steps (refused, naming it); the jobs taken must be
 * exactly the next numbers after the last one, job-(last + 1) .. job-(last + taken). */
static void check_dense_ids(const char *dir) {
    zt_jobs *jm = open_manager(dir, THREADS * ROUNDS + 8);
    int last = 0;
    for (int round = 0; round < ROUNDS; round++) {
        submitter subs[THREADS];
        race(jm, subs, NULL, 1000000, -5);
        bool taken[THREADS + 1] = {false};
        int ok = 0;
        for (int i = 0; i < THREADS; i++) {
            if (subs[i].status != ZT_OK) {
                CHECK(i % 2 == 1 && subs[i].status == ZT_ERR_INVALID &&
                      strstr(subs[i].message, "max_steps"), "round %d, submit %d: %s", round,
                      i, subs[i].message);
                continue;
            }
            int number = atoi(subs[i].id + strlen("job-"));
            CHECK(i % 2 == 0 && number > last && number <= last + THREADS / 2 &&
                  !taken[number - last], "round %d: submit %d got %s after job-%06d", round, i,
                  subs[i].id, last);
            if (number > last && number <= last + THREADS)
                taken[number - last] = true;
            ok++;
        }
        for (int k = 1; k <= ok; k++)
            CHECK(taken[k], "round %d: %d jobs taken but job-%06d is not one of them", round, ok,
                  last + k);
        last += ok;
        cancel_all(jm);
    }
    /* One at a time: accepted, refused, accepted are two consecutive ids. */
    submitter one[3];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 1);
    for (int i = 0; i < 3; i++) {
        one[i] = (submitter){.jm = jm, .start = &start};
        snprintf(one[i].spec, sizeof one[i].spec, spec_fmt, "one", i == 1 ? -5 : 1000000);
        submit_one(&one[i]);
    }
    pthread_barrier_destroy(&start);
    char want[2][32];
    snprintf(want[0], sizeof want[0], "job-%06d", last + 1);
    snprintf(want[1], sizeof want[1], "job-%06d", last + 2);
    CHECK(one[0].status == ZT_OK && one[1].status == ZT_ERR_INVALID && one[2].status == ZT_OK &&
          strcmp(one[0].id, want[0]) == 0 && strcmp(one[2].id, want[1]) == 0,
          "accepted, refused, accepted: %s, %s (%s), %s; want %s and %s", one[0].id,
          one[1].status == ZT_OK ? one[1].id : "refused", one[1].message, one[2].id, want[0],
          want[1]);
    cancel_all(jm);
    zt_jobs_destroy(jm);
}

int main(void) {
    const char *dir = check_tmpdir_create("zt-job-submit");
    static const char sleeper[] = "#!/bin/sh\nexec sleep 60\n";
    check_write_file(check_tmp_path("sleeper"), sleeper, sizeof sleeper - 1);
    chmod(check_tmp_path("sleeper"), 0755);
    check_max_jobs(dir);
    check_one_key(dir);
    check_gpu_jobs(dir);
    check_dense_ids(dir);
    check_tmpdir_remove();
    return check_summary("test_job_submit");
}
