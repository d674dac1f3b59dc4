/* cuDNN's fused attention graphs (kernels/cuda/attention/cudnn_sdpa_graph.c) built and finalized
 * by the cuDNN library itself, on a machine without a GPU: every tensor, operation and the
 * operation graph is accepted, for GPT-2's packed bf16 and fp16 attention and Llama's grouped-
 * query one (4 query heads a kv head, and 32 for multi-query), with the operation counts of the composite graph as the reference note lays
 * it out (/work/shared/reference/cudnn_sdpa.md §4: 14 forward operations; §5's backward, 20: D as
 * a product and a sum, the masked scores as in the forward (6), the probabilities recomputed (2),
 * cast, transposed and multiplied into dV (3), dP (1), dS (3), transposed and multiplied into dK
 * (2), dQ (1); with grouped-query heads 22: dK and dV each into a full-head tensor, then summed
 * over the group by a reduction). A finalized graph says nothing about whether an engine runs it; that needs a GPU
 * (scripts/gpu-check.sh, phase ops). Skipped (77) where libcudnn.so.9 is absent. */
#include <stdio.h>

#include "../../kernels/cuda/attention/cudnn_sdpa_graph.h"
#include "check.h"

static void build(const zt_cudnn_api *api, zt_attn_shape s, zt_dtype act, bool backward,
                  int want_ops) {
    zt_sdpa_graph g;
    cudnnStatus_t st = zt_sdpa_graph_build(&g, api, NULL, &s, act, backward);
    CHECK(st == CUDNN_STATUS_SUCCESS, "%s graph, B=%d T=%d heads %d/%d hd %d at %s: %s",
          backward ? "backward" : "forward", s.B, s.T, s.n_head, s.n_kv_head, s.head_dim,
          zt_dtype_name(act), g.why);
    CHECK(st != CUDNN_STATUS_SUCCESS || g.n_op == want_ops, "%s graph: %d operations, want %d",
          backward ? "backward" : "forward", g.n_op, want_ops);
    zt_sdpa_graph_free(&g);
}

int main(void) {
    zt_cudnn_api api;
    char why[256];
    if (!zt_cudnn_open(&api, why, sizeof why)) {
        printf("test_cudnn_sdpa_graph: SKIPPED: %s\n", why);
        return 77;
    }
    printf("cuDNN %zu\n", api.version());
    fflush(stdout);
    const zt_attn_shape gpt2 = {4, 64, 12, 12, 64, true, 0, NULL};
    const zt_attn_shape llama = {2, 32, 32, 8, 128, false, 0, NULL};
    build(&api, gpt2, ZT_BF16, false, 14);
    build(&api, gpt2, ZT_F16, false, 14);
    build(&api, llama, ZT_BF16, false, 14);
    build(&api, gpt2, ZT_BF16, true, 20);
    build(&api, gpt2, ZT_F16, true, 20);
    build(&api, llama, ZT_BF16, true, 22);
    build(&api, llama, ZT_F16, true, 22);
    const zt_attn_shape mqa = {2, 32, 32, 1, 128, false, 0, NULL};
    build(&api, mqa, ZT_BF16, true, 22);
    return check_summary("test_cudnn_sdpa_graph");
}
