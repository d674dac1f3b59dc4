/* Per-op timings (op_profile.h): a table of the backend's own entries, each wrapped between two
 * timing events, and the sums of a step's times per op. Backend-neutral: the clock is whatever
 * the backend's timers read (the CPU's monotonic clock, CUDA events), so this one file profiles
 * every device. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/op_profile.h"

/* Events for this many op calls before a step must stop to read them: GPT-2 124M calls about
 * 200 ops a micro-step, and a poolful costs little memory (CUDA events are small). */
enum { POOL_CALLS = 4096 };

struct zt_op_profile {
    zt_ops table;         /* first: be->ops points here, and the entries find the profile by it */
    const zt_ops *real;   /* the backend's own table */
    zt_backend *be;
    pthread_t thread;     /* the step's thread */
    atomic_bool in_step;  /* read by any thread that calls an op */
    zt_event **ev;        /* [2 · POOL_CALLS]: a call's start and end */
    unsigned char *op_of; /* [POOL_CALLS]: which op each pooled call was */
    size_t used;
    zt_op_time sums[ZT_OP_COUNT];
    atomic_long other;
    zt_status err;        /* the first failure to read a time this step, kept for end_step */
    char err_msg[512];
};

static const char *const op_names[ZT_OP_COUNT] = {
    "embedding_forward", "embedding_backward", "layernorm_forward", "layernorm_backward",
    "rmsnorm_forward", "rmsnorm_backward", "rope_forward", "rope_backward",
    "linear_forward", "linear_backward", "linear_gelu_forward", "linear_backward_gelu",
    "attention_forward", "attention_backward",
    "gelu_forward", "gelu_backward", "silu_mul_forward", "silu_mul_backward",
    "add", "softmax_xent", "xent_partial_stats", "xent_partial_grad",
    "adam_update", "sgd_update", "adam_update_mixed", "lamb_moments",
    "lamb_apply", "sum_squares", "scale", "to_half",
    "from_half", "round_to", "accumulate_half", "sum_squares_half",
    "sgd_update_mixed", "lamb_apply_mixed", "sum_to", "lamb_moments_to",
    "xent_partial_combine", "lamb_steps", "weighted_sum_to",
};

const char *zt_op_name(zt_op_id op) {
    return (unsigned)op < ZT_OP_COUNT ? op_names[op] : "?";
}

static zt_op_profile *profile_of(const zt_ctx *x) { return (zt_op_profile *)(void *)x->be->ops; }

/* Reads the pooled calls' times into the sums and empties the pool. */
static void harvest(zt_op_profile *p) {
    for (size_t i = 0; i < p->used; i++) {
        double ms = 0.0;
        zt_status s = zt_backend_timer_elapsed(p->be, p->ev[2 * i], p->ev[2 * i + 1], &ms);
        if (s != ZT_OK && p->err == ZT_OK) {
            p->err = s;
            snprintf(p->err_msg, sizeof p->err_msg, "%s", zt_last_error());
        }
        p->sums[p->op_of[i]].calls++;
        p->sums[p->op_of[i]].ms += s == ZT_OK ? ms : 0.0;
    }
    p->used = 0;
}

/* The pool slot of a timed call, its start recorded; -1 for a call that is not the step's. */
static long span_begin(zt_op_profile *p, zt_op_id op) {
    if (!atomic_load(&p->in_step) || !pthread_equal(pthread_self(), p->thread)) {
        atomic_fetch_add(&p->other, 1);
        return -1;
    }
    if (p->used == POOL_CALLS)
        harvest(p);
    size_t i = p->used++;
    p->op_of[i] = (unsigned char)op;
    zt_backend_event_record(p->be, p->ev[2 * i], ZT_STREAM_COMPUTE);
    return (long)i;
}

static void span_end(zt_op_profile *p, long i) {
    if (i >= 0)
        zt_backend_event_record(p->be, p->ev[2 * i + 1], ZT_STREAM_COMPUTE);
}

/* One entry of the table: the backend's own between the two records. */
#define TIMED(id, name, params, args)                                                              \
    static void timed_##name params {                                                              \
        zt_op_profile *p = profile_of(x);                                                          \
        long i = span_begin(p, id);                                                                \
        p->real->name args;                                                                        \
        span_end(p, i);                                                                            \
    }
#define TIMED_DOUBLE(id, name, params, args)                                                       \
    static double timed_##name params {                                                            \
        zt_op_profile *p = profile_of(x);                                                          \
        long i = span_begin(p, id);                                                                \
        double r = p->real->name args;                                                             \
        span_end(p, i);                                                                            \
        return r;                                                                                  \
    }

TIMED(ZT_OP_EMBEDDING_FORWARD, embedding_forward,
      (const zt_ctx *x, void *out, const int32_t *tokens, const float *wte, const float *wpe,
       int B, int T, int C),
      (x, out, tokens, wte, wpe, B, T, C))
TIMED(ZT_OP_EMBEDDING_BACKWARD, embedding_backward,
      (const zt_ctx *x, float *dwte, float *dwpe, const void *dout, const int32_t *tokens, int B,
       int T, int C),
      (x, dwte, dwpe, dout, tokens, B, T, C))
TIMED(ZT_OP_LAYERNORM_FORWARD, layernorm_forward,
      (const zt_ctx *x, void *out, float *mean, float *rstd, const void *inp, const float *w,
       const float *b, int N, int C),
      (x, out, mean, rstd, inp, w, b, N, C))
TIMED(ZT_OP_LAYERNORM_BACKWARD, layernorm_backward,
      (const zt_ctx *x, void *dinp, float *dw, float *db, const void *dout, const void *inp,
       const float *w, const float *mean, const float *rstd, int N, int C),
      (x, dinp, dw, db, dout, inp, w, mean, rstd, N, C))
TIMED(ZT_OP_RMSNORM_FORWARD, rmsnorm_forward,
      (const zt_ctx *x, void *out, float *rstd, const void *inp, const float *w, float eps, int N,
       int C),
      (x, out, rstd, inp, w, eps, N, C))
TIMED(ZT_OP_RMSNORM_BACKWARD, rmsnorm_backward,
      (const zt_ctx *x, void *dinp, float *dw, const void *dout, const void *inp, const float *w,
       const float *rstd, int N, int C),
      (x, dinp, dw, dout, inp, w, rstd, N, C))
TIMED(ZT_OP_ROPE_FORWARD, rope_forward,
      (const zt_ctx *x, void *xq, const float *cos, const float *sin, int B, int T, int n_heads,
       int head_dim, size_t row_stride),
      (x, xq, cos, sin, B, T, n_heads, head_dim, row_stride))
TIMED(ZT_OP_ROPE_BACKWARD, rope_backward,
      (const zt_ctx *x, void *dxq, const float *cos, const float *sin, int B, int T, int n_heads,
       int head_dim, size_t row_stride),
      (x, dxq, cos, sin, B, T, n_heads, head_dim, row_stride))
TIMED(ZT_OP_LINEAR_FORWARD, linear_forward,
      (const zt_ctx *x, void *out, const void *inp, const float *w, const float *bias,
       const void *residual, int N, int C, int OC, zt_weight_layout layout),
      (x, out, inp, w, bias, residual, N, C, OC, layout))
TIMED(ZT_OP_LINEAR_BACKWARD, linear_backward,
      (const zt_ctx *x, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
       const float *w, int N, int C, int OC, zt_weight_layout layout, bool accumulate_dinp),
      (x, dinp, dw, dbias, dout, inp, w, N, C, OC, layout, accumulate_dinp))
TIMED(ZT_OP_LINEAR_GELU_FORWARD, linear_gelu_forward,
      (const zt_ctx *x, void *out, void *pre, const void *inp, const float *w, const float *bias,
       int N, int C, int OC, zt_weight_layout layout),
      (x, out, pre, inp, w, bias, N, C, OC, layout))
TIMED(ZT_OP_LINEAR_BACKWARD_GELU, linear_backward_gelu,
      (const zt_ctx *x, void *dpre, float *dw, float *dbias, const void *dout, const void *inp,
       const void *pre, const float *w, int N, int C, int OC, zt_weight_layout layout),
      (x, dpre, dw, dbias, dout, inp, pre, w, N, C, OC, layout))
TIMED(ZT_OP_ATTENTION_FORWARD, attention_forward,
      (const zt_ctx *x, const zt_attn_shape *s, void *out, float *att, const void *q,
       const void *k, const void *v),
      (x, s, out, att, q, k, v))
TIMED(ZT_OP_ATTENTION_BACKWARD, attention_backward,
      (const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk, void *dv, float *scratch,
       const void *dout, const void *out, const void *q, const void *k, const void *v,
       const float *att),
      (x, s, dq, dk, dv, scratch, dout, out, q, k, v, att))
TIMED(ZT_OP_GELU_FORWARD, gelu_forward, (const zt_ctx *x, void *out, const void *inp, size_t n),
      (x, out, inp, n))
TIMED(ZT_OP_GELU_BACKWARD, gelu_backward,
      (const zt_ctx *x, void *dinp, const void *inp, const void *dout, size_t n),
      (x, dinp, inp, dout, n))
TIMED(ZT_OP_SILU_MUL_FORWARD, silu_mul_forward,
      (const zt_ctx *x, void *out, const void *gate, const void *up, size_t n),
      (x, out, gate, up, n))
TIMED(ZT_OP_SILU_MUL_BACKWARD, silu_mul_backward,
      (const zt_ctx *x, void *dgate, void *dup, const void *dout, const void *gate,
       const void *up, size_t n),
      (x, dgate, dup, dout, gate, up, n))
TIMED(ZT_OP_ADD, add, (const zt_ctx *x, void *out, const void *a, const void *b, size_t n),
      (x, out, a, b, n))
TIMED(ZT_OP_SOFTMAX_XENT, softmax_xent,
      (const zt_ctx *x, float *losses, void *logits, const int32_t *targets, int N, int V,
       float grad_scale),
      (x, losses, logits, targets, N, V, grad_scale))
TIMED(ZT_OP_XENT_PARTIAL_STATS, xent_partial_stats,
      (const zt_ctx *x, float *stats, const void *logits, const int32_t *targets, int N, int V),
      (x, stats, logits, targets, N, V))
TIMED(ZT_OP_XENT_PARTIAL_GRAD, xent_partial_grad,
      (const zt_ctx *x, void *logits, const float *logz, const int32_t *targets, int N, int V,
       float grad_scale),
      (x, logits, logz, targets, N, V, grad_scale))
TIMED(ZT_OP_XENT_PARTIAL_COMBINE, xent_partial_combine,
      (const zt_ctx *x, float *logz, float *losses, const float *stats, const int32_t *targets,
       int N, int shards),
      (x, logz, losses, stats, targets, N, shards))
TIMED(ZT_OP_ADAM_UPDATE, adam_update,
      (const zt_ctx *x, float *p_, const float *g, float *m, float *v, size_t n,
       const zt_adam_args *a),
      (x, p_, g, m, v, n, a))
TIMED(ZT_OP_SGD_UPDATE, sgd_update,
      (const zt_ctx *x, float *p_, const float *g, float *buf, size_t n, const zt_sgd_args *a),
      (x, p_, g, buf, n, a))
TIMED(ZT_OP_ADAM_UPDATE_MIXED, adam_update_mixed,
      (const zt_ctx *x, float *master, const void *grad, zt_dtype grad_type, float grad_mul,
       float *m, float *v, uint16_t *param16, zt_dtype param_type, size_t n,
       const zt_adam_args *a),
      (x, master, grad, grad_type, grad_mul, m, v, param16, param_type, n, a))
TIMED(ZT_OP_LAMB_MOMENTS, lamb_moments,
      (const zt_ctx *x, const float *p_, const float *g, float *m, float *v, size_t n,
       const zt_lamb_args *a, double sums[2]),
      (x, p_, g, m, v, n, a, sums))
TIMED(ZT_OP_LAMB_APPLY, lamb_apply,
      (const zt_ctx *x, float *p_, const float *m, const float *v, size_t n,
       const zt_lamb_args *a, const float *step),
      (x, p_, m, v, n, a, step))
TIMED(ZT_OP_SGD_UPDATE_MIXED, sgd_update_mixed,
      (const zt_ctx *x, float *master, const void *grad, zt_dtype grad_type, float grad_mul,
       float *buf, uint16_t *param16, zt_dtype param_type, size_t n, const zt_sgd_args *a),
      (x, master, grad, grad_type, grad_mul, buf, param16, param_type, n, a))
TIMED(ZT_OP_LAMB_APPLY_MIXED, lamb_apply_mixed,
      (const zt_ctx *x, float *p_, const float *m, const float *v, size_t n,
       const zt_lamb_args *a, const float *step, uint16_t *param16, zt_dtype param_type),
      (x, p_, m, v, n, a, step, param16, param_type))
TIMED_DOUBLE(ZT_OP_SUM_SQUARES, sum_squares, (const zt_ctx *x, const float *v, size_t n),
             (x, v, n))
TIMED(ZT_OP_SCALE, scale, (const zt_ctx *x, float *v, size_t n, float s), (x, v, n, s))
TIMED(ZT_OP_TO_HALF, to_half,
      (const zt_ctx *x, uint16_t *dst, const float *src, size_t n, zt_dtype t),
      (x, dst, src, n, t))
TIMED(ZT_OP_FROM_HALF, from_half,
      (const zt_ctx *x, float *dst, const uint16_t *src, size_t n, zt_dtype t),
      (x, dst, src, n, t))
TIMED(ZT_OP_ROUND_TO, round_to, (const zt_ctx *x, float *v, size_t n, zt_dtype t), (x, v, n, t))
TIMED(ZT_OP_ACCUMULATE_HALF, accumulate_half,
      (const zt_ctx *x, uint16_t *dst, const float *src, size_t n, zt_dtype t),
      (x, dst, src, n, t))
TIMED_DOUBLE(ZT_OP_SUM_SQUARES_HALF, sum_squares_half,
             (const zt_ctx *x, const uint16_t *v, size_t n, zt_dtype t), (x, v, n, t))
TIMED(ZT_OP_SUM_TO, sum_to,
      (const zt_ctx *x, double *out, const void *v, size_t n, zt_dtype t, bool squares),
      (x, out, v, n, t, squares))
TIMED(ZT_OP_LAMB_MOMENTS_TO, lamb_moments_to,
      (const zt_ctx *x, const float *p_, const float *g, float *m, float *v, size_t n,
       const zt_lamb_args *a, double *sums),
      (x, p_, g, m, v, n, a, sums))
TIMED(ZT_OP_LAMB_STEPS, lamb_steps,
      (const zt_ctx *x, float *steps, const double *sums, size_t n, const zt_lamb_step_args *a),
      (x, steps, sums, n, a))
TIMED(ZT_OP_WEIGHTED_SUM_TO, weighted_sum_to,
      (const zt_ctx *x, double *out, const double *parts, const double *weights, int n),
      (x, out, parts, weights, n))

/* The profile's table: an entry for each the backend has, NULL where it has none (a model checks
 * the entries it needs, and must find the same ones missing). */
static void fill_table(zt_ops *t, const zt_ops *r) {
#define ENTRY(name) t->name = r->name ? timed_##name : NULL
    ENTRY(embedding_forward);
    ENTRY(embedding_backward);
    ENTRY(layernorm_forward);
    ENTRY(layernorm_backward);
    ENTRY(rmsnorm_forward);
    ENTRY(rmsnorm_backward);
    ENTRY(rope_forward);
    ENTRY(rope_backward);
    ENTRY(linear_forward);
    ENTRY(linear_backward);
    ENTRY(linear_gelu_forward);
    ENTRY(linear_backward_gelu);
    ENTRY(attention_forward);
    ENTRY(attention_backward);
    ENTRY(gelu_forward);
    ENTRY(gelu_backward);
    ENTRY(silu_mul_forward);
    ENTRY(silu_mul_backward);
    ENTRY(add);
    ENTRY(softmax_xent);
    ENTRY(xent_partial_stats);
    ENTRY(xent_partial_grad);
    ENTRY(adam_update);
    ENTRY(sgd_update);
    ENTRY(adam_update_mixed);
    ENTRY(lamb_moments);
    ENTRY(lamb_apply);
    ENTRY(sum_squares);
    ENTRY(scale);
    ENTRY(to_half);
    ENTRY(from_half);
    ENTRY(round_to);
    ENTRY(accumulate_half);
    ENTRY(sum_squares_half);
    ENTRY(sgd_update_mixed);
    ENTRY(lamb_apply_mixed);
    ENTRY(sum_to);
    ENTRY(lamb_moments_to);
    ENTRY(xent_partial_combine);
    ENTRY(lamb_steps);
    ENTRY(weighted_sum_to);
#undef ENTRY
}

zt_status zt_op_profile_create(zt_op_profile **out, zt_backend *be) {
    *out = NULL;
    if (!be->iface->timer_create || !be->iface->timer_elapsed)
        return zt_error(ZT_ERR_UNSUPPORTED, "--profile: backend \"%s\" has no timing events",
                        be->name);
    zt_op_profile *p = calloc(1, sizeof *p);
    if (!p)
        return zt_error(ZT_ERR_NOMEM, "--profile: out of memory");
    p->ev = calloc(2 * POOL_CALLS, sizeof *p->ev);
    p->op_of = calloc(POOL_CALLS, 1);
    for (size_t i = 0; p->ev && p->op_of && i < 2 * POOL_CALLS; i++)
        if (!(p->ev[i] = zt_backend_timer_create(be))) {
            p->be = be;
            zt_op_profile_destroy(p);
            return zt_error(ZT_ERR_NOMEM, "--profile: backend \"%s\" could not make timing event "
                            "%zu of %d", be->name, i + 1, 2 * POOL_CALLS);
        }
    if (!p->ev || !p->op_of) {
        free(p->ev);
        free(p->op_of);
        free(p);
        return zt_error(ZT_ERR_NOMEM, "--profile: out of memory");
    }
    p->be = be;
    p->real = be->ops;
    fill_table(&p->table, p->real);
    atomic_init(&p->other, 0);
    atomic_init(&p->in_step, false);
    be->ops = &p->table;
    *out = p;
    return ZT_OK;
}

void zt_op_profile_destroy(zt_op_profile *p) {
    if (!p)
        return;
    if (p->real && p->be->ops == &p->table)
        p->be->ops = p->real;
    /* Events still queued on the device must finish before they go. */
    zt_backend_sync(p->be);
    for (size_t i = 0; p->ev && i < 2 * POOL_CALLS && p->ev[i]; i++)
        zt_backend_event_destroy(p->be, p->ev[i]);
    free(p->ev);
    free(p->op_of);
    free(p);
}

const char *zt_op_profile_clock(const zt_op_profile *p) {
    return p->be->device == ZT_DEVICE_CUDA ? "cudaEvent" : "monotonic";
}

void zt_op_profile_begin_step(zt_op_profile *p) {
    memset(p->sums, 0, sizeof p->sums);
    p->used = 0;
    p->err = ZT_OK;
    p->thread = pthread_self();
    atomic_store(&p->in_step, true);
}

zt_status zt_op_profile_end_step(zt_op_profile *p, zt_op_time out[ZT_OP_COUNT]) {
    atomic_store(&p->in_step, false);
    harvest(p);
    memcpy(out, p->sums, sizeof p->sums);
    if (p->err != ZT_OK)
        return zt_error(p->err, "--profile: %s", p->err_msg);
    return ZT_OK;
}

long zt_op_profile_other_calls(const zt_op_profile *p) {
    return atomic_load(&((zt_op_profile *)p)->other);
}
