/* DeepSpeed's five learning-rate schedules as pure functions of last_batch_iteration k.
 *
 * Each formula keeps DeepSpeed's order of operations (deepspeed/runtime/lr_schedules.py), so the lr
 * a user sees in ztrain's metrics equals the one DeepSpeed logs for the same config to the last bit
 * or two. */
#include <math.h>

#include "ztrain/lr_schedule.h"

#define PI 3.14159265358979323846

void zt_lr_schedule_init(zt_lr_schedule *s, const zt_schedule_config *cfg, double base_lr,
                         double base_beta1) {
    s->cfg = *cfg;
    s->base_lr = base_lr;
    s->base_beta1 = base_beta1;
    s->last_batch_iteration = -1;
}

void zt_lr_schedule_step(zt_lr_schedule *s) { s->last_batch_iteration++; }

/* DeepSpeed clamps the warmup length to 2 so the log warmup never divides by ln(1) = 0. */
static int64_t warmup_steps(const zt_schedule_config *c) {
    return c->warmup_num_steps < 2 ? 2 : c->warmup_num_steps;
}

/* The warmup fraction for 0 <= k < N: ln(k+1)/ln(N) or k/N. DeepSpeed multiplies by a precomputed
 * 1/ln(N) rather than dividing, and so do we. */
static double warmup_gamma(const zt_schedule_config *c, int64_t k) {
    int64_t n = warmup_steps(c);
    if (c->warmup_linear)
        return (double)k / (double)n;
    return (1.0 / log((double)n)) * log((double)(k + 1));
}

static double warmup_lr(const zt_schedule_config *c, int64_t k) {
    double gamma = k < warmup_steps(c) ? warmup_gamma(c, k) : 1.0;
    return c->warmup_min_lr + (c->warmup_max_lr - c->warmup_min_lr) * gamma;
}

static double warmup_decay_lr(const zt_schedule_config *c, int64_t k) {
    int64_t n = warmup_steps(c);
    double gamma;
    if (k < n) {
        gamma = warmup_gamma(c, k);
    } else {
        double span = fmax(1.0, (double)c->total_num_steps - n);
        gamma = fmax(0.0, ((double)c->total_num_steps - (double)k) / span);
    }
    return c->warmup_min_lr + (c->warmup_max_lr - c->warmup_min_lr) * gamma;
}

static double warmup_cosine_ratio(const zt_schedule_config *c, int64_t k) {
    int64_t n = warmup_steps(c);
    if (k < n)
        return c->warmup_min_ratio + warmup_gamma(c, k) * (1.0 - c->warmup_min_ratio);
    double span = fmax(1.0, (double)c->total_num_steps - n);
    /* Past total_num_steps the progress stays at 1, so the lr rests at cos_min_ratio instead of
     * climbing back up the cosine. */
    double progress = fmin(1.0, (double)(k - n + 1) / span);
    double cosine = (1.0 + cos(PI * progress)) / 2.0;
    return fmax(0.0, c->cos_min_ratio + (1.0 - c->cos_min_ratio) * cosine);
}

static double range_test_lr(const zt_schedule_config *c, int64_t k) {
    double interval = (double)(k + 1) / (double)c->lr_range_test_step_size;
    if (c->lr_range_test_staircase)
        interval = floor(interval);
    return c->lr_range_test_min_lr * (1.0 + c->lr_range_test_step_rate * interval);
}

/* OneCycle's position in the cycle as a fraction of the way from min to max lr, for k < T. */
static double one_cycle_scale(const zt_schedule_config *c, int64_t k) {
    double first = c->cycle_first_step_size, second = c->cycle_second_step_size;
    double total = first + second, ratio = first / total;
    double i = (double)(k + 1);
    double x = 1.0 + i / total - floor(1.0 + i / total);
    double scale;
    int64_t stairs;
    if (x <= ratio) {
        scale = x / ratio;
        stairs = c->cycle_first_stair_count;
    } else {
        scale = (x - 1.0) / (ratio - 1.0);
        stairs = c->cycle_second_stair_count;
    }
    /* Stairs hold the lr flat for total/stairs steps. DeepSpeed quantises the integer offset into
     * the cycle, not `scale`: at the peak of an asymmetric cycle `scale` can come out a hair under
     * 1.0, and flooring that would drop a whole stair. */
    if (stairs > 0) {
        double pos = fmod(i, total);
        double position = pos <= first ? pos * (double)stairs / first
                                       : (total - pos) * (double)stairs / second;
        scale = floor(position) / (double)stairs;
    }
    return scale;
}

static double one_cycle_total(const zt_schedule_config *c) {
    return (double)c->cycle_first_step_size + (double)c->cycle_second_step_size;
}

/* After the cycle the lr decays from cycle_min_lr as 1/(1 + rate*d/decay_step_size); a zero step
 * size or rate means DeepSpeed skips the decay and holds cycle_min_lr. */
static double one_cycle_lr(const zt_schedule_config *c, int64_t k) {
    if ((double)k < one_cycle_total(c))
        return c->cycle_min_lr + (c->cycle_max_lr - c->cycle_min_lr) * one_cycle_scale(c, k);
    if (c->decay_step_size == 0 || c->decay_lr_rate == 0.0)
        return c->cycle_min_lr;
    double d = (double)k - one_cycle_total(c) + 1.0;
    return c->cycle_min_lr / (1.0 + c->decay_lr_rate * (d / (double)c->decay_step_size));
}

/* Momentum moves opposite to the lr during the cycle and grows from cycle_max_mom afterwards. */
static double one_cycle_momentum(const zt_schedule_config *c, int64_t k) {
    if ((double)k < one_cycle_total(c))
        return c->cycle_max_mom - (c->cycle_max_mom - c->cycle_min_mom) * one_cycle_scale(c, k);
    if (c->decay_step_size == 0 || c->decay_mom_rate == 0.0)
        return c->cycle_max_mom;
    double d = (double)k - one_cycle_total(c) + 1.0;
    return c->cycle_max_mom * (1.0 + c->decay_mom_rate * (d / (double)c->decay_step_size));
}

double zt_lr_schedule_lr(const zt_lr_schedule *s) {
    const zt_schedule_config *c = &s->cfg;
    int64_t k = s->last_batch_iteration;
    /* Before the first step each schedule has set the optimizer's lr at construction. */
    if (k < 0) {
        switch (c->type) {
        case ZT_SCHED_NONE: return s->base_lr;
        case ZT_SCHED_WARMUP_LR:
        case ZT_SCHED_WARMUP_DECAY_LR: return c->warmup_min_lr;
        case ZT_SCHED_WARMUP_COSINE_LR: return 0.0;
        case ZT_SCHED_ONE_CYCLE: return c->cycle_min_lr;
        case ZT_SCHED_LR_RANGE_TEST: return c->lr_range_test_min_lr;
        }
        return s->base_lr;
    }
    switch (c->type) {
    case ZT_SCHED_NONE: return s->base_lr;
    case ZT_SCHED_WARMUP_LR: return warmup_lr(c, k);
    case ZT_SCHED_WARMUP_DECAY_LR: return warmup_decay_lr(c, k);
    case ZT_SCHED_WARMUP_COSINE_LR: return s->base_lr * warmup_cosine_ratio(c, k);
    case ZT_SCHED_ONE_CYCLE: return one_cycle_lr(c, k);
    case ZT_SCHED_LR_RANGE_TEST: return range_test_lr(c, k);
    }
    return s->base_lr;
}

double zt_lr_schedule_momentum(const zt_lr_schedule *s) {
    const zt_schedule_config *c = &s->cfg;
    if (c->type != ZT_SCHED_ONE_CYCLE || !c->cycle_momentum)
        return s->base_beta1;
    /* OneCycle's constructor sets beta1 to cycle_min_mom, although the cycle formula at its start
     * gives cycle_max_mom; the first update runs with cycle_min_mom, as in DeepSpeed. */
    if (s->last_batch_iteration < 0)
        return c->cycle_min_mom;
    return one_cycle_momentum(c, s->last_batch_iteration);
}
