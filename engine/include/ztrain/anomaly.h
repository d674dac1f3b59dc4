/* Anomaly events of a training run and what to do about each: the job spec's "events" section,
 * the moving-window z-score detector of loss and gradient-norm spikes (after llm.c's outlier
 * detector), and the per-step decision that every rank makes alike.
 *
 *     "events": {
 *       "nonfinite":           {"policy": "skip"},
 *       "loss_spike":          {"zscore": 5, "window": 64, "policy": "skip"},
 *       "grad_norm_spike":     {"zscore": 5, "window": 64, "policy": "record"},
 *       "loss_scale_collapse": {"overflows": 5, "policy": "checkpoint_and_stop"},
 *       "slow_rank":           {"factor": 2, "policy": "record"},
 *       "stall":               {"seconds": 300}
 *     }
 *
 * Policies: "record" (the event is reported, training goes on as it would have), "skip" (the
 * optimizer update of that step is not applied, as llm.c's -sl/-sg: gradients are dropped, the
 * step counts as skipped, the lr schedule and the optimizer's step count do not advance), and
 * "checkpoint_and_stop" (the update is not applied, a checkpoint of the step is written and the
 * run ends with an error naming the event). The decision is taken before the update from values
 * that every rank has (the loss averaged over the ranks, the global gradient norm), so every rank
 * decides the same. A stall cannot be seen by the stalled job: ztraind detects it (record only). */
#ifndef ZTRAIN_ANOMALY_H
#define ZTRAIN_ANOMALY_H

#include <stdbool.h>
#include <stdint.h>

#include "ztrain/status.h"

typedef enum {
    ZT_ANOMALY_NONFINITE,   /* "nonfinite": the step's loss or gradient norm is NaN or inf */
    ZT_ANOMALY_LOSS_SPIKE,  /* "loss_spike": the loss's z-score over the window above zscore */
    ZT_ANOMALY_GRAD_SPIKE,  /* "grad_norm_spike": the same for the global gradient norm */
    ZT_ANOMALY_LOSS_SCALE,  /* "loss_scale_collapse": fp16's scale at min_loss_scale with an
                               overflow, or `overflows` overflow-skipped steps in a row */
    ZT_ANOMALY_SLOW_RANK,   /* "slow_rank": a rank's work time above factor × the lower
                               median of the ranks' */
    ZT_ANOMALY_STALL,       /* "stall": no step for `seconds` (ztraind) */
    ZT_ANOMALY_KINDS
} zt_anomaly_kind;

typedef enum {
    ZT_POLICY_RECORD,       /* "record" */
    ZT_POLICY_SKIP,         /* "skip" */
    ZT_POLICY_STOP,         /* "checkpoint_and_stop" */
} zt_anomaly_policy;

/* A rank is slow only when it is also this many milliseconds behind the lower median: on steps
 * of a millisecond, timer noise alone doubles a time. */
#define ZT_SLOW_RANK_MIN_MS 10.0

/* The longest spike window, in steps: the detector's buffers are sized from the rule at init. */
#define ZT_ANOMALY_MAX_WINDOW 100000

/* One event kind's rule. A kind absent from the section is disabled, but for "nonfinite", which
 * is always on with "record" (its default, with a non-finite gradient in fp32 the run then fails
 * as before). Defaults when the kind is given: zscore 5, window 64, overflows 5, factor 2,
 * seconds 300. */
typedef struct {
    bool enabled;
    zt_anomaly_policy policy;
    double zscore;          /* spikes: the threshold, > 0 */
    int window;             /* spikes: values the mean and deviation are taken over, 2.. */
    int overflows;          /* loss_scale_collapse: overflow-skipped steps in a row, >= 1 */
    double factor;          /* slow_rank: > 1 */
    double seconds;         /* stall: > 0 */
} zt_anomaly_rule;

typedef struct {
    zt_anomaly_rule rule[ZT_ANOMALY_KINDS];
} zt_events_spec;

/* "nonfinite", "loss_spike", ...; and "record", "skip", "checkpoint_and_stop". */
const char *zt_anomaly_kind_name(zt_anomaly_kind k);
const char *zt_anomaly_policy_name(zt_anomaly_policy p);

/* The defaults: only "nonfinite", with "record". */
void zt_events_spec_default(zt_events_spec *ev);

/* Parses the "events" section's JSON text (an object; NULL: the defaults). Unknown kinds and
 * keys, values out of range and a policy a kind cannot have (skip for loss_scale_collapse,
 * slow_rank; anything but record for stall) are ZT_ERR_INVALID naming "source: events.KIND.KEY". */
zt_status zt_events_spec_parse(zt_events_spec *ev, const char *json_text, const char *source);

/* A z-score over a moving window, as llm.c's OutlierDetector: no score (NaN) until `window`
 * values were seen; then each value's score is (x - mean) / std over the window's values before
 * it (population standard deviation; 0 when the window is constant). A value scored above the
 * threshold is left out of the window, so that one spike does not make the detector blind to the
 * next, unless it is the third in a row (the level itself has moved). The caller owns the struct;
 * zt_spike_detector_free releases its buffer. */
typedef struct {
    double *values;         /* [window], a ring */
    int window, count, next, outliers_in_a_row;
    double threshold;
} zt_spike_detector;

zt_status zt_spike_detector_init(zt_spike_detector *d, int window, double threshold);
void zt_spike_detector_free(zt_spike_detector *d);
/* The z-score of x against the window (NaN before the window is full, or for a non-finite x,
 * which is never added), then takes x in as above. */
double zt_spike_detector_update(zt_spike_detector *d, double x);

/* One detected event, as rank 0 reports it: the kind, the step it happened at, the value that
 * triggered it (loss, norm, scale, time ratio), its z-score (NaN when not a spike), the policy
 * applied and a sentence saying what happened. */
typedef struct {
    zt_anomaly_kind kind;
    zt_anomaly_policy policy;
    int64_t step;
    double value;
    double zscore;
    int rank;               /* slow_rank: the slow rank; else -1 */
    char message[256];
} zt_anomaly_event;

/* The per-run state of the detectors. */
typedef struct {
    zt_events_spec spec;
    zt_spike_detector loss, grad;
    int overflows_in_a_row;
    zt_anomaly_event events[ZT_ANOMALY_KINDS]; /* this step's, first n */
    int n;
} zt_anomaly_monitor;

zt_status zt_anomaly_monitor_init(zt_anomaly_monitor *m, const zt_events_spec *spec);
void zt_anomaly_monitor_free(zt_anomaly_monitor *m);

/* Judges one optimizer step before its update from the global loss and the global gradient norm
 * (NaN when the fp16 scaler found an overflow: overflow says so, and that step is then no spike
 * and counts toward a collapse). Fills m->events[0 .. m->n) and returns whether the update must
 * be held back (a skip or stop policy fired; for an overflow step, which the scaler skips
 * anyway, only a stop). at_min_scale: the loss scale is at min_loss_scale. Deterministic in its
 * inputs, so that ranks agree. */
bool zt_anomaly_judge_step(zt_anomaly_monitor *m, int64_t step, double loss, double grad_norm,
                           bool overflow, bool at_min_scale);

/* A slow rank, from every rank's own work on the step (the same array on every rank: the time
 * from the step's start to its gradient reduction, which is data, forward and backward; at ZeRO
 * stage 2 and 3 the reductions overlapped with the backward make the ranks wait for each other
 * inside it, which hides part of a straggler). A rank above factor × the lower median of the
 * times (sorted, the ((world - 1) / 2)-th: with two ranks the faster one) and at least
 * ZT_SLOW_RANK_MIN_MS behind it is reported, the message naming that median as "the lower
 * median of the N ranks' times". Appends to m->events. */
void zt_anomaly_judge_ranks(zt_anomaly_monitor *m, int64_t step, const double *rank_ms,
                            int world);

/* Whether one of this step's events asks to checkpoint and stop. */
bool zt_anomaly_wants_stop(const zt_anomaly_monitor *m);

/* The event as one JSON line for ztraind's metrics pipe (no newline):
 * {"event": "anomaly", "kind": ..., "policy": ..., "train/global_step": ..., "value": ...,
 *  "zscore": ..., "rank": ..., "message": ...}. Returns the length, or -1 when it does not fit. */
int zt_anomaly_event_json(const zt_anomaly_event *e, char *buf, int size);

#endif
