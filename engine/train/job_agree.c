/* The check, when the ranks meet, that they were all started with the same job (ztrain/trainer.h:
 * zt_train_check_agreement). Nodes read their own job files; one that differs (another lr, seed
 * or model size) would otherwise train silently to other results, or wait in a collective of
 * another size until the timeout and blame the network. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ztrain/job_spec.h"
#include "ztrain/trainer.h"

/* FNV-1a, 64 bits: a digest for telling texts apart, not for security. */
static uint64_t fnv1a64(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Sends root's text (len bytes) to every rank into a new buffer *out. Bytes travel as fp64
 * elements: collectives move them unchanged, only reductions compute. */
static zt_status share_text(zt_comm *comm, int root, const char *mine, size_t len, char **out) {
    size_t n = (len + 8) / 8;
    double *buf = calloc(n, sizeof *buf);
    if (!buf)
        return zt_error(ZT_ERR_NOMEM, "job agreement: out of memory for %zu bytes", len);
    if (zt_comm_rank(comm) == root)
        memcpy(buf, mine, len);
    zt_status s = zt_comm_broadcast(comm, buf, n, ZT_F64, root);
    if (s != ZT_OK) {
        free(buf);
        return s;
    }
    ((char *)buf)[len] = '\0';
    *out = (char *)buf;
    return ZT_OK;
}

zt_status zt_train_check_agreement(const zt_job_spec *job, zt_comm *comm) {
    int world = zt_comm_world_size(comm), me = zt_comm_rank(comm);
    if (world < 2)
        return ZT_OK;
    char *text = zt_job_spec_agreement_text(job);
    double *all = calloc((size_t)world * 3, sizeof *all);
    size_t *offsets = calloc((size_t)world, sizeof *offsets);
    size_t *counts = calloc((size_t)world, sizeof *counts);
    zt_status s = ZT_OK;
    if (!text || !all || !offsets || !counts)
        s = zt_error(ZT_ERR_NOMEM, "job agreement: out of memory");
    /* Each rank's length and digest (as two 32-bit halves, exact in fp64). */
    size_t len = text ? strlen(text) : 0;
    if (s == ZT_OK) {
        uint64_t h = fnv1a64(text, len);
        for (int r = 0; r < world; r++) {
            offsets[r] = (size_t)r * 3;
            counts[r] = 3;
        }
        all[me * 3] = (double)len;
        all[me * 3 + 1] = (double)(h >> 32);
        all[me * 3 + 2] = (double)(h & 0xffffffffu);
        s = zt_comm_all_gather(comm, all, (size_t)world * 3, offsets, counts, ZT_F64);
    }
    int other = -1, differing = 0;
    for (int r = 1; s == ZT_OK && r < world; r++) {
        if (memcmp(all + r * 3, all, 3 * sizeof *all) != 0) {
            differing++;
            if (other < 0)
                other = r;
        }
    }
    char *zero = NULL, *theirs = NULL;
    if (s == ZT_OK && other > 0) {
        s = share_text(comm, 0, text, (size_t)all[0], &zero);
        if (s == ZT_OK)
            s = share_text(comm, other, text, (size_t)all[other * 3], &theirs);
        char key[512] = "", v0[256] = "", v1[256] = "";
        if (s == ZT_OK && zt_job_spec_agreement_diff(zero, theirs, key, sizeof key, v0,
                                                     sizeof v0, v1, sizeof v1)) {
            char more[64] = "";
            if (differing > 1)
                snprintf(more, sizeof more, " (and %d more rank(s) differ)", differing - 1);
            s = zt_error(ZT_ERR_INVALID,
                         "the ranks were started with different jobs: rank %d's differs from "
                         "rank 0's at %s (rank 0: %s, rank %d: %s)%s; give every node the same "
                         "job file",
                         other, key, v0, other, v1, more);
        } else if (s == ZT_OK) {
            s = zt_error(ZT_ERR_INVALID,
                         "the ranks were started with different jobs: rank %d's digest differs "
                         "from rank 0's; give every node the same job file",
                         other);
        }
    }
    free(zero);
    free(theirs);
    free(text);
    free(all);
    free(offsets);
    free(counts);
    return s;
}
