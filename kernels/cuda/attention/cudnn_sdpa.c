/* cuDNN's fused attention for the CUDA backend (cudnn_sdpa.h): plans built once per shape and
 * kept with their graphs and workspace, executed with a variant pack per call. Plan building
 * is slow (runtime-compiled engines), so it happens on a shape's first call, which is the first
 * step; the step loop afterwards only executes. One cuDNN handle serves the process, made on the
 * device current at the first call (a rank drives one GPU). Nothing here has run on a GPU yet:
 * scripts/gpu-check.sh's ops phase is its first test against the CPU and the flash kernel. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda_backend.h"
#include "cudnn_sdpa.h"
#include "cudnn_sdpa_graph.h"

enum { MAX_PLANS = 16 };

typedef struct {
    bool used, ok, backward;
    zt_attn_shape s;
    zt_dtype act;
    zt_sdpa_graph graph;
    cudnnBackendDescriptor_t plan;
    void *workspace;
    size_t workspace_bytes;
    char why[256]; /* when !ok: why this shape runs the flash kernel */
} plan_entry;

static struct {
    pthread_mutex_t lock;
    bool tried, usable;
    char why[256];
    zt_cudnn_api api;
    cudnnHandle_t handle;
    int sm;
    plan_entry plans[MAX_PLANS];
} C = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Opens the library and makes the handle, once; false with C.why when cuDNN cannot be used. */
static bool ready(void) {
    if (C.tried)
        return C.usable;
    C.tried = true;
    if (!zt_cudnn_open(&C.api, C.why, sizeof C.why))
        return false;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        snprintf(C.why, sizeof C.why, "the device's compute capability is unknown");
        return false;
    }
    C.sm = major * 10 + minor;
    cudnnStatus_t st = C.api.create(&C.handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(C.why, sizeof C.why, "cudnnCreate: %s", C.api.error_string(st));
        return false;
    }
    C.usable = true;
    return true;
}

static bool same_shape(const zt_attn_shape *a, const zt_attn_shape *b) {
    return a->B == b->B && a->T == b->T && a->n_head == b->n_head &&
           a->n_kv_head == b->n_kv_head && a->head_dim == b->head_dim && a->packed == b->packed;
}

/* The first engine configuration of heuristics mode A whose plan finalizes. */
static bool build_plan(plan_entry *e) {
    const zt_cudnn_api *api = &C.api;
    cudnnStatus_t st = zt_sdpa_graph_build(&e->graph, api, C.handle, &e->s, e->act, e->backward);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(e->why, sizeof e->why, "cuDNN refused the graph: %.200s", e->graph.why);
        return false;
    }
    cudnnBackendDescriptor_t heur = NULL;
    if (api->create_desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) != CUDNN_STATUS_SUCCESS) {
        snprintf(e->why, sizeof e->why, "cuDNN: no heuristics descriptor");
        return false;
    }
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    int64_t n = 0;
    bool found = false;
    if (api->set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &e->graph.graph) == CUDNN_STATUS_SUCCESS &&
        api->set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) ==
            CUDNN_STATUS_SUCCESS &&
        api->finalize(heur) == CUDNN_STATUS_SUCCESS &&
        api->get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                 NULL) == CUDNN_STATUS_SUCCESS &&
        n > 0) {
        cudnnBackendDescriptor_t cfg[32];
        int64_t made = 0, got = 0;
        n = n > 32 ? 32 : n;
        while (made < n &&
               api->create_desc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]) ==
                   CUDNN_STATUS_SUCCESS)
            made++;
        if (api->get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, made,
                     &got, cfg) == CUDNN_STATUS_SUCCESS) {
            for (int64_t i = 0; i < got && !found; i++) {
                cudnnBackendDescriptor_t plan = NULL;
                if (api->create_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
                    CUDNN_STATUS_SUCCESS)
                    break;
                int64_t ws = 0, cnt = 0;
                if (api->set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                             &C.handle) == CUDNN_STATUS_SUCCESS &&
                    api->set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]) == CUDNN_STATUS_SUCCESS &&
                    api->finalize(plan) == CUDNN_STATUS_SUCCESS &&
                    api->get(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                             &cnt, &ws) == CUDNN_STATUS_SUCCESS) {
                    e->plan = plan, e->workspace_bytes = (size_t)ws, found = true;
                } else {
                    api->destroy_desc(plan);
                }
            }
        }
        /* The plan keeps what it needs of its configuration. */
        for (int64_t i = 0; i < made; i++)
            api->destroy_desc(cfg[i]);
    }
    api->destroy_desc(heur);
    if (!found) {
        snprintf(e->why, sizeof e->why, "cuDNN %zu has no engine for this %s graph",
                 api->version(), e->backward ? "backward" : "forward");
        return false;
    }
    if (e->workspace_bytes && cudaMalloc(&e->workspace, e->workspace_bytes) != cudaSuccess) {
        cudaGetLastError();
        snprintf(e->why, sizeof e->why, "no %zu bytes of device memory for cuDNN's workspace",
                 e->workspace_bytes);
        return false;
    }
    return true;
}

/* The plan of a shape and direction, built on its first call; NULL with *why when cuDNN does not
 * take it. Caller holds C.lock. */
static plan_entry *plan_for(const zt_ctx *x, const zt_attn_shape *s, bool backward,
                            const char **why) {
    if (!ready()) {
        *why = C.why;
        return NULL;
    }
    const char *no = zt_sdpa_unsupported(s, x->act, C.sm);
    if (no) {
        *why = no;
        return NULL;
    }
    plan_entry *free_slot = NULL;
    for (int i = 0; i < MAX_PLANS; i++) {
        plan_entry *e = &C.plans[i];
        if (!e->used) {
            free_slot = free_slot ? free_slot : e;
            continue;
        }
        if (e->backward == backward && e->act == x->act && same_shape(&e->s, s)) {
            *why = e->ok ? "cuDNN's fused attention" : e->why;
            return e->ok ? e : NULL;
        }
    }
    if (!free_slot) {
        *why = "more attention shapes than cuDNN plans are kept for";
        return NULL;
    }
    plan_entry *e = free_slot;
    *e = (plan_entry){.used = true, .backward = backward, .s = *s, .act = x->act};
    e->ok = build_plan(e);
    if (e->ok)
        zt_cuda_count(zt_cuda_of(x), (long long)e->workspace_bytes);
    *why = e->ok ? "cuDNN's fused attention" : e->why;
    return e->ok ? e : NULL;
}

/* Runs e's plan with the tensors keyed by uid[i] at ptr[i]; failures are recorded for sync. */
static void run(const zt_ctx *x, plan_entry *e, const int64_t *uid, void **ptr, int n) {
    const zt_cudnn_api *api = &C.api;
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st = api->create_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uid);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptr);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                      &e->workspace);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->finalize(pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->set_stream(C.handle, zt_cuda_stream(x));
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->execute(C.handle, e->plan, pack);
    if (st != CUDNN_STATUS_SUCCESS)
        zt_cuda_fail(x->be, "cuDNN", e->backward ? "attention backward" : "attention forward",
                     api->error_string(st), __FILE__, __LINE__);
    if (pack)
        api->destroy_desc(pack);
}

/* Where q, k and v start, in bytes: packed ones inside q's rows (zt_sdpa_layout's offsets). */
static void *at(const zt_attn_shape *s, zt_sdpa_tensor_kind kind, const void *p, size_t es) {
    return (char *)p + (size_t)zt_sdpa_layout(s, kind).offset * es;
}

bool zt_cudnn_sdpa_forward(const zt_ctx *x, const zt_attn_shape *s, void *out, float *stats,
                           const void *q, const void *k, const void *v, const char **why) {
    pthread_mutex_lock(&C.lock);
    plan_entry *e = plan_for(x, s, false, why);
    if (e) {
        const size_t es = zt_dtype_size(x->act);
        float scale = 1.0f / sqrtf((float)s->head_dim), neg_inf = -INFINITY;
        const void *kb = s->packed ? q : k, *vb = s->packed ? q : v;
        int64_t uid[] = {ZT_SDPA_UID_Q, ZT_SDPA_UID_K, ZT_SDPA_UID_V, ZT_SDPA_UID_SCALE,
                         ZT_SDPA_UID_NEG_INF, ZT_SDPA_UID_O, ZT_SDPA_UID_STATS};
        void *ptr[] = {(void *)q, at(s, ZT_SDPA_KT, kb, es), at(s, ZT_SDPA_V, vb, es), &scale,
                       &neg_inf, out, stats};
        run(x, e, uid, ptr, 7);
    }
    pthread_mutex_unlock(&C.lock);
    return e != NULL;
}

bool zt_cudnn_sdpa_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk, void *dv,
                            float *scratch, const void *dout, const void *out, const void *q,
                            const void *k, const void *v, const float *stats, const char **why) {
    pthread_mutex_lock(&C.lock);
    plan_entry *e = plan_for(x, s, true, why);
    if (e) {
        const size_t es = zt_dtype_size(x->act);
        float scale = 1.0f / sqrtf((float)s->head_dim), neg_inf = -INFINITY;
        const void *kb = s->packed ? q : k, *vb = s->packed ? q : v;
        void *dkb = s->packed ? dq : dk, *dvb = s->packed ? dq : dv;
        void *kp = at(s, ZT_SDPA_K, kb, es);
        int64_t uid[] = {ZT_SDPA_UID_Q, ZT_SDPA_UID_Q_ROWS, ZT_SDPA_UID_K, ZT_SDPA_UID_K_ROWS,
                         ZT_SDPA_UID_V, ZT_SDPA_UID_O, ZT_SDPA_UID_DO, ZT_SDPA_UID_STATS,
                         ZT_SDPA_UID_DSUM, ZT_SDPA_UID_SCALE, ZT_SDPA_UID_NEG_INF,
                         ZT_SDPA_UID_DQ, ZT_SDPA_UID_DK, ZT_SDPA_UID_DV};
        void *ptr[] = {(void *)q, (void *)q, kp, kp, at(s, ZT_SDPA_V, vb, es), (void *)out,
                       (void *)dout, (void *)stats, scratch, &scale, &neg_inf, dq,
                       at(s, ZT_SDPA_K, dkb, es), at(s, ZT_SDPA_V, dvb, es)};
        run(x, e, uid, ptr, 14);
    }
    pthread_mutex_unlock(&C.lock);
    return e != NULL;
}
