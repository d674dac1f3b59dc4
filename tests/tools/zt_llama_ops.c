/* Runs the CPU backend's Llama-family ops (fp32 activations) over raw files, for
 * tests/reference/test_llama_ops.py to compare with Hugging Face's own functions.
 *
 *   zt_llama_ops rmsnorm N C EPS DIR          inp w dout     -> out rstd dinp dw
 *   zt_llama_ops rope B T H HD DIR            x cos sin dout -> out dx
 *   zt_llama_ops silu_mul N DIR               gate up dout   -> out dgate dup
 *   zt_llama_ops attention B T NH KVH HD WINDOW DIR
 *                                             q k v dout     -> out att dq dk dv
 *
 * Each name is DIR/NAME.f32, a native-endian fp32 array without a header. rope's rows hold the H
 * heads alone; attention's q, k and v are separate buffers. Gradients that accumulate start at
 * zero. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/backend.h"

static const char *prog = "zt_llama_ops", *dir;

/* Every buffer the run allocates, freed together at its end. */
static float *bufs[16];
static int nbufs;

static float *zeros(size_t n) {
    float *v = calloc(n ? n : 1, sizeof *v);
    if (!v || nbufs == (int)(sizeof bufs / sizeof bufs[0])) {
        fprintf(stderr, "%s: out of memory\n", prog);
        exit(1);
    }
    return bufs[nbufs++] = v;
}

/* DIR/NAME.f32 holding exactly n floats; exits on failure (this is a test program). */
static float *load(const char *name, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    FILE *f = fopen(path, "rb");
    float *buf = zeros(n);
    if (!f || fread(buf, sizeof *buf, n, f) != n || fgetc(f) != EOF) {
        fprintf(stderr, "%s: %s: cannot read %zu floats (or the file is longer)\n", prog, path, n);
        exit(1);
    }
    fclose(f);
    return buf;
}

static void save(const char *name, const float *v, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
        exit(1);
    }
}

static int usage(void) {
    fprintf(stderr,
            "usage: %s rmsnorm N C EPS DIR\n"
            "       %s rope B T H HD DIR\n"
            "       %s silu_mul N DIR\n"
            "       %s attention B T NH KVH HD WINDOW DIR\n",
            prog, prog, prog, prog);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return usage();
    const char *op = argv[1];
    zt_backend *be;
    if (zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        fprintf(stderr, "%s: %s\n", prog, zt_last_error());
        return 1;
    }
    const zt_ops *k = be->ops;
    const zt_ctx x = {.be = be, .act = ZT_F32};
    dir = argv[argc - 1];
    int rc = 0;

    if (strcmp(op, "rmsnorm") == 0 && argc == 6) {
        int N = atoi(argv[2]), C = atoi(argv[3]);
        float eps = strtof(argv[4], NULL);
        size_t n = (size_t)N * C;
        float *inp = load("inp", n), *w = load("w", C), *dout = load("dout", n);
        float *out = zeros(n), *rstd = zeros(N), *dinp = zeros(n), *dw = zeros(C);
        k->rmsnorm_forward(&x, out, rstd, inp, w, eps, N, C);
        k->rmsnorm_backward(&x, dinp, dw, dout, inp, w, rstd, N, C);
        save("out", out, n), save("rstd", rstd, N), save("dinp", dinp, n), save("dw", dw, C);
    } else if (strcmp(op, "rope") == 0 && argc == 7) {
        int B = atoi(argv[2]), T = atoi(argv[3]), H = atoi(argv[4]), hd = atoi(argv[5]);
        size_t n = (size_t)B * T * H * hd, nt = (size_t)T * (hd / 2);
        float *v = load("x", n), *cs = load("cos", nt), *sn = load("sin", nt), *d = load("dout", n);
        k->rope_forward(&x, v, cs, sn, B, T, H, hd, (size_t)H * hd);
        k->rope_backward(&x, d, cs, sn, B, T, H, hd, (size_t)H * hd);
        save("out", v, n), save("dx", d, n);
    } else if (strcmp(op, "silu_mul") == 0 && argc == 4) {
        size_t n = strtoull(argv[2], NULL, 10);
        float *gate = load("gate", n), *up = load("up", n), *dout = load("dout", n);
        float *out = zeros(n), *dgate = zeros(n), *dup = zeros(n);
        k->silu_mul_forward(&x, out, gate, up, n);
        k->silu_mul_backward(&x, dgate, dup, dout, gate, up, n);
        save("out", out, n), save("dgate", dgate, n), save("dup", dup, n);
    } else if (strcmp(op, "attention") == 0 && argc == 9) {
        zt_attn_shape s = {.B = atoi(argv[2]), .T = atoi(argv[3]), .n_head = atoi(argv[4]),
                           .n_kv_head = atoi(argv[5]), .head_dim = atoi(argv[6]),
                           .packed = false, .window = atoi(argv[7])};
        size_t rows = (size_t)s.B * s.T, nq = rows * s.n_head * s.head_dim,
               nkv = rows * s.n_kv_head * s.head_dim, np = (size_t)s.B * s.n_head * s.T * s.T;
        float *q = load("q", nq), *kk = load("k", nkv), *v = load("v", nkv);
        float *dout = load("dout", nq), *out = zeros(nq), *att = zeros(np), *scratch = zeros(np);
        float *dq = zeros(nq), *dk = zeros(nkv), *dv = zeros(nkv);
        k->attention_forward(&x, &s, out, att, q, kk, v);
        k->attention_backward(&x, &s, dq, dk, dv, scratch, dout, out, q, kk, v, att);
        save("out", out, nq), save("att", att, np), save("dq", dq, nq), save("dk", dk, nkv),
            save("dv", dv, nkv);
    } else {
        rc = usage();
    }
    while (nbufs > 0)
        free(bufs[--nbufs]);
    zt_backend_destroy(be);
    return rc;
}
