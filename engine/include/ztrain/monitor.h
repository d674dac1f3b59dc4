/* DeepSpeed's file monitors (deepspeed/monitor/): the "tensorboard" and "csv_monitor" sections of
 * the config, written by rank 0 where and as DeepSpeed writes them.
 *
 * An event is DeepSpeed's (tag, value, step) tuple; the step is the global sample count. The
 * TensorBoard monitor appends scalars to one new event file per run under its directory
 * (SummaryWriter's layout and file name) and flushes after each batch of events. The CSV monitor
 * keeps one file per tag, <dir>/<tag with '/' and ' ' replaced by '_'>.csv, opened for appending;
 * the first time a run writes a tag it writes the header row "step,<last component of the tag>",
 * then one "step,value" row per event, the value as Python's repr of a float writes it. */
#ifndef ZTRAIN_MONITOR_H
#define ZTRAIN_MONITOR_H

#include <stdint.h>

#include "ztrain/ds_config.h"
#include "ztrain/status.h"

typedef struct zt_monitor zt_monitor;

typedef struct {
    const char *tag; /* e.g. "Train/Samples/lr" */
    double value;
} zt_monitor_event;

/* Opens the monitors cfg enables: creates their directories and, for TensorBoard, the event file.
 * *out is NULL when none is enabled (zt_monitor_write and zt_monitor_close accept NULL). Call on
 * rank 0 only. */
zt_status zt_monitor_open(zt_monitor **out, const zt_monitor_config *cfg);

/* Writes n events at `step` (global samples) to every open monitor and flushes them. */
zt_status zt_monitor_write(zt_monitor *m, const zt_monitor_event *events, int n, int64_t step);

void zt_monitor_close(zt_monitor *m);

/* Python's repr() of a float (shortest round-trip digits; "1e-05", "65536.0", "nan", "inf"),
 * into buf of at least 32 bytes; exposed for tests. */
void zt_monitor_format_float(char *buf, size_t size, double v);

#endif
