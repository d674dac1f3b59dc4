/* metrics.jsonl writer, with an optional mirror to ztraind's metrics pipe and an optional copy
 * of every record as TensorBoard scalars (tb_events.c, the DeepSpeed monitor's writer too). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ztrain/tb_events.h"
#include "ztrain/metrics.h"

zt_status zt_metrics_open(zt_metrics_writer *w, const char *path, bool append) {
    w->mirror_fd = 0;
    zt_strbuf_init(&w->line);
    w->tb = NULL;
    w->f = fopen(path, append ? "a" : "w");
    if (!w->f)
        return zt_error(ZT_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    w->path = strdup(path);
    return ZT_OK;
}

void zt_metrics_mirror(zt_metrics_writer *w, int fd) {
    w->mirror_fd = fd;
    /* A daemon that died must not kill the rank with SIGPIPE: the write fails with EPIPE. */
    if (fd > 0)
        signal(SIGPIPE, SIG_IGN);
}

/* One write() per line: the pipe is read line by line, and a line under PIPE_BUF is atomic. */
static void mirror_line(zt_metrics_writer *w, const char *line, size_t n) {
    while (w->mirror_fd > 0 && n > 0) {
        ssize_t k = write(w->mirror_fd, line, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            w->mirror_fd = 0;
            return;
        }
        line += k;
        n -= (size_t)k;
    }
}

bool zt_metrics_value_of(const cJSON *member, double *v) {
    if (cJSON_IsNull(member)) {
        *v = NAN;
        return true;
    }
    if (!cJSON_IsNumber(member))
        return false;
    *v = member->valuedouble;
    return true;
}

/* A value as a record writes it: null for a non-finite one, an integral one without a
 * fraction, any other with 9 significant digits. */
static void format_value(char buf[32], double v) {
    if (!isfinite(v))
        snprintf(buf, 32, "null");
    else if (v == (double)(long long)v && fabs(v) < 1e15)
        snprintf(buf, 32, "%lld", (long long)v);
    else
        snprintf(buf, 32, "%.9g", v);
}

/* The record's values as TensorBoard scalars (zt_metrics_tensorboard). */
static zt_status write_tensorboard(zt_metrics_writer *w, const zt_metric *m, int n) {
    int at = 0;
    while (at < n && strcmp(m[at].key, "train/global_step") != 0)
        at++;
    if (at == n || !isfinite(m[at].value))
        return ZT_OK;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    for (int i = 0; i < n; i++) {
        if (i == at)
            continue;
        char buf[32];
        format_value(buf, m[i].value);
        double v = isfinite(m[i].value) ? strtod(buf, NULL) : m[i].value;
        ZT_TRY(zt_tb_scalar(w->tb, m[i].key, v, (int64_t)m[at].value, now));
    }
    return zt_tb_flush(w->tb);
}

zt_status zt_metrics_write(zt_metrics_writer *w, const zt_metric *m, int n) {
    /* The line's memory stays between records, so the step loop allocates only for a record
     * longer than any before. */
    zt_strbuf *b = &w->line;
    zt_strbuf_clear(b);
    zt_strbuf_putc(b, '{');
    for (int i = 0; i < n; i++) {
        char value[32];
        format_value(value, m[i].value);
        zt_strbuf_printf(b, "%s\"%s\": %s", i ? ", " : "", m[i].key, value);
    }
    zt_strbuf_puts(b, "}\n");
    if (b->oom) {
        /* This record is lost; the next one starts again from an empty buffer. */
        zt_strbuf_free(b);
        return zt_error(ZT_ERR_NOMEM, "out of memory formatting a metric record");
    }
    fwrite(b->data, 1, b->len, w->f);
    mirror_line(w, b->data, b->len);
    if (fflush(w->f) != 0 || ferror(w->f))
        return zt_error(ZT_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    return w->tb ? write_tensorboard(w, m, n) : ZT_OK;
}

zt_status zt_metrics_tensorboard(zt_metrics_writer *w, const char *dir) {
    ZT_ASSERT(!w->tb);
    zt_tb_writer *tb = calloc(1, sizeof *tb);
    if (!tb)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory opening a TensorBoard event file", dir);
    zt_status s = zt_tb_open(tb, dir);
    if (s != ZT_OK) {
        zt_tb_close(tb);
        free(tb);
        return s;
    }
    w->tb = tb;
    return ZT_OK;
}

void zt_metrics_event(zt_metrics_writer *w, const char *event, long long step,
                      long long max_steps) {
    char line[256];
    int n = snprintf(line, sizeof line,
                     "{\"event\": \"%s\", \"train/global_step\": %lld, \"max_steps\": %lld}\n",
                     event, step, max_steps);
    if (n > 0 && (size_t)n < sizeof line)
        mirror_line(w, line, (size_t)n);
}

void zt_metrics_close(zt_metrics_writer *w) {
    if (w->f)
        fclose(w->f);
    if (w->tb) {
        zt_tb_close(w->tb);
        free(w->tb);
    }
    w->tb = NULL;
    free(w->path);
    zt_strbuf_free(&w->line);
    w->f = NULL;
    w->path = NULL;
    w->mirror_fd = 0;
}

void zt_metrics_send(zt_metrics_writer *w, const char *json) {
    size_t n = strlen(json);
    char line[1024];
    if (n + 2 > sizeof line)
        return;
    memcpy(line, json, n);
    line[n++] = '\n';
    mirror_line(w, line, n);
}
