/* Anomaly events (ztrain/anomaly.h): the z-score detector against the formula computed here
 * directly from its definition, the per-step judgement and its policies, and the "events"
 * section's defaults and error messages. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ztrain/anomaly.h"

/* The definition: the population mean and deviation of the `w` values before x. */
static double zscore_by_definition(const double *prev, int w, double x) {
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < w; i++)
        mean += prev[i] / w;
    for (int i = 0; i < w; i++)
        var += (prev[i] - mean) * (prev[i] - mean) / w;
    return var > 0.0 ? (x - mean) / sqrt(var) : 0.0;
}

static void test_detector(void) {
    zt_spike_detector d;
    CHECK(zt_spike_detector_init(&d, 8, 5.0) == ZT_OK);
    double xs[40], kept[40];
    int nkept = 0;
    for (int i = 0; i < 40; i++)
        xs[i] = 3.0 - 0.01 * i + 0.05 * sin(1.7 * i);
    xs[20] = 9.0; /* a spike */
    for (int i = 0; i < 40; i++) {
        double z = zt_spike_detector_update(&d, xs[i]);
        if (nkept < 8) {
            CHECK(isnan(z), "value %d: no score before the window is full, got %g", i, z);
        } else {
            double want = zscore_by_definition(kept + nkept - 8, 8, xs[i]);
            CHECK(fabs(z - want) < 1e-9 * (1 + fabs(want)), "value %d: z %g, want %g", i, z, want);
        }
        /* The spike stays out of the window. */
        if (!(z > 5.0))
            kept[nkept++] = xs[i];
        if (i == 20)
            CHECK(z > 5.0, "the spike scores %g", z);
    }
    CHECK(nkept == 39);
    CHECK(isnan(zt_spike_detector_update(&d, NAN)));
    zt_spike_detector_free(&d);

    /* A lasting change of level: the third outlier in a row enters the window. */
    CHECK(zt_spike_detector_init(&d, 4, 2.0) == ZT_OK);
    double base[] = {1.0, 1.1, 0.9, 1.0};
    for (int i = 0; i < 4; i++)
        zt_spike_detector_update(&d, base[i]);
    CHECK(zt_spike_detector_update(&d, 10.0) > 2.0);
    CHECK(zt_spike_detector_update(&d, 10.0) > 2.0);
    double z3 = zt_spike_detector_update(&d, 10.0);
    double after[] = {1.1, 0.9, 1.0, 10.0};
    double z4 = zt_spike_detector_update(&d, 10.0);
    CHECK(z3 > 2.0);
    CHECK(fabs(z4 - zscore_by_definition(after, 4, 10.0)) < 1e-9, "z4 %g", z4);
    zt_spike_detector_free(&d);

    /* A constant window scores 0, as llm.c's does. */
    CHECK(zt_spike_detector_init(&d, 3, 2.0) == ZT_OK);
    for (int i = 0; i < 3; i++)
        zt_spike_detector_update(&d, 2.0);
    CHECK(zt_spike_detector_update(&d, 7.0) == 0.0);
    zt_spike_detector_free(&d);
}

static void test_judge(void) {
    zt_events_spec spec;
    CHECK(zt_events_spec_parse(&spec,
                               "{\"nonfinite\": {\"policy\": \"skip\"}, \"loss_spike\": "
                               "{\"zscore\": 4, \"window\": 5, \"policy\": \"skip\"}, "
                               "\"grad_norm_spike\": {\"window\": 5}, "
                               "\"loss_scale_collapse\": {\"overflows\": 2, \"policy\": "
                               "\"checkpoint_and_stop\"}, \"slow_rank\": {\"factor\": 1.5}}",
                               "job.json") == ZT_OK,
          "%s", zt_last_error());
    zt_anomaly_monitor m;
    CHECK(zt_anomaly_monitor_init(&m, &spec) == ZT_OK);
    int64_t step = 0;
    for (int i = 0; i < 5; i++)
        CHECK(!zt_anomaly_judge_step(&m, ++step, 2.0 + 0.01 * i, 1.0 + 0.01 * i, false, false));
    CHECK(m.n == 0);
    /* A loss spike is held back (skip); the gradient norm's is only recorded. */
    CHECK(zt_anomaly_judge_step(&m, ++step, 8.0, 50.0, false, false));
    CHECK(m.n == 2 && m.events[0].kind == ZT_ANOMALY_LOSS_SPIKE &&
          m.events[0].policy == ZT_POLICY_SKIP && m.events[0].step == 6 &&
          m.events[1].kind == ZT_ANOMALY_GRAD_SPIKE && m.events[1].policy == ZT_POLICY_RECORD);
    CHECK(!zt_anomaly_wants_stop(&m));
    /* A non-finite gradient norm, skipped. */
    CHECK(zt_anomaly_judge_step(&m, ++step, 2.0, NAN, false, false));
    CHECK(m.n == 1 && m.events[0].kind == ZT_ANOMALY_NONFINITE && isnan(m.events[0].value));
    CHECK(strstr(m.events[0].message, "gradient norm is nan") != NULL, "%s", m.events[0].message);
    /* Two fp16 overflows in a row: a collapse, which stops. */
    CHECK(!zt_anomaly_judge_step(&m, ++step, 2.0, NAN, true, false));
    CHECK(m.n == 0);
    CHECK(zt_anomaly_judge_step(&m, ++step, 2.0, NAN, true, false));
    CHECK(m.n == 1 && m.events[0].kind == ZT_ANOMALY_LOSS_SCALE && zt_anomaly_wants_stop(&m));
    /* A straggler: rank 2 at 3× the median. */
    zt_anomaly_judge_step(&m, ++step, 2.0, 1.0, false, false);
    double ms[4] = {10.0, 11.0, 30.0, 10.5};
    zt_anomaly_judge_ranks(&m, step, ms, 4);
    CHECK(m.n == 1 && m.events[0].kind == ZT_ANOMALY_SLOW_RANK && m.events[0].rank == 2 &&
          fabs(m.events[0].value - 30.0 / 10.5) < 1e-12, "n %d value %g", m.n, m.events[0].value);
    char line[1024];
    CHECK(zt_anomaly_event_json(&m.events[0], line, sizeof line) > 0);
    /* Twice the median but a fraction of a millisecond behind it: timer noise, not a straggler. */
    zt_anomaly_judge_step(&m, ++step, 2.0, 1.0, false, false);
    double quick[2] = {0.3, 0.7};
    zt_anomaly_judge_ranks(&m, step, quick, 2);
    CHECK(m.n == 0);
    CHECK(strstr(line, "\"kind\": \"slow_rank\"") && strstr(line, "\"rank\": 2"), "%s", line);
    zt_anomaly_monitor_free(&m);
}

/* The median a slow_rank message names, by its definition: the ranks' times sorted, the
 * ((n - 1) / 2)-th, which for an even n is the faster of the two middle ones. */
static double lower_median_by_definition(const double *ms, int n) {
    double s[8];
    memcpy(s, ms, sizeof(double) * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && s[k - 1] > s[k]; k--) {
            double t = s[k];
            s[k] = s[k - 1];
            s[k - 1] = t;
        }
    return s[(n - 1) / 2];
}

/* The numbers of a slow_rank message ("rank R took T ms, X times the lower median of the N
 * ranks' times, M ms") against the times judged: the slowest rank, its time, the lower median
 * and their ratio as printed (%.1f). The median of perf/median_compute_ms (the mean of the two
 * middle times) differs from it for an even N, so the message must not call it "the median". */
static void test_slow_rank_message(void) {
    zt_events_spec spec;
    CHECK(zt_events_spec_parse(&spec, "{\"slow_rank\": {\"factor\": 2}}", "job.json") == ZT_OK,
          "%s", zt_last_error());
    zt_anomaly_monitor m;
    CHECK(zt_anomaly_monitor_init(&m, &spec) == ZT_OK);
    static const double cases[][6] = {
        {2.6, 17.5},                        /* the report's two ranks: the median is rank 0's */
        {40.0, 12.0, 13.0},                 /* odd: the middle time */
        {12.0, 14.0, 60.0, 13.0},           /* even: the faster middle time, 13 (not 13.5) */
        {20.0, 21.0, 22.0, 23.0, 24.0, 95.0},
    };
    static const int sizes[] = {2, 3, 4, 6};
    for (int c = 0; c < 4; c++) {
        const double *ms = cases[c];
        int n = sizes[c], slow = 0;
        for (int r = 1; r < n; r++)
            if (ms[r] > ms[slow])
                slow = r;
        double want = lower_median_by_definition(ms, n);
        m.n = 0;
        zt_anomaly_judge_ranks(&m, 7, ms, n);
        CHECK(m.n == 1 && m.events[0].rank == slow, "case %d: n %d", c, m.n);
        if (m.n != 1)
            continue;
        int rank = -1, ranks = -1;
        double took = NAN, times = NAN, median = NAN;
        int got = sscanf(m.events[0].message, "step 7: rank %d took %lf ms, %lf times the lower "
                         "median of the %d ranks' times, %lf ms", &rank, &took, &times, &ranks,
                         &median);
        CHECK(got == 5, "case %d: the message reads %s", c, m.events[0].message);
        CHECK(rank == slow && fabs(took - ms[slow]) <= 0.05 && ranks == n &&
                  fabs(median - want) <= 0.05 && fabs(times - ms[slow] / want) <= 0.05 &&
                  fabs(m.events[0].value - ms[slow] / want) < 1e-12,
              "case %d: want rank %d, %.1f ms, %.1f times the lower median %.1f ms of %d: %s", c,
              slow, ms[slow], ms[slow] / want, want, n, m.events[0].message);
    }
    zt_anomaly_monitor_free(&m);
}

#define ERR(json, msg)                                                                             \
    do {                                                                                           \
        zt_events_spec ev;                                                                         \
        zt_status s_ = zt_events_spec_parse(&ev, json, "job.json");                              \
        check_error_is(__FILE__, __LINE__, "events", json, s_, ZT_ERR_INVALID, msg, true);         \
    } while (0)

static void test_spec(void) {
    zt_events_spec ev;
    CHECK(zt_events_spec_parse(&ev, NULL, "job.json") == ZT_OK);
    CHECK(ev.rule[ZT_ANOMALY_NONFINITE].enabled && !ev.rule[ZT_ANOMALY_LOSS_SPIKE].enabled);
    CHECK(zt_events_spec_parse(&ev, "{\"loss_spike\": {}}", "job.json") == ZT_OK);
    CHECK(ev.rule[ZT_ANOMALY_LOSS_SPIKE].enabled && ev.rule[ZT_ANOMALY_LOSS_SPIKE].window == 64 &&
          ev.rule[ZT_ANOMALY_LOSS_SPIKE].zscore == 5.0 &&
          ev.rule[ZT_ANOMALY_LOSS_SPIKE].policy == ZT_POLICY_RECORD);
    ERR("{\"loss_spik\": {}}", "job.json: unknown key 'loss_spik' in events");
    ERR("{\"loss_spike\": {\"zscore\": -1}}",
        "job.json: key 'events.loss_spike.zscore' must be a number above 0, got -1");
    ERR("{\"loss_spike\": {\"window\": 1}}",
        "job.json: key 'events.loss_spike.window' must be between 2 and 100000, got 1");
    ERR("{\"loss_spike\": {\"policy\": \"halt\"}}",
        "job.json: key 'events.loss_spike.policy' must be \"record\", \"skip\" or "
        "\"checkpoint_and_stop\", got \"halt\"");
    ERR("{\"slow_rank\": {\"policy\": \"skip\"}}",
        "job.json: key 'events.slow_rank.policy' \"skip\" is not possible for slow_rank");
    ERR("{\"stall\": {\"policy\": \"checkpoint_and_stop\"}}",
        "job.json: key 'events.stall.policy' \"checkpoint_and_stop\" is not possible for stall");
    ERR("{\"slow_rank\": {\"factor\": 1}}",
        "job.json: key 'events.slow_rank.factor' must be a number above 1, got 1");
    ERR("{\"stall\": {\"zscore\": 3}}", "job.json: unknown key 'zscore' in events.stall");
    ERR("[1]", "job.json: key 'events' must be an object, got [1]");
}

int main(void) {
    test_detector();
    test_judge();
    test_slow_rank_message();
    test_spec();
    return check_summary("test_anomaly");
}
