/* DeepSpeed's fp16 loss scaler: the ZeRO DynamicLossScaler.update_scale rule, the non-ZeRO
 * FP16_Optimizer._update_scale rule, and the static scale, with DeepSpeed's log texts
 * (shared/reference/deepspeed.md §1.6; deepspeed/runtime/fp16/loss_scaler.py, fused_optimizer.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/loss_scaler.h"

void zt_loss_scaler_init(zt_loss_scaler *s, const zt_ds_config *cfg) {
    const zt_fp16_config *f = &cfg->fp16;
    memset(s, 0, sizeof *s);
    s->cur_iter = 0;
    s->last_overflow_iter = -1;
    s->scale_window = f->loss_scale_window;
    s->hysteresis = f->hysteresis;
    s->cur_hysteresis = f->hysteresis;
    s->consecutive_hysteresis = f->consecutive_hysteresis;
    s->min_scale = f->min_loss_scale;
    if (!f->enabled) {
        /* bf16 and fp32: DeepSpeed's CreateLossScaler gives them LossScaler(scale=1.0). */
        s->kind = ZT_SCALER_STATIC;
        s->cur_scale = 1.0;
    } else if (f->loss_scale > 0) {
        s->kind = ZT_SCALER_STATIC;
        s->cur_scale = f->loss_scale;
    } else {
        s->kind = cfg->zero.stage >= 1 ? ZT_SCALER_ZERO : ZT_SCALER_NON_ZERO;
        s->cur_scale = ldexp(1.0, f->initial_scale_power);
        /* The config parser refuses a non-positive window or minimum when the scale is dynamic. */
        ZT_ASSERT(s->scale_window > 0);
        ZT_ASSERT(s->min_scale > 0);
    }
}

double zt_loss_scaler_scale(const zt_loss_scaler *s) { return s->cur_scale; }

/* Python's repr() of a float, which is how an f-string prints a float: the shortest digit string
 * that reads back as the same double, in fixed notation with a trailing ".0" when integral
 * ("65536.0", "0.25"), and in exponent notation ("1e+16", "1e-05") when the decimal point would
 * sit more than 16 places right or 4 or more places left of the first digit. */
static void py_float_repr(char *out, size_t n, double x) {
    if (isnan(x)) {
        snprintf(out, n, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(out, n, x < 0 ? "-inf" : "inf");
        return;
    }
    if (x == 0) {
        snprintf(out, n, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char sci[40];
    for (int prec = 0; prec <= 16; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec, x);
        if (strtod(sci, NULL) == x)
            break;
    }
    /* sci is "[-]d[.ddd]e±XX": collect the digits without trailing zeros, and the exponent. */
    const char *p = sci;
    bool neg = *p == '-';
    if (neg)
        p++;
    char digits[24];
    int nd = 0;
    for (; *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    int decpt = exp10 + 1; /* digits "d1d2..." stand for 0.d1d2... × 10^decpt */

    char body[48];
    if (decpt <= -4 || decpt > 16) {
        snprintf(body, sizeof body, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1,
                 exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (decpt <= 0) {
        snprintf(body, sizeof body, "0.%.*s%s", -decpt, "0000", digits);
    } else if (decpt >= nd) {
        snprintf(body, sizeof body, "%s%.*s.0", digits, decpt - nd, "0000000000000000");
    } else {
        snprintf(body, sizeof body, "%.*s.%s", decpt, digits, digits + decpt);
    }
    snprintf(out, n, "%s%s", neg ? "-" : "", body);
}

/* Python's int() of a float (truncation toward zero), which the ZeRO rule's log applies to the
 * scales: "Attempted loss scale: 65536, reducing to 32768". */
static void py_int_of_float(char *out, size_t n, double x) {
    if (!isfinite(x))
        py_float_repr(out, n, x);
    else
        snprintf(out, n, "%.0f", trunc(x) == 0 ? 0.0 : trunc(x));
}

/* The ZeRO 1-3 rule, DynamicLossScaler.update_scale (deepspeed.md §1.6, "ZeRO 1/2/3 path"):
 *   overflow:  if hysteresis == 1 or cur_hysteresis == 1:
 *                  cur_scale == min_scale → the "already at minimum" error (state untouched);
 *                  otherwise cur_scale = max(cur_scale / 2, min_scale)
 *              else cur_hysteresis -= 1;
 *              then last_overflow_iter = cur_iter
 *   clean:     consecutive_hysteresis → cur_hysteresis = hysteresis (logged);
 *              stable = cur_iter - last_overflow_iter - 1;
 *              stable > 0 and stable % window == 0 → (not consecutive: cur_hysteresis = hysteresis),
 *              cur_scale *= 2
 *   always:    cur_iter += 1 */
static zt_status update_zero(zt_loss_scaler *s, bool overflow, FILE *log) {
    char a[64], b[64];
    if (overflow) {
        if (s->hysteresis == 1 || s->cur_hysteresis == 1) {
            if (s->cur_scale == s->min_scale)
                return zt_error(ZT_ERR_NUMERIC, "Current loss scale already at minimum - cannot "
                                                "decrease scale anymore. Exiting run.");
            double next = fmax(s->cur_scale / 2.0, s->min_scale);
            if (log) {
                py_int_of_float(a, sizeof a, s->cur_scale);
                py_int_of_float(b, sizeof b, next);
                fprintf(log, "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: %s, "
                             "reducing to %s\n", a, b);
            }
            s->cur_scale = next;
        } else {
            if (log) {
                py_int_of_float(a, sizeof a, s->cur_scale);
                fprintf(log, "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: %s, "
                             "but hysteresis is %d. Reducing hysteresis to %d\n",
                        a, s->cur_hysteresis, s->cur_hysteresis - 1);
            }
            s->cur_hysteresis--;
        }
        s->last_overflow_iter = s->cur_iter;
    } else {
        if (s->consecutive_hysteresis) {
            if (log)
                fprintf(log, "Consecutive hysteresis is enabled. Restoring hysteresis to %d\n",
                        s->hysteresis);
            s->cur_hysteresis = s->hysteresis;
        }
        int64_t stable = s->cur_iter - s->last_overflow_iter - 1;
        if (stable > 0 && stable % s->scale_window == 0) {
            if (!s->consecutive_hysteresis)
                s->cur_hysteresis = s->hysteresis;
            s->cur_scale *= 2.0;
        }
    }
    s->cur_iter++;
    return ZT_OK;
}

/* The stage-0 rule, FP16_Optimizer._update_scale (deepspeed.md §1.6, "Non-ZeRO fp16"): halve to
 * no less than the minimum on overflow, with no hysteresis and no error; double on the same
 * window condition as the ZeRO rule.
 *
 * The doubling test is DeepSpeed's `stable_interval = (cur_iter - last_overflow_iter) - 1;
 * stable_interval > 0 and stable_interval % scale_window == 0`, which deepspeed.md calls "the same
 * stable % window doubling". The older Megatron/apex form `(cur_iter - last_overflow_iter) % window
 * == 0` doubles one step earlier (already at cur_iter 1 with window 2), which DeepSpeed's own
 * test_dynamic_loss_scale.py (power 8, window 2: the scale is still 2^8 after the second step)
 * rules out.
 *
 * Logs, as FP16_Optimizer does with verbose on, "Grad overflow on iteration N" and "Reducing
 * dynamic loss scale from A to B" on overflow, "No Grad overflow for W iterations" and "Increasing
 * dynamic loss scale from A to B" on a doubling, with the scales printed as Python floats.
 * DeepSpeed's first message starts with a newline, which gives a blank log line; it is left out. */
static zt_status update_non_zero(zt_loss_scaler *s, bool overflow, FILE *log) {
    char a[64], b[64];
    double prev = s->cur_scale;
    if (overflow) {
        s->cur_scale = fmax(s->cur_scale / 2.0, s->min_scale);
        s->last_overflow_iter = s->cur_iter;
        if (log) {
            py_float_repr(a, sizeof a, prev);
            py_float_repr(b, sizeof b, s->cur_scale);
            fprintf(log, "Grad overflow on iteration %lld\n", (long long)s->cur_iter);
            fprintf(log, "Reducing dynamic loss scale from %s to %s\n", a, b);
        }
    } else {
        int64_t stable = s->cur_iter - s->last_overflow_iter - 1;
        if (stable > 0 && stable % s->scale_window == 0) {
            s->cur_scale *= 2.0;
            if (log) {
                py_float_repr(a, sizeof a, prev);
                py_float_repr(b, sizeof b, s->cur_scale);
                fprintf(log, "No Grad overflow for %d iterations\n", s->scale_window);
                fprintf(log, "Increasing dynamic loss scale from %s to %s\n", a, b);
            }
        }
    }
    s->cur_iter++;
    return ZT_OK;
}

zt_status zt_loss_scaler_update(zt_loss_scaler *s, bool overflow, FILE *log) {
    switch (s->kind) {
    case ZT_SCALER_ZERO:
        return update_zero(s, overflow, log);
    case ZT_SCALER_NON_ZERO:
        return update_non_zero(s, overflow, log);
    case ZT_SCALER_STATIC:
        break;
    }
    /* A static scale never changes and logs nothing here; the step counters still advance so that
     * cur_iter means the same for every kind. */
    if (overflow)
        s->last_overflow_iter = s->cur_iter;
    s->cur_iter++;
    return ZT_OK;
}
