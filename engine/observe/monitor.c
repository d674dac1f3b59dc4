/* DeepSpeed's TensorBoard and CSV monitors (ztrain/monitor.h), after deepspeed/monitor/
 * tensorboard.py and csv_monitor.py. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ztrain/fsutil.h"
#include "ztrain/tb_events.h"
#include "ztrain/monitor.h"

enum { MAX_CSV_TAGS = 32 };

struct zt_monitor {
    bool tb_open;
    zt_tb_writer tb;
    bool csv;
    char csv_dir[1024];
    /* The tags this run has written a CSV header for (csvMonitor.filenames). */
    char *csv_tags[MAX_CSV_TAGS];
    int n_csv_tags;
};

zt_status zt_monitor_open(zt_monitor **out, const zt_monitor_config *cfg) {
    *out = NULL;
    if (!cfg->tensorboard.enabled && !cfg->csv.enabled)
        return ZT_OK;
    zt_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return zt_error(ZT_ERR_NOMEM, "monitor: out of memory");
    zt_status s = ZT_OK;
    if (cfg->tensorboard.enabled) {
        s = zt_tb_open(&m->tb, cfg->tensorboard.dir);
        m->tb_open = s == ZT_OK;
    }
    if (s == ZT_OK && cfg->csv.enabled) {
        m->csv = true;
        snprintf(m->csv_dir, sizeof m->csv_dir, "%s", cfg->csv.dir);
        s = zt_mkdirs(m->csv_dir);
    }
    if (s != ZT_OK) {
        zt_monitor_close(m);
        return s;
    }
    *out = m;
    return ZT_OK;
}

/* Python's float repr: the shortest digits that read back as v, in fixed notation when the
 * decimal point falls within 16 digits of the first digit (1e-4 <= |v| < 1e16), else in
 * exponent notation with at least two exponent digits. */
void zt_monitor_format_float(char *buf, size_t size, double v) {
    if (isnan(v)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, size, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == 0.0) {
        snprintf(buf, size, signbit(v) ? "-0.0" : "0.0");
        return;
    }
    char e[40];
    for (int p = 0; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p, v);
        if (strtod(e, NULL) == v)
            break;
    }
    /* e is [-]d[.ddd]e[+-]xx: its digits and decimal exponent. */
    const char *s = e[0] == '-' ? e + 1 : e;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    digits[nd] = '\0';
    int exp10 = atoi(s + 1), decpt = exp10 + 1;
    char out[64];
    size_t k = 0;
    if (v < 0)
        out[k++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -decpt; i++)
                out[k++] = '0';
            for (int i = 0; i < nd; i++)
                out[k++] = digits[i];
        } else {
            for (int i = 0; i < nd || i < decpt; i++) {
                if (i == decpt)
                    out[k++] = '.';
                out[k++] = i < nd ? digits[i] : '0';
            }
            if (decpt >= nd) {
                out[k++] = '.';
                out[k++] = '0';
            }
        }
        out[k] = '\0';
    } else {
        snprintf(out + k, sizeof out - k, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "",
                 digits + 1, exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(buf, size, "%s", out);
}

static zt_status csv_write(zt_monitor *m, const char *tag, double value, int64_t step) {
    char name[256], path[1400];
    snprintf(name, sizeof name, "%s", tag);
    for (char *c = name; *c; c++)
        if (*c == '/' || *c == ' ')
            *c = '_';
    snprintf(path, sizeof path, "%s/%s.csv", m->csv_dir, name);
    bool header = true;
    for (int i = 0; i < m->n_csv_tags; i++)
        header = header && strcmp(m->csv_tags[i], tag) != 0;
    FILE *f = fopen(path, "a");
    if (!f)
        return zt_error(ZT_ERR_IO, "%s: cannot open for appending: %s", path, strerror(errno));
    if (header) {
        const char *last = strrchr(tag, '/');
        fprintf(f, "step,%s\r\n", last ? last + 1 : tag);
        if (m->n_csv_tags < MAX_CSV_TAGS)
            m->csv_tags[m->n_csv_tags++] = strdup(tag);
    }
    char num[64];
    zt_monitor_format_float(num, sizeof num, value);
    fprintf(f, "%lld,%s\r\n", (long long)step, num);
    if (fclose(f) != 0)
        return zt_error(ZT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return ZT_OK;
}

zt_status zt_monitor_write(zt_monitor *m, const zt_monitor_event *events, int n, int64_t step) {
    if (!m)
        return ZT_OK;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    for (int i = 0; i < n; i++) {
        if (m->tb_open)
            ZT_TRY(zt_tb_scalar(&m->tb, events[i].tag, events[i].value, step, now));
        if (m->csv)
            ZT_TRY(csv_write(m, events[i].tag, events[i].value, step));
    }
    return m->tb_open ? zt_tb_flush(&m->tb) : ZT_OK;
}

void zt_monitor_close(zt_monitor *m) {
    if (!m)
        return;
    if (m->tb_open)
        zt_tb_close(&m->tb);
    for (int i = 0; i < m->n_csv_tags; i++)
        free(m->csv_tags[i]);
    free(m);
}
