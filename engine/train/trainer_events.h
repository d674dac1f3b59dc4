/* The trainer's side of anomaly events (internal to libztrain): the step gate that applies the
 * job's "events" rules before each update (ztrain/anomaly.h), and where rank 0 reports what it
 * found — ztraind's metrics pipe, <out_dir>/events.jsonl and the progress output. */
#ifndef ZTRAIN_TRAINER_EVENTS_H
#define ZTRAIN_TRAINER_EVENTS_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ztrain/anomaly.h"
#include "ztrain/engine.h"
#include "ztrain/job_spec.h"
#include "ztrain/metrics.h"

typedef struct {
    zt_anomaly_monitor mon;
    zt_engine *e;
    int rank, world;
    bool fp16;
    int gas;                  /* micro-batches per step */
    double tokens;            /* this rank's, over the step's micro-batches so far */
    double begin_ms;          /* when the step began on this rank */
    double work_ms;           /* from then to the step's last zt_engine_step call */
    double *sums;             /* [3 + world]: loss, tokens, stop requests, every rank's work_ms */
    volatile sig_atomic_t *stop_requested; /* this rank's stop request; NULL: none */
    bool summed;              /* the gate ran this step */
    bool held;                /* the gate held this step's update back */
    zt_status status;         /* what summing the step failed with, inside the gate */
    zt_metrics_writer *metrics; /* rank 0: the pipe to ztraind; NULL elsewhere */
    FILE *progress;
    FILE *file;               /* rank 0: <out_dir>/events.jsonl; NULL without out_dir */
} zt_trainer_events;

/* Reads the rules from job->events and installs the gate on e. The step's losses, tokens, work
 * times and stop requests of comm's world ranks (NULL: one) travel in the engine's step table
 * over comm (zt_engine_set_step_table), gathered with the step's one read: on NCCL on the
 * device when comm has e's backend attached. Free with zt_trainer_events_free. */
zt_status zt_trainer_events_init(zt_trainer_events *ev, const zt_job_spec *job, zt_engine *e,
                                 zt_comm *comm, int rank, int world,
                                 volatile sig_atomic_t *stop_requested);
void zt_trainer_events_free(zt_trainer_events *ev);
/* Where rank 0 reports events (metrics' mirror, progress and out_dir may each be NULL); other
 * ranks report nothing. events.jsonl is appended to. */
void zt_trainer_events_report_to(zt_trainer_events *ev, zt_metrics_writer *metrics,
                                 FILE *progress, const char *out_dir);

void zt_trainer_events_begin_step(zt_trainer_events *ev);
/* A micro-batch's tokens, before its zt_engine_step (its loss the gate takes from the engine,
 * zt_engine_step_losses, once the step has read it back). */
void zt_trainer_events_add_micro(zt_trainer_events *ev, double tokens);
/* After the step: the loss summed over ranks and the tokens summed over ranks, as the gate
 * reduced them (or reduced now when the gate did not run). */
zt_status zt_trainer_events_step_sums(zt_trainer_events *ev, double sums[2]);
/* Whether the gate held this step's update back, and whether an event asks to stop (then
 * stop_reason says which). */
bool zt_trainer_events_held(const zt_trainer_events *ev);
/* After a step: whether any rank had a stop request when it finished its share of the step (as
 * the sums say, so every rank answers alike). */
bool zt_trainer_events_stop_requested(const zt_trainer_events *ev);
bool zt_trainer_events_stop(const zt_trainer_events *ev);
void zt_trainer_events_stop_reason(const zt_trainer_events *ev, char *buf, size_t size);

#endif
