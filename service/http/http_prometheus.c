/* GET /metrics (http_internal.h): the state and last reported numbers of the jobs not yet over
 * and of those that ended within the server's window (--metrics-window), in Prometheus' text
 * exposition format (version 0.0.4), one family per quantity, each sample labelled with the
 * job's id and name (the per-rank series, only for jobs not yet over, also with the rank). Every
 * job ever submitted would make a scrape grow without end, and each job id a series Prometheus
 * keeps: its guidance on label cardinality asks for bounded label sets. ztrain_jobs{state} still
 * counts every job; the history of the others stays in the API. A scrape copies a summary of
 * each job (zt_jobs_summaries), not its spec nor its history. */
#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"

/* The record keys /metrics reports beyond the job's step, loss and throughput: the value each
 * had at the job's last step. */
enum { K_LR, K_STEP_MS, K_TFLOPS, K_GRAD_NORM, K_SKIPPED, K_STRAGGLER, K_STRAGGLER_RATIO,
       K_COUNT };
static const char *const prom_keys[K_COUNT] = {
    "train/learning_rate", "perf/step_time_ms", "perf/tflops", "train/grad_norm",
    "train/skipped_steps", "perf/straggler_rank", "perf/straggler_ratio",
};

static double pv_world_size(const zt_job_summary *j) { return j->world_size; }
static double pv_step(const zt_job_summary *j) { return (double)j->step; }
static double pv_loss(const zt_job_summary *j) { return j->loss; }
static double pv_tps(const zt_job_summary *j) { return j->tokens_per_second; }
static double pv_lr(const zt_job_summary *j) { return j->values[K_LR]; }
static double pv_step_s(const zt_job_summary *j) { return j->values[K_STEP_MS] / 1e3; }
/* Prometheus names carry base units: FLOP/s, from the record's TFLOPS (10^12 FLOP/s). */
static double pv_flops(const zt_job_summary *j) { return j->values[K_TFLOPS] * 1e12; }
static double pv_gnorm(const zt_job_summary *j) { return j->values[K_GRAD_NORM]; }
static double pv_skipped(const zt_job_summary *j) { return j->values[K_SKIPPED]; }
static double pv_straggler(const zt_job_summary *j) { return j->values[K_STRAGGLER]; }
static double pv_straggler_ratio(const zt_job_summary *j) { return j->values[K_STRAGGLER_RATIO]; }

/* A family from a record key (key >= 0) has a sample while the job's last step has the key, NaN
 * where the record had null (a value that was not finite: a diverged gradient norm must show,
 * not vanish); the others have one while their value is known (not NaN). */
static const struct {
    const char *name, *type, *help;
    double (*value)(const zt_job_summary *);
    int key;
} prom_job_families[] = {
    {"ztrain_job_world_size", "gauge", "Ranks the job runs on.", pv_world_size, -1},
    {"ztrain_job_step", "gauge", "Last train/global_step the job reported.", pv_step, -1},
    {"ztrain_job_loss", "gauge", "Last training loss (train/loss).", pv_loss, -1},
    {"ztrain_job_tokens_per_second", "gauge", "Last training throughput in tokens per second.",
     pv_tps, -1},
    {"ztrain_job_learning_rate", "gauge", "Last learning rate (train/learning_rate).", pv_lr,
     K_LR},
    {"ztrain_job_step_time_seconds", "gauge", "Duration of the last logged step in seconds.",
     pv_step_s, K_STEP_MS},
    {"ztrain_job_flops_per_second", "gauge",
     "Last achieved model FLOP/s (perf/tflops times 10^12).", pv_flops, K_TFLOPS},
    {"ztrain_job_grad_norm", "gauge", "Last global gradient norm (train/grad_norm).", pv_gnorm,
     K_GRAD_NORM},
    {"ztrain_job_skipped_steps_total", "counter",
     "Optimizer steps skipped because of gradient overflow.", pv_skipped, K_SKIPPED},
    {"ztrain_job_straggler_rank", "gauge",
     "The rank with the longest compute time (step less communication) in the last logged step.",
     pv_straggler, K_STRAGGLER},
    {"ztrain_job_straggler_ratio", "gauge",
     "The straggler's compute time over the median rank's in the last logged step.",
     pv_straggler_ratio, K_STRAGGLER_RATIO},
};

/* The per-rank series (rank_figures.h), labelled with the rank; times in seconds as
 * Prometheus' conventions ask. The step's parts are one family with a phase label. */
static const struct {
    const char *name, *help, *phase;
    int figure;
    double per_unit;  /* the figure's units in the series' unit: ms per second, or 1 */
} prom_rank_families[] = {
    {"ztrain_rank_step_time_seconds", "The rank's last logged step, in seconds.", NULL,
     ZT_FIG_STEP_TIME, 1e3},
    {"ztrain_rank_step_phase_seconds",
     "The rank's last logged step by phase: data wait, forward, backward, optimizer step (each "
     "without communication) and communication; they add up to the step time.", "data",
     ZT_FIG_DATA, 1e3},
    {"ztrain_rank_step_phase_seconds", NULL, "fwd", ZT_FIG_FWD, 1e3},
    {"ztrain_rank_step_phase_seconds", NULL, "bwd", ZT_FIG_BWD, 1e3},
    {"ztrain_rank_step_phase_seconds", NULL, "step", ZT_FIG_STEP, 1e3},
    {"ztrain_rank_step_phase_seconds", NULL, "comm", ZT_FIG_COMM, 1e3},
    {"ztrain_rank_compute_seconds",
     "The rank's last logged step less its communication: what the other ranks wait for.", NULL,
     ZT_FIG_COMPUTE, 1e3},
    {"ztrain_rank_cpu_utilization",
     "Process CPU time over wall time in the last log interval (1 is one core busy).", NULL,
     ZT_FIG_CPU_UTIL, 1},
    {"ztrain_rank_resident_memory_bytes", "The rank's resident set (VmRSS).", NULL, ZT_FIG_RSS,
     1},
    {"ztrain_rank_peak_resident_memory_bytes", "The rank's largest resident set (VmHWM).", NULL,
     ZT_FIG_PEAK_RSS, 1},
    {"ztrain_rank_gpu_utilization", "Fraction of time the rank's GPU ran a kernel (NVML).",
     NULL, ZT_FIG_GPU_UTIL, 1},
    {"ztrain_rank_gpu_memory_used_bytes", "Memory in use on the rank's GPU (NVML).", NULL,
     ZT_FIG_GPU_MEMORY, 1},
    {"ztrain_rank_gpu_power_watts", "Power drawn by the rank's GPU (NVML).", NULL,
     ZT_FIG_GPU_POWER, 1},
    {"ztrain_rank_gpu_temperature_celsius", "Temperature of the rank's GPU (NVML).", NULL,
     ZT_FIG_GPU_TEMPERATURE, 1},
};
#define N_PROM_RANK_FAMILIES (sizeof prom_rank_families / sizeof prom_rank_families[0])
#define N_PROM_JOB_FAMILIES (sizeof prom_job_families / sizeof prom_job_families[0])

static void prom_family(zt_jbuf *b, const char *name, const char *type, const char *help) {
    zt_jbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value in the exposition format: backslash, double quote and newline escaped. */
static void prom_label_value(zt_jbuf *b, const char *v) {
    const char *run = v;
    for (const char *p = v; *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        if (!esc)
            continue;
        zt_jbuf_text(b, run, (size_t)(p - run));
        zt_jbuf_puts(b, esc);
        run = p + 1;
    }
    zt_jbuf_puts(b, run);
}

static void prom_job_labels(zt_jbuf *b, const zt_job_summary *j) {
    zt_jbuf_puts(b, "{job_id=\"");
    prom_label_value(b, j->id);
    zt_jbuf_puts(b, "\",job_name=\"");
    prom_label_value(b, j->name ? j->name : "");
    zt_jbuf_puts(b, "\"");
}

/* A sample value: JSON's number syntax is also valid exposition text, and the values JSON has
 * no number for are written as the format spells them. */
static void prom_value(zt_jbuf *b, double v) {
    zt_jbuf_puts(b, "} ");
    if (isfinite(v))
        zt_json_num(b, v);
    else
        zt_jbuf_puts(b, isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
    zt_jbuf_puts(b, "\n");
}

/* Every rank's figures of every job that has reported them; a family without a single value
 * (the GPU ones on CPU jobs) is left out whole. */
static void prom_write_ranks(zt_jbuf *b, const zt_job_summary *jobs, int n) {
    /* Only the jobs not yet over: a rank that ended has no current figures. */
    for (size_t f = 0; f < N_PROM_RANK_FAMILIES; f++) {
        bool header = prom_rank_families[f].help == NULL;  /* a later phase of the family above */
        int fig = prom_rank_families[f].figure;
        for (int i = 0; i < n; i++) {
            bool live = !zt_job_state_terminal(jobs[i].state);
            for (int r = 0; live && jobs[i].ranks && r < jobs[i].world_size; r++) {
                const zt_rank_figures *rf = &jobs[i].ranks[r];
                if (!rf->reported || isnan(rf->v[fig]))
                    continue;
                if (!header)
                    prom_family(b, prom_rank_families[f].name, "gauge",
                                prom_rank_families[f].help);
                header = true;
                zt_jbuf_puts(b, prom_rank_families[f].name);
                prom_job_labels(b, &jobs[i]);
                /* The rank's coordinates in the grid dp × pp × tp (ztrain/tp.h). */
                zt_grid at = zt_grid_at(&jobs[i].grid, r);
                zt_jbuf_printf(b, ",rank=\"%d\",dp_rank=\"%d\",pp_stage=\"%d\",tp_rank=\"%d\"",
                               r, at.replica, at.stage, at.tp_rank);
                if (prom_rank_families[f].phase)
                    zt_jbuf_printf(b, ",phase=\"%s\"", prom_rank_families[f].phase);
                prom_value(b, rf->v[fig] / prom_rank_families[f].per_unit);
            }
        }
    }
}

/* Copies (shallowly, in order) the summaries /metrics exports into shown; returns how many.
 * The originals stay as they are: zt_job_summaries_free wants them in their places. */
static int exported_jobs(const zt_job_summary *jobs, int n, int64_t window_ms,
                         zt_job_summary *shown) {
    int64_t since = zt_http_wall_ms() - window_ms;
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (!zt_job_state_terminal(jobs[i].state) ||
            (window_ms > 0 && jobs[i].finished_ms >= since))
            shown[kept++] = jobs[i];
    return kept;
}

static void prom_write(zt_jbuf *b, const zt_job_summary *all, int n_all, int64_t window_ms) {
    zt_job_summary *jobs = malloc((size_t)(n_all > 0 ? n_all : 1) * sizeof *jobs);
    if (!jobs) {
        b->buf.oom = true;
        return;
    }
    int n = n_all;
    prom_family(b, "ztrain_up", "gauge", "1 while ztraind answers.");
    zt_jbuf_puts(b, "ztrain_up 1\n");
    prom_family(b, "ztrain_jobs", "gauge", "Jobs known to ztraind, by state.");
    for (zt_job_state st = ZT_JOB_QUEUED; st <= ZT_JOB_CANCELLED; st++) {
        int count = 0;
        for (int i = 0; i < n_all; i++)
            count += all[i].state == st;
        zt_jbuf_printf(b, "ztrain_jobs{state=\"%s\"} %d\n", zt_job_state_name(st), count);
    }
    n = exported_jobs(all, n_all, window_ms, jobs);
    prom_family(b, "ztrain_job_state", "gauge", "1 for the job's current state.");
    for (int i = 0; i < n; i++) {
        zt_jbuf_puts(b, "ztrain_job_state");
        prom_job_labels(b, &jobs[i]);
        zt_jbuf_printf(b, ",state=\"%s\"", zt_job_state_name(jobs[i].state));
        prom_value(b, 1);
    }
    for (size_t f = 0; f < N_PROM_JOB_FAMILIES; f++) {
        prom_family(b, prom_job_families[f].name, prom_job_families[f].type,
                    prom_job_families[f].help);
        int key = prom_job_families[f].key;
        for (int i = 0; i < n; i++) {
            double v = prom_job_families[f].value(&jobs[i]);
            if (key >= 0 ? !jobs[i].reported[key] : isnan(v))
                continue;
            zt_jbuf_puts(b, prom_job_families[f].name);
            prom_job_labels(b, &jobs[i]);
            prom_value(b, v);
        }
    }
    prom_write_ranks(b, jobs, n);
    free(jobs);
}

enum MHD_Result zt_http_prometheus(zt_http_server *s, struct MHD_Connection *c) {
    zt_job_summary *jobs = NULL;
    int n = 0;
    zt_status st = zt_jobs_summaries(s->jm, prom_keys, K_COUNT, &jobs, &n);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, NULL);
    zt_jbuf b;
    zt_jbuf_init(&b);
    prom_write(&b, jobs, n, s->metrics_window_ms);
    zt_job_summaries_free(jobs, n);
    return zt_http_send_text(c, MHD_HTTP_OK, &b, "text/plain; version=0.0.4; charset=utf-8");
}
