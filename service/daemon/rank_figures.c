/* Per-rank figures from metric records (rank_figures.h). One pass over the record's members,
 * parsing the rank out of each "perf/rank<r>/<name>" or "system/rank<r>/<name>" key, so a record
 * of a large world costs its size and not world × its size. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "job_manager.h"

const char *const zt_rank_figure_names[ZT_RANK_FIGURES] = {
    "step_time_ms", "data_ms",     "fwd_ms",         "bwd_ms",
    "step_ms",      "comm_ms",     "compute_ms",     "cpu_util",
    "rss_bytes",    "peak_rss_bytes", "gpu_util",    "gpu_memory_used_bytes",
    "gpu_power_watts", "gpu_temperature_c",
};

/* The rank and figure a key names, or false. */
static bool parse_key(const char *key, int world, int *rank, int *figure) {
    bool system = strncmp(key, "system/rank", 11) == 0;
    if (!system && strncmp(key, "perf/rank", 9) != 0)
        return false;
    const char *p = key + (system ? 11 : 9);
    char *end;
    long r = strtol(p, &end, 10);
    if (*p < '0' || *p > '9' || *end != '/' || r < 0 || r >= world)
        return false;
    int first = system ? ZT_FIG_CPU_UTIL : 0, end_fig = system ? ZT_RANK_FIGURES : ZT_FIG_CPU_UTIL;
    for (int i = first; i < end_fig; i++) {
        if (strcmp(end + 1, zt_rank_figure_names[i]) == 0) {
            *rank = (int)r;
            *figure = i;
            return true;
        }
    }
    return false;
}

void zt_rank_figures_take(zt_rank_info *ranks, int world, const cJSON *record) {
    bool seen = false;
    const cJSON *item;
    cJSON_ArrayForEach(item, record) {
        int r, i;
        if (!item->string || !parse_key(item->string, world, &r, &i))
            continue;
        if (!seen) {
            /* A new set of figures replaces the old one whole: what it lacks is NaN. */
            for (int q = 0; q < world; q++) {
                ranks[q].figures.reported = true;
                for (int k = 0; k < ZT_RANK_FIGURES; k++)
                    ranks[q].figures.v[k] = NAN;
            }
            seen = true;
        }
        ranks[r].figures.v[i] = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    }
}
