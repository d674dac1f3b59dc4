/* The job-level checks of tensor parallelism (DeepSpeed's tensor_parallel.autotp_size): the model
 * must split evenly over the TP ranks, which is refused by name before any rank starts rather
 * than failing (or silently differing) later. */
#include <stdio.h>

#include "job_tp.h"

/* A model dimension the TP size must divide, named as the job spec names it. */
static zt_status divides(int tp, int value, const char *field, const char *why,
                         const char *source) {
    if (value > 0 && value % tp != 0)
        return zt_error(ZT_ERR_INVALID, "%s: model.%s (%d) must be divisible by "
                        "tensor_parallel.autotp_size (%d): %s", source, field, value, tp, why);
    return ZT_OK;
}

zt_status zt_job_check_tp(const zt_job_spec *job, const char *source) {
    const int tp = job->ds.tp_size;
    if (tp <= 1)
        return ZT_OK;
    const zt_model_spec *m = &job->model;
    ZT_TRY(divides(tp, m->n_head, "n_head", "attention is split by heads", source));
    /* Megatron's grouped-query attention under TP: kv heads are split between the ranks, or,
     * when there are fewer, each is replicated over autotp_size / n_kv_head of them. */
    if (m->n_kv_head > 0 && m->n_kv_head % tp != 0 && tp % m->n_kv_head != 0)
        return zt_error(ZT_ERR_INVALID, "%s: model.n_kv_head (%d) must be divisible by "
                        "tensor_parallel.autotp_size (%d), or divide it: kv heads are split "
                        "between TP ranks, or each replicated over autotp_size / n_kv_head of "
                        "them", source, m->n_kv_head, tp);
    ZT_TRY(divides(tp, m->intermediate_size, "intermediate_size",
                   "the MLP is split by columns", source));
    ZT_TRY(divides(tp, m->vocab_size, "vocab_size",
                   "the embedding and LM head are split by vocabulary rows (pad the vocabulary)",
                   source));
    return ZT_OK;
}
