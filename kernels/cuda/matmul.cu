/* cuBLASLt products with their plans cached: creating a matmul descriptor, four layouts and a
 * preference, and asking cublasLtMatmulAlgoGetHeuristic for an algorithm, costs host time on
 * every call (tens of microseconds for the heuristic) while a training step repeats the same few
 * shapes every layer. So each distinct shape — transposes, sizes, leading dimensions, types,
 * epilogue, and the pointer alignments the algorithm is chosen for — gets a plan once, kept in a
 * small table of the backend; later calls set only the pointers the epilogue reads and run the
 * plan's algorithm. The first step fills the table, later steps query nothing. A shape whose
 * epilogue cuBLASLt refuses (zt_cuda_gemm_try) keeps that answer in its slot the same way. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.cuh"

/* Plans a backend keeps: GPT-2 or Llama use a dozen shapes per micro-batch size (forward and two
 * backward products per linear layer, the head), evaluation a dozen more; when the table is full
 * the oldest plan makes room. */
enum { ZT_MATMUL_PLANS = 64 };

/* What a plan is valid for; compared with memcmp, so always built from a zeroed struct. */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldd, ab_type, cd_type, epilogue, aux_ld;
    uint32_t align[6]; /* A, B, C, D, bias, aux */
} plan_key;

typedef struct {
    plan_key key;
    bool refused; /* cuBLASLt has no algorithm for the key (zt_cuda_gemm_try): nothing else set */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

struct zt_cuda_matmul_plans {
    /* Held across lookup, pointer attributes and the matmul's enqueue: a plan's descriptor is
     * shared, and its pointers are set per call. */
    pthread_mutex_t lock;
    int used, next; /* plans filled; the slot the next new plan evicts once full */
    plan p[ZT_MATMUL_PLANS];
    unsigned long long lookups, heuristics, gelu_products;
};

/* The alignment of p that cuBLASLt may assume: the largest power of two dividing its address, up
 * to the 256 bytes cuBLASLt assumes when told nothing. Activations are slices of larger buffers
 * at any element offset, so the preference declares what each call really has; otherwise an
 * algorithm chosen for 256-byte alignment would read them misaligned. */
static uint32_t alignment_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uintptr_t low = a & (~a + 1);
    return a == 0 || low > 256 ? 256u : (uint32_t)low;
}

static void plan_destroy(plan *p) {
    if (p->lc)
        cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

static bool bias_grad(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}

/* The pointers an epilogue reads or writes, set on the plan's descriptor before every use (and
 * before the heuristic, which takes their alignment from them). */
static void set_pointers(zt_backend *be, cublasLtMatmulDesc_t op, const zt_gemm *g) {
    if (g->epilogue == CUBLASLT_EPILOGUE_BIAS || g->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &g->bias, sizeof g->bias));
    if (bias_grad(g->epilogue))
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &g->dbias, sizeof g->dbias));
    if (g->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || g->epilogue == CUBLASLT_EPILOGUE_DGELU)
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(
                                op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                sizeof g->aux));
}

/* A new plan for g into p, or false after recording why there is none. With may_refuse, a
 * heuristic that answers NOT_SUPPORTED or finds nothing is not recorded: p is then a refused
 * plan (its key and the flag) and the answer is still false. */
static bool plan_create(const zt_ctx *x, plan *p, const plan_key *key, const zt_gemm *g,
                        bool may_refuse) {
    zt_backend *be = x->be;
    zt_cuda_state *st = zt_cuda_of(x);
    memset(p, 0, sizeof *p);
    p->key = *key;
    cublasOperation_t ta = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = g->epilogue;
    int64_t aux_ld = g->aux_ld;
    cublasLtMatmulPreference_t pref = NULL;
    bool refused = false;
    ZT_CUBLAS_CHECK(be, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (!p->op)
        return false;
    ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                       sizeof ta));
    ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                       sizeof tb));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                           &epi, sizeof epi));
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU)
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(
                                p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                sizeof aux_ld));
    if (bias_grad(epi)) {
        const int32_t f32 = CUDA_R_32F;
        ZT_CUBLAS_CHECK(be, cublasLtMatmulDescSetAttribute(
                                p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32, sizeof f32));
    }
    set_pointers(be, p->op, g);
    ZT_CUBLAS_CHECK(be, cublasLtMatrixLayoutCreate(&p->la, g->ab_type, g->ta ? g->k : g->m,
                                                   g->ta ? g->m : g->k, g->lda));
    ZT_CUBLAS_CHECK(be, cublasLtMatrixLayoutCreate(&p->lb, g->ab_type, g->tb ? g->n : g->k,
                                                   g->tb ? g->k : g->n, g->ldb));
    ZT_CUBLAS_CHECK(be, cublasLtMatrixLayoutCreate(&p->lc, g->cd_type, g->m, g->n, g->ldd));
    ZT_CUBLAS_CHECK(be, cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ZT_CUDA_CUBLAS_WORKSPACE;
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    bool ok = p->la && p->lb && p->lc && pref;
    if (ok) {
        ZT_CUBLAS_CHECK(be, cublasLtMatmulPreferenceSetAttribute(
                                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        for (int i = 0; i < 4; i++)
            ZT_CUBLAS_CHECK(be, cublasLtMatmulPreferenceSetAttribute(
                                    pref, align_attr[i], &key->align[i], sizeof key->align[i]));
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        st->plans->heuristics++;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->lt, p->op, p->la, p->lb, p->lc,
                                                           p->lc, pref, 1, &heur, &found);
        if (may_refuse && (hs == CUBLAS_STATUS_NOT_SUPPORTED ||
                           (hs == CUBLAS_STATUS_SUCCESS && found != 1))) {
            refused = true;
        } else {
            if (hs != CUBLAS_STATUS_SUCCESS)
                zt_cuda_fail(be, "cuBLASLt", "cublasLtMatmulAlgoGetHeuristic",
                             cublasLtGetStatusString(hs), __FILE__, __LINE__);
            else if (found != 1)
                zt_cuda_fail(be, "cuBLASLt", "cublasLtMatmulAlgoGetHeuristic",
                             "no algorithm for the shape", __FILE__, __LINE__);
        }
        if (hs == CUBLAS_STATUS_SUCCESS && found == 1)
            p->algo = heur.algo;
        ok = hs == CUBLAS_STATUS_SUCCESS && found == 1;
    }
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (!ok)
        plan_destroy(p);
    if (refused) {
        p->key = *key;
        p->refused = true;
    }
    return ok;
}

static struct zt_cuda_matmul_plans *plans_of(zt_cuda_state *st) {
    /* Made on the first product, under the lock that guards first errors (the table's own lock
     * does not exist yet); freed by zt_cuda_matmul_plans_free at the backend's end. */
    pthread_mutex_lock(&st->lock);
    if (!st->plans) {
        struct zt_cuda_matmul_plans *t =
            (struct zt_cuda_matmul_plans *)calloc(1, sizeof(struct zt_cuda_matmul_plans));
        if (t) {
            pthread_mutex_init(&t->lock, NULL);
            st->plans = t;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return st->plans;
}

/* zt_cuda_gemm, and zt_cuda_gemm_try with may_refuse: false only for a refused plan. */
static bool gemm(const zt_ctx *x, const zt_gemm *g, bool may_refuse) {
    if (g->m == 0 || g->n == 0)
        return true;
    zt_backend *be = x->be;
    zt_cuda_state *st = zt_cuda_of(x);
    struct zt_cuda_matmul_plans *t = plans_of(st);
    if (!t) {
        zt_cuda_fail(be, "CUDA", "zt_cuda_gemm", "out of host memory for the matmul plans",
                     __FILE__, __LINE__);
        return true;
    }
    plan_key key;
    memset(&key, 0, sizeof key);
    key.ta = g->ta;
    key.tb = g->tb;
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.lda = g->lda;
    key.ldb = g->ldb;
    key.ldd = g->ldd;
    key.ab_type = g->ab_type;
    key.cd_type = g->cd_type;
    key.epilogue = g->epilogue;
    key.aux_ld = g->aux_ld;
    const void *c = g->c ? g->c : g->d;
    const void *ptrs[6] = {g->a, g->b, c, g->d, g->bias ? g->bias : g->dbias, g->aux};
    for (int i = 0; i < 6; i++)
        key.align[i] = alignment_of(ptrs[i]);
    const float alpha = 1.0f, beta = g->beta;

    if (!zt_cuda_on_compute(x, "a matmul"))
        return true; /* failed, recorded: not a refusal to fall back from */
    pthread_mutex_lock(&t->lock);
    t->lookups++;
    plan *p = NULL;
    for (int i = 0; i < t->used && !p; i++)
        if (!memcmp(&t->p[i].key, &key, sizeof key))
            p = &t->p[i];
    if (p && p->refused) {
        pthread_mutex_unlock(&t->lock);
        return false;
    }
    bool refused = false;
    if (!p) {
        /* A failed plan leaves its slot zeroed, which no key matches (alignments are >= 1); a
         * refused one keeps its key, so that the refusal is remembered. */
        int slot = t->used < ZT_MATMUL_PLANS ? t->used : t->next;
        plan_destroy(&t->p[slot]);
        bool made = plan_create(x, &t->p[slot], &key, g, may_refuse);
        refused = t->p[slot].refused;
        if (made || refused) {
            p = made ? &t->p[slot] : NULL;
            if (t->used < ZT_MATMUL_PLANS)
                t->used++;
            else
                t->next = (t->next + 1) % ZT_MATMUL_PLANS;
        }
    } else {
        set_pointers(be, p->op, g);
    }
    if (p && (g->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
              g->epilogue == CUBLASLT_EPILOGUE_DGELU))
        t->gelu_products++;
    if (p)
        ZT_CUBLAS_CHECK(be, cublasLtMatmul(st->lt, p->op, &alpha, g->a, p->la, g->b, p->lb, &beta,
                                           c, p->lc, g->d, p->lc, &p->algo, st->lt_workspace,
                                           ZT_CUDA_CUBLAS_WORKSPACE, zt_cuda_stream(x)));
    pthread_mutex_unlock(&t->lock);
    return !refused;
}

void zt_cuda_gemm(const zt_ctx *x, const zt_gemm *g) { gemm(x, g, false); }

bool zt_cuda_gemm_try(const zt_ctx *x, const zt_gemm *g) { return gemm(x, g, true); }

extern "C" void zt_cuda_matmul_plans_free(zt_cuda_state *st) {
    struct zt_cuda_matmul_plans *t = st->plans;
    if (!t)
        return;
    for (int i = 0; i < t->used; i++)
        plan_destroy(&t->p[i]);
    pthread_mutex_destroy(&t->lock);
    free(t);
    st->plans = NULL;
}

extern "C" void zt_cuda_matmul_counts(zt_backend *be, unsigned long long *products,
                                      unsigned long long *heuristics,
                                      unsigned long long *gelu_products) {
    zt_cuda_state *st = (zt_cuda_state *)be->impl;
    struct zt_cuda_matmul_plans *t = st->plans;
    if (t)
        pthread_mutex_lock(&t->lock);
    *products = t ? t->lookups : 0;
    *heuristics = t ? t->heuristics : 0;
    *gelu_products = t ? t->gelu_products : 0;
    if (t)
        pthread_mutex_unlock(&t->lock);
}
