/* Runs the optimizer update of bf16_master_weights_and_grads with bf16_optimizer_states
 * (zt_optimizer_update_16, as the engine's ZeRO partition runs it) over raw files, for
 * tests/reference/test_bf16_states.py to compare with torch.
 *
 * usage: zt_states16_dump DS_CONFIG.json PARAMS.u16 GRADS.u16 STEPS GRAD_MUL OUT_PREFIX
 *   PARAMS.u16 holds n bf16 parameters (raw bits), GRADS.u16 STEPS*n bf16 gradients (step s uses
 *   [s*n, (s+1)*n)), each multiplied by GRAD_MUL. The optimizer and schedule come from the
 *   DeepSpeed config (the lr and momentum of each update from the schedule, which steps after it).
 *   Writes OUT_PREFIX.p16, .m16 and (Adam) .v16: the final parameters and state as raw bf16 bits
 *   (.m16 is SGD's momentum buffer, absent without one). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/backend.h"
#include "ztrain/ds_config.h"
#include "ztrain/lr_schedule.h"
#include "ztrain/optimizer.h"

static const char *prog = "zt_states16_dump";

static uint16_t *read_u16(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint16_t *buf = bytes > 0 && bytes % 2 == 0 ? malloc((size_t)bytes) : NULL;
    if (!buf || fread(buf, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "%s: %s: not a whole number of 16-bit values, or a short read\n", prog,
                path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = buf ? (size_t)bytes / 2 : 0;
    return buf;
}

static int write_u16(const char *prefix, const char *ext, const uint16_t *v, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, 2, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "%s: %s: cannot write\n", prog, path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s DS_CONFIG.json PARAMS.u16 GRADS.u16 STEPS GRAD_MUL OUT_PREFIX\n",
                prog);
        return 2;
    }
    zt_ds_config cfg;
    char *end, *end_mul;
    long steps = strtol(argv[4], &end, 10);
    float mul = strtof(argv[5], &end_mul);
    if (steps < 1 || *end || *end_mul) {
        fprintf(stderr, "%s: STEPS must be positive and GRAD_MUL a number\n", prog);
        return 2;
    }
    if (zt_ds_config_load(&cfg, argv[1], 1) != ZT_OK || !cfg.has_optimizer) {
        fprintf(stderr, "%s: %s\n", prog, cfg.has_optimizer ? zt_last_error() : "no optimizer");
        return 1;
    }
    size_t n, ng;
    uint16_t *params = read_u16(argv[2], &n), *grads = params ? read_u16(argv[3], &ng) : NULL;
    if (!grads || ng != n * (size_t)steps) {
        fprintf(stderr, "%s: GRADS must hold STEPS*n values\n", prog);
        return 1;
    }
    zt_backend *be;
    if (zt_backend_create(&be, ZT_DEVICE_CPU, NULL) != ZT_OK) {
        fprintf(stderr, "%s: %s\n", prog, zt_last_error());
        return 1;
    }
    zt_optimizer o;
    zt_optimizer_init_external(&o, &cfg.optimizer, be, n);
    int n_state = zt_optimizer_state_count(&cfg.optimizer);
    uint16_t *m = n_state >= 1 ? calloc(n, 2) : NULL, *v = n_state >= 2 ? calloc(n, 2) : NULL;
    float *staging = malloc(4 * ZT_OPTIMIZER_PIECE16 * sizeof(float));
    double beta1 = cfg.optimizer.type == ZT_OPTIM_SGD ? cfg.optimizer.momentum : cfg.optimizer.beta1;
    zt_lr_schedule sched;
    zt_lr_schedule_init(&sched, &cfg.scheduler, cfg.optimizer.lr, beta1);
    for (long s = 0; s < steps; s++) {
        zt_optimizer_begin_step(&o);
        zt_optimizer_update_16(&o, params, grads + (size_t)s * n, mul, m, v, ZT_BF16, n, staging,
                               zt_lr_schedule_lr(&sched), zt_lr_schedule_momentum(&sched));
        zt_lr_schedule_step(&sched);
    }
    int rc = write_u16(argv[6], "p16", params, n) || (m && write_u16(argv[6], "m16", m, n)) ||
             (v && write_u16(argv[6], "v16", v, n));
    free(params);
    free(grads);
    free(m);
    free(v);
    free(staging);
    zt_backend_destroy(be);
    return rc;
}
