/* Tensor parallelism's grid of ranks (Megatron-style sharded layers; DeepSpeed's
 * tensor_parallel.autotp_size): which data-parallel replica, pipeline stage and tensor-parallel
 * shard a rank is, and the sub-group communicators that connect them.
 *
 * The grid is dp × pp × tp with tp innermost:
 *
 *     rank = ((stage · dp) + replica) · tp + tp_rank
 *
 * so a replica's TP ranks are consecutive. Launchers number the ranks of a host consecutively
 * (LOCAL_RANK), so the TP group, whose all-reduces run twice per block in each direction and sit
 * on the critical path, lands on one host's fastest links (NVLink, or shared memory), while the
 * data-parallel reduction, once per step and overlappable, crosses hosts. This is Megatron-LM's
 * order (tensor-model-parallel ranks adjacent, then data, then pipeline) and DeepSpeed's
 * PipeModelDataParallelTopology's (axes pipe, data, model: model fastest); with tp 1 it is
 * ztrain's pipeline grid (rank = stage · dp + replica, ztrain/pipeline.h). */
#ifndef ZTRAIN_TP_H
#define ZTRAIN_TP_H

#include "ztrain/comm.h"
#include "ztrain/status.h"

typedef struct {
    int dp, stages, tp;          /* the grid's sizes: dp · stages · tp ranks */
    int replica, stage, tp_rank; /* this rank's coordinates */
} zt_grid;

static inline int zt_grid_rank(const zt_grid *g, int stage, int replica, int tp_rank) {
    return (stage * g->dp + replica) * g->tp + tp_rank;
}

/* The coordinates of `rank` in a world of `world` ranks cut into `stages` pipeline stages of
 * `tp`-rank TP groups: ZT_ERR_INVALID, naming the sizes, when stages · tp does not divide world. */
zt_status zt_grid_of(int rank, int world, int stages, int tp, zt_grid *out);

/* The communicators of one rank of a pipeline-less grid (stages 1): its TP group (members in
 * tp_rank order; NULL with tp 1) and its data-parallel group, the replicas of its shard (members
 * in replica order; NULL with dp 1). Every rank of `world` calls this at the same point. Free
 * with zt_tp_groups_destroy before world. */
typedef struct {
    zt_comm *tp, *dp;
} zt_tp_groups;

zt_status zt_tp_groups_create(zt_tp_groups *out, zt_comm *world, const zt_grid *g);
void zt_tp_groups_destroy(zt_tp_groups *g);

/* The grid's sizes (dp, stages, tp; coordinates 0) of a job spec as JSON text whose DeepSpeed
 * config is inline and was accepted by the job-spec parser (a stored or resolved spec): for
 * the service, which shows the grid and labels ranks with their coordinates. A spec it cannot
 * read gives dp = world_size (or 1), stages 1, tp 1. */
zt_grid zt_grid_of_spec_json(const char *spec_json);

/* The coordinates of `rank` in a grid of g's sizes (g->dp, stages, tp set). */
zt_grid zt_grid_at(const zt_grid *g, int rank);

#endif
