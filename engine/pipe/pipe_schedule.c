/* DeepSpeed's pipeline schedules as command lists: TrainSchedule (1F1B) and InferenceSchedule.
 *
 * Each schedule is a sequence of steps, and each step's commands are emitted in the order
 * DeepSpeed's generators yield them (deepspeed/runtime/pipe/schedule.py), so a stage that runs
 * them in order meets its neighbours' sends and receives exactly as DeepSpeed's engine does. */
#include "ztrain/pipeline.h"

#include "ztrain/status.h"

const char *zt_pipe_cmd_name(zt_pipe_cmd_kind k) {
    static const char *const names[ZT_PIPE_CMD_KINDS] = {
        [ZT_PIPE_LOAD_MICRO_BATCH] = "LoadMicroBatch",
        [ZT_PIPE_FORWARD] = "ForwardPass",
        [ZT_PIPE_BACKWARD] = "BackwardPass",
        [ZT_PIPE_SEND_ACTIVATION] = "SendActivation",
        [ZT_PIPE_RECV_ACTIVATION] = "RecvActivation",
        [ZT_PIPE_SEND_GRAD] = "SendGrad",
        [ZT_PIPE_RECV_GRAD] = "RecvGrad",
        [ZT_PIPE_REDUCE_TIED_GRADS] = "ReduceTiedGrads",
        [ZT_PIPE_REDUCE_GRADS] = "ReduceGrads",
        [ZT_PIPE_OPTIMIZER_STEP] = "OptimizerStep",
    };
    return (unsigned)k < ZT_PIPE_CMD_KINDS ? names[k] : "?";
}

int zt_pipe_train_buffers(int stages, int stage, int micro_batches) {
    int n = stages - stage + 1;
    if (micro_batches < n)
        n = micro_batches;
    return n > 2 ? n : 2;
}

/* Appends commands to a list whose storage may be shorter than the schedule: the count goes on
 * so that a first call with no storage sizes the second. */
typedef struct {
    zt_pipe_cmd *out;
    size_t cap, n;
    int step;
} cmd_list;

static void emit(cmd_list *l, zt_pipe_cmd_kind kind, int buffer, int micro_batch) {
    if (l->n < l->cap)
        l->out[l->n] = (zt_pipe_cmd){kind, l->step, buffer, micro_batch};
    l->n++;
}

/* Python's floor division, which DeepSpeed's micro-batch arithmetic relies on. */
static int floor_div2(int x) { return x >= 0 ? x / 2 : -((-x + 1) / 2); }

/* Which micro-batch a training step works on at this stage, and whether it is its forward:
 * forwards fall on the steps whose parity matches the stage's, backwards on the others. */
static int train_micro_batch(int stages, int stage, int step, bool *forward) {
    bool even_step = step % 2 == 0, even_stage = stage % 2 == 0;
    *forward = even_step == even_stage;
    if (*forward)
        return floor_div2(even_step ? step : step - 1) - stage / 2;
    if (even_step)
        return step / 2 - stages + (stage + 1) / 2;
    return floor_div2(step - 1) - stages + 1 + stage / 2;
}

size_t zt_pipe_train_schedule(int stages, int stage, int micro_batches, zt_pipe_cmd *out,
                              size_t cap) {
    ZT_ASSERT(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1);
    cmd_list l = {out, out ? cap : 0, 0, 0};
    int buffers = zt_pipe_train_buffers(stages, stage, micro_batches);
    int total = 2 * (micro_batches + stages - 1);
    bool has_prev = stage > 0, has_next = stage < stages - 1;
    int prev_mb = -1;
    for (int step = 0; step < total; step++) {
        l.step = step;
        bool forward;
        int mb = train_micro_batch(stages, stage, step, &forward);
        bool valid = mb >= 0 && mb < micro_batches;
        bool prev_valid = prev_mb >= 0 && prev_mb < micro_batches;
        int buf = valid ? mb % buffers : -1, prev_buf = prev_valid ? prev_mb % buffers : -1;
        /* Exchange with the neighbours first: a forward step receives its input and returns the
         * previous step's input gradient; a backward step passes on the previous step's output
         * and receives its own output gradient. */
        if (forward) {
            if (valid && has_prev)
                emit(&l, ZT_PIPE_RECV_ACTIVATION, buf, mb);
            if (prev_valid && has_prev)
                emit(&l, ZT_PIPE_SEND_GRAD, prev_buf, prev_mb);
        } else {
            if (prev_valid && has_next)
                emit(&l, ZT_PIPE_SEND_ACTIVATION, prev_buf, prev_mb);
            if (valid && has_next)
                emit(&l, ZT_PIPE_RECV_GRAD, buf, mb);
        }
        if ((stage == 0 || stage == stages - 1) && forward && valid)
            emit(&l, ZT_PIPE_LOAD_MICRO_BATCH, buf, mb);
        if (valid)
            emit(&l, forward ? ZT_PIPE_FORWARD : ZT_PIPE_BACKWARD, buf, mb);
        if (step == total - 1) {
            emit(&l, ZT_PIPE_REDUCE_TIED_GRADS, -1, -1);
            emit(&l, ZT_PIPE_REDUCE_GRADS, -1, -1);
            emit(&l, ZT_PIPE_OPTIMIZER_STEP, -1, -1);
        }
        prev_mb = mb;
    }
    return l.n;
}

size_t zt_pipe_inference_schedule(int stages, int stage, int micro_batches, zt_pipe_cmd *out,
                                  size_t cap) {
    ZT_ASSERT(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1);
    cmd_list l = {out, out ? cap : 0, 0, 0};
    int total = micro_batches + stages - 1;
    bool has_prev = stage > 0, has_next = stage < stages - 1, even = stage % 2 == 0;
    for (int step = 0; step < total; step++) {
        l.step = step;
        int mb = step - stage;
        bool valid = mb >= 0 && mb < micro_batches;
        bool send_valid = mb - 1 >= 0 && mb - 1 < micro_batches;
        /* Two buffers alternate between receiving this step's input and sending the previous
         * step's output; even and odd stages swap roles so that neighbours agree. */
        int recv_buf = even ? step % 2 : (step + 1) % 2;
        int send_buf = even ? (step + 1) % 2 : step % 2;
        if ((stage == 0 || stage == stages - 1) && valid)
            emit(&l, ZT_PIPE_LOAD_MICRO_BATCH, recv_buf, mb);
        /* Even stages send before they receive and odd ones the other way round, so a pair of
         * blocking calls always meets. */
        if (even) {
            if (has_next && send_valid)
                emit(&l, ZT_PIPE_SEND_ACTIVATION, send_buf, mb - 1);
            if (has_prev && valid)
                emit(&l, ZT_PIPE_RECV_ACTIVATION, recv_buf, mb);
        } else {
            if (has_prev && valid)
                emit(&l, ZT_PIPE_RECV_ACTIVATION, recv_buf, mb);
            if (has_next && send_valid)
                emit(&l, ZT_PIPE_SEND_ACTIVATION, send_buf, mb - 1);
        }
        if (valid)
            emit(&l, ZT_PIPE_FORWARD, recv_buf, mb);
    }
    return l.n;
}
