/* The per-rank figures ztraind keeps of a job from its metric records: each rank's step time and
 * breakdown, CPU and memory, GPU (the keys perf/rank<r>/... and system/rank<r>/... that the
 * trainer writes, engine/observe/rank_stats.c), for the per-rank table of GetJob / the HTTP job JSON and
 * for Prometheus' rank-labelled series. */
#ifndef ZTRAIN_RANK_FIGURES_H
#define ZTRAIN_RANK_FIGURES_H

#include <stdbool.h>

#include <cjson/cJSON.h>

/* The figures, in the order of zt_rank_figure_names. */
enum {
    ZT_FIG_STEP_TIME, ZT_FIG_DATA, ZT_FIG_FWD, ZT_FIG_BWD, ZT_FIG_STEP, ZT_FIG_COMM,
    ZT_FIG_COMPUTE, ZT_FIG_CPU_UTIL, ZT_FIG_RSS, ZT_FIG_PEAK_RSS, ZT_FIG_GPU_UTIL,
    ZT_FIG_GPU_MEMORY, ZT_FIG_GPU_POWER, ZT_FIG_GPU_TEMPERATURE, ZT_RANK_FIGURES
};

/* The names as the records spell them after "perf/rank<r>/" (the first ZT_FIG_CPU_UTIL) or
 * "system/rank<r>/" (the others), and as the job JSON's rank objects do: "step_time_ms", ... */
extern const char *const zt_rank_figure_names[ZT_RANK_FIGURES];

/* One rank's figures from the newest record that carried any rank's; a figure that record
 * lacked or held as null is NaN. `reported` is false until the first such record. */
typedef struct {
    bool reported;
    double v[ZT_RANK_FIGURES];
} zt_rank_figures;

#endif
