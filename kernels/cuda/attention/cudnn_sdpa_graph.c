/* The forward and backward graphs of causal attention in cuDNN's backend API
 * (cudnn_sdpa_graph.h). Intermediates are virtual fp32 tensors; the probabilities and score
 * gradients that feed a matmul are cast to the activations' type first, as cuDNN's fused
 * attention engines require of a second matmul's operand. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cudnn_sdpa_graph.h"

bool zt_cudnn_open(zt_cudnn_api *api, char *why, size_t why_size) {
    memset(api, 0, sizeof *api);
    api->lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        snprintf(why, why_size, "libcudnn.so.9 not loaded: %s", dlerror());
        return false;
    }
    struct {
        void **fn;
        const char *name;
    } calls[] = {
        {(void **)&api->version, "cudnnGetVersion"},
        {(void **)&api->error_string, "cudnnGetErrorString"},
        {(void **)&api->create, "cudnnCreate"},
        {(void **)&api->destroy, "cudnnDestroy"},
        {(void **)&api->set_stream, "cudnnSetStream"},
        {(void **)&api->create_desc, "cudnnBackendCreateDescriptor"},
        {(void **)&api->destroy_desc, "cudnnBackendDestroyDescriptor"},
        {(void **)&api->finalize, "cudnnBackendFinalize"},
        {(void **)&api->set, "cudnnBackendSetAttribute"},
        {(void **)&api->get, "cudnnBackendGetAttribute"},
        {(void **)&api->execute, "cudnnBackendExecute"},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        *calls[i].fn = dlsym(api->lib, calls[i].name);
        if (!*calls[i].fn) {
            snprintf(why, why_size, "libcudnn.so.9 has no %s", calls[i].name);
            return false;
        }
    }
    return true;
}

/* ---- descriptors, recording the first failure ----------------------------------------------- */

static void fail(zt_sdpa_graph *g, cudnnStatus_t st, const char *what, int attr) {
    if (g->status != CUDNN_STATUS_SUCCESS)
        return;
    g->status = st;
    snprintf(g->why, sizeof g->why, "%s%s%d: %s", what, attr >= 0 ? ", attribute " : "",
             attr >= 0 ? attr : 0, g->api->error_string(st));
}

static cudnnBackendDescriptor_t make(zt_sdpa_graph *g, cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->status != CUDNN_STATUS_SUCCESS || g->n_desc == ZT_SDPA_MAX_DESCS)
        return NULL;
    cudnnStatus_t st = g->api->create_desc(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(g, st, "cudnnBackendCreateDescriptor", (int)type);
        return NULL;
    }
    g->desc[g->n_desc++] = d;
    return d;
}

static void set(zt_sdpa_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value) {
    if (g->status != CUDNN_STATUS_SUCCESS)
        return;
    cudnnStatus_t st = g->api->set(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS)
        fail(g, st, "cudnnBackendSetAttribute", (int)name);
}

static void finish(zt_sdpa_graph *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS)
        return;
    cudnnStatus_t st = g->api->finalize(d);
    if (st != CUDNN_STATUS_SUCCESS)
        fail(g, st, what, -1);
}

static void add_op(zt_sdpa_graph *g, cudnnBackendDescriptor_t op, const char *what) {
    finish(g, op, what);
    if (g->status == CUDNN_STATUS_SUCCESS && g->n_op < ZT_SDPA_MAX_OPS)
        g->op[g->n_op++] = op;
}

/* ---- tensors --------------------------------------------------------------------------------- */

static cudnnBackendDescriptor_t tensor(zt_sdpa_graph *g, int64_t uid, cudnnDataType_t type,
                                       const int64_t dim[4], const int64_t stride[4],
                                       bool is_virtual, bool by_value) {
    cudnnBackendDescriptor_t d = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
    set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value)
        set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finish(g, d, "tensor descriptor");
    return d;
}

static cudnnBackendDescriptor_t real(zt_sdpa_graph *g, int64_t uid, cudnnDataType_t type,
                                     zt_sdpa_tensor t) {
    return tensor(g, uid, type, t.dim, t.stride, false, false);
}

/* A virtual (B, H, rows, cols) intermediate, contiguous. */
static cudnnBackendDescriptor_t virt(zt_sdpa_graph *g, cudnnDataType_t type, int64_t B, int64_t H,
                                     int64_t rows, int64_t cols) {
    const int64_t dim[4] = {B, H, rows, cols}, stride[4] = {H * rows * cols, rows * cols, cols, 1};
    return tensor(g, g->next_uid++, type, dim, stride, true, false);
}

/* A (B, H, cols, rows) virtual view of a contiguous (B, H, rows, cols) one. */
static cudnnBackendDescriptor_t virt_t(zt_sdpa_graph *g, cudnnDataType_t type, int64_t B,
                                       int64_t H, int64_t rows, int64_t cols) {
    const int64_t dim[4] = {B, H, cols, rows}, stride[4] = {H * rows * cols, rows * cols, 1, cols};
    return tensor(g, g->next_uid++, type, dim, stride, true, false);
}

static cudnnBackendDescriptor_t scalar(zt_sdpa_graph *g, int64_t uid) {
    const int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, uid, CUDNN_DATA_FLOAT, one, one, false, true);
}

/* ---- operations ------------------------------------------------------------------------------ */

/* y = mode(x, b) (b NULL for one operand); t is BINARY_SELECT's predicate; axis >= 0 for
 * GEN_INDEX. */
static void pointwise(zt_sdpa_graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                      cudnnBackendDescriptor_t y, int64_t axis) {
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0)
        set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finish(g, pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
        &pw);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_op(g, op, "pointwise operation");
}

static void matmul(zt_sdpa_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finish(g, mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    add_op(g, op, "matmul operation");
}

static void reduction(zt_sdpa_graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finish(g, r, "reduction descriptor");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    add_op(g, op, "reduction operation");
}

static void reshape(zt_sdpa_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_op(g, op, "reshape operation");
}

/* ---- the graphs ------------------------------------------------------------------------------ */

/* s·Q·Kᵀ with the causal mask (key j ≤ query i kept, −∞ elsewhere): the scores both graphs
 * start from, [B, H, T, T] fp32. */
static cudnnBackendDescriptor_t masked_scores(zt_sdpa_graph *g, const zt_attn_shape *s,
                                              cudnnDataType_t io) {
    const int64_t B = s->B, H = s->n_head, T = s->T;
    cudnnBackendDescriptor_t q = real(g, ZT_SDPA_UID_Q, io, zt_sdpa_layout(s, ZT_SDPA_Q));
    cudnnBackendDescriptor_t kt = real(g, ZT_SDPA_UID_K, io, zt_sdpa_layout(s, ZT_SDPA_KT));
    cudnnBackendDescriptor_t scale = scalar(g, ZT_SDPA_UID_SCALE);
    cudnnBackendDescriptor_t neg_inf = scalar(g, ZT_SDPA_UID_NEG_INF);
    cudnnBackendDescriptor_t sc = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t scaled = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t row = virt(g, CUDNN_DATA_INT32, B, H, T, T);
    cudnnBackendDescriptor_t col = virt(g, CUDNN_DATA_INT32, B, H, T, T);
    cudnnBackendDescriptor_t keep = virt(g, CUDNN_DATA_BOOLEAN, B, H, T, T);
    cudnnBackendDescriptor_t masked = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    matmul(g, q, kt, sc);
    pointwise(g, CUDNN_POINTWISE_MUL, sc, scale, NULL, scaled, -1);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, scaled, NULL, NULL, row, 2);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, scaled, NULL, NULL, col, 3);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, -1);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, scaled, neg_inf, keep, masked, -1);
    return masked;
}

static void forward(zt_sdpa_graph *g, const zt_attn_shape *s, cudnnDataType_t io) {
    const int64_t B = s->B, H = s->n_head, T = s->T;
    cudnnBackendDescriptor_t masked = masked_scores(g, s, io);
    cudnnBackendDescriptor_t v = real(g, ZT_SDPA_UID_V, io, zt_sdpa_layout(s, ZT_SDPA_V));
    cudnnBackendDescriptor_t o = real(g, ZT_SDPA_UID_O, io, zt_sdpa_layout(s, ZT_SDPA_O));
    cudnnBackendDescriptor_t stats =
        real(g, ZT_SDPA_UID_STATS, CUDNN_DATA_FLOAT, zt_sdpa_layout(s, ZT_SDPA_STATS));
    cudnnBackendDescriptor_t mx = virt(g, CUDNN_DATA_FLOAT, B, H, T, 1);
    cudnnBackendDescriptor_t shifted = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t e = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t z = virt(g, CUDNN_DATA_FLOAT, B, H, T, 1);
    cudnnBackendDescriptor_t logz = virt(g, CUDNN_DATA_FLOAT, B, H, T, 1);
    cudnnBackendDescriptor_t p = virt(g, io, B, H, T, T);
    reduction(g, CUDNN_REDUCE_TENSOR_MAX, masked, mx);
    pointwise(g, CUDNN_POINTWISE_SUB, masked, mx, NULL, shifted, -1);
    pointwise(g, CUDNN_POINTWISE_EXP, shifted, NULL, NULL, e, -1);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    pointwise(g, CUDNN_POINTWISE_LOG, z, NULL, NULL, logz, -1);
    pointwise(g, CUDNN_POINTWISE_ADD, mx, logz, NULL, stats, -1);
    pointwise(g, CUDNN_POINTWISE_DIV, e, z, NULL, p, -1);
    matmul(g, p, v, o);
}

/* The product a·b into the real gradient out of a K or V (dK = dSᵀ·Q, dV = Pᵀ·dO). With grouped
 * query heads the product has a query head's rows per head, and the kv head's gradient is the sum
 * over its group: the product goes to a virtual full-head tensor in the activations' type
 * ([B, n_head, T, head_dim]) and an ADD reduction folds each group of n_head / n_kv_head
 * consecutive heads into the kv head's [B, n_kv_head, T, head_dim], as cudnn-frontend's
 * composite node does it (red_dK_head, red_dV_head). */
static void kv_grad(zt_sdpa_graph *g, const zt_attn_shape *s, cudnnDataType_t io,
                    cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                    cudnnBackendDescriptor_t out) {
    if (s->n_head == s->n_kv_head) {
        matmul(g, a, b, out);
        return;
    }
    cudnnBackendDescriptor_t full = virt(g, io, s->B, s->n_head, s->T, s->head_dim);
    matmul(g, a, b, full);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

/* dV = Pᵀ·dO, dS = P ⊙ (dO·Vᵀ − D)·s, dK = dSᵀ·Q, dQ = dS·K, with P = exp(S − Stats) and
 * D = Σ dO ⊙ O (written to the D tensor, which the caller provides); dK and dV summed over each
 * kv head's group of query heads (kv_grad). */
static void backward(zt_sdpa_graph *g, const zt_attn_shape *s, cudnnDataType_t io) {
    const int64_t B = s->B, H = s->n_head, T = s->T, hd = s->head_dim;
    zt_sdpa_tensor lq = zt_sdpa_layout(s, ZT_SDPA_Q), lk = zt_sdpa_layout(s, ZT_SDPA_K);
    zt_sdpa_tensor lv = zt_sdpa_layout(s, ZT_SDPA_V), lo = zt_sdpa_layout(s, ZT_SDPA_O);
    /* Vᵀ: V's last two dims and strides swapped, as Kᵀ */
    zt_sdpa_tensor lvt = lv;
    lvt.dim[2] = lv.dim[3], lvt.dim[3] = lv.dim[2];
    lvt.stride[2] = lv.stride[3], lvt.stride[3] = lv.stride[2];
    cudnnBackendDescriptor_t o = real(g, ZT_SDPA_UID_O, io, lo);
    cudnnBackendDescriptor_t dout = real(g, ZT_SDPA_UID_DO, io, lo);
    cudnnBackendDescriptor_t stats =
        real(g, ZT_SDPA_UID_STATS, CUDNN_DATA_FLOAT, zt_sdpa_layout(s, ZT_SDPA_STATS));
    cudnnBackendDescriptor_t dsum =
        real(g, ZT_SDPA_UID_DSUM, CUDNN_DATA_FLOAT, zt_sdpa_layout(s, ZT_SDPA_STATS));
    cudnnBackendDescriptor_t vt = real(g, ZT_SDPA_UID_V, io, lvt);
    cudnnBackendDescriptor_t q_rows = real(g, ZT_SDPA_UID_Q_ROWS, io, lq);
    cudnnBackendDescriptor_t k_rows = real(g, ZT_SDPA_UID_K_ROWS, io, lk);
    cudnnBackendDescriptor_t dq = real(g, ZT_SDPA_UID_DQ, io, lq);
    cudnnBackendDescriptor_t dk = real(g, ZT_SDPA_UID_DK, io, lk);
    cudnnBackendDescriptor_t dv = real(g, ZT_SDPA_UID_DV, io, lv);
    cudnnBackendDescriptor_t scale = scalar(g, ZT_SDPA_UID_SCALE);

    cudnnBackendDescriptor_t prod = virt(g, CUDNN_DATA_FLOAT, B, H, T, hd);
    pointwise(g, CUDNN_POINTWISE_MUL, dout, o, NULL, prod, -1);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, prod, dsum);

    cudnnBackendDescriptor_t masked = masked_scores(g, s, io);
    cudnnBackendDescriptor_t shifted = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t p = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t p16 = virt(g, io, B, H, T, T);
    cudnnBackendDescriptor_t pt = virt_t(g, io, B, H, T, T);
    pointwise(g, CUDNN_POINTWISE_SUB, masked, stats, NULL, shifted, -1);
    pointwise(g, CUDNN_POINTWISE_EXP, shifted, NULL, NULL, p, -1);
    pointwise(g, CUDNN_POINTWISE_IDENTITY, p, NULL, NULL, p16, -1);
    reshape(g, p16, pt);
    kv_grad(g, s, io, pt, dout, dv);

    cudnnBackendDescriptor_t dp = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t dpc = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t ds0 = virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
    cudnnBackendDescriptor_t ds = virt(g, io, B, H, T, T);
    cudnnBackendDescriptor_t dst = virt_t(g, io, B, H, T, T);
    matmul(g, dout, vt, dp);
    pointwise(g, CUDNN_POINTWISE_SUB, dp, dsum, NULL, dpc, -1);
    pointwise(g, CUDNN_POINTWISE_MUL, p, dpc, NULL, ds0, -1);
    pointwise(g, CUDNN_POINTWISE_MUL, ds0, scale, NULL, ds, -1);
    reshape(g, ds, dst);
    kv_grad(g, s, io, dst, q_rows, dk);
    matmul(g, ds, k_rows, dq);
}

cudnnStatus_t zt_sdpa_graph_build(zt_sdpa_graph *g, const zt_cudnn_api *api, cudnnHandle_t handle,
                                  const zt_attn_shape *s, zt_dtype act, bool backward_graph) {
    memset(g, 0, sizeof *g);
    g->api = api;
    g->next_uid = 100;
    const cudnnDataType_t io = act == ZT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    if (backward_graph)
        backward(g, s, io);
    else
        forward(g, s, io);
    cudnnBackendDescriptor_t graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_op, g->op);
    if (handle)
        set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    finish(g, graph, "operation graph");
    g->graph = graph;
    return g->status;
}

void zt_sdpa_graph_free(zt_sdpa_graph *g) {
    while (g->n_desc > 0)
        g->api->destroy_desc(g->desc[--g->n_desc]);
    g->n_op = 0;
    g->graph = NULL;
}
