/* The release marks of the CUDA backend's VMM: an event recorded on the compute stream by one
 * release and shared by every granule it let go of, counted by the granules whose last release
 * it is, and taken again for a later release once none is (so a training step records as few
 * events as it has releases, and the table stops growing after the first steps). */
#include "vmm_internal.h"

int zt_vmm_mark_take(zt_backend *be, struct zt_cuda_vmm *v) {
    if (v->n_free_marks)
        return v->free_marks[--v->n_free_marks];
    if (!zt_vmm_grow_pair((void **)&v->marks, sizeof *v->marks, &v->free_marks, v->n_marks,
                          &v->cap_marks, 16))
        return -1;
    zt_vmm_mark *m = &v->marks[v->n_marks];
    *m = (zt_vmm_mark){0};
    if (cudaEventCreateWithFlags(&m->ev, cudaEventDisableTiming) != cudaSuccess) {
        ZT_CUDA_LAUNCHED(be);
        return -1;
    }
    return (int)v->n_marks++;
}

void zt_vmm_mark_set(struct zt_cuda_vmm *v, zt_vmm_granule *g, int m) {
    if (g->released >= 0 && --v->marks[g->released].refs == 0)
        v->free_marks[v->n_free_marks++] = g->released;
    g->released = m;
    if (m >= 0)
        v->marks[m].refs++;
}

void zt_vmm_marks_free(struct zt_cuda_vmm *v) {
    for (size_t i = 0; i < v->n_marks; i++)
        cudaEventDestroy(v->marks[i].ev);
    free(v->marks);
    free(v->free_marks);
    v->marks = NULL;
    v->free_marks = NULL;
    v->n_marks = v->cap_marks = v->n_free_marks = 0;
}
