/* The op test harness's shared pieces (test_ops.c and the files beside this one): checks that
 * count into check.h's summary, random inputs, an independent reference for 16-bit rounding,
 * device buffers filled and read back through the backend object, tolerance comparisons, finite
 * differences and the list of op families that test_ops runs. */
#ifndef ZT_TEST_OPS_HARNESS_H
#define ZT_TEST_OPS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/backend.h"

/* ---- tolerances -------------------------------------------------------------------------------
 * A comparison passes element i when |got[i] - want[i]| <= tol · (|want[i]| + rms(want)): relative
 * to the element where it is large, and to the tensor's typical magnitude where it is near zero (a
 * sum that cancels, a GELU near 0), so one number states each precision. */

/* fp32 against fp32 computed by another backend, or by the same one in another order: an output
 * summed over K terms may differ by about sqrt(K) rounding errors of 2^-24 each, 3e-6 of the
 * typical magnitude even at GPT-2's K = 3072, and far less at the few hundred terms here. A
 * backend that multiplies in TF32 (10-bit mantissas) does not pass, which is intended: fp32
 * activations mean fp32 arithmetic. */
#define ZT_TEST_TOL_F32 1e-5

/* The CPU's fp32 forward against the double-precision reference in this test: the shapes here sum
 * at most a few hundred terms, whose rounding errors (2^-24 each, adding like a random walk) stay
 * near 5e-7 of the typical magnitude; the largest measured is 4e-7. Tighter than between
 * backends, so that a LayerNorm eps off by 10x shows. */
#define ZT_TEST_TOL_FWD 2e-6

/* The CPU's fp32 backward against central differences of the double-precision reference. The
 * differences themselves are good to about 1e-8 (truncation h²·f'''/6 with h = 1e-4 relative,
 * round-off 1e-16·|loss|/h); what the bound allows is the fp32 backward's own rounding, which the
 * cancelling sums of a LayerNorm or softmax backward raise to a few 1e-6 of the typical magnitude.
 * The largest error measured at the shapes here is about 15x below it. A wrong term (a sign, a
 * missing 1/C, an off-by-one mask) is off by tens of percent. */
#define ZT_TEST_TOL_FD 5e-5

/* Outputs held at a 16-bit precision, against the CPU at the same precision: a backend that
 * computes in fp32 and rounds once differs by one unit in the last place (at most 2^-7 of the
 * value for bfloat16, 2^-10 for binary16) where the two fp32 results straddle a rounding
 * boundary; one that keeps an intermediate in the 16-bit type (a normalised row, a GELU argument,
 * the W of a 16-bit matmul) adds a rounding or two of its own. The bound is two units at the
 * coarsest relative spacing, which the rms term above doubles for a typical element. fp32 outputs
 * computed at that precision (parameter gradients, LayerNorm statistics, attention probabilities,
 * losses) get the same bound, since a backend may compute them from 16-bit intermediates too. */
double zt_test_tol(zt_dtype act);

/* ---- checks (counted into check.h's summary) ------------------------------------------------- */

/* test_ops --margins: every tolerance check also prints its worst error as a fraction of its
 * bound, which is how the bounds above were set. */
extern bool zt_test_margins;

__attribute__((format(printf, 4, 5))) bool zt_test_check_at(const char *file, int line, bool ok,
                                                            const char *fmt, ...);
#define CHECK_AT(cond, ...) zt_test_check_at(__FILE__, __LINE__, (cond), __VA_ARGS__)

/* |got - want| within tol (see above) for every element; one check per tensor, whose failure
 * names the tensor (the format), how many elements are off and the worst one. */
__attribute__((format(printf, 7, 8))) bool zt_test_close_f(const char *file, int line,
                                                           const float *got, const float *want,
                                                           size_t n, double tol, const char *fmt,
                                                           ...);
__attribute__((format(printf, 7, 8))) bool zt_test_close_d(const char *file, int line,
                                                           const float *got, const double *want,
                                                           size_t n, double tol, const char *fmt,
                                                           ...);
#define CHECK_CLOSE(got, want, n, tol, ...)                                                        \
    _Generic((want),                                                                               \
        float *: zt_test_close_f,                                                                  \
        const float *: zt_test_close_f,                                                            \
        double *: zt_test_close_d,                                                                 \
        const double *: zt_test_close_d)(__FILE__, __LINE__, (got), (want), (n), (tol),            \
                                         __VA_ARGS__)

/* The same bits in every element (two NaNs count as the same only with equal bits). */
__attribute__((format(printf, 6, 7))) bool zt_test_same_at(const char *file, int line,
                                                           const float *got, const float *want,
                                                           size_t n, const char *fmt, ...);
#define CHECK_SAME(got, want, n, ...)                                                              \
    zt_test_same_at(__FILE__, __LINE__, (got), (want), (n), __VA_ARGS__)

/* An activation the CPU holds at t: every element of got is a value of type t (a round trip
 * through the CPU's to_half and from_half leaves its bits unchanged) and is f32[i], the op's fp32
 * result on the same inputs, rounded once to t by zt_test_round. */
__attribute__((format(printf, 8, 9))) bool zt_test_held_at(const char *file, int line,
                                                           zt_backend *cpu, zt_dtype t,
                                                           const float *got, const float *f32,
                                                           size_t n, const char *fmt, ...);
#define CHECK_HELD(cpu, t, got, f32, n, ...)                                                       \
    zt_test_held_at(__FILE__, __LINE__, (cpu), (t), (got), (f32), (n), __VA_ARGS__)

/* The verdict of every check made (check.h's check_summary). */
int zt_test_summary(void);

/* ---- random numbers and host buffers --------------------------------------------------------- */

typedef struct {
    uint64_t s;
} zt_test_rng;

/* A generator seeded from a name and a number, so a family's cases are the same whether it runs
 * alone (--op) or with the others. */
zt_test_rng zt_test_rng_for(const char *name, uint64_t k);
uint64_t zt_test_next(zt_test_rng *r);
double zt_test_uniform(zt_test_rng *r);             /* [0, 1) */
double zt_test_normal(zt_test_rng *r);              /* N(0, 1) */
int zt_test_int(zt_test_rng *r, int lo, int hi);    /* [lo, hi] */

/* Host buffers: these exit with status 2 when memory runs out; free them with free(). */
float *zt_test_zeros(size_t n);
float *zt_test_random(zt_test_rng *r, size_t n, double mean, double std); /* normal */
float *zt_test_nans(size_t n);                                            /* quiet NaNs */
float *zt_test_dup(const float *v, size_t n);                             /* NULL stays NULL */
double *zt_test_widen(const float *v, size_t n);                          /* to double */

/* ---- the independent 16-bit reference ------------------------------------------------------
 * Written from the formats' definitions (precision p and least exponent emin of each type, round
 * half to even with rint in double) rather than from bit tricks, so it shares nothing with the
 * kernels' conversions. */

/* x rounded to the nearest value of type t (F32: x itself); values past the type's range become
 * ±inf, -0 stays -0, a NaN stays a NaN. */
float zt_test_round(float x, zt_dtype t);
void zt_test_round_all(float *v, size_t n, zt_dtype t);
/* The 16-bit pattern of a finite or infinite x of type t (x already rounded), and back. NaNs have
 * no single pattern: encode gives the quiet NaN of x's sign, decode any NaN. */
uint16_t zt_test_encode(float x, zt_dtype t);
float zt_test_decode(uint16_t h, zt_dtype t);

/* ---- device buffers ---------------------------------------------------------------------------
 * One case's device memory on one backend: every buffer is allocated with ZT_MEM_DEVICE, filled
 * by a ZT_COPY_H2D copy and read back by a ZT_COPY_D2H copy, and freed together by
 * zt_test_dev_finish after zt_backend_sync, whose status is checked. */

enum { ZT_TEST_DEV_MAX = 24 };

typedef struct {
    zt_backend *be;
    zt_ctx ctx; /* the backend and the activation precision the case's ops run at */
    int n;
    void *p[ZT_TEST_DEV_MAX];
    size_t bytes[ZT_TEST_DEV_MAX];
} zt_test_dev;

void zt_test_dev_init(zt_test_dev *d, zt_backend *be, zt_dtype act);
/* Bytes of one activation element as be holds it at act: the CPU keeps fp32 storage at every
 * precision (ops.h); a backend that computes in a 16-bit type is taken to store that type. */
size_t zt_test_act_size(const zt_backend *be, zt_dtype act);
/* Zeroed device memory. */
void *zt_test_dev_alloc(zt_test_dev *d, size_t bytes);
/* An fp32 tensor (parameters, their gradients, statistics) holding host[n]; NULL for NULL. */
float *zt_test_dev_f32(zt_test_dev *d, const float *host, size_t n);
/* An activation tensor holding host[n], whose values must already be of d's precision; NULL for
 * NULL. */
void *zt_test_dev_act(zt_test_dev *d, const float *host, size_t n);
/* An fp32 tensor of n normal values with the given spread (--perf's inputs). */
float *zt_test_dev_random(zt_test_dev *d, zt_test_rng *r, size_t n, double std);
/* Raw device memory holding host[0, bytes) (16-bit buffers, say); NULL for NULL. */
void *zt_test_dev_bytes(zt_test_dev *d, const void *host, size_t bytes);
void zt_test_dev_get_bytes(zt_test_dev *d, void *host, const void *dev, size_t bytes);
/* Reads a tensor back into host[n]. */
void zt_test_dev_get_f32(zt_test_dev *d, float *host, const float *dev, size_t n);
void zt_test_dev_get_act(zt_test_dev *d, float *host, const void *dev, size_t n);
/* Synchronises (checking the status) and frees every buffer. */
void zt_test_dev_finish(zt_test_dev *d);

/* ---- finite differences ---------------------------------------------------------------------- */

/* The scalar whose gradient a backward computes, from an op's double-precision reference at the
 * inputs that state holds: sum(out · r) for a random r that the backward was fed as dout. */
typedef double (*zt_test_loss_fn)(void *state);

/* Checks grad[i] against the central difference (loss(x + h·e_i) - loss(x - h·e_i)) / 2h with
 * h = 1e-4·max(1, |x_i|), at every element of x[n] or, when n is larger than samples, at that many
 * random ones. With base (an output that accumulates) grad[i] - base[i] is checked. x is perturbed
 * in place and restored. One check per tensor, within ZT_TEST_TOL_FD. */
__attribute__((format(printf, 11, 12))) void zt_test_fd_at(const char *file, int line, double *x,
                                                           size_t n, const float *grad,
                                                           const float *base, zt_test_loss_fn loss,
                                                           void *state, int samples,
                                                           zt_test_rng *r, const char *fmt, ...);
#define CHECK_FD(x, n, grad, base, loss, state, samples, r, ...)                                   \
    zt_test_fd_at(__FILE__, __LINE__, (x), (n), (grad), (base), (loss), (state), (samples), (r),   \
                  __VA_ARGS__)

/* ---- families and backends ------------------------------------------------------------------- */

/* The backends of this build, the CPU first: the CPU is the reference each is compared with, and
 * is compared with itself, so the path from upload to read-back runs even with no other device. */
typedef struct {
    zt_backend *be[ZT_DEVICE_COUNT];
    int n;
} zt_test_env;

/* The fields of zt_ops, in their order: count and names. */
int zt_test_entry_count(void);
const char *zt_test_entry_name(int i);
/* Whether be's table has the entry (a field name of zt_ops, "layernorm_forward"). */
bool zt_test_has(const zt_backend *be, const char *entry);

/* One comparison of an op family on backend be against the CPU at one activation precision. */
typedef void (*zt_test_compare_fn)(zt_backend *cpu, zt_backend *be, zt_dtype act,
                                   zt_test_rng *r);

/* Runs compare for every backend of env whose table has all the entries (a NULL-terminated list)
 * at F32, BF16 and F16 (or F32 only when !act_matters); prints "not implemented" for a backend
 * lacking one, and fails for a backend having them when the CPU does not. Returns whether the CPU
 * has them all. */
bool zt_test_each_backend(const zt_test_env *env, const char *family, const char *const *entries,
                          bool act_matters, zt_test_compare_fn compare);

/* ---- the families (defined by the files beside this one) ------------------------------------ */

typedef struct {
    const char *name;                          /* what --op selects */
    const char *const *entries;                /* the zt_ops fields it covers, NULL-terminated */
    void (*check)(const zt_test_env *env);
    void (*perf)(zt_backend *be);              /* --perf; NULL when the family has no timing */
} zt_test_family;

extern const zt_test_family zt_test_embedding, zt_test_layernorm, zt_test_linear, zt_test_linear_gelu,
    zt_test_attention, zt_test_gelu, zt_test_add, zt_test_softmax_xent, zt_test_rmsnorm,
    zt_test_xent_partial, zt_test_rope, zt_test_silu_mul, zt_test_adam_update, zt_test_sgd_update,
    zt_test_adam_update_mixed, zt_test_lamb, zt_test_sum_squares, zt_test_scale, zt_test_to_half,
    zt_test_from_half, zt_test_round_to, zt_test_accumulate_half, zt_test_sum_squares_half,
    zt_test_backend_memory, zt_test_linear_twin, zt_test_optim_slices, zt_test_sum_to,
    zt_test_weighted_sum_to, zt_test_param_twin, zt_test_grad_twin;

/* ---- --perf ---------------------------------------------------------------------------------- */

/* The median wall time in milliseconds of reps runs of fn(arg), each followed by
 * zt_backend_sync, after one untimed run. */
double zt_test_time_ms(zt_backend *be, void (*fn)(void *arg), void *arg, int reps);
/* One row of the --perf table; work is bytes moved (gbytes) or FLOP (gflop), whichever is
 * meaningful, 0 for neither. */
void zt_test_perf_row(const char *op, const zt_backend *be, const char *shape, double ms,
                      double gbytes, double gflop);

#endif
