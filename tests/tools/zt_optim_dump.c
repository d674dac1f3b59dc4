/* Runs ztrain's optimizer over raw files, for tests/reference/test_optimizer.py to compare with
 * torch.optim; and times the Adam updates for bench/bench_adam.py.
 *
 * usage: zt_optim_dump DS_CONFIG.json PARAMS.f32 GRADS.f32 STEPS OUT.f32
 *   PARAMS.f32 holds n floats, GRADS.f32 holds STEPS*n (step s uses floats [s*n, (s+1)*n)).
 *   The optimizer and scheduler come from the DeepSpeed config; each update takes its lr and
 *   momentum from the schedule, which steps after it, as in the engine. OUT.f32 receives the final
 *   n parameters.
 * usage: zt_optim_dump --mixed DS_CONFIG.json GRAD_TYPE PARAM_TYPE GRAD_MUL PARAMS.f32 GRADS STEPS
 *                      OUT_PREFIX fused|4pass
 *   Mixed precision with an Adam config: PARAMS.f32 are the fp32 masters; GRADS holds STEPS*n
 *   gradients of GRAD_TYPE (f32, bf16 or f16; 16-bit ones as raw bits), each multiplied by
 *   GRAD_MUL; PARAM_TYPE (bf16, f16 or none) is the 16-bit parameter copy written after each
 *   update. "fused" runs the adam_update_mixed kernel over the slice in uneven pieces; "4pass"
 *   streams it through a 64K-float buffer with from_half, scale, zt_optimizer_update and to_half,
 *   as the engine's zt_zero_update_half does. Writes OUT_PREFIX.master.f32, .m.f32, .v.f32 and
 *   (unless none) .param16 (raw 16-bit bits).
 * usage: zt_optim_dump --isa
 *   Prints the CPU optimizer's instruction-set path (ZTRAIN_OPTIM_ISA forces one).
 * usage: zt_optim_dump --bench DS_CONFIG.json NPARAMS STEPS
 *   Times STEPS updates over NPARAMS parameters (after one untimed update) and prints the rate.
 * usage: zt_optim_dump --bench-json DS_CONFIG.json NPARAMS REPS
 *   With an Adam config, times in turn, REPS times after an untimed round, the fp32 update, the
 *   fused mixed update (bf16 gradients, bf16 parameters out), the engine's 4-pass equivalent, a
 *   memcpy of 14 bytes a parameter (28 moved: fp32 Adam's traffic) and a loop with Adam's access
 *   pattern and no arithmetic to speak of; prints the median seconds of each as one JSON object.
 * Threads follow OMP_NUM_THREADS. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ztrain/backend.h"
#include "ztrain/ds_config.h"
#include "ztrain/lr_schedule.h"
#include "ztrain/optimizer.h"

/* The CPU backend, made on first use. The tool's buffers are plain host memory, which is the CPU
 * backend's device memory. */
static zt_backend *cpu_backend(void) {
    static zt_backend *be;
    if (!be && zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        fprintf(stderr, "zt_optim_dump: %s\n", zt_last_error());
        exit(1);
    }
    return be;
}

static int parse_count(const char *s, long long *out) {
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    return errno == 0 && *end == 0 && *out >= 0;
}

/* Reads a whole file of elem-byte elements; *n receives the count. */
static void *read_raw(const char *path, size_t elem, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "zt_optim_dump: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (bytes < 0 || (size_t)bytes % elem) {
        fprintf(stderr, "zt_optim_dump: %s: size %ld is not a whole number of %zu-byte elements\n",
                path, bytes, elem);
        fclose(f);
        return NULL;
    }
    *n = (size_t)bytes / elem;
    void *buf = malloc(bytes ? (size_t)bytes : 1);
    if (!buf || fread(buf, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "zt_optim_dump: %s: short read\n", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static float *read_floats(const char *path, size_t *n) { return read_raw(path, sizeof(float), n); }

static int write_raw(const char *path, const void *data, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "zt_optim_dump: %s: cannot write\n", path);
        return 1;
    }
    return 0;
}

static double beta1_of(const zt_optimizer_config *o) {
    return o->type == ZT_OPTIM_SGD ? o->momentum : o->beta1;
}

static int run_dump(const zt_ds_config *cfg, const char *params_path, const char *grads_path,
                    long long steps, const char *out_path) {
    size_t n, ng;
    float *params = read_floats(params_path, &n);
    float *grads = params ? read_floats(grads_path, &ng) : NULL;
    if (!grads)
        return 1;
    if (ng != n * (size_t)steps) {
        fprintf(stderr, "zt_optim_dump: %s holds %zu floats, expected STEPS*n = %lld*%zu\n",
                grads_path, ng, steps, n);
        return 1;
    }
    zt_optimizer opt;
    if (zt_optimizer_init(&opt, &cfg->optimizer, cpu_backend(), n) != ZT_OK) {
        fprintf(stderr, "zt_optim_dump: %s\n", zt_last_error());
        return 1;
    }
    zt_lr_schedule sched;
    zt_lr_schedule_init(&sched, &cfg->scheduler, cfg->optimizer.lr, beta1_of(&cfg->optimizer));
    for (long long s = 0; s < steps; s++) {
        zt_optimizer_step(&opt, params, grads + (size_t)s * n, zt_lr_schedule_lr(&sched),
                          zt_lr_schedule_momentum(&sched));
        zt_lr_schedule_step(&sched);
    }
    if (write_raw(out_path, params, n * sizeof(float)))
        return 1;
    zt_optimizer_free(&opt);
    free(params);
    free(grads);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int run_bench(const zt_ds_config *cfg, size_t n, long long steps) {
    float *params = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64 + 64);
    float *grads = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64 + 64);
    if (!params || !grads) {
        fprintf(stderr, "zt_optim_dump: cannot allocate %zu parameters\n", n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        params[i] = (float)((i % 1000) * 1e-3 - 0.5);
        grads[i] = (float)((i % 777) * 1e-5 - 3e-3);
    }
    zt_optimizer opt;
    if (zt_optimizer_init(&opt, &cfg->optimizer, cpu_backend(), n) != ZT_OK) {
        fprintf(stderr, "zt_optim_dump: %s\n", zt_last_error());
        return 1;
    }
    double lr = cfg->optimizer.lr, mom = beta1_of(&cfg->optimizer);
    /* The first update faults the state pages in; it is not what a training step costs. */
    zt_optimizer_step(&opt, params, grads, lr, mom);
    double t0 = now_s();
    for (long long s = 0; s < steps; s++)
        zt_optimizer_step(&opt, params, grads, lr, mom);
    double dt = (now_s() - t0) / (double)steps;
    /* Adam reads p, g, m, v and writes p, m, v: 28 bytes an element; SGD with momentum reads p,
     * g, buf and writes p, buf: 20. */
    double bytes = cfg->optimizer.type == ZT_OPTIM_ADAM ? 28.0 : (opt.m ? 20.0 : 12.0);
    printf("%s n=%zu: %.3f ms/step, %.1f M params/s, %.1f GB/s\n", cfg->optimizer.name, n,
           dt * 1e3, n / dt * 1e-6, n * bytes / dt * 1e-9);
    zt_optimizer_free(&opt);
    free(params);
    free(grads);
    return 0;
}

/* "f32", "bf16", "f16", or (for a parameter copy) "none", which comes back as ZT_F32. */
static int parse_dtype(const char *s, int none_ok, zt_dtype *out) {
    if (strcmp(s, "bf16") == 0)
        *out = ZT_BF16;
    else if (strcmp(s, "f16") == 0)
        *out = ZT_F16;
    else if (strcmp(s, none_ok ? "none" : "f32") == 0)
        *out = ZT_F32;
    else
        return 0;
    return 1;
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* The engine's zt_zero_update_half: the slice streams through a 64K-float buffer. */
enum { STAGE_CHUNK = 1 << 16 };

static void update_4pass(zt_optimizer *o, float *master, const void *g, zt_dtype gt, float mul,
                         uint16_t *p16, zt_dtype pt, float *chunk, double lr, double mom) {
    const zt_ops *k = o->ctx.be->ops;
    const zt_ctx *x = &o->ctx;
    for (size_t c = 0; c < o->n; c += STAGE_CHUNK) {
        size_t len = min_sz(STAGE_CHUNK, o->n - c);
        if (gt == ZT_F32)
            memcpy(chunk, (const float *)g + c, len * sizeof(float));
        else
            k->from_half(x, chunk, (const uint16_t *)g + c, len, gt);
        k->scale(x, chunk, len, mul);
        zt_optimizer_update(o, master + c, chunk, c, len, lr, mom);
        if (p16)
            k->to_half(x, p16 + c, master + c, len, pt);
    }
}

/* The fused path over the slice in pieces of `piece` elements, through the same optimizer call
 * the engine makes, so a slice can start anywhere in a vector. */
static void update_fused(zt_optimizer *o, float *master, const void *g, zt_dtype gt, float mul,
                         uint16_t *p16, zt_dtype pt, double lr, double mom, size_t piece) {
    size_t esize = gt == ZT_F32 ? sizeof(float) : sizeof(uint16_t);
    for (size_t c = 0; c < o->n; c += piece) {
        bool fused = zt_optimizer_update_mixed(o, master + c, (const char *)g + c * esize, gt, mul,
                                               p16 ? p16 + c : NULL, pt, c, min_sz(piece, o->n - c),
                                               lr, mom);
        ZT_ASSERT(fused);
    }
}

/* Pieces of an odd length, so the fused kernel sees slices that start anywhere in a vector. */
#define FUSED_PIECE ((size_t)100003)

static int run_mixed(const zt_ds_config *cfg, zt_dtype gt, zt_dtype pt, float mul,
                     const char *params_path, const char *grads_path, long long steps,
                     const char *prefix, int fused) {
    size_t esize = gt == ZT_F32 ? sizeof(float) : sizeof(uint16_t);
    size_t n, ng;
    float *master = read_floats(params_path, &n);
    void *grads = master ? read_raw(grads_path, esize, &ng) : NULL;
    if (!grads)
        return 1;
    if (ng != n * (size_t)steps) {
        fprintf(stderr, "zt_optim_dump: %s holds %zu gradients, expected STEPS*n = %lld*%zu\n",
                grads_path, ng, steps, n);
        return 1;
    }
    uint16_t *p16 = pt == ZT_F32 ? NULL : calloc(n ? n : 1, sizeof *p16);
    float *chunk = malloc(STAGE_CHUNK * sizeof *chunk);
    zt_optimizer opt;
    if ((pt != ZT_F32 && !p16) || !chunk ||
        zt_optimizer_init(&opt, &cfg->optimizer, cpu_backend(), n) != ZT_OK) {
        fprintf(stderr, "zt_optim_dump: %s\n", zt_last_error());
        return 1;
    }
    zt_lr_schedule sched;
    zt_lr_schedule_init(&sched, &cfg->scheduler, cfg->optimizer.lr, beta1_of(&cfg->optimizer));
    for (long long s = 0; s < steps; s++) {
        const char *g = (const char *)grads + (size_t)s * n * esize;
        double lr = zt_lr_schedule_lr(&sched), mom = zt_lr_schedule_momentum(&sched);
        zt_optimizer_begin_step(&opt);
        if (fused)
            update_fused(&opt, master, g, gt, mul, p16, pt, lr, mom, FUSED_PIECE);
        else
            update_4pass(&opt, master, g, gt, mul, p16, pt, chunk, lr, mom);
        zt_lr_schedule_step(&sched);
    }
    char path[4096];
    const char *suffix[] = {"master.f32", "m.f32", "v.f32"};
    const float *data[] = {master, opt.m, opt.v};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s.%s", prefix, suffix[i]);
        if (write_raw(path, data[i], n * sizeof(float)))
            return 1;
    }
    snprintf(path, sizeof path, "%s.param16", prefix);
    if (p16 && write_raw(path, p16, n * sizeof *p16))
        return 1;
    zt_optimizer_free(&opt);
    free(master);
    free(grads);
    free(p16);
    free(chunk);
    return 0;
}

static void *alloc_or_die(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) {
        fprintf(stderr, "zt_optim_dump: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, long long k) {
    qsort(t, (size_t)k, sizeof *t, cmp_double);
    return k % 2 ? t[k / 2] : 0.5 * (t[k / 2 - 1] + t[k / 2]);
}

/* Each thread copies one contiguous share with one memcpy, so glibc takes its large-copy path
 * (non-temporal stores past its threshold): the traffic is the bytes read plus the bytes
 * written, as in the Adam update, whose stores go to lines it has just read. */
static void parallel_copy(char *dst, const char *src, size_t bytes) {
#pragma omp parallel
    {
        size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        size_t lo = bytes * t / nt, hi = bytes * (t + 1) / nt;
        memcpy(dst + lo, src + lo, hi - lo);
    }
}

/* Adam's memory traffic with next to no arithmetic: reads p, g, m, v and writes p, m, v, in the
 * same chunks and thread schedule as the kernel, so its time is what the memory system allows
 * that access pattern. */
static void stream_r4w3(float *p, const float *g, float *m, float *v, size_t n) {
    const size_t chunk = 16384;
    size_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t lo = ci * chunk, hi = min_sz(n, lo + chunk);
        for (size_t i = lo; i < hi; i++) {
            p[i] += g[i];
            m[i] *= 0.5f;
            v[i] *= 0.5f;
        }
    }
}

enum { B_FP32, B_FUSED, B_4PASS, B_COPY, B_STREAM, B_KINDS };

static int run_bench_json(const zt_ds_config *cfg, size_t n, long long reps) {
    if (cfg->optimizer.type != ZT_OPTIM_ADAM) {
        fprintf(stderr, "zt_optim_dump: --bench-json needs an Adam config\n");
        return 1;
    }
    const zt_ops *k = cpu_backend()->ops;
    const zt_ctx xc = {.be = cpu_backend(), .act = ZT_F32}, *x = &xc;
    float *p = alloc_or_die(n * sizeof(float)), *g = alloc_or_die(n * sizeof(float));
    uint16_t *g16 = alloc_or_die(n * sizeof(uint16_t)), *p16 = alloc_or_die(n * sizeof(uint16_t));
    float *chunk = alloc_or_die(STAGE_CHUNK * sizeof(float));
    size_t copy_bytes = 14 * n;
    char *src = alloc_or_die(copy_bytes), *dst = alloc_or_die(copy_bytes);
    float *sp = alloc_or_die(n * sizeof(float)), *sg = alloc_or_die(n * sizeof(float));
    float *sm = alloc_or_die(n * sizeof(float)), *sv = alloc_or_die(n * sizeof(float));
    double *t[B_KINDS];
    for (int b = 0; b < B_KINDS; b++)
        t[b] = alloc_or_die((size_t)reps * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)((i % 1000) * 1e-3 - 0.5);
        g[i] = (float)((i % 777) * 1e-5 - 3e-3);
    }
    memset(src, 1, copy_bytes);
    k->to_half(x, g16, g, n, ZT_BF16);
    zt_optimizer opt;
    if (zt_optimizer_init(&opt, &cfg->optimizer, cpu_backend(), n) != ZT_OK) {
        fprintf(stderr, "zt_optim_dump: %s\n", zt_last_error());
        return 1;
    }
    double lr = cfg->optimizer.lr, mom = cfg->optimizer.beta1;
    const float mul = 1.0f / 1024.0f;
    /* The kinds take turns, so a machine that slows down or speeds up during the run moves them
     * all alike; round -1 is untimed (it faults the pages in). */
    for (long long r = -1; r < reps; r++) {
        for (int b = 0; b < B_KINDS; b++) {
            double t0 = now_s();
            switch (b) {
            case B_FP32:
                zt_optimizer_step(&opt, p, g, lr, mom);
                break;
            case B_FUSED:
                zt_optimizer_begin_step(&opt);
                update_fused(&opt, p, g16, ZT_BF16, mul, p16, ZT_BF16, lr, mom, n ? n : 1);
                break;
            case B_4PASS:
                zt_optimizer_begin_step(&opt);
                update_4pass(&opt, p, g16, ZT_BF16, mul, p16, ZT_BF16, chunk, lr, mom);
                break;
            case B_COPY:
                parallel_copy(dst, src, copy_bytes);
                break;
            default:
                stream_r4w3(sp, sg, sm, sv, n);
                break;
            }
            if (r >= 0)
                t[b][r] = now_s() - t0;
        }
    }
    printf("{\"n\": %zu, \"reps\": %lld, \"threads\": %d, \"isa\": \"%s\", \"adam_fp32_s\": %.6g, "
           "\"mixed_fused_bf16_s\": %.6g, \"mixed_4pass_bf16_s\": %.6g, \"copy_bytes\": %zu, "
           "\"copy_s\": %.6g, \"stream_s\": %.6g}\n",
           n, reps, omp_get_max_threads(), zt_backend_cpu_optim_isa(), median(t[B_FP32], reps),
           median(t[B_FUSED], reps), median(t[B_4PASS], reps), copy_bytes,
           median(t[B_COPY], reps), median(t[B_STREAM], reps));
    zt_optimizer_free(&opt);
    void *bufs[] = {p, g, g16, p16, chunk, src, dst, sp, sg, sm, sv};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    for (int b = 0; b < B_KINDS; b++)
        free(t[b]);
    return 0;
}

static int usage(const char *prog) {
    fprintf(stderr,
            "usage: %s DS_CONFIG.json PARAMS.f32 GRADS.f32 STEPS OUT.f32\n"
            "       %s --mixed DS_CONFIG.json f32|bf16|f16 bf16|f16|none GRAD_MUL PARAMS.f32 GRADS "
            "STEPS OUT_PREFIX fused|4pass\n"
            "       %s --isa\n"
            "       %s --bench DS_CONFIG.json NPARAMS STEPS\n"
            "       %s --bench-json DS_CONFIG.json NPARAMS STEPS\n",
            prog, prog, prog, prog, prog);
    return 2;
}

static int load_config(zt_ds_config *cfg, const char *prog, const char *path) {
    if (zt_ds_config_load(cfg, path, 1) != ZT_OK) {
        fprintf(stderr, "%s: %s\n", prog, zt_last_error());
        return 0;
    }
    if (!cfg->has_optimizer) {
        fprintf(stderr, "%s: %s has no \"optimizer\" section\n", prog, path);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    zt_ds_config cfg;
    long long a, b;
    if (argc == 2 && strcmp(mode, "--isa") == 0) {
        printf("%s\n", zt_backend_cpu_optim_isa());
        return 0;
    }
    if (argc == 5 && (strcmp(mode, "--bench") == 0 || strcmp(mode, "--bench-json") == 0)) {
        if (!parse_count(argv[3], &a) || !parse_count(argv[4], &b) || b == 0) {
            fprintf(stderr, "%s: counts must be non-negative integers, STEPS positive\n", argv[0]);
            return 2;
        }
        if (!load_config(&cfg, argv[0], argv[2]))
            return 1;
        return strcmp(mode, "--bench") == 0 ? run_bench(&cfg, (size_t)a, b)
                                            : run_bench_json(&cfg, (size_t)a, b);
    }
    if (argc == 11 && strcmp(mode, "--mixed") == 0) {
        zt_dtype gt, pt;
        char *end;
        float mul = strtof(argv[5], &end);
        int fused = strcmp(argv[10], "fused") == 0;
        if (!parse_dtype(argv[3], 0, &gt) || !parse_dtype(argv[4], 1, &pt) || *end != 0 ||
            !parse_count(argv[8], &a) || (!fused && strcmp(argv[10], "4pass") != 0))
            return usage(argv[0]);
        if (!load_config(&cfg, argv[0], argv[2]))
            return 1;
        if (cfg.optimizer.type != ZT_OPTIM_ADAM) {
            fprintf(stderr, "%s: --mixed needs an Adam config\n", argv[0]);
            return 1;
        }
        return run_mixed(&cfg, gt, pt, mul, argv[6], argv[7], a, argv[9], fused);
    }
    if (argc != 6 || mode[0] == '-')
        return usage(argv[0]);
    if (!parse_count(argv[4], &a)) {
        fprintf(stderr, "%s: counts must be non-negative integers\n", argv[0]);
        return 2;
    }
    if (!load_config(&cfg, argv[0], argv[1]))
        return 1;
    return run_dump(&cfg, argv[2], argv[3], a, argv[5]);
}
