/* xent_partial_stats, xent_partial_combine and xent_partial_grad, the vocabulary-parallel
 * cross-entropy's three parts: every backend against the CPU (the combine bit for bit, from the
 * same gathered stats), the CPU's combine against a double-precision log-sum-exp over the whole
 * rows, and the CPU's shards, combined by the op, against the whole-row softmax_xent op: the
 * same losses and, shard by shard, the same gradient. Ignored rows and targets held by another
 * shard included. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    int N, V, shards;  /* V columns in `shards` equal shards */
    float *logits;     /* [N,V] whole rows at the case's precision */
    int32_t *targets;  /* [N] whole-vocabulary ids; -1 ignored */
    float grad_scale;
} xp_case;

static xp_case xp_make(zt_test_rng *r, int N, int Vs, int shards, zt_dtype act) {
    xp_case c = {N, Vs * shards, shards, NULL, NULL, (float)(0.1 + zt_test_uniform(r))};
    c.logits = zt_test_random(r, (size_t)N * c.V, 0.0, 3.0);
    /* One row far up: each shard must subtract its own maximum. */
    for (int v = 0; v < c.V; v++)
        c.logits[v] += 60.0f;
    zt_test_round_all(c.logits, (size_t)N * c.V, act);
    c.targets = calloc(N, sizeof *c.targets);
    for (int i = 0; i < N; i++)
        c.targets[i] = i % 4 == 3 ? -1 : zt_test_int(r, 0, c.V - 1);
    return c;
}

/* Shard s's columns of the rows, and its local targets as the ops take them. */
static float *xp_shard(const xp_case *c, int s, int32_t *local) {
    const int Vs = c->V / c->shards;
    float *x = zt_test_zeros((size_t)c->N * Vs);
    for (int n = 0; n < c->N; n++) {
        memcpy(x + (size_t)n * Vs, c->logits + (size_t)n * c->V + (size_t)s * Vs,
               Vs * sizeof *x);
        int32_t t = c->targets[n];
        local[n] = t < 0 ? ZT_XENT_IGNORED : t / Vs == s ? t % Vs : -1;
    }
    return x;
}

/* Both halves on be for shard s: the stats, and the gradient from the given logz. */
static void xp_run(zt_backend *be, zt_dtype act, const xp_case *c, int s, const float *logz,
                   float *stats, float *grad) {
    const int Vs = c->V / c->shards;
    int32_t *local = calloc(c->N, sizeof *local);
    float *shard = xp_shard(c, s, local);
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    float *nans = zt_test_nans(3 * (size_t)c->N);
    float *dstats = zt_test_dev_f32(&d, nans, 3 * (size_t)c->N);
    void *dx = zt_test_dev_act(&d, shard, (size_t)c->N * Vs);
    be->ops->xent_partial_stats(&d.ctx, dstats, dx, local, c->N, Vs);
    zt_test_dev_get_f32(&d, stats, dstats, 3 * (size_t)c->N);
    if (logz) {
        float *dlogz = zt_test_dev_f32(&d, logz, c->N);
        be->ops->xent_partial_grad(&d.ctx, dx, dlogz, local, c->N, Vs, c->grad_scale);
        zt_test_dev_get_act(&d, grad, dx, (size_t)c->N * Vs);
    }
    zt_test_dev_finish(&d);
    free(nans), free(shard), free(local);
}

/* The combine op on be over the shards' stats gathered side by side (all[s] shard s's). */
static void xp_combine(zt_backend *be, const xp_case *c, float *const *all, float *logz,
                       float *loss) {
    const size_t part = 3 * (size_t)c->N;
    float *side = zt_test_zeros((size_t)c->shards * part);
    for (int s = 0; s < c->shards; s++)
        memcpy(side + (size_t)s * part, all[s], part * sizeof *side);
    int32_t *local = calloc(c->N, sizeof *local);
    free(xp_shard(c, 0, local));
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    float *nans = zt_test_nans(c->N);
    float *dstats = zt_test_dev_f32(&d, side, (size_t)c->shards * part);
    float *dlogz = zt_test_dev_f32(&d, nans, c->N), *dloss = zt_test_dev_f32(&d, nans, c->N);
    be->ops->xent_partial_combine(&d.ctx, dlogz, dloss, dstats, local, c->N, c->shards);
    zt_test_dev_get_f32(&d, logz, dlogz, c->N);
    zt_test_dev_get_f32(&d, loss, dloss, c->N);
    zt_test_dev_finish(&d);
    free(side), free(local), free(nans);
}

/* The reference: each whole row's log-partition log Σ exp(x) in double (shifted by the row's
 * maximum) and its loss, 0 for an ignored row. */
static void xp_reference(const xp_case *c, double *logz, double *loss) {
    for (int n = 0; n < c->N; n++) {
        const float *x = c->logits + (size_t)n * c->V;
        double mx = x[0], sum = 0.0;
        for (int v = 1; v < c->V; v++)
            mx = fmax(mx, x[v]);
        for (int v = 0; v < c->V; v++)
            sum += exp((double)x[v] - mx);
        logz[n] = mx + log(sum);
        loss[n] = c->targets[n] >= 0 ? logz[n] - x[c->targets[n]] : 0.0;
    }
}

static void xp_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 3; k++) {
        xp_case c = xp_make(r, zt_test_int(r, 1, 9), zt_test_int(r, 1, 40), 2 + k, act);
        const int Vs = c.V / c.shards;
        float *stats[8];
        for (int s = 0; s < c.shards; s++) {
            float *want = zt_test_zeros(3 * (size_t)c.N), *got = zt_test_zeros(3 * (size_t)c.N);
            float *gw = zt_test_zeros((size_t)c.N * Vs), *gg = zt_test_zeros((size_t)c.N * Vs);
            float *logz = zt_test_random(r, c.N, 62.0, 1.0);
            xp_run(cpu, act, &c, s, logz, want, gw);
            xp_run(be, act, &c, s, logz, got, gg);
            char at[128];
            snprintf(at, sizeof at, "xent_partial %s vs cpu at %s, N=%d V=%d shard %d of %d",
                     be->name, zt_dtype_name(act), c.N, c.V, s, c.shards);
            CHECK_CLOSE(got, want, 3 * (size_t)c.N, zt_test_tol(act), "%s: stats", at);
            CHECK_CLOSE(gg, gw, (size_t)c.N * Vs, zt_test_tol(act), "%s: gradient", at);
            stats[s] = want;
            free(got), free(gw), free(gg), free(logz);
        }
        /* The same gathered stats combined on both: the same operations in the same order. */
        float *lw = zt_test_zeros(c.N), *lg = zt_test_zeros(c.N);
        float *zw = zt_test_zeros(c.N), *zg = zt_test_zeros(c.N);
        xp_combine(cpu, &c, stats, zw, lw);
        xp_combine(be, &c, stats, zg, lg);
        CHECK_SAME(zg, zw, c.N, "xent_partial_combine %s vs cpu at %s, N=%d in %d shards: logz",
                   be->name, zt_dtype_name(act), c.N, c.shards);
        CHECK_SAME(lg, lw, c.N, "xent_partial_combine %s vs cpu at %s, N=%d in %d shards: "
                   "losses", be->name, zt_dtype_name(act), c.N, c.shards);
        for (int s = 0; s < c.shards; s++)
            free(stats[s]);
        free(lw), free(lg), free(zw), free(zg);
        free(c.logits), free(c.targets);
    }
}

/* The shards of rows against the whole rows' softmax_xent. */
static void xp_against_whole(zt_backend *cpu, zt_test_rng *r) {
    static const int shapes[][3] = {{5, 7, 2}, {3, 1, 4}, {8, 33, 3}, {1, 250, 2}};
    for (int k = 0; k < 4; k++) {
        xp_case c = xp_make(r, shapes[k][0], shapes[k][1], shapes[k][2], ZT_F32);
        const int N = c.N, V = c.V, Vs = V / c.shards;
        /* The whole rows through softmax_xent. */
        zt_test_dev d;
        zt_test_dev_init(&d, cpu, ZT_F32);
        float *nans = zt_test_nans(N), *losses = zt_test_dev_f32(&d, nans, N);
        void *x = zt_test_dev_act(&d, c.logits, (size_t)N * V);
        cpu->ops->softmax_xent(&d.ctx, losses, x, c.targets, N, V, c.grad_scale);
        float *want_loss = zt_test_zeros(N), *want_grad = zt_test_zeros((size_t)N * V);
        zt_test_dev_get_f32(&d, want_loss, losses, N);
        zt_test_dev_get_act(&d, want_grad, x, (size_t)N * V);
        zt_test_dev_finish(&d);
        /* The shards. */
        float *stats[8], *grads[8];
        for (int s = 0; s < c.shards; s++) {
            stats[s] = zt_test_zeros(3 * (size_t)N);
            grads[s] = zt_test_zeros((size_t)N * Vs);
            xp_run(cpu, ZT_F32, &c, s, NULL, stats[s], NULL);
        }
        float *logz = zt_test_zeros(N), *loss = zt_test_zeros(N);
        xp_combine(cpu, &c, stats, logz, loss);
        double *ref_logz = calloc(N, sizeof *ref_logz), *ref_loss = calloc(N, sizeof *ref_loss);
        xp_reference(&c, ref_logz, ref_loss);
        float *got_grad = zt_test_zeros((size_t)N * V);
        for (int s = 0; s < c.shards; s++) {
            xp_run(cpu, ZT_F32, &c, s, logz, stats[s], grads[s]);
            for (int n = 0; n < N; n++)
                memcpy(got_grad + (size_t)n * V + (size_t)s * Vs, grads[s] + (size_t)n * Vs,
                       Vs * sizeof(float));
        }
        char at[96];
        snprintf(at, sizeof at, "xent_partial cpu N=%d V=%d in %d shards", N, V, c.shards);
        CHECK_CLOSE(logz, ref_logz, N, ZT_TEST_TOL_FWD, "%s: combined log-partition against "
                    "the double reference", at);
        CHECK_CLOSE(loss, ref_loss, N, ZT_TEST_TOL_FWD, "%s: combined losses against the "
                    "double reference", at);
        CHECK_CLOSE(loss, want_loss, N, ZT_TEST_TOL_FWD, "%s: losses against softmax_xent", at);
        CHECK_CLOSE(got_grad, want_grad, (size_t)N * V, ZT_TEST_TOL_FWD,
                    "%s: gradient against softmax_xent", at);
        for (int s = 0; s < c.shards; s++)
            free(stats[s]), free(grads[s]);
        free(nans), free(want_loss), free(want_grad), free(logz), free(loss), free(got_grad);
        free(ref_logz), free(ref_loss);
        free(c.logits), free(c.targets);
    }
}

static const char *const entries[] = {"xent_partial_stats", "xent_partial_combine",
                                      "xent_partial_grad", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "xent_partial", entries, true, xp_compare))
        return;
    zt_test_rng r = zt_test_rng_for("xent_partial/cpu", 0);
    xp_against_whole(env->be[0], &r);
}

const zt_test_family zt_test_xent_partial = {"xent_partial", entries, check, NULL};
