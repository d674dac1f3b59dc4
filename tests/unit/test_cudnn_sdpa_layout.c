/* cuDNN's fused attention sees ztrain's attention tensors through dims and strides
 * (kernels/cuda/attention/cudnn_sdpa_layout.c); this checks, without cuDNN or a GPU, that every
 * element cuDNN would address through them is the element ops.h's zt_attn_shape puts there, written out
 * here from that header's definition: token (b, t) of head h at row b·T + t, q | k | v packed in
 * one row or separate, query head h reading kv head h / (n_head / n_kv_head). And which shapes
 * it is asked to run. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../kernels/cuda/attention/cudnn_sdpa_layout.h"
#include "check.h"

/* The element of head h, token t, dimension d of tensor kind (k and v on their kv head), by
 * ops.h: the row width and where k and v start inside a packed row. */
static int64_t want_at(const zt_attn_shape *s, zt_sdpa_tensor_kind kind, int b, int h, int t,
                       int d) {
    const int64_t qw = (int64_t)s->n_head * s->head_dim, kvw = (int64_t)s->n_kv_head * s->head_dim;
    const int64_t row = (int64_t)b * s->T + t;
    switch (kind) {
    case ZT_SDPA_Q:
        return row * (s->packed ? qw + 2 * kvw : qw) + (int64_t)h * s->head_dim + d;
    case ZT_SDPA_K:
    case ZT_SDPA_KT:
    case ZT_SDPA_V: {
        int64_t at = s->packed ? (kind == ZT_SDPA_V ? qw + kvw : qw) : 0;
        return row * (s->packed ? qw + 2 * kvw : kvw) + at + (int64_t)h * s->head_dim + d;
    }
    case ZT_SDPA_O:
        return row * qw + (int64_t)h * s->head_dim + d;
    case ZT_SDPA_STATS: /* the flash kernel's log-sum-exp, [B, n_head, T] */
        return ((int64_t)b * s->n_head + h) * s->T + t;
    default:
        return -1;
    }
}

static int64_t got_at(const zt_sdpa_tensor *x, const int64_t i[4]) {
    return x->offset + i[0] * x->stride[0] + i[1] * x->stride[1] + i[2] * x->stride[2] +
           i[3] * x->stride[3];
}

static void check_shape(const zt_attn_shape *s) {
    static const char *const names[] = {"Q", "K", "KT", "V", "O", "Stats"};
    for (int kind = 0; kind < ZT_SDPA_TENSORS; kind++) {
        const zt_sdpa_tensor x = zt_sdpa_layout(s, (zt_sdpa_tensor_kind)kind);
        const bool kv = kind == ZT_SDPA_K || kind == ZT_SDPA_KT || kind == ZT_SDPA_V;
        const int64_t heads = kv ? s->n_kv_head : s->n_head;
        const int64_t last = kind == ZT_SDPA_STATS ? 1 : s->head_dim;
        const int64_t want_dims[4] = {s->B, heads, kind == ZT_SDPA_KT ? last : s->T,
                                      kind == ZT_SDPA_KT ? s->T : last};
        CHECK(memcmp(x.dim, want_dims, sizeof want_dims) == 0,
              "%s of B=%d T=%d heads %d/%d hd %d%s: dims (%lld,%lld,%lld,%lld)", names[kind],
              s->B, s->T, s->n_head, s->n_kv_head, s->head_dim, s->packed ? " packed" : "",
              (long long)x.dim[0], (long long)x.dim[1], (long long)x.dim[2],
              (long long)x.dim[3]);
        int bad = 0;
        for (int b = 0; b < s->B; b++)
            for (int h = 0; h < heads; h++)
                for (int t = 0; t < s->T; t++)
                    for (int d = 0; d < last; d++) {
                        int64_t i[4] = {b, h, kind == ZT_SDPA_KT ? d : t,
                                        kind == ZT_SDPA_KT ? t : d};
                        bad += got_at(&x, i) != want_at(s, (zt_sdpa_tensor_kind)kind, b, h, t, d);
                    }
        CHECK(bad == 0, "%s of B=%d T=%d heads %d/%d hd %d%s: %d elements at the wrong address",
              names[kind], s->B, s->T, s->n_head, s->n_kv_head, s->head_dim,
              s->packed ? " packed" : "", bad);
    }
}

static void check_support(void) {
    const int32_t pos[2] = {0, 1};
    zt_attn_shape gpt2 = {2, 16, 12, 12, 64, true, 0, NULL};
    CHECK(zt_sdpa_unsupported(&gpt2, ZT_BF16, 90) == NULL, "GPT-2's attention at bf16 on SM90");
    CHECK(zt_sdpa_unsupported(&gpt2, ZT_F16, 80) == NULL, "GPT-2's attention at fp16 on SM80");
    zt_attn_shape llama = {1, 8, 32, 8, 128, false, 0, NULL};
    CHECK(zt_sdpa_unsupported(&llama, ZT_BF16, 90) == NULL, "Llama's GQA attention at bf16");
    CHECK(zt_sdpa_unsupported(&gpt2, ZT_F32, 90) != NULL, "fp32 goes to the flash kernel");
    CHECK(zt_sdpa_unsupported(&gpt2, ZT_BF16, 75) != NULL, "SM75 goes to the flash kernel");
    zt_attn_shape x = gpt2;
    x.window = 4;
    CHECK(zt_sdpa_unsupported(&x, ZT_BF16, 90) != NULL, "a window goes to the flash kernel");
    x = gpt2, x.doc_pos = pos;
    CHECK(zt_sdpa_unsupported(&x, ZT_BF16, 90) != NULL, "documents go to the flash kernel");
    x = gpt2, x.head_dim = 60;
    CHECK(zt_sdpa_unsupported(&x, ZT_BF16, 90) != NULL, "head_dim 60 goes to the flash kernel");
    x = gpt2, x.head_dim = 256;
    CHECK(zt_sdpa_unsupported(&x, ZT_BF16, 90) != NULL, "head_dim 256 goes to the flash kernel");
}

int main(void) {
    static const zt_attn_shape shapes[] = {
        {2, 5, 3, 3, 8, true, 0, NULL},  {2, 7, 4, 2, 16, false, 0, NULL},
        {1, 9, 6, 1, 8, true, 0, NULL},  {3, 4, 8, 4, 24, true, 0, NULL},
        {1, 1, 2, 2, 64, false, 0, NULL},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(&shapes[i]);
    check_support();
    return check_summary("test_cudnn_sdpa_layout");
}
