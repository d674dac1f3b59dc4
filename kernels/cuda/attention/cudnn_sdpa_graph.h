/* cuDNN's fused attention as backend-API graphs (cuDNN 9, the C "graph API"): the library opened
 * with dlopen, so that the CUDA module loads on a machine without libcudnn, and the forward and
 * backward operation graphs of causal scaled-dot-product attention built the way cudnn-frontend's
 * composite SDPA node builds them (reference: /work/shared/reference/cudnn_sdpa.md §4–§5).
 * Building a graph needs no GPU: tests/unit/test_cudnn_sdpa_graph.c finalizes them on any machine
 * with the library. Plans and execution, which need the GPU, are cudnn_sdpa.c's. */
#ifndef ZTRAIN_CUDNN_SDPA_GRAPH_H
#define ZTRAIN_CUDNN_SDPA_GRAPH_H

#include <cudnn_graph.h>
#include <stdbool.h>

#include "cudnn_sdpa_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The calls used, from libcudnn.so.9. */
typedef struct {
    void *lib;
    size_t (*version)(void);
    const char *(*error_string)(cudnnStatus_t);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*destroy)(cudnnHandle_t);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*set)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                         cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*get)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                         cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} zt_cudnn_api;

/* Opens libcudnn.so.9 and resolves every call; false with why[] saying what is missing. The
 * library stays open for the process. */
bool zt_cudnn_open(zt_cudnn_api *api, char *why, size_t why_size);

/* The variant-pack keys of the graphs' real tensors. */
enum {
    ZT_SDPA_UID_Q = 1, ZT_SDPA_UID_K, ZT_SDPA_UID_V, ZT_SDPA_UID_SCALE, ZT_SDPA_UID_O,
    ZT_SDPA_UID_STATS, ZT_SDPA_UID_DO, ZT_SDPA_UID_DQ, ZT_SDPA_UID_DK, ZT_SDPA_UID_DV,
    ZT_SDPA_UID_NEG_INF, ZT_SDPA_UID_DSUM, ZT_SDPA_UID_K_ROWS, ZT_SDPA_UID_Q_ROWS
};

enum { ZT_SDPA_MAX_DESCS = 128, ZT_SDPA_MAX_OPS = 32 };

/* One operation graph and every descriptor made for it, destroyed together. */
typedef struct {
    const zt_cudnn_api *api;
    cudnnBackendDescriptor_t desc[ZT_SDPA_MAX_DESCS];
    int n_desc;
    cudnnBackendDescriptor_t op[ZT_SDPA_MAX_OPS];
    int n_op;
    cudnnBackendDescriptor_t graph; /* the finalized operation graph */
    int64_t next_uid;               /* virtual tensors' keys */
    cudnnStatus_t status;           /* the first failure, with what failed in why */
    char why[256];
} zt_sdpa_graph;

/* Builds and finalizes the forward (O and Stats from Q, K, V) or backward (dQ, dK, dV from Q, K,
 * V, O, dO, Stats and the row sums D) graph of shape s at act (bf16 or fp16; the shape one that
 * zt_sdpa_unsupported accepts; with grouped-query heads the backward sums dK and dV over each kv
 * head's group with two more operations). handle may be NULL where
 * there is no GPU (the graph then finalizes without one). Returns the status, with g->why naming
 * the descriptor and attribute that failed; zt_sdpa_graph_free either way. */
cudnnStatus_t zt_sdpa_graph_build(zt_sdpa_graph *g, const zt_cudnn_api *api, cudnnHandle_t handle,
                                  const zt_attn_shape *s, zt_dtype act, bool backward);
void zt_sdpa_graph_free(zt_sdpa_graph *g);

#ifdef __cplusplus
}
#endif

#endif
