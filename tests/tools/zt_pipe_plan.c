/* Prints pipeline schedules and layer partitions as ztrain computes them, for
 * tests/reference/test_pipe_plan.py to check against DeepSpeed's rules re-derived in Python.
 *
 * usage: zt_pipe_plan train|inference STAGES STAGE MICRO_BATCHES
 *        output: one line per command, "step Name buffer micro_batch"; then "buffers N"
 *        zt_pipe_plan partition PARTS METHOD TYPE:PARAMS ...
 *        output: "bounds b0 b1 ... bPARTS", or the error on stderr and exit 1 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/pipeline.h"

static int usage(const char *prog) {
    fprintf(stderr,
            "usage: %s train|inference STAGES STAGE MICRO_BATCHES\n"
            "       %s partition PARTS METHOD TYPE:PARAMS ...\n",
            prog, prog);
    return 2;
}

static int schedule(bool train, int stages, int stage, int mb) {
    size_t n = train ? zt_pipe_train_schedule(stages, stage, mb, NULL, 0)
                     : zt_pipe_inference_schedule(stages, stage, mb, NULL, 0);
    zt_pipe_cmd *cmds = malloc((n ? n : 1) * sizeof *cmds);
    if (!cmds)
        return 1;
    size_t got = train ? zt_pipe_train_schedule(stages, stage, mb, cmds, n)
                       : zt_pipe_inference_schedule(stages, stage, mb, cmds, n);
    if (got != n)
        return 1;
    for (size_t i = 0; i < n; i++)
        printf("%d %s %d %d\n", cmds[i].step, zt_pipe_cmd_name(cmds[i].kind), cmds[i].buffer,
               cmds[i].micro_batch);
    printf("buffers %d\n", train ? zt_pipe_train_buffers(stages, stage, mb) : 2);
    free(cmds);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && (strcmp(argv[1], "train") == 0 || strcmp(argv[1], "inference") == 0)) {
        int stages = atoi(argv[2]), stage = atoi(argv[3]), mb = atoi(argv[4]);
        if (stages < 1 || stage < 0 || stage >= stages || mb < 1)
            return usage(argv[0]);
        return schedule(argv[1][0] == 't', stages, stage, mb);
    }
    if (argc >= 5 && strcmp(argv[1], "partition") == 0) {
        int parts = atoi(argv[2]), n = argc - 4;
        if (parts < 1)
            return usage(argv[0]);
        zt_pipe_layer *layers = calloc((size_t)n, sizeof *layers);
        int *bounds = calloc((size_t)parts + 1, sizeof *bounds);
        if (!layers || !bounds)
            return 1;
        for (int i = 0; i < n; i++) {
            char *colon = strrchr(argv[4 + i], ':');
            if (!colon)
                return usage(argv[0]);
            *colon = '\0';
            layers[i].type = argv[4 + i];
            layers[i].params = strtoull(colon + 1, NULL, 10);
        }
        if (zt_pipe_partition(argv[3], layers, n, parts, bounds) != ZT_OK) {
            fprintf(stderr, "%s\n", zt_last_error());
            return 1;
        }
        printf("bounds");
        for (int p = 0; p <= parts; p++)
            printf(" %d", bounds[p]);
        printf("\n");
        free(layers);
        free(bounds);
        return 0;
    }
    return usage(argv[0]);
}
