/* Runs the CPU backend's mixed-precision conversions over raw files, for
 * tests/reference/test_casts.py to compare with PyTorch's casts.
 *
 *   zt_cast_tool to bf16|f16 IN.f32 OUT.u16              to_half
 *   zt_cast_tool from bf16|f16 IN.u16 OUT.f32            from_half
 *   zt_cast_tool round bf16|f16 IN.f32 OUT.f32           round_to
 *   zt_cast_tool accumulate bf16|f16 ACC.u16 ADD.f32 OUT.u16   accumulate_half
 *   zt_cast_tool sumsq bf16|f16 IN.u16                   sum_squares_half, printed with %.17g
 *
 * Files are native-endian arrays without a header: .f32 holds fp32 values, .u16 raw 16-bit bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/backend.h"

static const char *prog = "zt_cast_tool";

/* Reads a whole file of elements of `size` bytes; exits on failure (this is a test program). */
static void *read_all(const char *path, size_t size, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open %s\n", prog, path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (bytes < 0 || (size_t)bytes % size != 0) {
        fprintf(stderr, "%s: %s: size %ld is not a multiple of %zu bytes\n", prog, path, bytes,
                size);
        exit(1);
    }
    *n = (size_t)bytes / size;
    void *buf = malloc(bytes ? (size_t)bytes : 1);
    if (!buf || fread(buf, size, *n, f) != *n) {
        fprintf(stderr, "%s: cannot read %s\n", prog, path);
        exit(1);
    }
    fclose(f);
    return buf;
}

static void write_all(const char *path, const void *buf, size_t size, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, size, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
        exit(1);
    }
}

static int usage(void) {
    fprintf(stderr,
            "usage: %s to bf16|f16 IN.f32 OUT.u16\n"
            "       %s from bf16|f16 IN.u16 OUT.f32\n"
            "       %s round bf16|f16 IN.f32 OUT.f32\n"
            "       %s accumulate bf16|f16 ACC.u16 ADD.f32 OUT.u16\n"
            "       %s sumsq bf16|f16 IN.u16\n",
            prog, prog, prog, prog, prog);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 4)
        return usage();
    const char *op = argv[1];
    zt_dtype t;
    if (strcmp(argv[2], "bf16") == 0)
        t = ZT_BF16;
    else if (strcmp(argv[2], "f16") == 0)
        t = ZT_F16;
    else
        return usage();
    zt_backend *be;
    if (zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        fprintf(stderr, "zt_cast_tool: %s\n", zt_last_error());
        return 1;
    }
    const zt_ops *k = be->ops;
    const zt_ctx cx = {.be = be, .act = ZT_F32};
    int rc = 0;
    size_t n, m;

    if (strcmp(op, "to") == 0 && argc == 5) {
        float *in = read_all(argv[3], sizeof(float), &n);
        uint16_t *out = malloc(n * sizeof *out + 1);
        k->to_half(&cx, out, in, n, t);
        write_all(argv[4], out, sizeof *out, n);
        free(in);
        free(out);
    } else if (strcmp(op, "from") == 0 && argc == 5) {
        uint16_t *in = read_all(argv[3], sizeof(uint16_t), &n);
        float *out = malloc(n * sizeof *out + 1);
        k->from_half(&cx, out, in, n, t);
        write_all(argv[4], out, sizeof *out, n);
        free(in);
        free(out);
    } else if (strcmp(op, "round") == 0 && argc == 5) {
        float *x = read_all(argv[3], sizeof(float), &n);
        k->round_to(&cx, x, n, t);
        write_all(argv[4], x, sizeof *x, n);
        free(x);
    } else if (strcmp(op, "accumulate") == 0 && argc == 6) {
        uint16_t *acc = read_all(argv[3], sizeof(uint16_t), &n);
        float *add = read_all(argv[4], sizeof(float), &m);
        if (m != n) {
            fprintf(stderr, "%s: %s has %zu elements, %s has %zu\n", prog, argv[3], n, argv[4], m);
            rc = 1;
        } else {
            k->accumulate_half(&cx, acc, add, n, t);
            write_all(argv[5], acc, sizeof *acc, n);
        }
        free(acc);
        free(add);
    } else if (strcmp(op, "sumsq") == 0 && argc == 4) {
        uint16_t *x = read_all(argv[3], sizeof(uint16_t), &n);
        printf("%.17g\n", k->sum_squares_half(&cx, x, n, t));
        free(x);
    } else {
        rc = usage();
    }
    zt_backend_destroy(be);
    return rc;
}
