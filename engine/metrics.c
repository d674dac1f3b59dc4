/* metrics.jsonl writer. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/metrics.h"

zt_status zt_metrics_open(zt_metrics_writer *w, const char *path, bool append) {
    w->f = fopen(path, append ? "a" : "w");
    if (!w->f)
        return zt_error(ZT_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    w->path = strdup(path);
    return ZT_OK;
}

zt_status zt_metrics_write(zt_metrics_writer *w, const zt_metric *m, int n) {
    fputc('{', w->f);
    for (int i = 0; i < n; i++) {
        fprintf(w->f, "%s\"%s\": ", i ? ", " : "", m[i].key);
        double v = m[i].value;
        if (!isfinite(v))
            fputs("null", w->f);
        else if (v == (double)(long long)v && fabs(v) < 1e15)
            fprintf(w->f, "%lld", (long long)v);
        else
            fprintf(w->f, "%.9g", v);
    }
    fputs("}\n", w->f);
    if (fflush(w->f) != 0 || ferror(w->f))
        return zt_error(ZT_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    return ZT_OK;
}

void zt_metrics_close(zt_metrics_writer *w) {
    if (w->f)
        fclose(w->f);
    free(w->path);
    w->f = NULL;
    w->path = NULL;
}
