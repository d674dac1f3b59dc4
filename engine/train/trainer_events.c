/* The step gate that applies a job's anomaly rules (trainer_events.h): every rank sums the
 * step's losses, tokens, stop requests and times-to-gate over the ranks from the engine's step
 * table, judges them alike and so holds back the same updates; rank 0 reports the events. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ztrain/fault_inject.h"
#include "ztrain/stop_signals.h"
#include "trainer_events.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void report(zt_trainer_events *ev, int from) {
    if (ev->rank != 0)
        return;
    for (int i = from; i < ev->mon.n; i++) {
        const zt_anomaly_event *a = &ev->mon.events[i];
        char line[1024];
        if (zt_anomaly_event_json(a, line, sizeof line) < 0)
            continue;
        if (ev->metrics)
            zt_metrics_send(ev->metrics, line);
        if (ev->file) {
            fprintf(ev->file, "%s\n", line);
            fflush(ev->file);
        }
        if (ev->progress) {
            fprintf(ev->progress, "[ztrain] event %s: %s\n", zt_anomaly_kind_name(a->kind),
                    a->message);
            fflush(ev->progress);
        }
    }
}

/* Sums the ranks' losses, tokens, stop requests and work times from the engine's step table,
 * so that what every rank judges next is the same: the loss is each rank's mean over its
 * micro-batches, summed in rank order (the bits an all-reduce of them gives). */
static zt_status reduce_step(zt_trainer_events *ev) {
    double *sums = ev->sums;
    memset(sums, 0, sizeof(double) * (size_t)(3 + ev->world));
    const double *table = zt_engine_step_table(ev->e);
    if (!table)
        return zt_error(ZT_ERR_INVALID, "engine: no step table to sum (the step has not run)");
    ev->summed = true;
    const int cols = ev->gas + 3;
    for (int r = 0; r < ev->world; r++) {
        const double *row = table + (size_t)r * (size_t)cols;
        double loss_sum = 0.0;
        for (int i = 0; i < ev->gas; i++)
            loss_sum += row[i];
        sums[0] += loss_sum / ev->gas;
        sums[1] += row[ev->gas];
        sums[3 + r] = row[ev->gas + 1];
        sums[2] += row[ev->gas + 2];
    }
    return ZT_OK;
}

static bool gate(void *ctx, int64_t step, double grad_norm, bool overflow) {
    zt_trainer_events *ev = ctx;
    ev->status = reduce_step(ev);
    if (ev->status != ZT_OK)
        return ev->held = true;
    const zt_loss_scaler *sc = zt_engine_loss_scaler(ev->e);
    bool at_min = ev->fp16 && sc->kind != ZT_SCALER_STATIC && sc->cur_scale <= sc->min_scale;
    double loss = ev->sums[0] / ev->world;
    ev->held = zt_anomaly_judge_step(&ev->mon, step, loss, grad_norm, overflow, at_min);
    int n = ev->mon.n;
    zt_anomaly_judge_ranks(&ev->mon, step, ev->sums + 3, ev->world);
    ev->held |= ev->mon.n > n && ev->mon.events[n].policy == ZT_POLICY_STOP;
    report(ev, 0);
    return ev->held;
}

zt_status zt_trainer_events_init(zt_trainer_events *ev, const zt_job_spec *job, zt_engine *e,
                                 zt_comm *comm, int rank, int world,
                                 volatile sig_atomic_t *stop_requested) {
    memset(ev, 0, sizeof *ev);
    ev->e = e;
    ev->rank = rank;
    ev->world = world;
    ev->fp16 = job->ds.fp16.enabled;
    ev->gas = job->ds.gradient_accumulation_steps;
    ev->stop_requested = stop_requested;
    ev->sums = calloc((size_t)world + 3, sizeof *ev->sums);
    if (!ev->sums)
        return zt_error(ZT_ERR_NOMEM, "out of memory for the step sums of %d ranks", world);
    ZT_TRY(zt_anomaly_monitor_init(&ev->mon, &job->events));
    /* The table's values: tokens, work time, stop request. */
    ZT_TRY(zt_engine_set_step_table(e, 3, comm));
    zt_engine_set_step_gate(e, gate, ev);
    return ZT_OK;
}

void zt_trainer_events_free(zt_trainer_events *ev) {
    zt_anomaly_monitor_free(&ev->mon);
    free(ev->sums);
    ev->sums = NULL;
    if (ev->file)
        fclose(ev->file);
    ev->file = NULL;
}

void zt_trainer_events_report_to(zt_trainer_events *ev, zt_metrics_writer *metrics,
                                 FILE *progress, const char *out_dir) {
    if (ev->rank != 0)
        return;
    ev->metrics = metrics;
    ev->progress = progress;
    if (out_dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/events.jsonl", out_dir);
        ev->file = fopen(path, "a");
        if (!ev->file && progress)
            fprintf(progress, "[ztrain] warning: %s: cannot open for writing: %s\n", path,
                    strerror(errno));
    }
}

void zt_trainer_events_begin_step(zt_trainer_events *ev) {
    ev->tokens = 0.0;
    ev->summed = ev->held = false;
    ev->mon.n = 0;
    ev->status = ZT_OK;
    ev->begin_ms = now_ms();
}

/* Called before every zt_engine_step, so the last call is the boundary's: the time to it is
 * this rank's own work on the step, before the gradient reduction makes the ranks wait for each
 * other. */
void zt_trainer_events_add_micro(zt_trainer_events *ev, double tokens) {
    ev->tokens += tokens;
    ev->work_ms = now_ms() - ev->begin_ms;
    double *in = zt_engine_step_table_in(ev->e);
    in[0] = ev->tokens;
    in[1] = ev->work_ms;
    in[2] = zt_stop_is_requested(ev->stop_requested) ? 1.0 : 0.0; /* summed over the ranks */
}

zt_status zt_trainer_events_step_sums(zt_trainer_events *ev, double sums[2]) {
    ZT_TRY(ev->status);
    if (!ev->summed)
        ZT_TRY(reduce_step(ev));
    sums[0] = ev->sums[0];
    sums[1] = ev->sums[1];
    return ZT_OK;
}

bool zt_trainer_events_held(const zt_trainer_events *ev) { return ev->held; }

bool zt_trainer_events_stop_requested(const zt_trainer_events *ev) {
    return ev->summed && ev->sums[2] > 0.0;
}

bool zt_trainer_events_stop(const zt_trainer_events *ev) {
    return zt_anomaly_wants_stop(&ev->mon);
}

void zt_trainer_events_stop_reason(const zt_trainer_events *ev, char *buf, size_t size) {
    snprintf(buf, size, "an anomaly event");
    for (int i = 0; i < ev->mon.n; i++)
        if (ev->mon.events[i].policy == ZT_POLICY_STOP) {
            snprintf(buf, size, "the %s event (policy checkpoint_and_stop): %s",
                     zt_anomaly_kind_name(ev->mon.events[i].kind), ev->mon.events[i].message);
            return;
        }
}
