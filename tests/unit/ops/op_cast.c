/* to_half, from_half, round_to, accumulate_half and sum_squares_half: every backend, the CPU
 * included, bit for bit against the harness's own rounding (zt_test_round, written from the
 * formats' definitions), which for exact IEEE conversions is stricter than against the CPU's
 * results. Kept modest: tests/reference/test_casts.py already holds every CPU path to PyTorch's
 * casts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* As sum_squares (op_optim.c): a double sum in another order. */
#define TOL_SUMSQ 1e-11

static const zt_dtype halves[] = {ZT_BF16, ZT_F16};

/* Past two thread chunks of 16384, with a tail. */
#define CAST_N (2 * 16384 + 123)

static uint32_t bits32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint16_t quiet16(zt_dtype t) { return t == ZT_BF16 ? 0x0040 : 0x0200; }

/* The same 16-bit value: equal bits, or two NaNs of one sign with got quiet (ops.h promises a
 * quiet NaN of the same sign, not a payload). */
static bool same16(uint16_t got, uint16_t want, zt_dtype t) {
    if (got == want)
        return true;
    return isnan(zt_test_decode(want, t)) && isnan(zt_test_decode(got, t)) &&
           (got & 0x8000) == (want & 0x8000) && (got & quiet16(t));
}

static bool same32(float got, float want) {
    if (bits32(got) == bits32(want))
        return true;
    return isnan(want) && isnan(got) && signbit(got) == signbit(want) &&
           (bits32(got) & 0x00400000u);
}

static void check16(const uint16_t *got, const uint16_t *want, size_t n, zt_dtype t,
                    const char *at) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!same16(got[i], want[i], t) && bad++ == 0)
            first = i;
    CHECK_AT(bad == 0, "%s: %zu of %zu values differ; first [%zu] got 0x%04x want 0x%04x", at, bad,
             n, first, bad ? got[first] : 0, bad ? want[first] : 0);
}

static void check32(const float *got, const float *want, size_t n, const char *at) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!same32(got[i], want[i]) && bad++ == 0)
            first = i;
    CHECK_AT(bad == 0, "%s: %zu of %zu values differ; first [%zu] got 0x%08x want 0x%08x", at, bad,
             n, first, bad ? bits32(got[first]) : 0, bad ? bits32(want[first]) : 0);
}

/* fp32 values that a rounding to t must get right: any bit pattern (every exponent, fp32
 * subnormals, infinities, NaNs), values at every scale of t's range, exact ties between
 * neighbours of t, and the edges of t's range. */
static float *cast_inputs(zt_test_rng *r, size_t n, zt_dtype t) {
    int lo = t == ZT_BF16 ? -140 : -27, hi = t == ZT_BF16 ? 128 : 16;
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN,
                             65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f,
                             0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 0x1p-14f, 0x1.ffcp-15f,
                             3.3895314e38f, 3.4028235e38f, 0x1p-133f, 0x1p-134f, 0x1p-149f,
                             0x1p-126f, 1.0f, -1.0f};
    float *v = zt_test_zeros(n);
    for (size_t i = 0; i < n; i++) {
        switch (i % 4) {
        case 0:
            v[i] = float_of((uint32_t)zt_test_next(r));
            break;
        case 1:
            v[i] = ldexpf((float)zt_test_normal(r), zt_test_int(r, lo, hi));
            break;
        case 2: {
            /* The midpoint of a finite value of t and the next one up in magnitude. */
            uint16_t h = (uint16_t)zt_test_next(r);
            float a = zt_test_decode(h, t), b = zt_test_decode((uint16_t)(h + 1), t);
            v[i] = isfinite(a) && isfinite(b) && (h & 0x7FFF) != 0x7FFF
                       ? (float)(0.5 * ((double)a + (double)b))
                       : a;
            break;
        }
        default:
            v[i] = special[(i / 4) % (sizeof special / sizeof special[0])];
        }
    }
    return v;
}

/* ---- runners: each op on one backend, host in and host out ----------------------------------- */

/* Where a runner puts its buffers: each this many elements past a 16-byte boundary, so that the
 * vectorised kernels' element-by-element path (a slice that starts misaligned) runs too. */
typedef struct {
    size_t dst, src;
    const char *name;
} shift;

static const shift shifts[] = {
    {0, 0, "aligned"}, {1, 0, "output one element off"}, {0, 1, "input one element off"}};
enum { NSHIFTS = sizeof shifts / sizeof shifts[0] };

/* host's bytes on the device, at = that many elements of elem bytes past an aligned start. */
static void *dev_at(zt_test_dev *d, const void *host, size_t bytes, size_t at, size_t elem) {
    char *pad = calloc(1, bytes + at * elem);
    memcpy(pad + at * elem, host, bytes);
    char *dev = zt_test_dev_bytes(d, pad, bytes + at * elem);
    free(pad);
    return dev + at * elem;
}

static uint16_t *run_to_half(zt_backend *be, const float *src, size_t n, zt_dtype t, shift sh) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *s = dev_at(&d, src, n * sizeof(float), sh.src, sizeof(float));
    uint16_t *dst = (uint16_t *)zt_test_dev_alloc(&d, (n + sh.dst) * sizeof(uint16_t)) + sh.dst;
    uint16_t *out = calloc(n, sizeof *out);
    be->ops->to_half(&d.ctx, dst, s, n, t);
    zt_test_dev_get_bytes(&d, out, dst, n * sizeof(uint16_t));
    zt_test_dev_finish(&d);
    return out;
}

static float *run_from_half(zt_backend *be, const uint16_t *src, size_t n, zt_dtype t, shift sh) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    uint16_t *s = dev_at(&d, src, n * sizeof(uint16_t), sh.src, sizeof(uint16_t));
    float *dst = (float *)zt_test_dev_alloc(&d, (n + sh.dst) * sizeof(float)) + sh.dst;
    float *out = zt_test_zeros(n);
    be->ops->from_half(&d.ctx, dst, s, n, t);
    zt_test_dev_get_f32(&d, out, dst, n);
    zt_test_dev_finish(&d);
    return out;
}

/* In place: the one buffer at the output's shift. */
static float *run_round_to(zt_backend *be, const float *src, size_t n, zt_dtype t, shift sh) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *v = dev_at(&d, src, n * sizeof(float), sh.dst, sizeof(float)), *out = zt_test_zeros(n);
    be->ops->round_to(&d.ctx, v, n, t);
    zt_test_dev_get_f32(&d, out, v, n);
    zt_test_dev_finish(&d);
    return out;
}

static uint16_t *run_accumulate(zt_backend *be, const uint16_t *dst0, const float *src, size_t n,
                                zt_dtype t, shift sh) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    uint16_t *dst = dev_at(&d, dst0, n * sizeof(uint16_t), sh.dst, sizeof(uint16_t));
    uint16_t *out = calloc(n, sizeof *out);
    float *s = dev_at(&d, src, n * sizeof(float), sh.src, sizeof(float));
    be->ops->accumulate_half(&d.ctx, dst, s, n, t);
    zt_test_dev_get_bytes(&d, out, dst, n * sizeof(uint16_t));
    zt_test_dev_finish(&d);
    return out;
}

static double run_sumsq(zt_backend *be, const uint16_t *v, size_t n, zt_dtype t) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    uint16_t *dv = zt_test_dev_bytes(&d, v, n * sizeof(uint16_t));
    double s = be->ops->sum_squares_half(&d.ctx, dv, n, t);
    zt_test_dev_finish(&d);
    return s;
}

/* 16-bit patterns: every one (n = 65536), or finite ones only. */
static uint16_t *patterns(zt_test_rng *r, size_t n, zt_dtype t, bool finite) {
    uint16_t *h = calloc(n, sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = n == 65536 ? (uint16_t)i : (uint16_t)zt_test_next(r);
        while (finite && !isfinite(zt_test_decode(h[i], t)))
            h[i] = (uint16_t)zt_test_next(r);
    }
    return h;
}

/* ---- the families ---------------------------------------------------------------------------- */

static void to_half_all(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act, (void)cpu;
    for (int k = 0; k < 2 * NSHIFTS; k++) {
        zt_dtype t = halves[k % 2];
        shift sh = shifts[k / 2];
        float *src = cast_inputs(r, CAST_N, t);
        uint16_t *got = run_to_half(be, src, CAST_N, t, sh), *want = calloc(CAST_N, sizeof *want);
        for (size_t i = 0; i < CAST_N; i++)
            want[i] = zt_test_encode(zt_test_round(src[i], t), t);
        char at[96];
        snprintf(at, sizeof at, "to_half %s to %s, %s", be->name, zt_dtype_name(t), sh.name);
        check16(got, want, CAST_N, t, at);
        free(src), free(got), free(want);
    }
}

static void from_half_all(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act, (void)cpu;
    for (int k = 0; k < 2 * NSHIFTS; k++) {
        zt_dtype t = halves[k % 2];
        shift sh = shifts[k / 2];
        uint16_t *h = patterns(r, 65536, t, false);
        float *got = run_from_half(be, h, 65536, t, sh), *want = zt_test_zeros(65536);
        for (size_t i = 0; i < 65536; i++)
            want[i] = zt_test_decode(h[i], t);
        char at[96];
        snprintf(at, sizeof at, "from_half %s from %s, every pattern, %s", be->name,
                 zt_dtype_name(t), sh.name);
        check32(got, want, 65536, at);
        free(h), free(got), free(want);
    }
}

static void round_to_all(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act, (void)cpu;
    for (int k = 0; k < 2 * 2; k++) {
        zt_dtype t = halves[k % 2];
        shift sh = shifts[k / 2]; /* in place: aligned, and one element off */
        float *src = cast_inputs(r, CAST_N, t), *want = zt_test_zeros(CAST_N);
        float *got = run_round_to(be, src, CAST_N, t, sh);
        for (size_t i = 0; i < CAST_N; i++)
            want[i] = zt_test_round(src[i], t);
        char at[96];
        snprintf(at, sizeof at, "round_to %s to %s, %s", be->name, zt_dtype_name(t), sh.name);
        check32(got, want, CAST_N, at);
        free(src), free(got), free(want);
    }
    float *src = cast_inputs(r, CAST_N, ZT_BF16), *got = run_round_to(be, src, CAST_N, ZT_F32,
                                                                   shifts[0]);
    CHECK_AT(memcmp(got, src, CAST_N * sizeof(float)) == 0,
             "round_to %s to fp32 changed its input", be->name);
    free(src), free(got);
}

/* dst = to_half(from_half(dst) + src), the sum in fp32; a NaN already in dst stays that NaN,
 * quieted (sign and payload kept, as from_half widens it). */
static void accumulate_all(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act, (void)cpu;
    for (int k = 0; k < 2 * NSHIFTS; k++) {
        zt_dtype t = halves[k % 2];
        shift sh = shifts[k / 2];
        uint16_t *dst = patterns(r, CAST_N, t, false);
        float *src = zt_test_zeros(CAST_N);
        for (size_t i = 0; i < CAST_N; i++) {
            float d = zt_test_decode(dst[i], t);
            src[i] = i % 5 == 4 ? float_of((uint32_t)zt_test_next(r))
                                : (float)(zt_test_normal(r) * (isfinite(d) ? fabs(d) + 1e-3 : 1.0));
        }
        uint16_t *got = run_accumulate(be, dst, src, CAST_N, t, sh);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < CAST_N; i++) {
            float d = zt_test_decode(dst[i], t), s = d + src[i];
            bool ok = isnan(d) ? got[i] == (dst[i] | quiet16(t))
                      : isnan(s) ? isnan(zt_test_decode(got[i], t))
                                 : got[i] == zt_test_encode(zt_test_round(s, t), t);
            if (!ok && bad++ == 0)
                first = i;
        }
        CHECK_AT(bad == 0,
                 "accumulate_half %s into %s, %s: %zu of %d values wrong; first [%zu] dst "
                 "0x%04x + %.9g gave 0x%04x",
                 be->name, zt_dtype_name(t), sh.name, bad, CAST_N, first, dst[first], (double)src[first],
                 got[first]);
        free(dst), free(src), free(got);
    }
}

static void sumsq_half_all(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act, (void)cpu;
    const size_t n = 3 * 16384 + 77;
    for (int k = 0; k < 2; k++) {
        zt_dtype t = halves[k];
        uint16_t *h = patterns(r, n, t, true);
        /* bfloat16 spans fp32's exponents; keep the squares inside double's range and the sum
         * away from being one element's. */
        for (size_t i = 0; t == ZT_BF16 && i < n; i++)
            h[i] = (uint16_t)((h[i] & 0x807F) | (uint16_t)(zt_test_int(r, 100, 150) << 7));
        double want = 0.0;
        for (size_t i = 0; i < n; i++)
            want += (double)zt_test_decode(h[i], t) * zt_test_decode(h[i], t);
        double got = run_sumsq(be, h, n, t);
        CHECK_AT(fabs(got - want) <= TOL_SUMSQ * want,
                 "sum_squares_half %s of %s, n=%zu: %.17g, the double loop %.17g", be->name,
                 zt_dtype_name(t), n, got, want);
        h[n / 2] = zt_test_encode(INFINITY, t);
        got = run_sumsq(be, h, n, t);
        CHECK_AT(!isfinite(got), "sum_squares_half %s of %s with an inf: %g", be->name,
                 zt_dtype_name(t), got);
        h[n / 2] = zt_test_encode(NAN, t);
        got = run_sumsq(be, h, n, t);
        CHECK_AT(!isfinite(got), "sum_squares_half %s of %s with a NaN: %g", be->name,
                 zt_dtype_name(t), got);
        free(h);
    }
}

#define CAST_FAMILY(name, fn)                                                                      \
    static const char *const name##_entries[] = {#name, NULL};                                     \
    static void name##_check(const zt_test_env *env) {                                             \
        zt_test_each_backend(env, #name, name##_entries, false, fn);                               \
    }

CAST_FAMILY(to_half, to_half_all)
CAST_FAMILY(from_half, from_half_all)
CAST_FAMILY(round_to, round_to_all)
CAST_FAMILY(accumulate_half, accumulate_all)
CAST_FAMILY(sum_squares_half, sumsq_half_all)

/* ---- --perf: 16M elements to and from bfloat16 ----------------------------------------------- */

typedef struct {
    zt_ctx ctx;
    float *f;
    uint16_t *h;
    size_t n;
    double sink;
} cast_perf;

static void to_half_perf_run(void *a) {
    cast_perf *q = a;
    q->ctx.be->ops->to_half(&q->ctx, q->h, q->f, q->n, ZT_BF16);
}
static void from_half_perf_run(void *a) {
    cast_perf *q = a;
    q->ctx.be->ops->from_half(&q->ctx, q->f, q->h, q->n, ZT_BF16);
}
static void round_to_perf_run(void *a) {
    cast_perf *q = a;
    q->ctx.be->ops->round_to(&q->ctx, q->f, q->n, ZT_BF16);
}
static void accumulate_perf_run(void *a) {
    cast_perf *q = a;
    q->ctx.be->ops->accumulate_half(&q->ctx, q->h, q->f, q->n, ZT_BF16);
}
static void sumsq_perf_run(void *a) {
    cast_perf *q = a;
    q->sink += q->ctx.be->ops->sum_squares_half(&q->ctx, q->h, q->n, ZT_BF16);
}

/* Bytes an element: to and from 6, round_to 8, accumulate 8 (16-bit read and written, fp32
 * read), sum of squares 2. */
static void cast_perf_time(zt_backend *be, const char *op, void (*fn)(void *), double bytes) {
    if (!zt_test_has(be, op))
        return;
    const size_t n = (size_t)1 << 24;
    zt_test_rng r = zt_test_rng_for(op, 1);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    cast_perf q = {d.ctx, .n = n};
    q.f = zt_test_dev_random(&d, &r, n, 1.0);
    q.h = zt_test_dev_alloc(&d, n * sizeof(uint16_t));
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu bf16", n);
    double ms = zt_test_time_ms(be, fn, &q, 9);
    zt_test_perf_row(op, be, shape, ms, bytes * n / 1e9, 0);
    zt_test_dev_finish(&d);
}

static void to_half_perf(zt_backend *be) { cast_perf_time(be, "to_half", to_half_perf_run, 6); }
static void from_half_perf(zt_backend *be) {
    cast_perf_time(be, "from_half", from_half_perf_run, 6);
}
static void round_to_perf(zt_backend *be) { cast_perf_time(be, "round_to", round_to_perf_run, 8); }
static void accumulate_perf(zt_backend *be) {
    cast_perf_time(be, "accumulate_half", accumulate_perf_run, 8);
}
static void sumsq_half_perf(zt_backend *be) {
    cast_perf_time(be, "sum_squares_half", sumsq_perf_run, 2);
}

const zt_test_family zt_test_to_half = {"to_half", to_half_entries, to_half_check, to_half_perf};
const zt_test_family zt_test_from_half = {"from_half", from_half_entries, from_half_check,
                                          from_half_perf};
const zt_test_family zt_test_round_to = {"round_to", round_to_entries, round_to_check,
                                         round_to_perf};
const zt_test_family zt_test_accumulate_half = {"accumulate_half", accumulate_half_entries,
                                                accumulate_half_check, accumulate_perf};
const zt_test_family zt_test_sum_squares_half = {"sum_squares_half", sum_squares_half_entries,
                                                 sum_squares_half_check, sumsq_half_perf};
