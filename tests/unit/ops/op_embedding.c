/* embedding_forward and embedding_backward: every backend against the CPU, the CPU against a
 * double-precision reference and its finite differences, and the output held at 16 bits. Every
 * fifth token is -1, a token a vocabulary-parallel shard does not hold (no row, no gradient). */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

/* One case, in host memory. Tokens stay in host memory, as ops.h says. */
typedef struct {
    int B, T, C, V;
    int32_t *tok;         /* [B,T], values in [0,V) with repeats, or -1 (no row) */
    float *wte, *wpe;     /* [V,C], [T,C]; wpe NULL: no learned positions */
    float *dout;          /* [B,T,C] at the case's precision */
    float *dwte0, *dwpe0; /* what dwte and dwpe hold before the backward adds into them */
} emb_case;

typedef struct {
    float *out, *dwte, *dwpe;
} emb_result;

static emb_case emb_make(zt_test_rng *r, int B, int T, int C, int V, bool pos, zt_dtype act) {
    emb_case c = {.B = B, .T = T, .C = C, .V = V};
    c.tok = calloc((size_t)B * T, sizeof *c.tok);
    for (int i = 0; i < B * T; i++) {
        c.tok[i] = zt_test_int(r, 0, V - 1);
        if (i % 5 == 4)
            c.tok[i] = -1;
    }
    c.wte = zt_test_random(r, (size_t)V * C, 0.0, 1.0);
    c.wpe = pos ? zt_test_random(r, (size_t)T * C, 0.0, 1.0) : NULL;
    c.dout = zt_test_random(r, (size_t)B * T * C, 0.0, 1.0);
    zt_test_round_all(c.dout, (size_t)B * T * C, act);
    c.dwte0 = zt_test_random(r, (size_t)V * C, 0.0, 0.5);
    c.dwpe0 = pos ? zt_test_random(r, (size_t)T * C, 0.0, 0.5) : NULL;
    return c;
}

static void emb_free(emb_case *c, emb_result *a, emb_result *b) {
    free(c->tok), free(c->wte), free(c->wpe), free(c->dout), free(c->dwte0), free(c->dwpe0);
    emb_result *res[] = {a, b};
    for (int i = 0; i < 2; i++)
        if (res[i])
            free(res[i]->out), free(res[i]->dwte), free(res[i]->dwpe);
}

/* The forward, then the backward into dwte0 and dwpe0, on be at act. */
static emb_result emb_run(zt_backend *be, zt_dtype act, const emb_case *c) {
    size_t n = (size_t)c->B * c->T * c->C, nte = (size_t)c->V * c->C, npe = (size_t)c->T * c->C;
    zt_test_dev d;
    zt_test_dev_init(&d, be, act);
    void *out = zt_test_dev_alloc(&d, n * zt_test_act_size(be, act));
    float *wte = zt_test_dev_f32(&d, c->wte, nte), *wpe = zt_test_dev_f32(&d, c->wpe, npe);
    be->ops->embedding_forward(&d.ctx, out, c->tok, wte, wpe, c->B, c->T, c->C);
    float *dwte = zt_test_dev_f32(&d, c->dwte0, nte), *dwpe = zt_test_dev_f32(&d, c->dwpe0, npe);
    void *dout = zt_test_dev_act(&d, c->dout, n);
    be->ops->embedding_backward(&d.ctx, dwte, dwpe, dout, c->tok, c->B, c->T, c->C);
    emb_result res = {zt_test_zeros(n), zt_test_zeros(nte), c->wpe ? zt_test_zeros(npe) : NULL};
    zt_test_dev_get_act(&d, res.out, out, n);
    zt_test_dev_get_f32(&d, res.dwte, dwte, nte);
    if (dwpe)
        zt_test_dev_get_f32(&d, res.dwpe, dwpe, npe);
    zt_test_dev_finish(&d);
    return res;
}

/* Random widths, then widths for the 16-byte chunks (cuda/embedding.cu): whole aligned chunks at
 * every precision (64), whole chunks at fp32 with a tail at 16 bits (36), rows that start
 * misaligned with a tail (37, odd), and one chunk short of a vector (3). */
static const int emb_widths[] = {64, 36, 37, 3};

static void emb_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    for (int k = 0; k < 8; k++) {
        int B = k == 0 ? 1 : zt_test_int(r, 2, 3), T = zt_test_int(r, 1, 13);
        int C = k < 4 ? zt_test_int(r, 1, 53) : emb_widths[k - 4], V = zt_test_int(r, 2, 29);
        bool pos = k != 1 && k != 5;
        emb_case c = emb_make(r, B, T, C, V, pos, act);
        emb_result want = emb_run(cpu, act, &c), got = emb_run(be, act, &c);
        char at[160];
        snprintf(at, sizeof at, "embedding %s vs cpu at %s, B=%d T=%d C=%d V=%d%s", be->name,
                 zt_dtype_name(act), B, T, C, V, pos ? "" : " wpe=NULL");
        double tol = zt_test_tol(act);
        CHECK_CLOSE(got.out, want.out, (size_t)B * T * C, tol, "%s: out", at);
        CHECK_CLOSE(got.dwte, want.dwte, (size_t)V * C, tol, "%s: dwte", at);
        if (pos)
            CHECK_CLOSE(got.dwpe, want.dwpe, (size_t)T * C, tol, "%s: dwpe", at);
        emb_free(&c, &want, &got);
    }
}

/* ---- the double-precision reference ---------------------------------------------------------- */

typedef struct {
    const emb_case *c;
    double *wte, *wpe, *r; /* wpe NULL without positions; r is the dout the backward was fed */
} emb_ref;

static void emb_ref_forward(const emb_ref *s, double *out) {
    const emb_case *c = s->c;
    for (int bt = 0; bt < c->B * c->T; bt++)
        for (int i = 0; i < c->C; i++)
            out[(size_t)bt * c->C + i] =
                (c->tok[bt] >= 0 ? s->wte[(size_t)c->tok[bt] * c->C + i] : 0.0) +
                (s->wpe ? s->wpe[(size_t)(bt % c->T) * c->C + i] : 0.0);
}

static double emb_ref_loss(void *state) {
    emb_ref *s = state;
    size_t n = (size_t)s->c->B * s->c->T * s->c->C;
    double *out = calloc(n, sizeof *out), l = 0.0;
    emb_ref_forward(s, out);
    for (size_t i = 0; i < n; i++)
        l += out[i] * s->r[i];
    free(out);
    return l;
}

/* The forward against the reference, and the accumulated gradients (dwte0 and dwpe0 are not
 * zero) against its finite differences; with wpe NULL the positions are left out both ways. */
static void emb_grad(zt_backend *cpu, zt_test_rng *r) {
    static const int shapes[][4] = {{1, 5, 37, 7}, {2, 7, 16, 3}, {3, 4, 19, 11}, {2, 3, 5, 2}};
    for (int k = 0; k < 4; k++) {
        int B = shapes[k][0], T = shapes[k][1], C = shapes[k][2], V = shapes[k][3];
        bool pos = k != 2;
        emb_case c = emb_make(r, B, T, C, V, pos, ZT_F32);
        emb_result got = emb_run(cpu, ZT_F32, &c);
        size_t n = (size_t)B * T * C;
        emb_ref s = {&c, zt_test_widen(c.wte, (size_t)V * C),
                     pos ? zt_test_widen(c.wpe, (size_t)T * C) : NULL, zt_test_widen(c.dout, n)};
        double *want = calloc(n, sizeof *want);
        emb_ref_forward(&s, want);
        char at[128];
        snprintf(at, sizeof at, "embedding cpu B=%d T=%d C=%d V=%d%s", B, T, C, V,
                 pos ? "" : " wpe=NULL");
        CHECK_CLOSE(got.out, want, n, ZT_TEST_TOL_FWD, "%s: out against the reference", at);
        CHECK_FD(s.wte, (size_t)V * C, got.dwte, c.dwte0, emb_ref_loss, &s, 200, r,
                 "%s: dwte (accumulated)", at);
        if (pos)
            CHECK_FD(s.wpe, (size_t)T * C, got.dwpe, c.dwpe0, emb_ref_loss, &s, 200, r,
                     "%s: dwpe (accumulated)", at);
        free(want), free(s.wte), free(s.wpe), free(s.r);
        emb_free(&c, &got, NULL);
    }
}

/* At 16 bits the output is held; the parameter gradients are those of fp32 activations. */
static void emb_held(zt_backend *cpu, zt_test_rng *r) {
    for (zt_dtype t = ZT_BF16; t <= ZT_F16; t++) {
        int B = 2, T = 5, C = 23, V = 9;
        emb_case c = emb_make(r, B, T, C, V, true, t);
        emb_result f32 = emb_run(cpu, ZT_F32, &c), held = emb_run(cpu, t, &c);
        CHECK_HELD(cpu, t, held.out, f32.out, (size_t)B * T * C, "embedding at %s: out",
                   zt_dtype_name(t));
        CHECK_SAME(held.dwte, f32.dwte, (size_t)V * C, "embedding at %s: dwte", zt_dtype_name(t));
        CHECK_SAME(held.dwpe, f32.dwpe, (size_t)T * C, "embedding at %s: dwpe", zt_dtype_name(t));
        emb_free(&c, &f32, &held);
    }
}

static const char *const entries[] = {"embedding_forward", "embedding_backward", NULL};

static void check(const zt_test_env *env) {
    if (!zt_test_each_backend(env, "embedding", entries, true, emb_compare))
        return;
    zt_test_rng r = zt_test_rng_for("embedding/cpu", 0);
    emb_grad(env->be[0], &r);
    emb_held(env->be[0], &r);
}

/* ---- --perf: GPT-2 small's token and position embeddings ------------------------------------- */

typedef struct {
    zt_ctx ctx;
    void *out, *dout;
    int32_t *tok;
    float *wte, *wpe, *dwte, *dwpe;
    int B, T, C;
} emb_perf;

static void emb_perf_forward(void *arg) {
    emb_perf *p = arg;
    p->ctx.be->ops->embedding_forward(&p->ctx, p->out, p->tok, p->wte, p->wpe, p->B, p->T, p->C);
}

static void emb_perf_backward(void *arg) {
    emb_perf *p = arg;
    p->ctx.be->ops->embedding_backward(&p->ctx, p->dwte, p->dwpe, p->dout, p->tok, p->B, p->T,
                                       p->C);
}

static void perf(zt_backend *be) {
    if (!zt_test_has(be, "embedding_forward") || !zt_test_has(be, "embedding_backward"))
        return;
    const int B = 4, T = 256, C = 768, V = 50257;
    zt_test_rng r = zt_test_rng_for("embedding/perf", 0);
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    emb_perf p = {d.ctx, .B = B, .T = T, .C = C};
    size_t n = (size_t)B * T * C;
    p.tok = calloc((size_t)B * T, sizeof *p.tok);
    for (int i = 0; i < B * T; i++)
        p.tok[i] = zt_test_int(&r, 0, V - 1);
    p.out = zt_test_dev_alloc(&d, n * sizeof(float));
    p.dout = zt_test_dev_random(&d, &r, n, 1.0);
    p.wte = zt_test_dev_random(&d, &r, (size_t)V * C, 0.02);
    p.wpe = zt_test_dev_random(&d, &r, (size_t)T * C, 0.02);
    p.dwte = zt_test_dev_alloc(&d, (size_t)V * C * sizeof(float));
    p.dwpe = zt_test_dev_alloc(&d, (size_t)T * C * sizeof(float));
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
    /* Bytes: the rows read and written (4 bytes an element); dwte's untouched rows are not. */
    double ms = zt_test_time_ms(be, emb_perf_forward, &p, 20);
    zt_test_perf_row("embedding_forward", be, shape, ms, 3.0 * n * 4 / 1e9, 0);
    ms = zt_test_time_ms(be, emb_perf_backward, &p, 10);
    zt_test_perf_row("embedding_backward", be, shape, ms, 5.0 * n * 4 / 1e9, 0);
    zt_test_dev_finish(&d);
    free(p.tok);
}

const zt_test_family zt_test_embedding = {"embedding", entries, check, perf};
