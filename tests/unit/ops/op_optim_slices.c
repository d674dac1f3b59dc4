/* The optimizer updates over slices that start at every element offset inside a 16-byte vector
 * and end anywhere: adam_update, adam_update_mixed (16-bit gradients in, 16-bit parameters out),
 * sgd_update, sgd_update_mixed, lamb_apply, lamb_apply_mixed and scale, whose GPU kernels move
 * whole aligned chunks in 16-byte loads and stores and the rest element by element. Every backend
 * against the CPU op bit for bit (an element's result is the same IEEE sequence on both), over
 * the whole buffers around the slice too, so a chunk that reads or writes past either end fails;
 * and the CPU's fused sgd_update_mixed and lamb_apply_mixed against its separate passes (from_half,
 * scale, sgd_update, to_half; lamb_apply, to_half), which they must equal bit for bit. This
 * family owns the two fused entries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Slices: shorter than a chunk, one chunk, chunks and a tail, and long enough for many threads. */
static const size_t lens[] = {5, 8, 8 * 37 + 3, 4099};
enum { MAX_OFF = 8, PAD = 8 };

typedef enum {
    S_ADAM, S_MIXED_BF16, S_MIXED_F16, S_SGD, S_SGD_MIXED_BF16, S_SGD_MIXED_F16, S_LAMB,
    S_LAMB_MIXED_BF16, S_SCALE, S_KINDS,
    S_SGD_PASSES_BF16 = S_KINDS, S_LAMB_PASSES_BF16 /* the CPU's separate passes */
} slice_kind;
static const char *const kind_names[] = {
    "adam_update", "adam_update_mixed bf16", "adam_update_mixed fp16", "sgd_update",
    "sgd_update_mixed bf16", "sgd_update_mixed fp16", "lamb_apply", "lamb_apply_mixed bf16",
    "scale", "from_half, scale, sgd_update, to_half", "lamb_apply, to_half"};

/* The buffers of one run: fp32 p, g, m, v and 16-bit g16 and p16, each of off + len + PAD. */
typedef struct {
    size_t n;
    float *p, *g, *m, *v;
    uint16_t *g16, *p16;
} slice_bufs;

static slice_bufs bufs_make(zt_test_rng *r, size_t n) {
    slice_bufs b = {n, zt_test_random(r, n, 0.0, 1.0), zt_test_random(r, n, 0.0, 1.0),
                    zt_test_random(r, n, 0.0, 0.1), zt_test_random(r, n, 0.5, 0.1), NULL, NULL};
    for (size_t i = 0; i < n; i++)
        b.v[i] = b.v[i] * b.v[i];
    b.g16 = calloc(n, sizeof *b.g16);
    b.p16 = calloc(n, sizeof *b.p16);
    for (size_t i = 0; i < n; i++) {
        b.g16[i] = (uint16_t)(0x3c00u + (zt_test_next(r) & 0x3ffu)); /* finite in both */
        b.p16[i] = 0xABCDu;
    }
    return b;
}

static slice_bufs bufs_copy(const slice_bufs *s) {
    slice_bufs b = *s;
    b.p = zt_test_dup(s->p, s->n), b.g = zt_test_dup(s->g, s->n);
    b.m = zt_test_dup(s->m, s->n), b.v = zt_test_dup(s->v, s->n);
    b.g16 = malloc(s->n * 2), b.p16 = malloc(s->n * 2);
    memcpy(b.g16, s->g16, s->n * 2);
    memcpy(b.p16, s->p16, s->n * 2);
    return b;
}

static void bufs_free(slice_bufs *b) {
    free(b->p), free(b->g), free(b->m), free(b->v), free(b->g16), free(b->p16);
}

/* One update of kind over [off, off + len) of b on be, in place. */
static void slice_run(zt_backend *be, slice_kind kind, slice_bufs *b, size_t off, size_t len) {
    zt_test_dev d;
    zt_test_dev_init(&d, be, ZT_F32);
    size_t n = b->n;
    float *p = zt_test_dev_f32(&d, b->p, n), *g = zt_test_dev_f32(&d, b->g, n);
    float *m = zt_test_dev_f32(&d, b->m, n), *v = zt_test_dev_f32(&d, b->v, n);
    uint16_t *g16 = zt_test_dev_bytes(&d, b->g16, n * 2), *p16 = zt_test_dev_bytes(&d, b->p16, n * 2);
    zt_adam_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-3f,
                      .weight_decay = 0.1f, .bias_correction1 = 0.19f, .bias_correction2 = 0.002f,
                      .adamw_mode = true};
    zt_sgd_args sa = {.lr = 1e-2f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.01f,
                      .nesterov = true};
    zt_lamb_args la = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.01f};
    const float lamb_step = 0.013f, *step = zt_test_dev_f32(&d, &lamb_step, 1);
    const zt_ops *op = be->ops;
    switch (kind) {
    case S_ADAM:
        op->adam_update(&d.ctx, p + off, g + off, m + off, v + off, len, &a);
        break;
    case S_MIXED_BF16:
    case S_MIXED_F16: {
        zt_dtype t = kind == S_MIXED_BF16 ? ZT_BF16 : ZT_F16;
        op->adam_update_mixed(&d.ctx, p + off, g16 + off, t, 0.37f, m + off, v + off, p16 + off,
                              t, len, &a);
        break;
    }
    case S_SGD:
        op->sgd_update(&d.ctx, p + off, g + off, m + off, len, &sa);
        break;
    case S_SGD_MIXED_BF16:
    case S_SGD_MIXED_F16: {
        zt_dtype t = kind == S_SGD_MIXED_BF16 ? ZT_BF16 : ZT_F16;
        op->sgd_update_mixed(&d.ctx, p + off, g16 + off, t, 0.37f, m + off, p16 + off, t, len,
                             &sa);
        break;
    }
    case S_SGD_PASSES_BF16:
        op->from_half(&d.ctx, g + off, g16 + off, len, ZT_BF16);
        op->scale(&d.ctx, g + off, len, 0.37f);
        op->sgd_update(&d.ctx, p + off, g + off, m + off, len, &sa);
        op->to_half(&d.ctx, p16 + off, p + off, len, ZT_BF16);
        break;
    case S_LAMB:
        op->lamb_apply(&d.ctx, p + off, m + off, v + off, len, &la, step);
        break;
    case S_LAMB_MIXED_BF16:
        op->lamb_apply_mixed(&d.ctx, p + off, m + off, v + off, len, &la, step, p16 + off,
                             ZT_BF16);
        break;
    case S_LAMB_PASSES_BF16:
        op->lamb_apply(&d.ctx, p + off, m + off, v + off, len, &la, step);
        op->to_half(&d.ctx, p16 + off, p + off, len, ZT_BF16);
        break;
    default:
        op->scale(&d.ctx, p + off, len, 0.7f);
    }
    zt_test_dev_get_f32(&d, b->p, p, n);
    zt_test_dev_get_f32(&d, b->m, m, n);
    zt_test_dev_get_f32(&d, b->v, v, n);
    zt_test_dev_get_bytes(&d, b->p16, p16, n * 2);
    zt_test_dev_finish(&d);
}

/* kind on be against want_kind on cpu, over every slice. */
static void slices_run(zt_backend *cpu, zt_backend *be, slice_kind want_kind, slice_kind kind,
                       zt_test_rng *r) {
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (size_t off = 0; off < MAX_OFF; off++) {
            size_t len = lens[l];
            slice_bufs want = bufs_make(r, off + len + PAD), got = bufs_copy(&want);
            slice_run(cpu, want_kind, &want, off, len);
            slice_run(be, kind, &got, off, len);
            size_t n = want.n;
            bool same = memcmp(got.p, want.p, n * 4) == 0 && memcmp(got.m, want.m, n * 4) == 0 &&
                        memcmp(got.v, want.v, n * 4) == 0 &&
                        memcmp(got.p16, want.p16, n * 2) == 0;
            CHECK_AT(same, "%s on %s vs %s on cpu, slice [%zu, %zu) of %zu: p, m, v and p16 bit "
                     "for bit", kind_names[kind], be->name, kind_names[want_kind], off, off + len,
                     n);
            bufs_free(&want), bufs_free(&got);
        }
}

static void slices_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)act;
    for (int kind = 0; kind < S_KINDS; kind++)
        slices_run(cpu, be, (slice_kind)kind, (slice_kind)kind, r);
    if (be == cpu) {
        slices_run(cpu, cpu, S_SGD_PASSES_BF16, S_SGD_MIXED_BF16, r);
        slices_run(cpu, cpu, S_LAMB_PASSES_BF16, S_LAMB_MIXED_BF16, r);
    }
}

static const char *const slice_entries[] = {"adam_update",  "adam_update_mixed",
                                            "sgd_update",   "sgd_update_mixed",
                                            "lamb_apply",   "lamb_apply_mixed",
                                            "scale",        "from_half",
                                            "to_half",      NULL};

static void slices_check(const zt_test_env *env) {
    zt_test_each_backend(env, "optimizer slices", slice_entries, false, slices_compare);
}

/* Each entry belongs to one family: this one owns the fused ones, the rest are their own
 * families'. */
static const char *const owned[] = {"sgd_update_mixed", "lamb_apply_mixed", NULL};

const zt_test_family zt_test_optim_slices = {"optim_slices", owned, slices_check, NULL};
