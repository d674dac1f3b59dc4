/* The op test harness's shared pieces: see harness.h. The checks count into check.h's summary,
 * which this file alone includes (its counters are per translation unit). */
#define _GNU_SOURCE
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"

/* ---- checks ---------------------------------------------------------------------------------- */

static void vcheck(const char *file, int line, bool ok, const char *fmt, va_list ap) {
    if (ok) {
        check_at(file, line, true, "%s", "");
        return;
    }
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    check_at(file, line, false, "%s", msg);
}

bool zt_test_check_at(const char *file, int line, bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vcheck(file, line, ok, fmt, ap);
    va_end(ap);
    return ok;
}

int zt_test_summary(void) { return check_summary("test_ops"); }

double zt_test_tol(zt_dtype act) {
    switch (act) {
    case ZT_BF16:
        return 2.0 * 0x1p-7;
    case ZT_F16:
        return 2.0 * 0x1p-10;
    default:
        return ZT_TEST_TOL_F32;
    }
}

bool zt_test_margins;

/* The comparison behind zt_test_close_f and _d, with want widened to double. */
static bool vclose(const char *file, int line, const float *got, const double *want, size_t n,
                   double tol, const char *fmt, va_list ap) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += want[i] * want[i];
    double rms = n ? sqrt(ss / n) : 0.0;
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        double bound = tol * (fabs(want[i]) + rms), err = fabs((double)got[i] - want[i]);
        /* Written so that a NaN in either fails. */
        bool ok = err <= bound;
        double ratio = !ok && err != err ? INFINITY : err == 0 ? 0 : err / bound;
        bad += !ok;
        if (ratio > worst_ratio || (!ok && bad == 1))
            worst = i, worst_ratio = ratio;
    }
    char what[1024] = "";
    if (bad || zt_test_margins)
        vsnprintf(what, sizeof what, fmt, ap);
    if (zt_test_margins)
        printf("margin %.3f of tol %.3g: %s\n", worst_ratio, tol, what);
    if (bad == 0) {
        check_at(file, line, true, "%s", "");
        return true;
    }
    check_at(file, line, false,
             "%s: %zu of %zu elements beyond tol %.3g (relative to |want| + rms %.4g); worst [%zu] "
             "got %.9g want %.9g",
             what, bad, n, tol, rms, worst, (double)got[worst], want[worst]);
    return false;
}

bool zt_test_close_d(const char *file, int line, const float *got, const double *want, size_t n,
                     double tol, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    bool ok = vclose(file, line, got, want, n, tol, fmt, ap);
    va_end(ap);
    return ok;
}

bool zt_test_close_f(const char *file, int line, const float *got, const float *want, size_t n,
                     double tol, const char *fmt, ...) {
    double *w = zt_test_widen(want, n);
    va_list ap;
    va_start(ap, fmt);
    bool ok = vclose(file, line, got, w, n, tol, fmt, ap);
    va_end(ap);
    free(w);
    return ok;
}

bool zt_test_same_at(const char *file, int line, const float *got, const float *want, size_t n,
                     const char *fmt, ...) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0)
            first = i;
    va_list ap;
    va_start(ap, fmt);
    char what[1024] = "";
    if (bad)
        vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return check_at(file, line, bad == 0,
                    "%s: %zu of %zu elements differ; first [%zu] got %.9g want %.9g", what, bad, n,
                    first, bad ? (double)got[first] : 0.0,
                    bad ? (double)want[first] : 0.0);
}

/* ---- random numbers and host buffers --------------------------------------------------------- */

uint64_t zt_test_next(zt_test_rng *r) {
    /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

zt_test_rng zt_test_rng_for(const char *name, uint64_t k) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = name; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    zt_test_rng r = {h ^ (k * 0x9E3779B97F4A7C15ull)};
    zt_test_next(&r);
    return r;
}

double zt_test_uniform(zt_test_rng *r) { return (zt_test_next(r) >> 11) * 0x1.0p-53; }

double zt_test_normal(zt_test_rng *r) {
    double u = zt_test_uniform(r), v = zt_test_uniform(r);
    return sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * v);
}

int zt_test_int(zt_test_rng *r, int lo, int hi) {
    return lo + (int)(zt_test_next(r) % (uint64_t)(hi - lo + 1));
}

static void *must(void *p) {
    if (!p) {
        fprintf(stderr, "test_ops: out of host memory\n");
        exit(2);
    }
    return p;
}

float *zt_test_zeros(size_t n) { return must(calloc(n ? n : 1, sizeof(float))); }

float *zt_test_random(zt_test_rng *r, size_t n, double mean, double std) {
    float *v = zt_test_zeros(n);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(mean + std * zt_test_normal(r));
    return v;
}

float *zt_test_nans(size_t n) {
    float *v = zt_test_zeros(n);
    for (size_t i = 0; i < n; i++)
        v[i] = NAN;
    return v;
}

float *zt_test_dup(const float *v, size_t n) {
    if (!v)
        return NULL;
    float *d = zt_test_zeros(n);
    memcpy(d, v, n * sizeof *d);
    return d;
}

double *zt_test_widen(const float *v, size_t n) {
    double *d = must(calloc(n ? n : 1, sizeof(double)));
    for (size_t i = 0; i < n; i++)
        d[i] = v[i];
    return d;
}

/* ---- the independent 16-bit reference -------------------------------------------------------- */

/* A type's significand bits (the implicit one included), least normal exponent, field widths and
 * largest finite value. */
typedef struct {
    int p, emin, mbits, ebits, bias;
    double max;
} half_format;

static half_format format_of(zt_dtype t) {
    if (t == ZT_BF16)
        return (half_format){8, -126, 7, 8, 127, ldexp(255.0, 120)};
    ZT_ASSERT(t == ZT_F16);
    return (half_format){11, -14, 10, 5, 15, 65504.0};
}

float zt_test_round(float x, zt_dtype t) {
    if (t == ZT_F32 || isnan(x) || isinf(x) || x == 0.0f)
        return x;
    half_format f = format_of(t);
    double d = x;
    /* The spacing of t's values near d: 2^(e - p + 1), with e held at emin below the normal
     * range, where the spacing is that of the subnormals. d / q and rint(d / q) · q are exact in
     * double, and rint rounds half to even in the default rounding mode. */
    int e = ilogb(d);
    if (e < f.emin)
        e = f.emin;
    double q = ldexp(1.0, e - (f.p - 1));
    double r = rint(d / q) * q;
    if (fabs(r) > f.max)
        r = copysign(INFINITY, d);
    return (float)r;
}

void zt_test_round_all(float *v, size_t n, zt_dtype t) {
    for (size_t i = 0; i < n; i++)
        v[i] = zt_test_round(v[i], t);
}

uint16_t zt_test_encode(float x, zt_dtype t) {
    half_format f = format_of(t);
    uint32_t sign = signbit(x) ? 0x8000u : 0u, emax = (1u << f.ebits) - 1u;
    if (isnan(x))
        return (uint16_t)(sign | emax << f.mbits | 1u << (f.mbits - 1));
    if (isinf(x))
        return (uint16_t)(sign | emax << f.mbits);
    double a = fabs((double)x), m;
    uint32_t e;
    if (a < ldexp(1.0, f.emin)) {
        e = 0;
        m = a / ldexp(1.0, f.emin - f.mbits);
    } else {
        int k = ilogb(a);
        e = (uint32_t)(k + f.bias);
        m = a / ldexp(1.0, k - f.mbits) - ldexp(1.0, f.mbits);
    }
    ZT_ASSERT(m == floor(m)); /* x must be a value of type t */
    return (uint16_t)(sign | e << f.mbits | (uint32_t)m);
}

float zt_test_decode(uint16_t h, zt_dtype t) {
    half_format f = format_of(t);
    int e = (h >> f.mbits) & ((1 << f.ebits) - 1), m = h & ((1 << f.mbits) - 1);
    double v;
    if (e == (1 << f.ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, f.emin - f.mbits);
    else
        v = ldexp(m + (1 << f.mbits), e - f.bias - f.mbits);
    return (float)copysign(v, (h & 0x8000) ? -1.0 : 1.0);
}

bool zt_test_held_at(const char *file, int line, zt_backend *cpu, zt_dtype t, const float *got,
                     const float *f32, size_t n, const char *fmt, ...) {
    /* The CPU's device memory is host memory, so its casts run on these buffers directly. */
    uint16_t *h = must(calloc(n ? n : 1, sizeof *h));
    float *rt = zt_test_zeros(n);
    zt_ctx x = {.be = cpu, .act = ZT_F32};
    cpu->ops->to_half(&x, h, got, n, t);
    cpu->ops->from_half(&x, rt, h, n, t);
    size_t not_t = 0, not_once = 0, first_t = 0, first_once = 0;
    for (size_t i = 0; i < n; i++) {
        float once = zt_test_round(f32[i], t);
        if (memcmp(&rt[i], &got[i], sizeof(float)) != 0 && not_t++ == 0)
            first_t = i;
        if (memcmp(&once, &got[i], sizeof(float)) != 0 && not_once++ == 0)
            first_once = i;
    }
    bool ok = not_t == 0 && not_once == 0;
    if (!ok) {
        va_list ap;
        va_start(ap, fmt);
        char what[1024], a[256] = "", b[256] = "";
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        if (not_t)
            snprintf(a, sizeof a, "; %zu of %zu elements are not %s values (first [%zu] %.9g)",
                     not_t, n, zt_dtype_name(t), first_t, (double)got[first_t]);
        if (not_once)
            snprintf(b, sizeof b,
                     "; %zu of %zu are not the fp32 result rounded once (first [%zu] got %.9g, "
                     "fp32 %.9g rounds to %.9g)",
                     not_once, n, first_once, (double)got[first_once], (double)f32[first_once],
                     (double)zt_test_round(f32[first_once], t));
        check_at(file, line, false, "%s%s%s", what, a, b);
    } else {
        check_at(file, line, true, "%s", "");
    }
    free(h);
    free(rt);
    return ok;
}
