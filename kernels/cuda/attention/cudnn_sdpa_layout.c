/* ztrain's attention tensors as cuDNN's (B, H, T, D) views (cudnn_sdpa_layout.h). */
#include "cudnn_sdpa_layout.h"

zt_sdpa_tensor zt_sdpa_layout(const zt_attn_shape *s, zt_sdpa_tensor_kind kind) {
    const int64_t B = s->B, T = s->T, NH = s->n_head, KVH = s->n_kv_head, hd = s->head_dim;
    /* Distances between consecutive tokens: a packed row holds q | k | v. */
    const int64_t sq = s->packed ? (NH + 2 * KVH) * hd : NH * hd;
    const int64_t skv = s->packed ? sq : KVH * hd;
    const int64_t so = NH * hd;
    zt_sdpa_tensor t = {{0}, {0}, 0};
    switch (kind) {
    case ZT_SDPA_Q:
        t = (zt_sdpa_tensor){{B, NH, T, hd}, {T * sq, hd, sq, 1}, 0};
        break;
    case ZT_SDPA_K:
    case ZT_SDPA_V:
        t = (zt_sdpa_tensor){{B, KVH, T, hd}, {T * skv, hd, skv, 1}, 0};
        if (s->packed)
            t.offset = kind == ZT_SDPA_K ? NH * hd : (NH + KVH) * hd;
        break;
    case ZT_SDPA_KT:
        /* K's (t, d) element is Kᵀ's (d, t): the last two dims and strides swap */
        t = (zt_sdpa_tensor){{B, KVH, hd, T}, {T * skv, hd, 1, skv}, s->packed ? NH * hd : 0};
        break;
    case ZT_SDPA_O:
        t = (zt_sdpa_tensor){{B, NH, T, hd}, {T * so, hd, so, 1}, 0};
        break;
    case ZT_SDPA_STATS:
        t = (zt_sdpa_tensor){{B, NH, T, 1}, {NH * T, T, 1, 1}, 0};
        break;
    case ZT_SDPA_TENSORS:
        break;
    }
    return t;
}

const char *zt_sdpa_unsupported(const zt_attn_shape *s, zt_dtype act, int sm) {
    if (act != ZT_BF16 && act != ZT_F16)
        return "cuDNN's fused attention takes bf16 or fp16 activations";
    if (sm < 80)
        return "cuDNN's fused attention needs an SM80 or newer GPU";
    if (s->window != 0)
        return "a sliding window is not in cuDNN 9.19's causal attention graph";
    if (s->doc_pos)
        return "packed documents are not in cuDNN 9.19's causal attention graph";
    if (s->head_dim % 8 != 0 || s->head_dim > 128)
        return "cuDNN's fused attention takes head_dim a multiple of 8 up to 128";
    if (s->n_kv_head <= 0 || s->n_head % s->n_kv_head != 0)
        return "n_head is not a multiple of n_kv_head";
    return NULL;
}
