/* ZTRAIN_CUDA_VMM=check, for tests: a release waits for the work before it and unmaps the
 * granules it lets go of, so that any device work touching them before a commit is a fault
 * naming the granule (on the emulated device) instead of a read or write of memory that
 * another range may hold by then. The normal mode leaves them mapped and waits for nothing. */
#include "vmm_internal.h"

void zt_vmm_check_unmap(zt_backend *be, struct zt_cuda_vmm *v, zt_vmm_range *r, size_t k0,
                        size_t k1, int m) {
    unsigned long long t0 = zt_cuda_wait_begin(be);
    zt_status waited = zt_cuda_watched_event_wait(be, v->marks[m].ev);
    zt_cuda_wait_end(t0);
    if (waited != ZT_OK)
        return;
    for (size_t k = k0; k < k1; k++) {
        zt_vmm_granule *g = &r->g[k];
        if (g->live || g->released != m || g->handle < 0)
            continue;
        if (!zt_vmm_drv(be, v->unmap((CUdeviceptr)(r->base + k * v->granule), v->granule),
                        "cuMemUnmap"))
            return;
        v->handles[g->handle].mappings--;
        g->handle = -1;
    }
}
