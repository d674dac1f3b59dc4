/* Runs the loss scaler over a scripted pattern of overflow and clean steps, for
 * tests/reference/test_loss_scaler.py to check against DeepSpeed's rules.
 *
 * usage: zt_scaler_dump DS_CONFIG.json PATTERN
 *        zt_scaler_dump --manual STAGE,POWER,WINDOW,HYSTERESIS,CONSECUTIVE,MIN,STATIC[,PRECISION] PATTERN
 * PATTERN: one character per optimizer step, 'o' an overflow and '.' a clean step.
 * --manual builds the config by hand (DeepSpeed's defaults for everything else): fp16 with those
 * values, STATIC being fp16.loss_scale (0: dynamic), CONSECUTIVE 0 or 1; PRECISION is fp16 (the
 * default), bf16 or fp32, the latter two disabling fp16.
 * output: one line per step on stdout, "step overflow scale_before scale_after skipped" with step
 * counting from 0 (DeepSpeed's iteration numbers) and scales printed with %.17g; the scaler's log
 * lines on stderr. If an update fails, its message goes to stderr as "error: MESSAGE" and the
 * tool exits with status 3. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/ds_config.h"
#include "ztrain/loss_scaler.h"

static int parse_manual(zt_ds_config *cfg, const char *spec) {
    zt_ds_config_defaults(cfg);
    int stage, power, window, hyst, consec;
    double min_scale, static_scale;
    char precision[8] = "fp16";
    int n = sscanf(spec, "%d,%d,%d,%d,%d,%lf,%lf,%7s", &stage, &power, &window, &hyst, &consec,
                   &min_scale, &static_scale, precision);
    if (n < 7 || stage < 0 || stage > 3 || (consec != 0 && consec != 1) || static_scale < 0) {
        fprintf(stderr, "zt_scaler_dump: bad --manual spec '%s'\n", spec);
        return -1;
    }
    if (strcmp(precision, "fp16") && strcmp(precision, "bf16") && strcmp(precision, "fp32")) {
        fprintf(stderr, "zt_scaler_dump: precision must be fp16, bf16 or fp32, got '%s'\n", precision);
        return -1;
    }
    bool fp16 = strcmp(precision, "fp16") == 0;
    /* The checks the config parser makes before a dynamic scaler may be built. */
    if (fp16 && static_scale == 0 && (window <= 0 || min_scale <= 0)) {
        fprintf(stderr, "zt_scaler_dump: a dynamic scale needs WINDOW > 0 and MIN > 0\n");
        return -1;
    }
    cfg->zero.stage = stage;
    cfg->fp16.enabled = fp16;
    cfg->bf16.enabled = strcmp(precision, "bf16") == 0;
    cfg->fp16.initial_scale_power = power;
    cfg->fp16.loss_scale_window = window;
    cfg->fp16.hysteresis = hyst;
    cfg->fp16.consecutive_hysteresis = consec;
    cfg->fp16.min_loss_scale = min_scale;
    cfg->fp16.loss_scale = static_scale;
    return 0;
}

int main(int argc, char **argv) {
    zt_ds_config cfg;
    const char *pattern;
    if (argc == 4 && strcmp(argv[1], "--manual") == 0) {
        if (parse_manual(&cfg, argv[2]) != 0)
            return 2;
        pattern = argv[3];
    } else if (argc == 3) {
        if (zt_ds_config_load(&cfg, argv[1], 1) != ZT_OK) {
            fprintf(stderr, "zt_scaler_dump: %s\n", zt_last_error());
            return 1;
        }
        pattern = argv[2];
    } else {
        fprintf(stderr, "usage: %s DS_CONFIG.json PATTERN\n"
                        "       %s --manual STAGE,POWER,WINDOW,HYSTERESIS,CONSECUTIVE,MIN,STATIC"
                        "[,PRECISION] PATTERN\n", argv[0], argv[0]);
        return 2;
    }
    if (strspn(pattern, "o.") != strlen(pattern)) {
        fprintf(stderr, "zt_scaler_dump: PATTERN may hold only 'o' and '.', got '%s'\n", pattern);
        return 2;
    }

    zt_loss_scaler s;
    zt_loss_scaler_init(&s, &cfg);
    for (size_t i = 0; pattern[i]; i++) {
        bool overflow = pattern[i] == 'o';
        double before = zt_loss_scaler_scale(&s);
        /* stdout is flushed before every update so that the two streams interleave in step order
         * when they share a terminal. */
        fflush(stdout);
        if (zt_loss_scaler_update(&s, overflow, stderr) != ZT_OK) {
            fprintf(stderr, "error: %s\n", zt_last_error());
            return 3;
        }
        /* Every fp16 path in DeepSpeed skips the optimizer step on overflow. */
        printf("%zu %d %.17g %.17g %d\n", i, overflow, before, zt_loss_scaler_scale(&s), overflow);
    }
    return 0;
}
