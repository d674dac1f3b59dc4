/* The CPU backend's matrix products: one call for every fp32 product the kernels make, routed at
 * run time to the library that runs fastest on this CPU, and a bf16 product for the bf16 jobs of
 * CPUs whose matrix units make 16-bit products pay.
 *
 * Why a choice at all: Debian's OpenBLAS picks its kernels by the CPU's family and model number,
 * and a model it does not know (Emerald Rapids, model 207, under 0.3.21) gets its oldest x86-64
 * kernels (SSE3, "Prescott"), about a fifth of the machine's speed, unless OPENBLAS_CORETYPE is set
 * before the library loads. oneDNN (Debian's libdnnl) generates its kernels for the instruction
 * sets the CPU reports (AVX2, AVX-512, AVX512_BF16, AMX), whatever its model. */
#ifndef ZTRAIN_CPU_GEMM_H
#define ZTRAIN_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

typedef enum {
    ZT_GEMM_OPENBLAS = 0, /* cblas_sgemm of the OpenMP build of OpenBLAS */
    ZT_GEMM_ONEDNN,       /* dnnl_sgemm (only when built with oneDNN) */
} zt_gemm_lib;

/* The library the fp32 products go to: oneDNN when this build has it, else OpenBLAS; the
 * environment variable ZTRAIN_GEMM ("openblas" or "onednn") forces one (how tests and benchmarks
 * compare them). Decided on the first call. */
zt_gemm_lib zt_cpu_gemm_lib(void);
const char *zt_cpu_gemm_lib_name(zt_gemm_lib lib);

/* Checks the environment variables of this file, ZTRAIN_GEMM and ZTRAIN_GEMM_BF16, as they are
 * now: ZT_OK when each is unset, empty or one of its accepted values that this build can honour;
 * else ZT_ERR_INVALID with a message naming the variable, its value and the accepted values. The
 * CPU backend refuses to be created when this fails (zt_backend_cpu_create), so a misspelt
 * library never trains a job on the default one. */
zt_status zt_cpu_gemm_check_env(void);

/* Makes the library generate the kernels of every transposition and beta now (oneDNN compiles
 * its kernels on first use, tens of milliseconds on a busy machine), so that a job's first step
 * costs what the others do: the slow-rank rule compares ranks from step 1 on. Called when the CPU
 * backend is created; products from a few sizes, nothing kept. */
void zt_cpu_gemm_warm(void);

/* C = alpha·op(A)·op(B) + beta·C, row-major, op(X) = Xᵀ when its flag is set; op(A) is M×K, op(B)
 * K×N; lda, ldb, ldc are row strides in floats. Inside an OpenMP parallel region it runs on the
 * calling thread alone; outside it uses the OpenMP threads. */
void zt_cpu_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* Whether the bf16 product below runs on native bf16 matrix instructions and is chosen for bf16
 * jobs: on CPUs with AMX-BF16 by default (where it is several times the fp32 rate); on AVX512_BF16
 * alone it is not (Intel issues VDPBF16PS on one port against two for FMA, so it does no more
 * floating-point work per cycle than fp32, and the conversions cost on top: measured slower here,
 * see bench/README.md). ZTRAIN_GEMM_BF16 ("on" or "off") overrides, where the CPU has AVX512_BF16
 * and the build oneDNN. */
bool zt_cpu_gemm_bf16_enabled(void);

/* The same product for operands whose values are bf16 numbers held in fp32 (a bf16 job's
 * activations, gradients and working weights): each operand is converted to bf16 (exactly, for such
 * values) and multiplied with fp32 accumulation; C stays fp32. Returns false, computing nothing,
 * when the build or CPU cannot, or the calling thread's staging cannot grow (callers then use
 * zt_cpu_sgemm). */
bool zt_cpu_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc);

#endif
