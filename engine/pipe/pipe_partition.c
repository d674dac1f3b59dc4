/* How a model's layers are cut into pipeline stages: DeepSpeed's PipelineModule partition
 * methods (`uniform`, `parameters`, `type:REGEX`) over the layer list a model offers.
 *
 * The balanced partition is DeepSpeed's runtime/utils.py partition_balanced: the linear-partition
 * dynamic programme that, among all cuts of the list into `parts` non-empty runs, picks one whose
 * heaviest and lightest runs differ least, preferring the latest cut on ties. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ztrain/pipeline.h"

void zt_pipe_partition_uniform(int n, int parts, int *bounds) {
    if (n <= parts) {
        for (int p = 0; p <= parts; p++)
            bounds[p] = p < n ? p : n;
        return;
    }
    /* Every part gets n / parts layers, and the first n % parts get one more. */
    int chunk = n / parts, extra = n % parts;
    for (int p = 0; p <= parts; p++)
        bounds[p] = p * chunk + (p < extra ? p : extra);
}

void zt_pipe_partition_balanced(const double *weights, int n, int parts, int *bounds) {
    if (n <= parts) {
        zt_pipe_partition_uniform(n, parts, bounds);
        return;
    }
    /* State (i, j): the first i layers cut into j runs. For each, the cheapest cost (heaviest
     * minus lightest run), the heaviest and lightest runs that cost came from, and where the
     * last run starts. Unreached states hold +inf, as DeepSpeed's tables start. */
    size_t cols = (size_t)parts + 1, cells = ((size_t)n + 1) * cols;
    double *cost = malloc(cells * sizeof *cost), *hi = malloc(cells * sizeof *hi);
    double *lo = malloc(cells * sizeof *lo), *prefix = malloc(((size_t)n + 1) * sizeof *prefix);
    int *start = calloc(cells, sizeof *start);
    ZT_ASSERT(cost && hi && lo && prefix && start);
    for (size_t c = 0; c < cells; c++)
        cost[c] = hi[c] = lo[c] = INFINITY;
    cost[0] = hi[0] = 0;
    prefix[0] = 0;
    for (int i = 0; i < n; i++)
        prefix[i + 1] = prefix[i] + weights[i];
    for (int i = 1; i <= n; i++) {
        for (int j = 1; j <= (i < parts ? i : parts); j++) {
            size_t at = (size_t)i * cols + (size_t)j;
            for (int k = 0; k < i; k++) {
                size_t from = (size_t)k * cols + (size_t)(j - 1);
                double run = prefix[i] - prefix[k];
                double mx = fmax(hi[from], run), mn = fmin(lo[from], run);
                double c = mx - mn;
                if (cost[at] >= c) {
                    cost[at] = c;
                    hi[at] = mx;
                    lo[at] = mn;
                    start[at] = k;
                }
            }
        }
    }
    bounds[parts] = n;
    for (int j = parts; j >= 1; j--)
        bounds[j - 1] = start[(size_t)bounds[j] * cols + (size_t)j];
    free(cost);
    free(hi);
    free(lo);
    free(prefix);
    free(start);
}

/* Lists the layer types for an error message: "embed, block, final_norm, head". */
static void list_types(const zt_pipe_layer *layers, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        bool seen = false;
        for (int k = 0; k < i && !seen; k++)
            seen = strcmp(layers[k].type, layers[i].type) == 0;
        if (!seen)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", layers[i].type);
    }
}

/* Weight 1 for each layer whose type the pattern finds (case-insensitively, anywhere in the name,
 * as DeepSpeed's re.search with IGNORECASE), 0 for the others. */
static zt_status type_weights(const char *method, const char *pattern, const zt_pipe_layer *layers,
                              int n, double *w) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_CASELESS,
                                   &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return zt_error(ZT_ERR_INVALID,
                        "pipeline.partition \"%s\": the pattern does not compile at offset %zu: %s",
                        method, (size_t)off, (char *)msg);
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    ZT_ASSERT(md);
    int matched = 0;
    for (int i = 0; i < n; i++) {
        int rc = pcre2_match(re, (PCRE2_SPTR)layers[i].type, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
        w[i] = rc >= 0 ? 1.0 : 0.0;
        matched += rc >= 0;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (matched == 0) {
        char types[256];
        list_types(layers, n, types, sizeof types);
        return zt_error(ZT_ERR_INVALID,
                        "pipeline.partition \"%s\": matches no layer; the layer types are %s",
                        method, types);
    }
    return ZT_OK;
}

zt_status zt_pipe_partition(const char *method, const zt_pipe_layer *layers, int n, int parts,
                            int *bounds) {
    ZT_ASSERT(n >= 1 && parts >= 1);
    if (strcasecmp(method, "uniform") == 0) {
        zt_pipe_partition_uniform(n, parts, bounds);
    } else if (strcasecmp(method, "parameters") == 0 || strncasecmp(method, "type:", 5) == 0) {
        double *w = malloc((size_t)n * sizeof *w);
        if (!w)
            return zt_error(ZT_ERR_NOMEM, "pipeline.partition: out of memory");
        zt_status st = ZT_OK;
        if (method[0] == 'p' || method[0] == 'P') {
            for (int i = 0; i < n; i++)
                w[i] = (double)layers[i].params;
        } else {
            /* DeepSpeed takes the text between the first and a second colon as the pattern. */
            char pattern[256];
            const char *p = method + 5, *end = strchr(p, ':');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len == 0 || len >= sizeof pattern)
                st = zt_error(ZT_ERR_INVALID,
                              "pipeline.partition \"%s\": type: needs a pattern of 1 to %zu "
                              "characters",
                              method, sizeof pattern - 1);
            else {
                memcpy(pattern, p, len);
                pattern[len] = '\0';
                st = type_weights(method, pattern, layers, n, w);
            }
        }
        if (st == ZT_OK)
            zt_pipe_partition_balanced(w, n, parts, bounds);
        free(w);
        if (st != ZT_OK)
            return st;
    } else {
        return zt_error(ZT_ERR_INVALID,
                        "pipeline.partition \"%s\": unknown method; use \"parameters\", "
                        "\"uniform\" or \"type:REGEX\"",
                        method);
    }
    for (int s = 0; s < parts; s++)
        if (bounds[s + 1] <= bounds[s])
            return zt_error(ZT_ERR_INVALID,
                            "pipeline.partition \"%s\": stage %d of %d gets no layers (the model "
                            "offers %d layers to cut)",
                            method, s, parts, n);
    return ZT_OK;
}
