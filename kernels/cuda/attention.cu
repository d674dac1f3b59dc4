/* Causal self-attention on the GPU, the straightforward way: one block per (query row, head,
 * batch) computes its scores against the keys it sees, the softmax and its output row, keeping
 * the probabilities in att as the CPU does (kernels/cpu/attention.c); the backward is one block
 * per query row for the score gradients and dq, and one per (key row, kv head, batch) for dk and
 * dv, which sums over the query heads of its group and the query rows that see the key, in a
 * fixed order and without atomics. Every shape of zt_attn_shape: packed or separate q/k/v,
 * grouped-query heads, any head_dim, a sliding window. Arithmetic is fp32.
 *
 * This is the version to check the others against: it reads K and V once per query row, where
 * batched GEMMs or a fused flash-style kernel reuse them across rows, and is the first thing to
 * replace when the GPU checks can measure it. */
#include "cuda_common.cuh"

/* Where the heads live, in elements: row strides of q, k/v and out, and offsets of k and v
 * inside a packed q|k|v row. */
struct geom {
    int B, T, NH, KVH, hd, group, window;
    size_t sq, skv, so;
    float scale;
    const int32_t *doc_pos; /* zt_attn_shape.doc_pos (device memory), or NULL */
};

static geom geom_of(const zt_attn_shape *s) {
    ZT_ASSERT(s->n_kv_head > 0 && s->n_head % s->n_kv_head == 0 && s->window >= 0);
    geom g;
    g.B = s->B, g.T = s->T, g.NH = s->n_head, g.KVH = s->n_kv_head, g.hd = s->head_dim;
    g.group = s->n_head / s->n_kv_head, g.window = s->window, g.doc_pos = s->doc_pos;
    size_t qw = (size_t)s->n_head * s->head_dim, kvw = (size_t)s->n_kv_head * s->head_dim;
    g.sq = s->packed ? qw + 2 * kvw : qw;
    g.skv = s->packed ? g.sq : kvw;
    g.so = qw;
    g.scale = 1.0f / sqrtf((float)s->head_dim);
    return g;
}

/* The first key query t of row b sees: the window's, or its document's first token if later
 * (zt_attn_shape.doc_pos); every key from there to t is visible. */
__device__ __forceinline__ int first_key(const geom &g, int b, int t) {
    int lo = g.window ? max(0, t - g.window + 1) : 0;
    return g.doc_pos ? max(lo, t - g.doc_pos[(size_t)b * g.T + t]) : lo;
}

/* grid (T, NH, B); dynamic shared memory: head_dim floats (the query row). */
template <typename T>
__global__ void attn_fwd(geom g, T *out, float *att, const T *q, const T *k, const T *v) {
    ZT_DYN_SHARED(float, qrow);
    __shared__ float red[32];
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const T *qh = q + ((size_t)b * g.T + t) * g.sq + (size_t)h * g.hd;
    const size_t kv0 = (size_t)b * g.T * g.skv + (size_t)(h / g.group) * g.hd;
    float *a = att + (((size_t)b * g.NH + h) * g.T + t) * g.T;
    for (int d = threadIdx.x; d < g.hd; d += blockDim.x)
        qrow[d] = zt_ld(qh, d);
    __syncthreads();
    const int lo = first_key(g, b, t);
    float mx = -INFINITY;
    for (int s = lo + threadIdx.x; s <= t; s += blockDim.x) {
        const T *ks = k + kv0 + (size_t)s * g.skv;
        float dot = 0.0f;
        for (int d = 0; d < g.hd; d++)
            dot += qrow[d] * zt_ld(ks, d);
        dot *= g.scale;
        a[s] = dot;
        mx = fmaxf(mx, dot);
    }
    mx = zt_block_max(mx, red);
    float sum = 0.0f;
    for (int s = lo + threadIdx.x; s <= t; s += blockDim.x) {
        float e = expf(a[s] - mx);
        a[s] = e;
        sum += e;
    }
    float inv = 1.0f / zt_block_sum(sum, red);
    for (int s = threadIdx.x; s < g.T; s += blockDim.x)
        a[s] = s >= lo && s <= t ? a[s] * inv : 0.0f;
    __syncthreads();
    T *o = out + ((size_t)b * g.T + t) * g.so + (size_t)h * g.hd;
    for (int d = threadIdx.x; d < g.hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = lo; s <= t; s++)
            acc += a[s] * zt_ld(v + kv0 + (size_t)s * g.skv, d);
        zt_st(o, d, acc);
    }
}

/* grid (T, NH, B): dscores of query row t into scratch (zero where masked), then dq of the row.
 * Dynamic shared memory: head_dim floats (the row of dout). */
template <typename T>
__global__ void attn_bwd_q(geom g, T *dq, float *scratch, const T *dout, const T *k, const T *v,
                           const float *att) {
    ZT_DYN_SHARED(float, drow);
    __shared__ float red[32];
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const T *d = dout + ((size_t)b * g.T + t) * g.so + (size_t)h * g.hd;
    const size_t kv0 = (size_t)b * g.T * g.skv + (size_t)(h / g.group) * g.hd;
    const size_t at = (((size_t)b * g.NH + h) * g.T + t) * g.T;
    const float *p = att + at;
    float *dp = scratch + at;
    for (int i = threadIdx.x; i < g.hd; i += blockDim.x)
        drow[i] = zt_ld(d, i);
    __syncthreads();
    const int lo = first_key(g, b, t);
    /* dprobs = dout·vᵀ, then through the softmax: dscores = p ⊙ (dp - Σ p·dp) · scale */
    float dot = 0.0f;
    for (int s = lo + threadIdx.x; s <= t; s += blockDim.x) {
        const T *vs = v + kv0 + (size_t)s * g.skv;
        float acc = 0.0f;
        for (int i = 0; i < g.hd; i++)
            acc += drow[i] * zt_ld(vs, i);
        dp[s] = acc;
        dot += p[s] * acc;
    }
    dot = zt_block_sum(dot, red);
    for (int s = threadIdx.x; s < g.T; s += blockDim.x)
        dp[s] = s >= lo && s <= t ? p[s] * (dp[s] - dot) * g.scale : 0.0f;
    __syncthreads();
    T *dqh = dq + ((size_t)b * g.T + t) * g.sq + (size_t)h * g.hd;
    for (int i = threadIdx.x; i < g.hd; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = lo; s <= t; s++)
            acc += dp[s] * zt_ld(k + kv0 + (size_t)s * g.skv, i);
        zt_st(dqh, i, acc);
    }
}

/* grid (T, KVH, B): key row s of kv head kvh receives from the query rows t >= s that see it
 * (t < s + window with a window), over the query heads of its group:
 *   dv[s] = Σ p[t][s]·dout[t],  dk[s] = Σ dscores[t][s]·q[t]. */
template <typename T>
__global__ void attn_bwd_kv(geom g, T *dk, T *dv, const float *scratch, const T *dout, const T *q,
                            const float *att) {
    const int s = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int t1 = g.window ? min(g.T, s + g.window) : g.T;
    const size_t kv_at = ((size_t)b * g.T + s) * g.skv + (size_t)kvh * g.hd;
    for (int i = threadIdx.x; i < g.hd; i += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int j = 0; j < g.group; j++) {
            const int h = kvh * g.group + j;
            const size_t a0 = ((size_t)b * g.NH + h) * g.T * g.T;
            for (int t = s; t < t1; t++) {
                size_t row = (size_t)b * g.T + t;
                size_t at = a0 + (size_t)t * g.T + s;
                av += att[at] * zt_ld(dout + row * g.so + (size_t)h * g.hd, i);
                ak += scratch[at] * zt_ld(q + row * g.sq + (size_t)h * g.hd, i);
            }
        }
        zt_st(dk + kv_at, i, ak);
        zt_st(dv + kv_at, i, av);
    }
}

/* Threads of the attention blocks: the longest loop is over keys (up to T) or head dimensions. */
static unsigned attn_threads(const geom &g) {
    int longest = g.T > g.hd ? g.T : g.hd;
    return zt_cuda_row_threads(longest < 256 ? longest : 256);
}

extern "C" void zt_cuda_attention_forward(const zt_ctx *x, const zt_attn_shape *s, void *out,
                                          float *att, const void *q, const void *k,
                                          const void *v) {
    const geom g = geom_of(s);
    if (g.B == 0 || g.T == 0)
        return;
    dim3 grid(g.T, g.NH, g.B);
    size_t shm = (size_t)g.hd * sizeof(float);
    ZT_ACT_DISPATCH(x->act, {
        const ACT_T *qa = (const ACT_T *)q;
        const ACT_T *ka = s->packed ? qa + (size_t)g.NH * g.hd : (const ACT_T *)k;
        const ACT_T *va = s->packed ? qa + (size_t)(g.NH + g.KVH) * g.hd : (const ACT_T *)v;
        ZT_LAUNCH(attn_fwd<ACT_T>, grid, attn_threads(g), shm, zt_cuda_compute(x), g, (ACT_T *)out,
                  att, qa, ka, va);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

extern "C" void zt_cuda_attention_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq,
                                           void *dk, void *dv, float *scratch, const void *dout,
                                           const void *q, const void *k, const void *v,
                                           const float *att) {
    const geom g = geom_of(s);
    if (g.B == 0 || g.T == 0)
        return;
    size_t shm = (size_t)g.hd * sizeof(float);
    ZT_ACT_DISPATCH(x->act, {
        const ACT_T *qa = (const ACT_T *)q;
        const ACT_T *ka = s->packed ? qa + (size_t)g.NH * g.hd : (const ACT_T *)k;
        const ACT_T *va = s->packed ? qa + (size_t)(g.NH + g.KVH) * g.hd : (const ACT_T *)v;
        ACT_T *dqa = (ACT_T *)dq;
        ACT_T *dka = s->packed ? dqa + (size_t)g.NH * g.hd : (ACT_T *)dk;
        ACT_T *dva = s->packed ? dqa + (size_t)(g.NH + g.KVH) * g.hd : (ACT_T *)dv;
        ZT_LAUNCH(attn_bwd_q<ACT_T>, dim3(g.T, g.NH, g.B), attn_threads(g), shm, zt_cuda_compute(x),
                  g, dqa, scratch, (const ACT_T *)dout, ka, va, att);
        ZT_CUDA_LAUNCHED(x->be);
        ZT_LAUNCH(attn_bwd_kv<ACT_T>, dim3(g.T, g.KVH, g.B), zt_cuda_row_threads(g.hd), 0,
                  zt_cuda_compute(x), g, dka, dva, scratch, (const ACT_T *)dout, qa, att);
        ZT_CUDA_LAUNCHED(x->be);
    });
}
