/* The cuBLASLt subset the backend calls, on the emulated device, from NVIDIA's documented
 * semantics (cublasLt.h, cuBLAS docs "cublasLtMatmul()"): column-major layouts (element (r, c)
 * of a layout at p[r + c·ld]), CUBLASLT_MATMUL_DESC_TRANSA/B, and
 *   D = epilogue(alpha·op(A)·op(B) + beta·C)
 * with A and B of one type (fp32, bf16 or fp16), C and D of that type or fp32, products summed
 * in fp32 in order of k (the GPU's order differs: compare with a tolerance), the epilogue in fp32
 * and one rounding to D's type, to nearest even. C is not read when beta is 0.
 * Epilogues, as cublasLt.h documents them:
 * - DEFAULT; BIAS: bias[r] (of D's type unless BIAS_DATA_TYPE says otherwise) added to every
 *   column.
 * - GELU_AUX_BIAS: pre = alpha·op(A)·op(B) + beta·C + bias[r]; pre is stored to the auxiliary
 *   matrix (EPILOGUE_AUX_POINTER, leading dimension EPILOGUE_AUX_LD, of D's type: "the GELU input
 *   matrix") and D = gelu(pre), from the fp32 pre before it is rounded.
 * - DGELU: D = (alpha·op(A)·op(B) + beta·C) ⊙ gelu'(aux), the "GELU gradient applied to the
 *   matmul output", aux read as the forward stored it.
 *   GELU is the tanh form 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the approximation
 *   PyTorch's cuBLASLt path (_addmm_activation with use_gelu) is tested against and llm.c swaps
 *   its own kernel in for; the header names no formula, so this is the point to check on a GPU.
 *   The auxiliary leading dimension must be divisible by 8 and at least D's rows (cublasLt.h,
 *   CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD), and the pointers set.
 * - BGRADA, BGRADB: the bias gradient of a weight-gradient product, beside D (computed as for
 *   DEFAULT). What NVIDIA documents (cublasLt.h of CUDA 13.0: cublasLtEpilogue_t and
 *   cublasLtMatmulDescAttributes_t; the cuBLAS guide's cublasLtEpilogue_t table says the same,
 *   as quoted in ROCm/composable_kernel issue 674):
 *   BGRADA is "bias gradient based on the input matrix A", its length the rows of D; BGRADB is
 *   based on B, its length the columns of D; for both "the reduction happens over the GEMM's k
 *   dimension", and the result is stored (not added: nothing says it is read) to
 *   CUBLASLT_MATMUL_DESC_BIAS_POINTER, a `void *` in the bias-gradient case, in
 *   CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, whose default (-1) is D's type ("bias gradient vector
 *   elements are the same type as the output elements", IMMA and fp8 kernels apart). Routines
 *   that do not dereference the pointer, the heuristic among them, "depend on its value to
 *   determine expected pointer alignment". No transpose or type restriction is written there;
 *   how others call it: TransformerEngine's cublaslt_gemm.cu takes BGRADB on the weight-gradient
 *   GEMM ("grad output is always input B", layout NT, op(B) transposed), as does a PyTorch
 *   extension's GemmAndBiasGradCUDA (mega2) and llm.c's matmul_cublaslt when asked for a
 *   backward with a bias; Paddle's fused_gemm_epilogue takes BGRADB when the gradient is a
 *   transposed B and BGRADA when it is A; OneFlow's cublas_fused_matmul_bias_add_grad.cu says
 *   BGRADB needs CUDA 11.4.2 and faulted for some shapes under 11.6. Which shapes and types a
 *   GPU's cuBLASLt has kernels for is not documented: a caller must take "no algorithm" from the
 *   heuristic as a refusal.
 *   So here: the sums are Σ_p op(A)[i,p] (BGRADA) or Σ_p op(B)[p,j] (BGRADB) of the operands as
 *   stored, in fp32 in order of p, rounded once to the bias type; independent of beta and C.
 *   Refused: a bias-gradient type other than D's, A's or CUDA_R_32F (NOT_SUPPORTED at the
 *   heuristic); alpha other than 1 (NOT_SUPPORTED at the matmul: whether alpha scales the sum is
 *   not written, so the emulator does not guess); a bias pointer less aligned than the heuristic
 *   saw, or not inside one device allocation. ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO=BGRADA,BGRADB
 *   (either or both) makes the heuristic find no algorithm for that epilogue, as a cuBLASLt
 *   without the kernel would, so the caller's fallback can be tested.
 * Anything else (another epilogue, compute type, attribute, batch, order) is refused with
 * CUBLAS_STATUS_NOT_SUPPORTED naming it, never ignored.
 *
 * Alignment is strict: the heuristic's algorithm assumes the pointer alignments the preference
 * declares (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, 256 by default) and the bias pointer's
 * own (as set on the descriptor when the heuristic ran), and a matmul whose pointers are less
 * aligned than its algorithm assumed fails. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "emu_internal.h"

using namespace zt_emu;

namespace {

struct lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    int32_t bias_type = -1; /* -1: D's */
    void *aux = nullptr;
    int64_t aux_ld = 0;
};

struct lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};

struct lt_pref {
    uint64_t workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256}; /* A, B, C, D */
};

thread_local std::string last_detail;
thread_local cublasStatus_t last_status = CUBLAS_STATUS_SUCCESS;

cublasStatus_t refuse(cublasStatus_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
cublasStatus_t refuse(cublasStatus_t st, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    last_detail = buf;
    last_status = st;
    fprintf(stderr, "ztrain cuda emulator: cuBLASLt: %s\n", buf);
    return st;
}

size_t type_size(cudaDataType_t t) {
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 0;
}

const char *type_name(int t) {
    return t == CUDA_R_32F    ? "CUDA_R_32F"
           : t == CUDA_R_16BF ? "CUDA_R_16BF"
           : t == CUDA_R_16F  ? "CUDA_R_16F"
                              : "an unsupported type";
}

float load(cudaDataType_t t, const void *p, size_t i) {
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    if (t == CUDA_R_16BF)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return __half2float(((const __half *)p)[i]);
}

void store(cudaDataType_t t, void *p, size_t i, float v) {
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else if (t == CUDA_R_16BF)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((__half *)p)[i] = __float2half_rn(v);
}

template <typename T> bool set_attr(T *dst, const void *buf, size_t size) {
    if (!buf || size != sizeof(T))
        return false;
    memcpy(dst, buf, sizeof(T));
    return true;
}

bool uses_aux(uint32_t epi) {
    return epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU;
}
bool uses_bias(uint32_t epi) {
    return epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool bias_grad(uint32_t epi) {
    return epi == CUBLASLT_EPILOGUE_BGRADA || epi == CUBLASLT_EPILOGUE_BGRADB;
}
const char *epilogue_name(uint32_t epi) {
    return epi == CUBLASLT_EPILOGUE_BGRADA ? "BGRADA" : epi == CUBLASLT_EPILOGUE_BGRADB ? "BGRADB"
                                                                                      : "?";
}

/* Whether ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO (a comma-separated list of BGRADA and BGRADB, read
 * at each heuristic) names epi: the heuristic then finds no algorithm for it. */
bool no_algo_for(uint32_t epi) {
    const char *v = getenv("ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO");
    if (!v || !bias_grad(epi))
        return false;
    const char *name = epilogue_name(epi);
    const size_t len = strlen(name);
    for (const char *p = v; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0)
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

/* The alignment an algorithm may assume of p: the largest power of two dividing it, at most 256
 * (a NULL pointer: 256, what cuBLASLt assumes when told nothing). */
uint32_t pointer_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uintptr_t low = a & (~a + 1);
    return a == 0 || low > 256 ? 256u : (uint32_t)low;
}

/* GELU in its tanh form and that form's derivative, in fp32 (the epilogue's precision). */
const float gelu_scale = 0.7978845608028654f; /* sqrt(2/pi) */
float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(gelu_scale * (x + 0.044715f * x * x * x)));
}
float gelu_grad(float x) {
    float th = tanhf(gelu_scale * (x + 0.044715f * x * x * x));
    float du = gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

/* out (m × n, column-major) = the m × k matrix a(i, p) times the k × n matrix b(p, j), each
 * out(i, j) summed in fp32 in order of p. The operands are first unpacked to fp32 (a by columns,
 * b by columns, both padded with zeros to whole tiles); then a tile of 16 rows × TJ columns is
 * summed at once, 16 rows to a vector: the lanes are independent sums, none reordered. */
template <typename LoadA, typename LoadB>
void product_f32(uint64_t m, uint64_t n, uint64_t k, LoadA a, LoadB b, float *out) {
    typedef float rows16 __attribute__((vector_size(64)));
    constexpr uint64_t TI = 16, TJ = 4;
    const uint64_t mp = (m + TI - 1) / TI * TI, np = (n + TJ - 1) / TJ * TJ;
    std::vector<float> at(mp * k, 0.0f), bt(np * k, 0.0f); /* at[p·mp + i], bt[j·k + p] */
    for (uint64_t p = 0; p < k; p++)
        for (uint64_t i = 0; i < m; i++)
            at[p * mp + i] = a(i, p);
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t p = 0; p < k; p++)
            bt[j * k + p] = b(p, j);
    for (uint64_t j0 = 0; j0 < np; j0 += TJ) {
        const float *bj = &bt[j0 * k];
        for (uint64_t i0 = 0; i0 < mp; i0 += TI) {
            rows16 acc[TJ] = {};
            for (uint64_t p = 0; p < k; p++) {
                rows16 ap;
                memcpy(&ap, &at[p * mp + i0], sizeof ap);
                for (uint64_t jj = 0; jj < TJ; jj++)
                    acc[jj] += ap * bj[jj * k + p];
            }
            for (uint64_t jj = 0; jj < TJ && j0 + jj < n; jj++)
                for (uint64_t ii = 0; ii < TI && i0 + ii < m; ii++)
                    out[i0 + ii + (j0 + jj) * m] = acc[jj][ii];
        }
    }
}

/* Bytes a layout spans. */
size_t span(const lt_layout *l) {
    return l->cols ? ((l->cols - 1) * (size_t)l->ld + l->rows) * type_size(l->type) : 0;
}

} // namespace

extern "C" {

const char *cublasLtGetStatusString(cublasStatus_t st) {
    static thread_local std::string s;
    const char *base = st == CUBLAS_STATUS_SUCCESS            ? "CUBLAS_STATUS_SUCCESS"
                       : st == CUBLAS_STATUS_INVALID_VALUE    ? "CUBLAS_STATUS_INVALID_VALUE"
                       : st == CUBLAS_STATUS_NOT_SUPPORTED    ? "CUBLAS_STATUS_NOT_SUPPORTED"
                       : st == CUBLAS_STATUS_ALLOC_FAILED     ? "CUBLAS_STATUS_ALLOC_FAILED"
                       : st == CUBLAS_STATUS_EXECUTION_FAILED ? "CUBLAS_STATUS_EXECUTION_FAILED"
                                                              : "CUBLAS_STATUS_INTERNAL_ERROR";
    if (st != last_status || last_detail.empty())
        return base;
    s = std::string(base) + " [emulated cuBLASLt: " + last_detail + "]";
    return s.c_str();
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    static int token;
    *h = (cublasLtHandle_t)&token;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    *d = nullptr;
    if (compute != CUBLAS_COMPUTE_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "compute type %d is not emulated (only "
                      "CUBLAS_COMPUTE_32F)",
                      (int)compute);
    if (scale != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "scale type %s is not emulated (only "
                      "CUDA_R_32F)",
                      type_name(scale));
    lt_desc *x = new lt_desc;
    x->compute = compute;
    x->scale = scale;
    *d = (cublasLtMatmulDesc_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete (lt_desc *)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size) {
    lt_desc *x = (lt_desc *)d;
    bool ok;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        ok = set_attr(&x->ta, buf, size) && (x->ta == CUBLAS_OP_N || x->ta == CUBLAS_OP_T);
        break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        ok = set_attr(&x->tb, buf, size) && (x->tb == CUBLAS_OP_N || x->tb == CUBLAS_OP_T);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        ok = set_attr(&x->epilogue, buf, size);
        if (ok && x->epilogue != CUBLASLT_EPILOGUE_DEFAULT && !uses_bias(x->epilogue) &&
            !uses_aux(x->epilogue) && !bias_grad(x->epilogue))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "epilogue %u is not emulated (DEFAULT, BIAS, "
                          "GELU_AUX_BIAS, DGELU, BGRADA and BGRADB are)",
                          x->epilogue);
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = set_attr(&x->bias, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = set_attr(&x->aux, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = set_attr(&x->aux_ld, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        ok = set_attr(&x->bias_type, buf, size) && type_size((cudaDataType_t)x->bias_type);
        break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: {
        int32_t mode;
        ok = set_attr(&mode, buf, size);
        if (ok && mode != CUBLASLT_POINTER_MODE_HOST)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "pointer mode %d is not emulated (only "
                          "host scalars)",
                          mode);
        break;
    }
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "matmul descriptor attribute %d is not "
                      "emulated",
                      (int)attr);
    }
    return ok ? CUBLAS_STATUS_SUCCESS
              : refuse(CUBLAS_STATUS_INVALID_VALUE,
                       "matmul descriptor attribute %d: bad value "
                       "or size %zu",
                       (int)attr, size);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    *l = nullptr;
    if (!type_size(type))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matrix type %d is not emulated", (int)type);
    if (ld < (int64_t)(rows ? rows : 1))
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "leading dimension %lld is below the %llu "
                      "rows",
                      (long long)ld, (unsigned long long)rows);
    *l = (cublasLtMatrixLayout_t) new lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete (lt_layout *)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    (void)l;
    int32_t v32 = 0;
    if ((attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && set_attr(&v32, buf, size) && v32 == 1) ||
        (attr == CUBLASLT_MATRIX_LAYOUT_ORDER && set_attr(&v32, buf, size) &&
         v32 == CUBLASLT_ORDER_COL))
        return CUBLAS_STATUS_SUCCESS;
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "matrix layout attribute %d (value %d) is not "
                  "emulated (column order, one batch)",
                  (int)attr, v32);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = (cublasLtMatmulPreference_t) new lt_pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete (lt_pref *)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    lt_pref *x = (lt_pref *)p;
    bool ok;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ok = set_attr(&x->workspace, buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
        uint32_t *a = &x->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES];
        ok = set_attr(a, buf, size) && *a && !(*a & (*a - 1));
        break;
    }
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute %d is not emulated",
                      (int)attr);
    }
    return ok ? CUBLAS_STATUS_SUCCESS
              : refuse(CUBLAS_STATUS_INVALID_VALUE,
                       "preference attribute %d: bad value or size "
                       "%zu",
                       (int)attr, size);
}

/* The one algorithm: it records the alignments it was chosen for (algo.data[0..3]). */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                              cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *found) {
    (void)h;
    *found = 0;
    const lt_desc *x = (const lt_desc *)d;
    const lt_layout *A = (const lt_layout *)la, *B = (const lt_layout *)lb,
                    *C = (const lt_layout *)lc, *D = (const lt_layout *)ld;
    if (requested < 1)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "requestedAlgoCount %d", requested);
    if (A->type != B->type)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A is %s and B %s: they must match",
                      type_name(A->type), type_name(B->type));
    if (C->type != D->type || (D->type != A->type && D->type != CUDA_R_32F))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "C %s / D %s with A and B %s: C and D must "
                      "match, as A's type or CUDA_R_32F",
                      type_name(C->type), type_name(D->type), type_name(A->type));
    const uint64_t m = D->rows, n = D->cols;
    const uint64_t am = x->ta == CUBLAS_OP_T ? A->cols : A->rows;
    const uint64_t k = x->ta == CUBLAS_OP_T ? A->rows : A->cols;
    const uint64_t bk = x->tb == CUBLAS_OP_T ? B->cols : B->rows;
    const uint64_t bn = x->tb == CUBLAS_OP_T ? B->rows : B->cols;
    if (am != m || bn != n || bk != k || C->rows != m || C->cols != n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "shapes disagree: op(A) %llux%llu, op(B) "
                      "%llux%llu, C %llux%llu, D %llux%llu",
                      (unsigned long long)am, (unsigned long long)k, (unsigned long long)bk,
                      (unsigned long long)bn, (unsigned long long)C->rows,
                      (unsigned long long)C->cols, (unsigned long long)m, (unsigned long long)n);
    if (uses_aux(x->epilogue) && (x->aux_ld < (int64_t)m || x->aux_ld % 8 != 0))
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "epilogue %u: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD %lld "
                      "must be divisible by 8 and at least D's %llu rows",
                      x->epilogue, (long long)x->aux_ld, (unsigned long long)m);
    if (bias_grad(x->epilogue)) {
        const int bt = x->bias_type < 0 ? (int)D->type : x->bias_type;
        if (bt != (int)D->type && bt != (int)A->type && bt != CUDA_R_32F)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "epilogue %s: a bias gradient of %s with A and B %s and D %s (D's "
                          "type, A's or CUDA_R_32F are emulated)",
                          epilogue_name(x->epilogue), type_name(bt), type_name(A->type),
                          type_name(D->type));
        if (no_algo_for(x->epilogue))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "epilogue %s: no algorithm (ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO)",
                          epilogue_name(x->epilogue));
    }
    const lt_pref *pr = (const lt_pref *)p;
    memset(&results[0], 0, sizeof results[0]);
    for (int i = 0; i < 4; i++)
        results[0].algo.data[i] = pr->align[i];
    results[0].algo.data[4] = pointer_alignment(x->bias);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *a, cublasLtMatrixLayout_t la, const void *b,
                              cublasLtMatrixLayout_t lb, const void *beta, const void *c,
                              cublasLtMatrixLayout_t lc, void *dp, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    (void)h;
    (void)workspace_bytes;
    const lt_desc x = *(const lt_desc *)d;
    const lt_layout A = *(const lt_layout *)la, B = *(const lt_layout *)lb,
                    C = *(const lt_layout *)lc, D = *(const lt_layout *)ld;
    if (!algo)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "no algorithm (the emulator needs the "
                                                   "heuristic's)");
    const void *ptrs[4] = {a, b, c, dp};
    const lt_layout *lays[4] = {&A, &B, &C, &D};
    static const char names[] = "ABCD";
    const float fa = *(const float *)alpha, fb = *(const float *)beta;
    for (int i = 0; i < 4; i++) {
        if (i == 2 && fb == 0.0f)
            continue; /* C is not read */
        uint64_t want = algo->data[i];
        if ((uintptr_t)ptrs[i] % want)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "matrix %c at %p is not %llu-byte aligned, "
                          "as its algorithm was chosen for "
                          "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)",
                          names[i], ptrs[i], (unsigned long long)want, names[i]);
        if (!dev_contains(ptrs[i], span(lays[i])))
            return refuse(CUBLAS_STATUS_INVALID_VALUE,
                          "matrix %c at %p (%zu bytes) is not inside "
                          "one device allocation",
                          names[i], ptrs[i], span(lays[i]));
    }
    const cudaDataType_t bias_type = x.bias_type < 0 ? D.type : (cudaDataType_t)x.bias_type;
    if (uses_aux(x.epilogue)) {
        const size_t aux_span =
            D.cols ? ((D.cols - 1) * (size_t)x.aux_ld + D.rows) * type_size(D.type) : 0;
        if (x.aux_ld < (int64_t)D.rows || x.aux_ld % 8 != 0)
            return refuse(CUBLAS_STATUS_INVALID_VALUE,
                          "epilogue %u: EPILOGUE_AUX_LD %lld is not divisible by 8 "
                          "or below D's %llu rows",
                          x.epilogue, (long long)x.aux_ld, (unsigned long long)D.rows);
        if (!dev_contains(x.aux, aux_span))
            return refuse(CUBLAS_STATUS_INVALID_VALUE,
                          "epilogue %u: the auxiliary matrix at %p (%zu bytes) is not "
                          "inside one device allocation",
                          x.epilogue, x.aux, aux_span);
    }
    const bool bgrad = bias_grad(x.epilogue);
    const uint64_t bias_n = x.epilogue == CUBLASLT_EPILOGUE_BGRADB ? D.cols : D.rows;
    if (uses_bias(x.epilogue) || bgrad) {
        if (algo->data[4] && (uintptr_t)x.bias % algo->data[4])
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "the bias at %p is not %llu-byte aligned, as its algorithm was "
                          "chosen for (the bias pointer's alignment when the heuristic ran)",
                          x.bias, (unsigned long long)algo->data[4]);
        if (!dev_contains(x.bias, bias_n * type_size(bias_type)))
            return refuse(CUBLAS_STATUS_INVALID_VALUE,
                          "bias at %p (%llu of %s) is not inside one "
                          "device allocation",
                          x.bias, (unsigned long long)bias_n, type_name(bias_type));
    }
    if (bgrad && fa != 1.0f)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "epilogue %s with alpha %g: whether alpha scales the bias gradient is "
                      "not documented, so only alpha 1 is emulated",
                      epilogue_name(x.epilogue), fa);
    (void)workspace;
    cudaError_t e = enqueue(stream, "cublasLtMatmul", [=](std::string &) {
        const uint64_t m = D.rows, n = D.cols;
        const uint64_t k = x.ta == CUBLAS_OP_T ? A.rows : A.cols;
        /* op(A) · op(B) in fp32, each sum in order of p as the header says (the tiles only let
         * independent sums share vector lanes; -ffp-contract=off keeps each product rounded). */
        std::vector<float> prod(m * n);
        product_f32(m, n, k, [&](uint64_t i, uint64_t p) {
            return load(A.type, a, x.ta == CUBLAS_OP_T ? p + i * A.ld : i + p * A.ld);
        }, [&](uint64_t p, uint64_t j) {
            return load(B.type, b, x.tb == CUBLAS_OP_T ? j + p * B.ld : p + j * B.ld);
        }, prod.data());
        for (uint64_t j = 0; j < n; j++) {
            for (uint64_t i = 0; i < m; i++) {
                float v = fa * prod[i + j * m];
                if (fb != 0.0f)
                    v += fb * load(C.type, c, i + j * C.ld);
                if (uses_bias(x.epilogue))
                    v += load(bias_type, x.bias, i);
                if (x.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                    store(D.type, x.aux, i + j * x.aux_ld, v);
                    v = gelu(v);
                } else if (x.epilogue == CUBLASLT_EPILOGUE_DGELU) {
                    v *= gelu_grad(load(D.type, x.aux, i + j * x.aux_ld));
                }
                store(D.type, dp, i + j * D.ld, v);
            }
        }
        /* The bias gradient: op(A)'s rows or op(B)'s columns summed over k, in order of p. */
        if (bgrad) {
            for (uint64_t r = 0; r < bias_n; r++) {
                float acc = 0.0f;
                for (uint64_t p = 0; p < k; p++) {
                    if (x.epilogue == CUBLASLT_EPILOGUE_BGRADA)
                        acc += load(A.type, a, x.ta == CUBLAS_OP_T ? p + r * A.ld : r + p * A.ld);
                    else
                        acc += load(B.type, b, x.tb == CUBLAS_OP_T ? r + p * B.ld : p + r * B.ld);
                }
                store(bias_type, (void *)x.bias, r, acc);
            }
        }
        return cudaSuccess;
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                            : refuse(CUBLAS_STATUS_EXECUTION_FAILED, "%s", cudaGetErrorString(e));
}

} /* extern "C" */
