/* Prints the lr and momentum that each of the first N optimizer updates uses under a DeepSpeed
 * config's scheduler, for tests/reference/test_lr_schedules.py to check against DeepSpeed's
 * formulas.
 *
 * usage: zt_lr_dump DS_CONFIG.json N
 * output: N lines "step lr momentum", step counting updates from 1, values printed with %.17g so
 * they read back as the exact doubles. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "ztrain/ds_config.h"
#include "ztrain/lr_schedule.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DS_CONFIG.json N\n", argv[0]);
        return 2;
    }
    char *end;
    errno = 0;
    long long n = strtoll(argv[2], &end, 10);
    if (errno || *end || n < 0) {
        fprintf(stderr, "%s: N must be a non-negative integer, got '%s'\n", argv[0], argv[2]);
        return 2;
    }

    zt_ds_config cfg;
    if (zt_ds_config_load(&cfg, argv[1], 1) != ZT_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], zt_last_error());
        return 1;
    }
    /* The same base values the engine hands the schedule: the optimizer's lr, and its beta1 (Adam)
     * or momentum (SGD). */
    double beta1 =
        cfg.optimizer.type == ZT_OPTIM_SGD ? cfg.optimizer.momentum : cfg.optimizer.beta1;
    zt_lr_schedule s;
    zt_lr_schedule_init(&s, &cfg.scheduler, cfg.optimizer.lr, beta1);
    for (long long step = 1; step <= n; step++) {
        printf("%lld %.17g %.17g\n", step, zt_lr_schedule_lr(&s), zt_lr_schedule_momentum(&s));
        zt_lr_schedule_step(&s);
    }
    return 0;
}
