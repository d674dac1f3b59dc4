/* `--profile`: per-op timings of every step to <out_dir>/profile.jsonl, their means over the timed
 * steps to <out_dir>/profile.json and a printed table (trainer_profile.h). */
#include <stdio.h>
#include <string.h>

#include "trainer_profile.h"
#include "ztrain/fsutil.h"
#include "ztrain/gpu.h"
#include "ztrain/model.h"

/* The members that say what was profiled: the device and clock, the model, the batch. */
static void describe(zt_trainer_profile *tp, const zt_job_spec *job) {
    char model[512], gpu[256] = "";
    zt_model_spec_describe(&job->model, model, sizeof model);
    for (char *c = model; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            *c = ' ';
    zt_gpu_props gp;
    if (tp->be->device == ZT_DEVICE_CUDA && zt_gpu_props_get(tp->be->device_index, &gp) == ZT_OK)
        for (size_t i = 0, j = 0; gp.name[i] && j + 1 < sizeof gpu; i++)
            if (gp.name[i] != '"' && gp.name[i] != '\\' && (unsigned char)gp.name[i] >= 0x20)
                gpu[j++] = gp.name[i], gpu[j] = '\0';
    const char *dtype = job->ds.bf16.enabled ? "bf16" : job->ds.fp16.enabled ? "fp16" : "fp32";
    snprintf(tp->header, sizeof tp->header,
             "\"format\": \"ztrain-op-profile\", \"version\": 1, \"device\": \"%s\", "
             "\"device_name\": \"%s\", \"clock\": \"%s\", \"model\": \"%s\", "
             "\"model_type\": \"%s\", \"n_layer\": %d, \"n_embd\": %d, "
             "\"micro_batch\": %d, \"seq_len\": %d, \"gradient_accumulation_steps\": %d, "
             "\"dtype\": \"%s\", \"warmup_steps\": %d",
             tp->be->name, gpu[0] ? gpu : tp->be->name, zt_op_profile_clock(tp->prof), model,
             job->model.type, job->model.n_layer, job->model.n_embd,
             job->ds.train_micro_batch_size_per_gpu, job->model.block_size,
             job->ds.gradient_accumulation_steps, dtype, job->train.warmup_steps);
}

zt_status zt_trainer_profile_init(zt_trainer_profile *tp, const zt_job_spec *job, zt_backend *be,
                                  int rank, const char *out_dir) {
    memset(tp, 0, sizeof *tp);
    tp->be = be;
    tp->rank = rank;
    ZT_TRY(zt_op_profile_create(&tp->prof, be));
    describe(tp, job);
    if (rank != 0 || !out_dir)
        return ZT_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/profile.jsonl", out_dir);
    zt_status s = zt_mkdirs(out_dir);
    /* A resumed run appends, as metrics.jsonl does. */
    if (s == ZT_OK && !(tp->file = fopen(path, job->train.resume ? "a" : "w")))
        s = zt_error(ZT_ERR_IO, "--profile: cannot open %s for writing", path);
    if (s != ZT_OK) {
        zt_trainer_profile_free(tp);
        return s;
    }
    snprintf(tp->path, sizeof tp->path, "%s/profile.json", out_dir);
    return ZT_OK;
}

void zt_trainer_profile_free(zt_trainer_profile *tp) {
    if (tp->file)
        fclose(tp->file);
    zt_op_profile_destroy(tp->prof);
    memset(tp, 0, sizeof *tp);
}

zt_status zt_trainer_profile_wait(zt_trainer_profile *tp) { return zt_backend_sync(tp->be); }

/* {"op": {"calls": c, "ms": t, "share": t / step_ms}, ...} over the ops called, each divided by
 * n (steps). */
static void write_ops(FILE *f, const zt_op_time *ops, double n, double step_ms) {
    fputc('{', f);
    bool first = true;
    for (int i = 0; i < ZT_OP_COUNT; i++) {
        if (!ops[i].calls)
            continue;
        fprintf(f, "%s\"%s\": {\"calls\": %.6g, \"ms\": %.6f, \"share\": %.6f}", first ? "" : ", ",
                zt_op_name((zt_op_id)i), ops[i].calls / n, ops[i].ms / n,
                step_ms > 0 ? ops[i].ms / n / step_ms : 0.0);
        first = false;
    }
    fputc('}', f);
}

static double ops_ms(const zt_op_time *ops, double n) {
    double s = 0.0;
    for (int i = 0; i < ZT_OP_COUNT; i++)
        s += ops[i].ms;
    return s / n;
}

/* profile.json through a temporary file, so a reader never sees half of one. */
static zt_status write_summary(const zt_trainer_profile *tp, int64_t step, double step_ms) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", tp->path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return zt_error(ZT_ERR_IO, "--profile: cannot open %s for writing", tmp);
    /* The mean over the timed steps, or the last step while none is timed yet. */
    bool timed = tp->timed_steps > 0;
    const zt_op_time *ops = timed ? tp->sum : tp->last;
    double n = timed ? (double)tp->timed_steps : 1.0;
    double mean_step = timed ? tp->sum_step_ms / n : step_ms;
    fprintf(f, "{%s, \"other_calls\": %ld,\n \"mean\": {\"steps\": %ld, \"after_warmup\": %s, "
            "\"step_ms\": %.6f, \"ops_ms\": %.6f, \"ops\": ",
            tp->header, zt_op_profile_other_calls(tp->prof), timed ? tp->timed_steps : 1L,
            timed ? "true" : "false", mean_step, ops_ms(ops, n));
    write_ops(f, ops, n, mean_step);
    fprintf(f, "},\n \"last_step\": {\"step\": %lld, \"step_ms\": %.6f, \"ops_ms\": %.6f, \"ops\": ",
            (long long)step, step_ms, ops_ms(tp->last, 1.0));
    write_ops(f, tp->last, 1.0, step_ms);
    fputs("}}\n", f);
    bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok || rename(tmp, tp->path) != 0) {
        remove(tmp);
        return zt_error(ZT_ERR_IO, "--profile: cannot write %s", tp->path);
    }
    return ZT_OK;
}

zt_status zt_trainer_profile_end(zt_trainer_profile *tp, int64_t step, double step_ms,
                                 bool timed) {
    ZT_TRY(zt_op_profile_end_step(tp->prof, tp->last));
    tp->steps++;
    if (timed) {
        for (int i = 0; i < ZT_OP_COUNT; i++) {
            tp->sum[i].calls += tp->last[i].calls;
            tp->sum[i].ms += tp->last[i].ms;
        }
        tp->sum_step_ms += step_ms;
        tp->timed_steps++;
    }
    if (!tp->file)
        return ZT_OK;
    FILE *f = tp->file;
    fprintf(f, "{\"step\": %lld, \"timed\": %s, \"step_ms\": %.6f, \"ops_ms\": %.6f, \"ops\": ",
            (long long)step, timed ? "true" : "false", step_ms, ops_ms(tp->last, 1.0));
    write_ops(f, tp->last, 1.0, step_ms);
    fputs("}\n", f);
    if (fflush(f) != 0 || ferror(f))
        return zt_error(ZT_ERR_IO, "--profile: cannot write profile.jsonl beside %s", tp->path);
    return write_summary(tp, step, step_ms);
}

/* Largest first, so the ops worth a look head the table. */
void zt_trainer_profile_print(const zt_trainer_profile *tp, FILE *out) {
    if (!out || tp->rank != 0 || !tp->steps)
        return;
    bool timed = tp->timed_steps > 0;
    const zt_op_time *ops = timed ? tp->sum : tp->last;
    double n = timed ? (double)tp->timed_steps : 1.0;
    double step = timed ? tp->sum_step_ms / n : 0.0;
    int order[ZT_OP_COUNT], k = 0;
    for (int i = 0; i < ZT_OP_COUNT; i++)
        if (ops[i].calls)
            order[k++] = i;
    for (int a = 1; a < k; a++)
        for (int b = a; b > 0 && ops[order[b]].ms > ops[order[b - 1]].ms; b--) {
            int t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    if (timed)
        fprintf(out, "op profile (%s clock, mean of %ld steps after warmup): step %.3f ms, ops "
                "%.3f ms\n", zt_op_profile_clock(tp->prof), tp->timed_steps, step,
                ops_ms(ops, n));
    else
        fprintf(out, "op profile (%s clock, the last step; none was past warmup): ops %.3f ms\n",
                zt_op_profile_clock(tp->prof), ops_ms(ops, n));
    fprintf(out, "  %-20s %10s %12s %7s\n", "op", "calls/step", "ms/step", "share");
    for (int j = 0; j < k; j++) {
        const zt_op_time *o = &ops[order[j]];
        char share[16] = "-";
        if (step > 0)
            snprintf(share, sizeof share, "%.1f%%", 100.0 * o->ms / n / step);
        fprintf(out, "  %-20s %10.0f %12.3f %7s\n", zt_op_name((zt_op_id)order[j]), o->calls / n,
                o->ms / n, share);
    }
    if (tp->path[0])
        fprintf(out, "op profile written to %s (per step: profile.jsonl)\n", tp->path);
    fflush(out);
}
