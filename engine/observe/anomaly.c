/* Detecting anomalies of a run (ztrain/anomaly.h): the moving-window z-score of llm.c's outlier
 * detector, and the per-step judgement of a job's event rules, which every rank makes alike. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/anomaly.h"
#include "ztrain/comm.h"

zt_status zt_spike_detector_init(zt_spike_detector *d, int window, double threshold) {
    memset(d, 0, sizeof *d);
    ZT_ASSERT(window >= 2 && window <= ZT_ANOMALY_MAX_WINDOW);
    d->values = calloc((size_t)window, sizeof *d->values);
    if (!d->values)
        return zt_error(ZT_ERR_NOMEM, "out of memory for a spike window of %d steps", window);
    d->window = window;
    d->threshold = threshold;
    return ZT_OK;
}

void zt_spike_detector_free(zt_spike_detector *d) {
    free(d->values);
    d->values = NULL;
}

/* The window is summed afresh each step rather than kept as running sums: a few thousand adds
 * per step cost nothing beside a training step, and nothing drifts. */
double zt_spike_detector_update(zt_spike_detector *d, double x) {
    if (!isfinite(x))
        return NAN;
    double z = NAN;
    if (d->count == d->window) {
        double sum = 0.0, sum_sq = 0.0;
        for (int i = 0; i < d->window; i++)
            sum += d->values[i];
        double mean = sum / d->window;
        for (int i = 0; i < d->window; i++)
            sum_sq += (d->values[i] - mean) * (d->values[i] - mean);
        double sd = sqrt(sum_sq / d->window);
        z = sd > 0.0 ? (x - mean) / sd : 0.0;
    }
    bool outlier = z > d->threshold;
    d->outliers_in_a_row = outlier ? d->outliers_in_a_row + 1 : 0;
    if (!outlier || d->outliers_in_a_row >= 3) {
        d->values[d->next] = x;
        d->next = (d->next + 1) % d->window;
        if (d->count < d->window)
            d->count++;
    }
    return z;
}

zt_status zt_anomaly_monitor_init(zt_anomaly_monitor *m, const zt_events_spec *spec) {
    memset(m, 0, sizeof *m);
    m->spec = *spec;
    const zt_anomaly_rule *l = &spec->rule[ZT_ANOMALY_LOSS_SPIKE];
    const zt_anomaly_rule *g = &spec->rule[ZT_ANOMALY_GRAD_SPIKE];
    if (l->enabled)
        ZT_TRY(zt_spike_detector_init(&m->loss, l->window, l->zscore));
    if (g->enabled) {
        zt_status s = zt_spike_detector_init(&m->grad, g->window, g->zscore);
        if (s != ZT_OK) {
            zt_spike_detector_free(&m->loss);
            return s;
        }
    }
    return ZT_OK;
}

void zt_anomaly_monitor_free(zt_anomaly_monitor *m) {
    zt_spike_detector_free(&m->loss);
    zt_spike_detector_free(&m->grad);
}

/* What the policy did, for the event's sentence. */
static const char *outcome(zt_anomaly_policy p) {
    return p == ZT_POLICY_SKIP   ? "the update was skipped"
           : p == ZT_POLICY_STOP ? "the update was skipped; checkpoint and stop"
                                 : "recorded";
}

static zt_anomaly_event *add_event(zt_anomaly_monitor *m, zt_anomaly_kind kind, int64_t step,
                                   double value, double z) {
    ZT_ASSERT(m->n < ZT_ANOMALY_KINDS);
    zt_anomaly_event *e = &m->events[m->n++];
    *e = (zt_anomaly_event){.kind = kind, .policy = m->spec.rule[kind].policy, .step = step,
                            .value = value, .zscore = z, .rank = -1};
    return e;
}

static bool judge_spike(zt_anomaly_monitor *m, zt_anomaly_kind kind, zt_spike_detector *d,
                        int64_t step, double x, const char *what) {
    const zt_anomaly_rule *r = &m->spec.rule[kind];
    if (!r->enabled)
        return false;
    double z = zt_spike_detector_update(d, x);
    if (!(z > r->zscore))
        return false;
    zt_anomaly_event *e = add_event(m, kind, step, x, z);
    snprintf(e->message, sizeof e->message,
             "step %lld: %s %.6g is %.1f standard deviations above the mean of the last %d "
             "steps (threshold %g): %s",
             (long long)step, what, x, z, r->window, r->zscore, outcome(r->policy));
    return r->policy != ZT_POLICY_RECORD;
}

bool zt_anomaly_judge_step(zt_anomaly_monitor *m, int64_t step, double loss, double grad_norm,
                           bool overflow, bool at_min_scale) {
    m->n = 0;
    bool hold = false;
    const zt_anomaly_rule *nf = &m->spec.rule[ZT_ANOMALY_NONFINITE];
    bool finite = isfinite(loss) && (overflow || isfinite(grad_norm));
    if (!finite && nf->enabled) {
        zt_anomaly_event *e = add_event(m, ZT_ANOMALY_NONFINITE, step,
                                        isfinite(loss) ? grad_norm : loss, NAN);
        snprintf(e->message, sizeof e->message, "step %lld: the %s is %g: %s", (long long)step,
                 isfinite(loss) ? "gradient norm" : "loss", e->value, outcome(nf->policy));
        hold = nf->policy != ZT_POLICY_RECORD;
    }
    /* A step the fp16 scaler skips for its overflow is no spike: its update is not applied
     * whatever the rules say, and its loss is the scaled training's, not the model's. */
    if (finite && !overflow) {
        hold |= judge_spike(m, ZT_ANOMALY_LOSS_SPIKE, &m->loss, step, loss, "loss");
        hold |= judge_spike(m, ZT_ANOMALY_GRAD_SPIKE, &m->grad, step, grad_norm,
                            "gradient norm");
    }
    const zt_anomaly_rule *ls = &m->spec.rule[ZT_ANOMALY_LOSS_SCALE];
    m->overflows_in_a_row = overflow ? m->overflows_in_a_row + 1 : 0;
    if (ls->enabled && overflow &&
        (at_min_scale || m->overflows_in_a_row == ls->overflows)) {
        zt_anomaly_event *e = add_event(m, ZT_ANOMALY_LOSS_SCALE, step, m->overflows_in_a_row,
                                        NAN);
        snprintf(e->message, sizeof e->message,
                 "step %lld: fp16 gradient overflow %s (%d overflow-skipped steps in a row): %s",
                 (long long)step, at_min_scale ? "at min_loss_scale" : "again",
                 m->overflows_in_a_row, ls->policy == ZT_POLICY_STOP ? "checkpoint and stop"
                                                                     : "recorded");
        hold |= ls->policy == ZT_POLICY_STOP;
    }
    /* An overflow step is skipped by the scaler whatever the rules say; holding it back as well
     * would keep the scaler from lowering the scale. Only a stop holds it. */
    if (overflow)
        hold = zt_anomaly_wants_stop(m);
    return hold;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void zt_anomaly_judge_ranks(zt_anomaly_monitor *m, int64_t step, const double *rank_ms,
                            int world) {
    const zt_anomaly_rule *r = &m->spec.rule[ZT_ANOMALY_SLOW_RANK];
    if (!r->enabled || world < 2 || m->n >= ZT_ANOMALY_KINDS)
        return;
    double sorted[ZT_MAX_WORLD];
    int n = world < ZT_MAX_WORLD ? world : ZT_MAX_WORLD;
    memcpy(sorted, rank_ms, sizeof(double) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(double), cmp_double);
    /* The lower median, sorted[(n - 1) / 2]: for an even number of ranks the faster of the two
     * middle ones, so that with two ranks the slower is compared with the faster (against the
     * statistical median, their mean, no rank of two is ever `factor` >= 2 times slower). The
     * message says which median it is: perf/median_compute_ms is the statistical one. */
    double median = sorted[(n - 1) / 2];
    int slow = 0;
    for (int i = 1; i < n; i++)
        if (rank_ms[i] > rank_ms[slow])
            slow = i;
    if (!(median > 0.0) || !(rank_ms[slow] > r->factor * median) ||
        !(rank_ms[slow] - median >= ZT_SLOW_RANK_MIN_MS))
        return;
    zt_anomaly_event *e = add_event(m, ZT_ANOMALY_SLOW_RANK, step, rank_ms[slow] / median, NAN);
    e->rank = slow;
    snprintf(e->message, sizeof e->message,
             "step %lld: rank %d took %.1f ms, %.1f times the lower median of the %d ranks' "
             "times, %.1f ms (factor %g): %s",
             (long long)step, slow, rank_ms[slow], e->value, n, median, r->factor,
             r->policy == ZT_POLICY_STOP ? "checkpoint and stop" : "recorded");
}

bool zt_anomaly_wants_stop(const zt_anomaly_monitor *m) {
    for (int i = 0; i < m->n; i++)
        if (m->events[i].policy == ZT_POLICY_STOP)
            return true;
    return false;
}

static int put_json_number(char *buf, int size, double v) {
    return isfinite(v) ? snprintf(buf, (size_t)size, "%.9g", v) : snprintf(buf, (size_t)size, "null");
}

int zt_anomaly_event_json(const zt_anomaly_event *e, char *buf, int size) {
    char value[32], z[32];
    put_json_number(value, sizeof value, e->value);
    put_json_number(z, sizeof z, e->zscore);
    /* The message holds only what snprintf put there; quotes and backslashes are escaped, and
     * control characters, which none should be, become spaces. */
    char msg[2 * sizeof e->message];
    int k = 0;
    for (const char *c = e->message; *c && k < (int)sizeof msg - 2; c++) {
        if (*c == '"' || *c == '\\')
            msg[k++] = '\\';
        msg[k++] = *c >= 0x20 ? *c : ' ';
    }
    msg[k] = '\0';
    int n = snprintf(buf, (size_t)size,
                     "{\"event\": \"anomaly\", \"kind\": \"%s\", \"policy\": \"%s\", "
                     "\"train/global_step\": %lld, \"value\": %s, \"zscore\": %s, \"rank\": %d, "
                     "\"message\": \"%s\"}",
                     zt_anomaly_kind_name(e->kind), zt_anomaly_policy_name(e->policy),
                     (long long)e->step, value, z, e->rank, msg);
    return n < size ? n : -1;
}
