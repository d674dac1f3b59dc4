/* Runs ztrain's optimizer over raw fp32 files, for tests/reference/test_optimizer.py to compare
 * with torch.optim; and times the Adam update.
 *
 * usage: zt_optim_dump DS_CONFIG.json PARAMS.f32 GRADS.f32 STEPS OUT.f32
 *   PARAMS.f32 holds n floats, GRADS.f32 holds STEPS*n (step s uses floats [s*n, (s+1)*n)).
 *   The optimizer and scheduler come from the DeepSpeed config; each update takes its lr and
 *   momentum from the schedule, which steps after it, as in the engine. OUT.f32 receives the final
 *   n parameters.
 * usage: zt_optim_dump --bench DS_CONFIG.json NPARAMS STEPS
 *   Times STEPS updates over NPARAMS parameters (after one untimed update) and prints the rate.
 *   Threads follow OMP_NUM_THREADS. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ztrain/ds_config.h"
#include "ztrain/kernels.h"
#include "ztrain/lr_schedule.h"
#include "ztrain/optimizer.h"

static int parse_count(const char *s, long long *out) {
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    return errno == 0 && *end == 0 && *out >= 0;
}

/* Reads a whole file of floats; *n receives the count. */
static float *read_floats(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "zt_optim_dump: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (bytes < 0 || bytes % sizeof(float)) {
        fprintf(stderr, "zt_optim_dump: %s: size %ld is not a whole number of floats\n", path, bytes);
        fclose(f);
        return NULL;
    }
    *n = (size_t)bytes / sizeof(float);
    float *buf = malloc(bytes ? (size_t)bytes : 1);
    if (!buf || fread(buf, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "zt_optim_dump: %s: short read\n", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
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
    if (zt_optimizer_init(&opt, &cfg->optimizer, zt_kernels_cpu(), n) != ZT_OK) {
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
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(params, sizeof(float), n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "zt_optim_dump: %s: cannot write\n", out_path);
        return 1;
    }
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
    if (zt_optimizer_init(&opt, &cfg->optimizer, zt_kernels_cpu(), n) != ZT_OK) {
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

int main(int argc, char **argv) {
    int bench = argc == 5 && strcmp(argv[1], "--bench") == 0;
    if (!bench && argc != 6) {
        fprintf(stderr,
                "usage: %s DS_CONFIG.json PARAMS.f32 GRADS.f32 STEPS OUT.f32\n"
                "       %s --bench DS_CONFIG.json NPARAMS STEPS\n",
                argv[0], argv[0]);
        return 2;
    }
    const char *config = argv[bench ? 2 : 1];
    long long a, b;
    if (bench ? !parse_count(argv[3], &a) || !parse_count(argv[4], &b) || b == 0
              : !parse_count(argv[4], &a)) {
        fprintf(stderr, "%s: counts must be non-negative integers\n", argv[0]);
        return 2;
    }
    zt_ds_config cfg;
    if (zt_ds_config_load(&cfg, config, 1) != ZT_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], zt_last_error());
        return 1;
    }
    if (!cfg.has_optimizer) {
        fprintf(stderr, "%s: %s has no \"optimizer\" section\n", argv[0], config);
        return 1;
    }
    return bench ? run_bench(&cfg, (size_t)a, b) : run_dump(&cfg, argv[2], argv[3], a, argv[5]);
}
