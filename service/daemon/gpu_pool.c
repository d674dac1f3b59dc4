/* The daemon's GPUs as a resource of its queue (gpu_pool.h): the ids it may hand out, who holds
 * each, and the CUDA_VISIBLE_DEVICES list of a job. */
#include <stdio.h>
#include <string.h>

#include "gpu_pool.h"

zt_status zt_gpu_pool_init(zt_gpu_pool *p, int n, const char *visible) {
    memset(p, 0, sizeof *p);
    if (n < 0 || n > ZT_MAX_GPUS)
        return zt_error(ZT_ERR_INVALID, "--gpus %d: must be in [0, %d]", n, ZT_MAX_GPUS);
    int listed = 0;
    if (visible && *visible) {
        /* Split the daemon's own list; each entry names one GPU as the driver does. */
        const char *s = visible;
        while (*s && listed < ZT_MAX_GPUS) {
            size_t len = strcspn(s, ",");
            if (len == 0 || len >= sizeof p->ids[0])
                return zt_error(ZT_ERR_INVALID, "CUDA_VISIBLE_DEVICES='%s': entry %d is %s",
                                visible, listed, len ? "too long" : "empty");
            snprintf(p->ids[listed++], sizeof p->ids[0], "%.*s", (int)len, s);
            s += len + (s[len] == ',');
        }
        if (n > listed)
            return zt_error(ZT_ERR_INVALID, "--gpus %d: CUDA_VISIBLE_DEVICES='%s' names only %d",
                            n, visible, listed);
    } else {
        for (int i = 0; i < n; i++)
            snprintf(p->ids[i], sizeof p->ids[0], "%d", i);
    }
    p->n = n;
    return ZT_OK;
}

int zt_gpu_pool_need(const zt_gpu_pool *p, int world_size) {
    return world_size < p->n ? world_size : p->n;
}

int zt_gpu_pool_free(const zt_gpu_pool *p) {
    int free_gpus = 0;
    for (int i = 0; i < p->n; i++)
        free_gpus += p->owner[i][0] == '\0';
    return free_gpus;
}

bool zt_gpu_pool_take(zt_gpu_pool *p, const char *owner, int count, char *list, size_t cap) {
    if (count < 0 || zt_gpu_pool_free(p) < count || !cap || !owner || !*owner)
        return false;
    int picked[ZT_MAX_GPUS], k = 0;
    size_t len = 0;
    list[0] = '\0';
    for (int i = 0; i < p->n && k < count; i++) {
        if (p->owner[i][0])
            continue;
        int w = snprintf(list + len, cap - len, "%s%s", k ? "," : "", p->ids[i]);
        if (w < 0 || (size_t)w >= cap - len) {
            list[0] = '\0';
            return false;
        }
        len += (size_t)w;
        picked[k++] = i;
    }
    for (int i = 0; i < k; i++)
        snprintf(p->owner[picked[i]], sizeof p->owner[0], "%s", owner);
    return true;
}

void zt_gpu_pool_release(zt_gpu_pool *p, const char *owner) {
    for (int i = 0; i < p->n; i++)
        if (owner && strcmp(p->owner[i], owner) == 0)
            p->owner[i][0] = '\0';
}
