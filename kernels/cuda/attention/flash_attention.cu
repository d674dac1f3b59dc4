/* Causal self-attention without a T×T matrix, flash-attention style (Dao et al., FlashAttention
 * and FlashAttention-2), written for ztrain: a block owns a tile of query rows of one head, walks
 * the key tiles those rows may see with the tiles of Q, K and V in shared memory, and keeps a
 * running maximum and sum per row (the online softmax) so that the output is finished in one
 * pass. Only the natural-log log-sum-exp of each row's scaled scores is kept for the backward,
 * [B, n_head, T] fp32, which is cuDNN's "Stats" tensor too, so either implementation's forward
 * feeds either's backward.
 *
 * The backward recomputes the probabilities from the log-sum-exp: one pass precomputes
 * D = rowsum(dO ∘ O); one grid owns query tiles and walks key tiles for dQ; one owns key tiles
 * of a kv head and walks the query rows of every query head of its group for dK and dV. Each
 * output element is summed by the one thread that owns it in a fixed order: no atomics, so
 * runs are bit-identical, and a kv head's gradient over its group needs no second pass.
 *
 * Every shape of zt_attn_shape: packed or separate q/k/v, grouped-query heads, any head_dim (the
 * tile shrinks to fit shared memory), a sliding window and packed documents (the same visible
 * range as kernels/cpu/attention.c: keys first_key(t)..t). Inputs fp32, bf16 or fp16; every
 * product and sum in fp32; outputs rounded once. Arithmetic runs on CUDA cores, not tensor
 * cores: cuDNN's fused attention (cudnn_sdpa.c) is the fast path where it applies, and this
 * kernel is the one that covers every shape and is verified on the emulated device. */
#include "cuda_common.cuh"

namespace {

/* Where the heads live, in elements (as the CPU's attention): row strides of q, k/v and out.
 * tile is the rows of a query tile and of a key tile. */
struct fgeom {
    int B, T, NH, KVH, hd, group, window, tile;
    size_t sq, skv, so;
    float scale;
    const int32_t *doc_pos; /* zt_attn_shape.doc_pos (device memory), or NULL */
};

enum { FLASH_THREADS = 128 };

/* Above 48 KiB of shared memory a kernel must ask for it (cudaFuncSetAttribute), up to the
 * device's opt-in limit (227 KiB on H100/H200, 163 KiB on A100). */
const size_t FLASH_SMEM_DEFAULT = 48 << 10;

/* The device's opt-in shared memory per block. */
size_t smem_optin(const zt_ctx *x) {
    int dev = 0, v = 0;
    ZT_CUDA_CHECK(x->be, cudaGetDevice(&dev));
    ZT_CUDA_CHECK(x->be, cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return v > 0 ? (size_t)v : FLASH_SMEM_DEFAULT;
}

fgeom geom_of(const zt_attn_shape *s, size_t smem_limit) {
    ZT_ASSERT(s->n_kv_head > 0 && s->n_head % s->n_kv_head == 0 && s->window >= 0);
    fgeom g;
    g.B = s->B, g.T = s->T, g.NH = s->n_head, g.KVH = s->n_kv_head, g.hd = s->head_dim;
    g.group = s->n_head / s->n_kv_head, g.window = s->window, g.doc_pos = s->doc_pos;
    size_t qw = (size_t)s->n_head * s->head_dim, kvw = (size_t)s->n_kv_head * s->head_dim;
    g.sq = s->packed ? qw + 2 * kvw : qw;
    g.skv = s->packed ? g.sq : kvw;
    g.so = qw;
    g.scale = 1.0f / sqrtf((float)s->head_dim);
    /* The largest tile whose kernels all fit (cuda_host.h): 32 rows up to head_dim 291 on an
     * H100, up to 206 on an A100, fewer past it. */
    g.tile = zt_cuda_flash_tile(g.hd, smem_limit);
    ZT_ASSERT(g.tile > 0 && "head_dim fits one row's tiles");
    return g;
}

/* The first key query t of row b sees: the window's, or its document's first token if later;
 * every key from there to t is visible. Non-decreasing in t, so a query tile's first row gives
 * the first key any of its rows sees. */
__device__ __forceinline__ int first_key(const fgeom &g, int b, int t) {
    int lo = g.window ? max(0, t - g.window + 1) : 0;
    return g.doc_pos ? max(lo, t - g.doc_pos[(size_t)b * g.T + t]) : lo;
}

/* Rows r0.. (n of them, at most R) of one head into an R×hd fp32 tile; the rows past n are 0. */
template <typename T>
__device__ __forceinline__ void load_rows(float *dst, const T *src, size_t stride, int r0, int n,
                                          int R, int hd) {
    for (int e = threadIdx.x; e < R * hd; e += blockDim.x) {
        int i = e / hd, d = e % hd;
        dst[e] = i < n ? zt_ld(src + (size_t)(r0 + i) * stride, d) : 0.0f;
    }
}

__device__ __forceinline__ float dot_rows(const float *a, const float *b, int hd) {
    float acc = 0.0f;
    for (int d = 0; d < hd; d++)
        acc += a[d] * b[d];
    return acc;
}

/* grid (query tiles, NH, B). out[B,T,NH·hd] and lse[B,NH,T]. */
template <typename T>
__global__ void flash_fwd(fgeom g, T *out, float *lse, const T *q, const T *k, const T *v) {
    ZT_DYN_SHARED(float, sm);
    const int R = g.tile, hd = g.hd;
    float *qs = sm, *ks = qs + R * hd, *vs = ks + R * hd, *os = vs + R * hd, *ss = os + R * hd;
    float *mrow = ss + R * R, *lrow = mrow + R, *alpha = lrow + R;
    int *lo = (int *)(alpha + R);
    const int r0 = blockIdx.x * R, h = blockIdx.y, b = blockIdx.z;
    const int nr = min(R, g.T - r0);
    const T *qh = q + (size_t)b * g.T * g.sq + (size_t)h * hd;
    const size_t kv0 = (size_t)b * g.T * g.skv + (size_t)(h / g.group) * hd;
    load_rows(qs, qh, g.sq, r0, nr, R, hd);
    for (int e = threadIdx.x; e < R * hd; e += blockDim.x)
        os[e] = 0.0f;
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        mrow[i] = -INFINITY, lrow[i] = 0.0f;
        lo[i] = i < nr ? first_key(g, b, r0 + i) : g.T;
    }
    __syncthreads();
    const int c_end = r0 + nr;
    for (int c0 = lo[0]; c0 < c_end; c0 += R) {
        const int nc = min(R, c_end - c0);
        load_rows(ks, k + kv0, g.skv, c0, nc, R, hd);
        load_rows(vs, v + kv0, g.skv, c0, nc, R, hd);
        __syncthreads();
        /* scaled scores of the tile, -inf where the mask is */
        for (int e = threadIdx.x; e < R * R; e += blockDim.x) {
            const int i = e / R, j = e % R, t = r0 + i, s = c0 + j;
            ss[e] = i < nr && j < nc && s <= t && s >= lo[i]
                        ? dot_rows(qs + i * hd, ks + j * hd, hd) * g.scale
                        : -INFINITY;
        }
        __syncthreads();
        /* the online softmax: the row's new maximum rescales what was summed before it */
        for (int i = threadIdx.x; i < R; i += blockDim.x) {
            float *row = ss + i * R;
            float mx = mrow[i];
            for (int j = 0; j < R; j++)
                mx = fmaxf(mx, row[j]);
            if (mx == -INFINITY) { /* nothing of this row visible yet */
                alpha[i] = 1.0f;
                for (int j = 0; j < R; j++)
                    row[j] = 0.0f;
                continue;
            }
            float a = expf(mrow[i] - mx), sum = 0.0f;
            for (int j = 0; j < R; j++) {
                float p = expf(row[j] - mx);
                row[j] = p;
                sum += p;
            }
            lrow[i] = lrow[i] * a + sum, mrow[i] = mx, alpha[i] = a;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < R * hd; e += blockDim.x) {
            const int i = e / hd, d = e % hd;
            float acc = os[e] * alpha[i];
            for (int j = 0; j < nc; j++)
                acc += ss[i * R + j] * vs[j * hd + d];
            os[e] = acc;
        }
        __syncthreads();
    }
    T *oh = out + (size_t)b * g.T * g.so + (size_t)h * hd;
    for (int e = threadIdx.x; e < nr * hd; e += blockDim.x) {
        const int i = e / hd, d = e % hd;
        zt_st(oh + (size_t)(r0 + i) * g.so, d, os[e] / lrow[i]);
    }
    for (int i = threadIdx.x; i < nr; i += blockDim.x)
        lse[((size_t)b * g.NH + h) * g.T + r0 + i] = mrow[i] + logf(lrow[i]);
}

/* D[b,h,t] = Σ_d dO·O over the row's head: the Σ_s P·dP of the softmax backward, since
 * O = P·V and dP = dO·Vᵀ. */
template <typename T>
__global__ void flash_bwd_dot(fgeom g, float *dsum, const T *dout, const T *out) {
    const size_t n = (size_t)g.B * g.NH * g.T;
    ZT_GRID_LOOP(i, n) {
        const size_t t = i % g.T, h = i / g.T % g.NH, b = i / ((size_t)g.T * g.NH);
        const size_t at = (b * g.T + t) * g.so + h * g.hd;
        float acc = 0.0f;
        for (int d = 0; d < g.hd; d++)
            acc += zt_ld(dout + at, d) * zt_ld(out + at, d);
        dsum[i] = acc;
    }
}

/* The gradient of the tile's scores, dS = P ⊙ (dP − D) · scale, with P recomputed from the
 * log-sum-exp; 0 where the mask is. Also P itself when p is not NULL. The tiles are qs/dos
 * (query rows r0.., nr of them) and ks/vs (keys c0.., nc). */
__device__ __forceinline__ void score_grads(const fgeom &g, float *ds, float *p, const float *qs,
                                            const float *dos, const float *ks, const float *vs,
                                            const float *lse, const float *dsum, const int *lo,
                                            int r0, int nr, int c0, int nc) {
    const int R = g.tile, hd = g.hd;
    for (int e = threadIdx.x; e < R * R; e += blockDim.x) {
        const int i = e / R, j = e % R, t = r0 + i, s = c0 + j;
        float pe = 0.0f, dse = 0.0f;
        if (i < nr && j < nc && s <= t && s >= lo[i]) {
            pe = expf(dot_rows(qs + i * hd, ks + j * hd, hd) * g.scale - lse[i]);
            dse = pe * (dot_rows(dos + i * hd, vs + j * hd, hd) - dsum[i]) * g.scale;
        }
        ds[e] = dse;
        if (p)
            p[e] = pe;
    }
}

/* grid (query tiles, NH, B): dq of the tile's rows, over the key tiles they see. */
template <typename T>
__global__ void flash_bwd_q(fgeom g, T *dq, const float *lse, const float *dsum, const T *dout,
                            const T *q, const T *k, const T *v) {
    ZT_DYN_SHARED(float, sm);
    const int R = g.tile, hd = g.hd;
    float *qs = sm, *dos = qs + R * hd, *ks = dos + R * hd, *vs = ks + R * hd, *dqs = vs + R * hd;
    float *ds = dqs + R * hd, *lr = ds + R * R, *dr = lr + R;
    int *lo = (int *)(dr + R);
    const int r0 = blockIdx.x * R, h = blockIdx.y, b = blockIdx.z;
    const int nr = min(R, g.T - r0);
    const size_t q0 = (size_t)b * g.T * g.sq + (size_t)h * hd;
    const size_t kv0 = (size_t)b * g.T * g.skv + (size_t)(h / g.group) * hd;
    const size_t row0 = ((size_t)b * g.NH + h) * g.T + r0;
    load_rows(qs, q + q0, g.sq, r0, nr, R, hd);
    load_rows(dos, dout + (size_t)b * g.T * g.so + (size_t)h * hd, g.so, r0, nr, R, hd);
    for (int e = threadIdx.x; e < R * hd; e += blockDim.x)
        dqs[e] = 0.0f;
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        lr[i] = i < nr ? lse[row0 + i] : 0.0f;
        dr[i] = i < nr ? dsum[row0 + i] : 0.0f;
        lo[i] = i < nr ? first_key(g, b, r0 + i) : g.T;
    }
    __syncthreads();
    const int c_end = r0 + nr;
    for (int c0 = lo[0]; c0 < c_end; c0 += R) {
        const int nc = min(R, c_end - c0);
        load_rows(ks, k + kv0, g.skv, c0, nc, R, hd);
        load_rows(vs, v + kv0, g.skv, c0, nc, R, hd);
        __syncthreads();
        score_grads(g, ds, NULL, qs, dos, ks, vs, lr, dr, lo, r0, nr, c0, nc);
        __syncthreads();
        for (int e = threadIdx.x; e < R * hd; e += blockDim.x) {
            const int i = e / hd, d = e % hd;
            float acc = dqs[e];
            for (int j = 0; j < nc; j++)
                acc += ds[i * R + j] * ks[j * hd + d];
            dqs[e] = acc;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < nr * hd; e += blockDim.x) {
        const int i = e / hd, d = e % hd;
        zt_st(dq + q0 + (size_t)(r0 + i) * g.sq, d, dqs[e]);
    }
}

/* grid (key tiles, KVH, B): dk and dv of the tile's keys of kv head kvh, summed over the query
 * heads of its group and the query tiles that may see the keys (with a window, those before
 * the last key + window). */
template <typename T>
__global__ void flash_bwd_kv(fgeom g, T *dk, T *dv, const float *lse, const float *dsum,
                             const T *dout, const T *q, const T *k, const T *v) {
    ZT_DYN_SHARED(float, sm);
    const int R = g.tile, hd = g.hd;
    float *ks = sm, *vs = ks + R * hd, *dks = vs + R * hd, *dvs = dks + R * hd;
    float *qs = dvs + R * hd, *dos = qs + R * hd, *ps = dos + R * hd, *ds = ps + R * R;
    float *lr = ds + R * R, *dr = lr + R;
    int *lo = (int *)(dr + R);
    const int c0 = blockIdx.x * R, kvh = blockIdx.y, b = blockIdx.z;
    const int nc = min(R, g.T - c0);
    const size_t kv0 = (size_t)b * g.T * g.skv + (size_t)kvh * hd;
    load_rows(ks, k + kv0, g.skv, c0, nc, R, hd);
    load_rows(vs, v + kv0, g.skv, c0, nc, R, hd);
    for (int e = threadIdx.x; e < R * hd; e += blockDim.x)
        dks[e] = 0.0f, dvs[e] = 0.0f;
    const int t_end = g.window ? min(g.T, c0 + nc - 1 + g.window) : g.T;
    for (int j = 0; j < g.group; j++) {
        const int h = kvh * g.group + j;
        const size_t q0 = (size_t)b * g.T * g.sq + (size_t)h * hd;
        const size_t o0 = (size_t)b * g.T * g.so + (size_t)h * hd;
        const size_t lrow0 = ((size_t)b * g.NH + h) * g.T;
        for (int r0 = c0; r0 < t_end; r0 += R) {
            const int nr = min(R, t_end - r0);
            /* the barrier before this reload: the previous tile's sums are done with qs, dos */
            __syncthreads();
            load_rows(qs, q + q0, g.sq, r0, nr, R, hd);
            load_rows(dos, dout + o0, g.so, r0, nr, R, hd);
            for (int i = threadIdx.x; i < R; i += blockDim.x) {
                lr[i] = i < nr ? lse[lrow0 + r0 + i] : 0.0f;
                dr[i] = i < nr ? dsum[lrow0 + r0 + i] : 0.0f;
                lo[i] = i < nr ? first_key(g, b, r0 + i) : g.T;
            }
            __syncthreads();
            score_grads(g, ds, ps, qs, dos, ks, vs, lr, dr, lo, r0, nr, c0, nc);
            __syncthreads();
            for (int e = threadIdx.x; e < R * hd; e += blockDim.x) {
                const int c = e / hd, d = e % hd;
                float av = dvs[e], ak = dks[e];
                for (int i = 0; i < nr; i++) {
                    av += ps[i * R + c] * dos[i * hd + d];
                    ak += ds[i * R + c] * qs[i * hd + d];
                }
                dvs[e] = av, dks[e] = ak;
            }
        }
    }
    for (int e = threadIdx.x; e < nc * hd; e += blockDim.x) {
        const int c = e / hd, d = e % hd;
        zt_st(dk + kv0 + (size_t)(c0 + c) * g.skv, d, dks[e]);
        zt_st(dv + kv0 + (size_t)(c0 + c) * g.skv, d, dvs[e]);
    }
}

/* Past 48 KiB a kernel's dynamic shared memory must be asked for before its launch. */
void allow_smem(const zt_ctx *x, const void *kernel, size_t bytes) {
    if (bytes > FLASH_SMEM_DEFAULT)
        ZT_CUDA_CHECK(x->be, cudaFuncSetAttribute(kernel,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)bytes));
}

unsigned tiles(const fgeom &g) { return (unsigned)((g.T + g.tile - 1) / g.tile); }

} // namespace

extern "C" void zt_cuda_flash_attention_forward(const zt_ctx *x, const zt_attn_shape *s,
                                                void *out, float *lse, const void *q,
                                                const void *k, const void *v) {
    const fgeom g = geom_of(s, smem_optin(x));
    if (g.B == 0 || g.T == 0)
        return;
    const size_t shm = zt_cuda_flash_fwd_smem(g.tile, g.hd);
    ZT_ACT_DISPATCH(x->act, {
        const ACT_T *qa = (const ACT_T *)q;
        const ACT_T *ka = s->packed ? qa + (size_t)g.NH * g.hd : (const ACT_T *)k;
        const ACT_T *va = s->packed ? qa + (size_t)(g.NH + g.KVH) * g.hd : (const ACT_T *)v;
        allow_smem(x, (const void *)flash_fwd<ACT_T>, shm);
        ZT_LAUNCH(flash_fwd<ACT_T>, dim3(tiles(g), g.NH, g.B), FLASH_THREADS, shm,
                  zt_cuda_stream(x), g, (ACT_T *)out, lse, qa, ka, va);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

extern "C" void zt_cuda_flash_attention_backward(const zt_ctx *x, const zt_attn_shape *s,
                                                 void *dq, void *dk, void *dv, float *scratch,
                                                 const void *dout, const void *out,
                                                 const void *q, const void *k, const void *v,
                                                 const float *lse) {
    const fgeom g = geom_of(s, smem_optin(x));
    if (g.B == 0 || g.T == 0)
        return;
    const size_t q_shm = zt_cuda_flash_dq_smem(g.tile, g.hd);
    const size_t kv_shm = zt_cuda_flash_kv_smem(g.tile, g.hd);
    ZT_ACT_DISPATCH(x->act, {
        const ACT_T *qa = (const ACT_T *)q;
        const ACT_T *ka = s->packed ? qa + (size_t)g.NH * g.hd : (const ACT_T *)k;
        const ACT_T *va = s->packed ? qa + (size_t)(g.NH + g.KVH) * g.hd : (const ACT_T *)v;
        ACT_T *dqa = (ACT_T *)dq;
        ACT_T *dka = s->packed ? dqa + (size_t)g.NH * g.hd : (ACT_T *)dk;
        ACT_T *dva = s->packed ? dqa + (size_t)(g.NH + g.KVH) * g.hd : (ACT_T *)dv;
        const ACT_T *douta = (const ACT_T *)dout;
        ZT_LAUNCH_1D(x, (size_t)g.B * g.NH * g.T, flash_bwd_dot<ACT_T>, g, scratch, douta,
                     (const ACT_T *)out);
        allow_smem(x, (const void *)flash_bwd_q<ACT_T>, q_shm);
        ZT_LAUNCH(flash_bwd_q<ACT_T>, dim3(tiles(g), g.NH, g.B), FLASH_THREADS, q_shm,
                  zt_cuda_stream(x), g, dqa, lse, (const float *)scratch, douta, qa, ka, va);
        ZT_CUDA_LAUNCHED(x->be);
        allow_smem(x, (const void *)flash_bwd_kv<ACT_T>, kv_shm);
        ZT_LAUNCH(flash_bwd_kv<ACT_T>, dim3(tiles(g), g.KVH, g.B), FLASH_THREADS, kv_shm,
                  zt_cuda_stream(x), g, dka, dva, lse, (const float *)scratch, douta, qa, ka,
                  va);
        ZT_CUDA_LAUNCHED(x->be);
    });
}
