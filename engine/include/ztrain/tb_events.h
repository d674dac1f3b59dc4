/* TensorBoard event files, written in C (internal to libztrain): the format TensorBoard's readers
 * take, as torch.utils.tensorboard.SummaryWriter writes it for add_scalar. */
#ifndef ZTRAIN_TB_EVENTS_H
#define ZTRAIN_TB_EVENTS_H

#include <stdint.h>
#include <stdio.h>

#include "ztrain/status.h"

typedef struct zt_tb_writer {
    FILE *f;
    char path[1280];
} zt_tb_writer;

/* Creates dir (and its parents) and a new event file in it named as SummaryWriter names one,
 * events.out.tfevents.<10-digit unix time>.<host>.<pid>.<n>, n counting the writers this process
 * has opened from 0 (so the first is .0), starting with the file-version event
 * ("brain.Event:2"). Close with zt_tb_close. */
zt_status zt_tb_open(zt_tb_writer *w, const char *dir);
/* Appends one scalar event: Event{wall_time, step, summary{value{tag, simple_value}}}, the value
 * rounded to float as simple_value holds it. Buffered until zt_tb_flush. */
zt_status zt_tb_scalar(zt_tb_writer *w, const char *tag, double value, int64_t step,
                       double wall_time);
/* Writes out what is buffered, so a TensorBoard reading the directory sees it. */
zt_status zt_tb_flush(zt_tb_writer *w);
void zt_tb_close(zt_tb_writer *w);

/* CRC-32C (Castagnoli) of n bytes, as TFRecord framing uses it (exposed for tests). */
uint32_t zt_crc32c(const void *data, size_t n);

#endif
