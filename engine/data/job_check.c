/* The checks of a job that read its files, made once by whoever starts the ranks (`ztrain run`,
 * ztraind) before any rank starts: the data files open with the model's vocabulary and hold at
 * least what one rank's first batch needs, model.init_from can be read, and data.tokenizer is a
 * tokenizer.json ztrain reads whose ids fit the model's vocabulary. Without them each
 * rank would find the same fault on its own and the job would fail with one error per rank. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ztrain/data.h"
#include "ztrain/job_spec.h"
#include "ztrain/tokenizer.h"

static zt_status check_dataset(const zt_job_spec *job, const char *path, const char *key,
                               bool drop_last, const char *source) {
    zt_dataset d;
    /* data.train may be a glob or a mixture, which only the train opener knows (path NULL). */
    zt_status s = path ? zt_dataset_open_val(&d, &job->data, job->model.vocab_size)
                       : zt_dataset_open_train(&d, &job->data, job->model.vocab_size);
    if (s != ZT_OK)
        return zt_error_prefix(s, "%s: %s: ", source, key);
    zt_loader l;
    s = zt_loader_init(&l, &d, job->ds.train_micro_batch_size_per_gpu, job->model.block_size, 0,
                       job->world_size, false, drop_last, job->train.seed);
    if (s == ZT_OK)
        zt_loader_free(&l);
    else
        zt_error_prefix(s, "%s: %s: ", source, key);
    zt_dataset_close(&d);
    return s;
}

/* data.tokenizer is what `ztrain sample` and the evaluation samples encode with, and what the
 * checkpoint records: a file that is not a tokenizer.json ztrain reads, or whose ids run past
 * model.vocab_size, would fail only later, after training. */
static zt_status check_tokenizer(const zt_job_spec *job, const char *source) {
    const char *path = job->data.tokenizer;
    struct stat st;
    /* Judged by stat before it is read: a FIFO would hold whoever checks the job. */
    if (stat(path, &st) != 0)
        return zt_error(ZT_ERR_IO, "%s: data.tokenizer: cannot open %s: %s", source, path,
                        strerror(errno));
    if (!S_ISREG(st.st_mode))
        return zt_error(ZT_ERR_IO, "%s: data.tokenizer: %s is not a regular file", source, path);
    zt_tokenizer_t *tok;
    zt_status s = zt_tokenizer_load(path, &tok);
    if (s != ZT_OK)
        return zt_error_prefix(s, "%s: data.tokenizer: ", source);
    int32_t n = zt_tokenizer_vocab_size(tok);
    zt_tokenizer_destroy(tok);
    if (n > job->model.vocab_size)
        return zt_error(ZT_ERR_INVALID, "%s: data.tokenizer: %s has %d tokens but "
                        "model.vocab_size is %d", source, path, n, job->model.vocab_size);
    return ZT_OK;
}

/* An nvme offload's directory, which every rank makes its own directory in (offload.c). */
static zt_status check_nvme_dir(const zt_offload_config *off, const char *key, const char *what,
                                const char *source) {
    if (off->device != ZT_OFFLOAD_NVME || !off->nvme_path[0])
        return ZT_OK;
    struct stat st;
    if (stat(off->nvme_path, &st) != 0)
        return zt_error(ZT_ERR_IO, "%s: deepspeed: %s '%s': %s (the ranks keep their offloaded %s "
                        "there)", source, key, off->nvme_path, strerror(errno), what);
    if (!S_ISDIR(st.st_mode))
        return zt_error(ZT_ERR_IO, "%s: deepspeed: %s '%s' is not a directory (the ranks keep "
                        "their offloaded %s there)", source, key, off->nvme_path, what);
    return ZT_OK;
}

zt_status zt_job_spec_check_files(const zt_job_spec *job, const char *source) {
    /* The tokenizer first: data made with a tokenizer larger than the model fails on its ids,
     * and the tokenizer is the cause to name. */
    if (job->data.tokenizer)
        ZT_TRY(check_tokenizer(job, source));
    ZT_TRY(check_dataset(job, NULL, "data.train", job->ds.dataloader_drop_last, source));
    if (job->data.val && job->train.eval_interval > 0)
        ZT_TRY(check_dataset(job, job->data.val, "data.val", false, source));
    if (job->model.init_from) {
        /* Opened without blocking and judged by fstat: a FIFO named here would otherwise hold
         * whoever checks the job (ztraind's submit) until something writes to it. */
        int fd = open(job->model.init_from, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (fd < 0)
            return zt_error(ZT_ERR_IO, "%s: model.init_from: cannot open %s: %s", source,
                            job->model.init_from, strerror(errno));
        struct stat st;
        bool ok = fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode));
        close(fd);
        if (!ok)
            return zt_error(ZT_ERR_IO, "%s: model.init_from: %s is neither a regular file nor "
                            "a directory", source, job->model.init_from);
    }
    return ZT_OK;
}

zt_status zt_job_spec_check_rank_dirs(const zt_job_spec *job, const char *source) {
    /* The stages that offload each (ZeRO-Offload: the optimizer from stage 1, the parameters
     * at stage 3). */
    const zt_zero_config *z = &job->ds.zero;
    if (z->stage >= 1)
        ZT_TRY(check_nvme_dir(&z->offload_optimizer, "zero_optimization.offload_optimizer.nvme_path",
                              "optimizer state", source));
    if (z->stage == 3)
        ZT_TRY(check_nvme_dir(&z->offload_param, "zero_optimization.offload_param.nvme_path",
                              "parameters", source));
    return ZT_OK;
}
