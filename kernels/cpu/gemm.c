/* The CPU backend's matrix products (see gemm.h): OpenBLAS or oneDNN for fp32, oneDNN's matmul
 * primitive for bf16 operands. */
#include "gemm.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "ztrain/status.h"

#ifdef ZT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

static const char *const lib_names[] = {"openblas", "onednn"};

const char *zt_cpu_gemm_lib_name(zt_gemm_lib lib) { return lib_names[lib]; }

static zt_gemm_lib chosen_lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

#ifdef ZT_HAVE_ONEDNN
#define LIBS_BUILT "openblas, onednn"
#else
#define LIBS_BUILT "openblas"
#endif

zt_status zt_cpu_gemm_check_env(void) {
    const char *want = getenv("ZTRAIN_GEMM");
    if (want && *want) {
#ifndef ZT_HAVE_ONEDNN
        if (strcmp(want, "onednn") == 0)
            return zt_error(ZT_ERR_INVALID,
                            "ZTRAIN_GEMM=onednn: this build has no oneDNN (it was built without "
                            "libdnnl-dev); the accepted values here are: " LIBS_BUILT);
#endif
        if (strcmp(want, "openblas") != 0 && strcmp(want, "onednn") != 0)
            return zt_error(ZT_ERR_INVALID,
                            "ZTRAIN_GEMM='%s' names no matrix library; the accepted values are: "
                            LIBS_BUILT,
                            want);
    }
    want = getenv("ZTRAIN_GEMM_BF16");
    if (want && *want && strcmp(want, "on") != 0 && strcmp(want, "off") != 0)
        return zt_error(ZT_ERR_INVALID,
                        "ZTRAIN_GEMM_BF16='%s' is neither of the accepted values on and off", want);
    return ZT_OK;
}

/* A value zt_cpu_gemm_check_env refuses leaves the default here: the CPU backend refuses to be
 * created with it, so no job computes with it. */
static void choose_lib(void) {
#ifdef ZT_HAVE_ONEDNN
    chosen_lib = ZT_GEMM_ONEDNN;
#else
    chosen_lib = ZT_GEMM_OPENBLAS;
#endif
    const char *want = getenv("ZTRAIN_GEMM");
    if (!want || !*want)
        return;
    if (strcmp(want, "openblas") == 0)
        chosen_lib = ZT_GEMM_OPENBLAS;
#ifdef ZT_HAVE_ONEDNN
    else if (strcmp(want, "onednn") == 0)
        chosen_lib = ZT_GEMM_ONEDNN;
#endif
}

zt_gemm_lib zt_cpu_gemm_lib(void) {
    pthread_once(&lib_once, choose_lib);
    return chosen_lib;
}

void zt_cpu_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0)
        return;
#ifdef ZT_HAVE_ONEDNN
    if (zt_cpu_gemm_lib() == ZT_GEMM_ONEDNN) {
        dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                                      lda, B, ldb, beta, C, ldc);
        ZT_ASSERT(st == dnnl_success);
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void zt_cpu_gemm_warm(void) {
    if (zt_cpu_gemm_lib() != ZT_GEMM_ONEDNN)
        return;
    /* Small and larger blocks, a row and a column: oneDNN's small, blocked, matrix-vector and
     * thin paths. */
    static const int dims[][3] = {{16, 16, 16}, {64, 64, 64}, {1, 64, 64}, {64, 1, 64},
                                  {256, 64, 256}};
    enum { MAX = 256 * 256 };
    float *a = calloc(MAX, sizeof *a), *b = calloc(MAX, sizeof *b), *c = calloc(MAX, sizeof *c);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return;
    }
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int t = 0; t < 4; t++)
            for (int beta = 0; beta < 2; beta++) {
                int M = dims[d][0], N = dims[d][1], K = dims[d][2];
                bool ta = t & 1, tb = t >> 1;
                zt_cpu_sgemm(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, (float)beta, c,
                             N);
            }
    free(a), free(b), free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* bf16 products                                                                                */

#ifdef ZT_HAVE_ONEDNN

static bool bf16_on;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

static void choose_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    bool native = __builtin_cpu_supports("avx512bf16");
#else
    bool native = false;
#endif
    /* AMX is enabled per process by the kernel and hidden by some hypervisors even where the
     * silicon has it; oneDNN asks for it and reports the ISA it got, so ask oneDNN. */
    bool amx = dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core_amx;
    bf16_on = native && amx;
    const char *want = getenv("ZTRAIN_GEMM_BF16");
    if (want && strcmp(want, "on") == 0)
        bf16_on = native;
    else if (want && strcmp(want, "off") == 0)
        bf16_on = false;
}

bool zt_cpu_gemm_bf16_enabled(void) {
    pthread_once(&bf16_once, choose_bf16);
    return bf16_on;
}

/* One matmul primitive per shape (a model has a handful), made on first use; NULL when the table
 * is full. */
typedef struct {
    int M, N, K, ldc;
    bool ta, tb, accumulate;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a, b, c;
} bf16_plan;

enum { MAX_PLANS = 64 };
static bf16_plan plans[MAX_PLANS];
static int n_plans;
static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;

#define DNNL_OK(call) ZT_ASSERT((call) == dnnl_success)

/* The operands are packed into dense bf16 copies (rows × cols of what is stored), so a plan
 * describes them with dense strides; transposition is a stride order. */
static void desc_of(dnnl_memory_desc_t *d, int rows, int cols, bool trans, dnnl_data_type_t t) {
    dnnl_dims_t dims = {trans ? cols : rows, trans ? rows : cols};
    dnnl_dims_t strides = {trans ? 1 : cols, trans ? cols : 1};
    DNNL_OK(dnnl_memory_desc_init_by_strides(d, 2, dims, t, strides));
}

static bf16_plan *plan_for(bool ta, bool tb, int M, int N, int K, int ldc, bool accumulate) {
    pthread_mutex_lock(&plans_lock);
    for (int i = 0; i < n_plans; i++) {
        bf16_plan *p = &plans[i];
        if (p->M == M && p->N == N && p->K == K && p->ta == ta && p->tb == tb &&
            p->ldc == ldc && p->accumulate == accumulate) {
            pthread_mutex_unlock(&plans_lock);
            return p;
        }
    }
    if (!engine) {
        DNNL_OK(dnnl_engine_create(&engine, dnnl_cpu, 0));
        DNNL_OK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    }
    if (n_plans == MAX_PLANS) {
        /* More shapes than a model has: this one goes to the fp32 product. */
        pthread_mutex_unlock(&plans_lock);
        return NULL;
    }
    bf16_plan *p = &plans[n_plans];
    *p = (bf16_plan){.M = M, .N = N, .K = K, .ldc = ldc, .ta = ta, .tb = tb,
                     .accumulate = accumulate};
    desc_of(&p->a, ta ? K : M, ta ? M : K, ta, dnnl_bf16);
    desc_of(&p->b, tb ? N : K, tb ? K : N, tb, dnnl_bf16);
    dnnl_dims_t cd = {M, N}, cs = {ldc, 1};
    DNNL_OK(dnnl_memory_desc_init_by_strides(&p->c, 2, cd, dnnl_f32, cs));
    dnnl_matmul_desc_t md;
    DNNL_OK(dnnl_matmul_desc_init(&md, &p->a, &p->b, NULL, &p->c));
    dnnl_primitive_attr_t attr;
    DNNL_OK(dnnl_primitive_attr_create(&attr));
    if (accumulate) {
        dnnl_post_ops_t po;
        DNNL_OK(dnnl_post_ops_create(&po));
        DNNL_OK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL));
    DNNL_OK(dnnl_primitive_create(&p->prim, pd));
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    n_plans++;
    pthread_mutex_unlock(&plans_lock);
    return p;
}

/* Per-thread staging for the bf16 copies of the operands, grown to the largest product once.
 * It belongs to the calling thread (products run on several: the trainer's, ZeRO's comm
 * thread, a pipeline stage's) and is freed when that thread exits, through the key's destructor
 * (a _Thread_local pointer would leak each exited thread's buffers). */
typedef struct {
    uint16_t *buf[2];
    size_t cap[2];
} bf16_stage;

static pthread_key_t stage_key;
static pthread_once_t stage_once = PTHREAD_ONCE_INIT;
static bool stage_key_ok;

static void stage_free(void *p) {
    bf16_stage *s = p;
    free(s->buf[0]);
    free(s->buf[1]);
    free(s);
}

static void stage_key_create(void) { stage_key_ok = pthread_key_create(&stage_key, stage_free) == 0; }

/* This thread's staging buffer `which` with room for n values; NULL when memory is short (the
 * caller then leaves the product to OpenBLAS). */
static uint16_t *stage_for(int which, size_t n) {
    pthread_once(&stage_once, stage_key_create);
    if (!stage_key_ok)
        return NULL;
    bf16_stage *s = pthread_getspecific(stage_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(stage_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->cap[which]) {
        uint16_t *grown = malloc(n * sizeof *grown);
        if (!grown)
            return NULL;
        free(s->buf[which]);
        s->buf[which] = grown;
        s->cap[which] = n;
    }
    return s->buf[which];
}

static void pack_bf16(uint16_t *dst, const float *x, int rows, int cols, int ld) {
    size_t n = (size_t)rows * cols;
#pragma omp parallel for if (n > 65536)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)r * cols + c] = bf16_from_f32(f32_bits(x[(size_t)r * ld + c]));
}

bool zt_cpu_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
    if (!zt_cpu_gemm_bf16_enabled() || (beta != 0.0f && beta != 1.0f))
        return false;
    if (M <= 0 || N <= 0)
        return true;
    bf16_plan *p = plan_for(trans_a, trans_b, M, N, K, ldc, beta != 0.0f);
    if (!p)
        return false;
    uint16_t *a16 = stage_for(0, (size_t)M * K), *b16 = stage_for(1, (size_t)K * N);
    if (!a16 || !b16)
        return false;
    pack_bf16(a16, A, trans_a ? K : M, trans_a ? M : K, lda);
    pack_bf16(b16, B, trans_b ? N : K, trans_b ? K : N, ldb);
    dnnl_memory_t am, bm, cm;
    DNNL_OK(dnnl_memory_create(&am, &p->a, engine, a16));
    DNNL_OK(dnnl_memory_create(&bm, &p->b, engine, b16));
    DNNL_OK(dnnl_memory_create(&cm, &p->c, engine, C));
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    DNNL_OK(dnnl_primitive_execute(p->prim, stream, 3, args));
    DNNL_OK(dnnl_stream_wait(stream));
    dnnl_memory_destroy(am);
    dnnl_memory_destroy(bm);
    dnnl_memory_destroy(cm);
    return true;
}

#else /* no oneDNN in this build */

bool zt_cpu_gemm_bf16_enabled(void) { return false; }

bool zt_cpu_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    return false;
}

#endif
