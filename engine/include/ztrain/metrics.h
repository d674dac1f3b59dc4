/* Metric records: one JSON object per logged step, one line each (metrics.jsonl), with the metric
 * names of DESIGN.md §3 ("train/loss", "perf/tokens_per_second", ...). Non-finite values are
 * written as null, since JSON has no NaN. */
#ifndef ZTRAIN_METRICS_H
#define ZTRAIN_METRICS_H

#include <stdbool.h>
#include <stdio.h>

#include "ztrain/status.h"
#include "ztrain/strbuf.h"

typedef struct {
    const char *key;
    double value;
} zt_metric;

/* The subdirectory of a run directory that rank 0's TensorBoard event files go to. */
#define ZT_METRICS_TB_DIR "tensorboard"

struct zt_tb_writer;

typedef struct {
    FILE *f;
    char *path;
    int mirror_fd;  /* > 0: every record is also written here as one line (see below) */
    zt_strbuf line; /* the record being formatted; grown once, reused for every record */
    struct zt_tb_writer *tb;  /* NULL unless zt_metrics_tensorboard opened one */
} zt_metrics_writer;

struct cJSON;

/* A member of a record read back: *v is its number, or NaN for null (a value that was not
 * finite: which of NaN and ±inf is not kept); false for anything else. */
bool zt_metrics_value_of(const struct cJSON *member, double *v);

/* Opens path for writing (append keeps earlier records, e.g. when a run resumes). */
zt_status zt_metrics_open(zt_metrics_writer *w, const char *path, bool append);
/* Writes one record and flushes it, so a reader tailing the file sees every step. */
zt_status zt_metrics_write(zt_metrics_writer *w, const zt_metric *m, int n);
void zt_metrics_close(zt_metrics_writer *w);

/* Also writes every record as TensorBoard scalars, into a new event file under dir (created if
 * needed, the file named as SummaryWriter names one): one scalar per key but train/global_step,
 * tagged with the key, at the record's train/global_step (a record without it is not written),
 * with the wall time of the write. The value is the record's as its text reads back, rounded
 * to float as simple_value holds it, so TensorBoard shows the numbers the record has;
 * non-finite values (null in the record) go in as NaN or infinity, as SummaryWriter writes
 * them. Each record is flushed. The same writer as DeepSpeed's tensorboard monitor
 * (ztrain/monitor.h); zt_metrics_close closes it. */
zt_status zt_metrics_tensorboard(zt_metrics_writer *w, const char *dir);

/* Also sends every record to fd (ztraind's pipe, ZTRAIN_METRICS_FD) with a single write(), so a
 * reader sees whole lines. The fd stays the caller's. A reader that has gone away (EPIPE) is not
 * the training's failure: the record still reaches the file, and the mirror is dropped. */
void zt_metrics_mirror(zt_metrics_writer *w, int fd);
/* Writes a lifecycle line to the mirror only: {"event": "<event>", "train/global_step": step,
 * "max_steps": max_steps}. ztraind takes "running" as the moment the job starts training. */
void zt_metrics_event(zt_metrics_writer *w, const char *event, long long step,
                      long long max_steps);
/* Writes one JSON object (without its newline, under 1 KiB) to the mirror only, as one line:
 * how rank 0 reports an anomaly event ({"event": "anomaly", ...}, ztrain/anomaly.h). */
void zt_metrics_send(zt_metrics_writer *w, const char *json);

#endif
