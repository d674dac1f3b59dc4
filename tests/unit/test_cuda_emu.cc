/* The emulated CUDA device's strictness (kernels/cuda/emu/): kernels broken on purpose the ways
 * a GPU punishes — a missing __syncthreads, an off-by-one index, a host read of an asynchronous
 * copy before the sync, a host dereference of device memory, a launch of 2,048 threads, a barrier
 * in divergent code, threads at two different barriers, a shuffle naming absent lanes, too much
 * dynamic shared memory, a host pointer handed to a kernel, a misaligned cuBLASLt operand — each
 * seen caught, beside the same kernels written correctly, whose results are checked against plain
 * loops; and CUDA_VISIBLE_DEVICES honoured as the CUDA runtime honours it.
 *
 * A fault on a GPU is sticky for the process, and on the emulator too, so every case runs in a
 * child process of its own; the parent reads its exit status and what it wrote to stderr.
 * Built by the host compiler with emu_device.h force-included, as the module's kernels are. */
#include <cublasLt.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "emu_child.h"

static int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "expectation failed at %s:%d: ", __FILE__, __LINE__);                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- kernels --------------------------------------------------------------------------------- */

/* out = in reversed through shared memory; `barrier` false leaves out the __syncthreads. */
__global__ void reverse_kernel(float *out, const float *in, int n, bool barrier) {
    __shared__ float s[256];
    int i = threadIdx.x;
    s[i] = in[i];
    if (barrier)
        __syncthreads();
    out[i] = s[n - 1 - i];
}

/* out[i] = 2·in[i] for i < n, or for i <= n with off_by_one. */
__global__ void twice_kernel(float *out, const float *in, int n, bool off_by_one) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n || (off_by_one && i == n))
        out[i] = 2.0f * (i < n ? in[i] : 0.0f);
}

/* Per block: the sum by shuffles inside warps and shared memory across them, and the count of
 * positive inputs by atomics and by a ballot. */
__global__ void reduce_kernel(float *sums, int *positives, int *ballots, const float *in) {
    __shared__ float warp_sums[32];
    const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    float v = in[i];
    unsigned b = __ballot_sync(0xFFFFFFFFu, v > 0.0f);
    if (v > 0.0f)
        atomicAdd(positives + blockIdx.x, 1);
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    if (lane == 0) {
        warp_sums[threadIdx.x / 32] = v;
        atomicAdd(ballots + blockIdx.x, __popc(b));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (unsigned w = 0; w < blockDim.x / 32; w++)
            t += warp_sums[w];
        sums[blockIdx.x] = t;
    }
}

__global__ void divergent_barrier_kernel(float *out) {
    if (threadIdx.x < 16)
        __syncthreads();
    out[threadIdx.x] = 1.0f;
}

/* Half the block waits at one __syncthreads, half at another: a GPU would hang or misbehave. */
__global__ void two_barriers_kernel(float *out) {
    if (threadIdx.x % 2 == 0)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void full_mask_shuffle_kernel(float *out) {
    out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, (float)threadIdx.x, 1);
}

__global__ void dyn_smem_kernel(float *out, int n) {
    ZT_DYN_SHARED(float, buf);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        buf[i] = (float)i;
    __syncthreads();
    out[threadIdx.x] = buf[n - 1 - threadIdx.x];
}

__global__ void nothing_kernel(float *out) { out[threadIdx.x] = 0.0f; }

/* A 16-byte load (a float4, as cuda_common.cuh's chunks are moved) at element Off of out, stored
 * back 16 bytes at element StoreOff: Off and StoreOff multiples of 4 are aligned, any other
 * faults on a GPU (a slice at an odd element, a tensor-parallel shard of an odd width). */
template <int Off, int StoreOff> __global__ void vec_copy_kernel(float *out) {
    if (threadIdx.x != 0)
        return;
    float4 v = *ZT_VEC_AT(const float4, out + Off);
    *ZT_VEC_AT(float4, out + StoreOff) = v;
}


/* ---- helpers --------------------------------------------------------------------------------- */

static float *dev_from(const float *host, size_t n) {
    float *d = nullptr;
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess)
        return nullptr;
    cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice);
    return d;
}

static bool says(cudaError_t e, const char *part) {
    return strstr(cudaGetErrorString(e), part) != nullptr;
}

/* ---- cases: each returns 0 when what it expects happened ------------------------------------- */

static int case_correct_kernels() {
    float in[256], out[256];
    for (int i = 0; i < 256; i++)
        in[i] = (float)(i % 7) - 3.0f;
    float *d_in = dev_from(in, 256), *d_out = nullptr;
    cudaMalloc(&d_out, sizeof out);
    ZT_LAUNCH(reverse_kernel, 1, 256, 0, nullptr, d_out, d_in, 256, true);
    EXPECT(cudaGetLastError() == cudaSuccess, "launch");
    EXPECT(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess, "%s",
           cudaGetErrorString(cudaGetLastError()));
    for (int i = 0; i < 256; i++)
        EXPECT(out[i] == in[255 - i], "reverse[%d] = %g, want %g", i, out[i], in[255 - i]);

    float *sums;
    int *pos, *bal;
    cudaMalloc(&sums, 2 * sizeof(float));
    cudaMalloc(&pos, 2 * sizeof(int));
    cudaMalloc(&bal, 2 * sizeof(int));
    cudaMemset(pos, 0, 2 * sizeof(int));
    cudaMemset(bal, 0, 2 * sizeof(int));
    ZT_LAUNCH(reduce_kernel, 2, 128, 0, nullptr, sums, pos, bal, d_in);
    float h_sums[2];
    int h_pos[2], h_bal[2];
    cudaMemcpy(h_sums, sums, sizeof h_sums, cudaMemcpyDeviceToHost);
    cudaMemcpy(h_pos, pos, sizeof h_pos, cudaMemcpyDeviceToHost);
    EXPECT(cudaMemcpy(h_bal, bal, sizeof h_bal, cudaMemcpyDeviceToHost) == cudaSuccess, "%s",
           cudaGetErrorString(cudaGetLastError()));
    for (int b = 0; b < 2; b++) {
        float want = 0.0f;
        int want_pos = 0;
        for (int i = b * 128; i < (b + 1) * 128; i++)
            want += in[i], want_pos += in[i] > 0.0f;
        EXPECT(h_sums[b] == want, "block %d sum %g, want %g", b, h_sums[b], want);
        EXPECT(h_pos[b] == want_pos && h_bal[b] == want_pos,
               "block %d: %d positives by atomics, "
               "%d by ballots, want %d",
               b, h_pos[b], h_bal[b], want_pos);
    }

    /* 64 KiB of dynamic shared memory runs once opted in. */
    const int n = 16384;
    EXPECT(cudaFuncSetAttribute((const void *)dyn_smem_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4) == cudaSuccess,
           "opt-in");
    ZT_LAUNCH(dyn_smem_kernel, 1, 256, n * sizeof(float), nullptr, d_out, n);
    EXPECT(cudaGetLastError() == cudaSuccess, "opted-in launch refused");
    EXPECT(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess, "%s",
           cudaGetErrorString(cudaGetLastError()));
    for (int i = 0; i < 256; i++)
        EXPECT(out[i] == (float)(n - 1 - i), "dyn smem [%d] = %g", i, out[i]);
    return 0;
}

static int case_missing_barrier() {
    float in[256];
    for (int i = 0; i < 256; i++)
        in[i] = (float)i;
    float *d_in = dev_from(in, 256), *d_out;
    cudaMalloc(&d_out, sizeof in);
    ZT_LAUNCH(reverse_kernel, 1, 256, 0, nullptr, d_out, d_in, 256, false);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaErrorLaunchFailure && says(e, "descending order") && says(e, "reverse_kernel"),
           "a missing __syncthreads went unseen: %s", cudaGetErrorString(e));
    return 0;
}

static int case_off_by_one() {
    float in[100] = {0};
    float *d_in = dev_from(in, 100), *d_out;
    cudaMalloc(&d_out, sizeof in);
    ZT_LAUNCH(twice_kernel, 1, 128, 0, nullptr, d_out, d_in, 100, true);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaErrorIllegalAddress && says(e, "past the end of allocation"),
           "a write one past the end went unseen: %s", cudaGetErrorString(e));
    return 0;
}

static int case_read_before_sync() {
    float *d, *pinned;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float host[64];
    for (int i = 0; i < 64; i++)
        host[i] = 1.0f;
    d = dev_from(host, 64);
    cudaMallocHost(&pinned, sizeof host);
    for (int i = 0; i < 64; i++)
        pinned[i] = -1.0f;
    cudaMemcpyAsync(pinned, d, sizeof host, cudaMemcpyDeviceToHost, s);
    /* The bug: the host reads before cudaStreamSynchronize. */
    EXPECT(pinned[0] == -1.0f,
           "the asynchronous copy had landed before the sync (%g): a read "
           "before the sync would pass here and fail on a GPU",
           pinned[0]);
    EXPECT(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    EXPECT(pinned[0] == 1.0f && pinned[63] == 1.0f, "after the sync: %g", pinned[0]);
    return 0;
}

/* Timing events (what --profile reads): a record's time is taken when the stream's queue reaches
 * it, so before a sync the times are not ready; afterwards they are ordered as recorded and lie
 * within the sync that ran the work. Events without timing, or never recorded, have no time. */
static int case_event_timing() {
    float in[256];
    for (int i = 0; i < 256; i++)
        in[i] = (float)i;
    float *d_in = dev_from(in, 256), *d_out;
    cudaMalloc(&d_out, sizeof in);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t a, b, c, untimed, unrecorded;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventCreate(&c);
    cudaEventCreate(&unrecorded);
    cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming);
    cudaEventRecord(a, s);
    ZT_LAUNCH(reverse_kernel, 1, 256, 0, s, d_out, d_in, 256, true);
    cudaEventRecord(b, s);
    ZT_LAUNCH(reverse_kernel, 1, 256, 0, s, d_in, d_out, 256, true);
    cudaEventRecord(c, s);
    cudaEventRecord(untimed, s);
    float ab = -1.0f, ac = -1.0f, ba = 1.0f;
    cudaError_t e = cudaEventElapsedTime(&ab, a, b);
    EXPECT(e == cudaErrorNotReady, "elapsed time before the work ran: %s", cudaGetErrorString(e));
    EXPECT(cudaGetLastError() == cudaSuccess, "not ready was left as an error");
    auto t0 = std::chrono::steady_clock::now();
    EXPECT(cudaEventSynchronize(c) == cudaSuccess, "sync");
    double sync_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT(cudaEventElapsedTime(&ab, a, b) == cudaSuccess &&
               cudaEventElapsedTime(&ac, a, c) == cudaSuccess &&
               cudaEventElapsedTime(&ba, b, a) == cudaSuccess,
           "elapsed times after the sync");
    EXPECT(ab >= 0.0f && ac >= ab && ba == -ab, "times out of order: a-b %g, a-c %g, b-a %g", ab,
           ac, ba);
    EXPECT(ac <= sync_ms, "a-c %g ms is longer than the sync that ran it (%g ms)", ac, sync_ms);
    e = cudaEventElapsedTime(&ab, a, untimed);
    EXPECT(e == cudaErrorInvalidResourceHandle, "an event without timing gave a time: %s",
           cudaGetErrorString(e));
    e = cudaEventElapsedTime(&ab, unrecorded, a);
    EXPECT(e == cudaErrorInvalidResourceHandle, "an event never recorded gave a time: %s",
           cudaGetErrorString(e));
    return 0;
}

static int case_host_dereference() {
    float *d;
    cudaMalloc(&d, 4096);
    volatile float x = d[10]; /* dies here with the allocation named */
    (void)x;
    return 1;
}

static int case_2048_threads() {
    float *d;
    cudaMalloc(&d, 4096 * sizeof(float));
    ZT_LAUNCH(nothing_kernel, 1, 2048, 0, nullptr, d);
    cudaError_t e = cudaGetLastError();
    EXPECT(e == cudaErrorInvalidConfiguration, "a launch of 2048 threads: %s", cudaGetErrorName(e));
    ZT_LAUNCH(nothing_kernel, dim3(1, 70000), 32, 0, nullptr, d);
    e = cudaGetLastError();
    EXPECT(e == cudaErrorInvalidConfiguration, "a grid y of 70000: %s", cudaGetErrorName(e));
    /* Not sticky: the device still works. */
    ZT_LAUNCH(nothing_kernel, 1, 1024, 0, nullptr, d);
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "after refused launches");
    return 0;
}

/* Launches kernel (one block of `threads`, on a buffer of as many floats) as ZT_LAUNCH would
 * (named as it names it): the launch must fail with a message that says `want`; `what` is the
 * mistake, for the message when it went unseen. */
static int expect_launch_fault(const char *name, void (*kernel)(float *), unsigned threads,
                               const char *want, const char *what) {
    float *d;
    cudaMalloc(&d, threads * sizeof(float));
    zt_emu_launch(name, kernel, dim3(1), dim3(threads), 0, nullptr, d);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaErrorLaunchFailure && says(e, want), "%s went unseen: %s", what,
           cudaGetErrorString(e));
    return 0;
}

static int case_divergent_barrier() {
    return expect_launch_fault("divergent_barrier_kernel", divergent_barrier_kernel, 64,
                               "reached by 16 of 64", "a barrier in divergent code");
}

static int case_two_barriers() {
    return expect_launch_fault("two_barriers_kernel", two_barriers_kernel, 64,
                               "two different __syncthreads",
                               "threads at two different barriers");
}

static int case_shuffle_absent_lanes() {
    return expect_launch_fault("full_mask_shuffle_kernel", full_mask_shuffle_kernel, 48,
                               "does not exist", "a full-mask shuffle in a 48-thread block");
}

static int case_dyn_smem_without_opt_in() {
    float *d;
    cudaMalloc(&d, 256 * sizeof(float));
    ZT_LAUNCH(dyn_smem_kernel, 1, 256, 64 << 10, nullptr, d, 16384);
    cudaError_t e = cudaGetLastError();
    EXPECT(e == cudaErrorInvalidValue, "64 KiB of dynamic shared memory without the opt-in: %s",
           cudaGetErrorName(e));
    return 0;
}

static int case_vec_aligned() {
    static const float host[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *d = dev_from(host, 8), back[8];
    zt_emu_launch("vec_copy_kernel<0, 4>", vec_copy_kernel<0, 4>, dim3(1), dim3(32), 0, nullptr,
                  d);
    cudaError_t e = cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    EXPECT(e == cudaSuccess, "aligned 16-byte copy: %s", cudaGetErrorString(e));
    EXPECT(back[4] == 0.0f && back[7] == 3.0f, "aligned 16-byte copy wrote %g..%g", back[4],
           back[7]);
    return 0;
}

static int case_vec_misaligned_load() {
    return expect_launch_fault("vec_copy_kernel<1, 4>", vec_copy_kernel<1, 4>, 32,
                               "misaligned address: a 16-byte vector access",
                               "a 16-byte load 4 bytes off");
}

static int case_vec_misaligned_store() {
    return expect_launch_fault("vec_copy_kernel<0, 6>", vec_copy_kernel<0, 6>, 32,
                               "misaligned address: a 16-byte vector access",
                               "a 16-byte store 8 bytes off");
}

static int case_host_pointer_to_kernel() {
    static float host[64];
    ZT_LAUNCH(nothing_kernel, 1, 64, 0, nullptr, host);
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaErrorIllegalAddress && says(e, "host memory"),
           "a host pointer given to a kernel went unseen: %s", cudaGetErrorString(e));
    return 0;
}

/* D(2x3) = A(2x4)·B(4x3), column-major, against the loop; then the same with A one float off its
 * 256-byte alignment, refused unless the preference declares the alignment. */
static int matmul(const float *a, const float *b, float *d, uint32_t align_a,
                  cublasStatus_t *status) {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 2, 4, 2);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 4, 3, 4);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 2, 3, 2);
    cublasLtMatmulPreferenceCreate(&pref);
    if (align_a)
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &align_a, sizeof align_a);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &heur, &found);
    const float alpha = 1.0f, beta = 0.0f;
    *status = cublasLtMatmul(h, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heur.algo, nullptr,
                             0, nullptr);
    return found;
}

static int case_cublaslt() {
    float a[9], b[12], want[6], got[6];
    for (int i = 0; i < 9; i++)
        a[i] = (float)(i + 1);
    for (int i = 0; i < 12; i++)
        b[i] = (float)(i % 5) - 2.0f;
    float *d_a = dev_from(a, 9), *d_b = dev_from(b, 12), *d_d;
    cudaMalloc(&d_d, sizeof got);
    cublasStatus_t st;
    EXPECT(matmul(d_a, d_b, d_d, 0, &st) == 1 && st == CUBLAS_STATUS_SUCCESS, "aligned matmul");
    cudaMemcpy(got, d_d, sizeof got, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            float acc = 0.0f;
            for (int k = 0; k < 4; k++)
                acc += a[i + k * 2] * b[k + j * 4];
            want[i + j * 2] = acc;
        }
    for (int i = 0; i < 6; i++)
        EXPECT(got[i] == want[i], "D[%d] = %g, want %g", i, got[i], want[i]);
    /* A one float in: 4-byte aligned. */
    matmul(d_a + 1, d_b, d_d, 0, &st);
    EXPECT(st == CUBLAS_STATUS_NOT_SUPPORTED &&
               strstr(cublasLtGetStatusString(st), "MIN_ALIGNMENT_A"),
           "a misaligned A under the default 256-byte alignment: %s", cublasLtGetStatusString(st));
    matmul(d_a + 1, d_b, d_d, 4, &st);
    EXPECT(st == CUBLAS_STATUS_SUCCESS, "a 4-byte aligned A declared as such: %s",
           cublasLtGetStatusString(st));
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU;
    st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    EXPECT(st == CUBLAS_STATUS_NOT_SUPPORTED, "an epilogue the emulator lacks was accepted");
    return 0;
}

/* One fp32 product D(m x n) = op(A)·op(B) + beta·D with epilogue epi writing the bias gradient
 * to bias (of bias_type, -1: left unset) and alpha 1 unless told; the heuristic's count of
 * algorithms to *found and the matmul's status to *status (not run when none was found). */
struct bgrad_call {
    bool ta, tb;
    int m, n, k;
    float beta, alpha = 1.0f;
    int32_t bias_type = -1;
};

static cublasStatus_t bgrad_matmul(const bgrad_call &c, cublasLtEpilogue_t epi, const float *a,
                                   const float *b, float *d, void *bias, int *found) {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasStatus_t st =
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (c.bias_type >= 0)
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c.bias_type,
                                       sizeof c.bias_type);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, c.ta ? c.k : c.m, c.ta ? c.m : c.k,
                               c.ta ? c.k : c.m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, c.tb ? c.n : c.k, c.tb ? c.k : c.n,
                               c.tb ? c.n : c.k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, c.m, c.n, c.m);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t heur;
    *found = 0;
    st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &heur, found);
    if (st != CUBLAS_STATUS_SUCCESS || *found != 1)
        return st;
    return cublasLtMatmul(h, op, &c.alpha, a, la, b, lb, &c.beta, d, ld, d, ld, &heur.algo,
                          nullptr, 0, nullptr);
}

/* BGRADA and BGRADB with every transpose and beta 0 and 1: D as the plain product, the bias
 * gradient written (over a value that must not be read) as op(A)'s row sums or op(B)'s column
 * sums over k, both against loops; then the documented refusals. */
static int case_cublaslt_bgrad() {
    const int m = 3, n = 5, k = 4;
    float a[12], b[20], d0[15], d[15], bias[5];
    for (int i = 0; i < 12; i++)
        a[i] = (float)(i % 7) - 2.5f;
    for (int i = 0; i < 20; i++)
        b[i] = 0.25f * (float)(i % 9) - 1.0f;
    for (int i = 0; i < 15; i++)
        d0[i] = (float)i * 0.5f;
    float *d_a = dev_from(a, 12), *d_b = dev_from(b, 20), *d_d = dev_from(d0, 15), *d_bias;
    cudaMalloc(&d_bias, 256);
    for (int epi_b = 0; epi_b < 2; epi_b++)
        for (int t = 0; t < 4; t++)
            for (int beta = 0; beta < 2; beta++) {
                bgrad_call c = {(t & 1) != 0, (t & 2) != 0, m, n, k, (float)beta};
                cublasLtEpilogue_t epi =
                    epi_b ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
                const int len = epi_b ? n : m;
                cudaMemcpy(d_d, d0, sizeof d0, cudaMemcpyHostToDevice);
                const float stale[5] = {99, 99, 99, 99, 99};
                cudaMemcpy(d_bias, stale, sizeof stale, cudaMemcpyHostToDevice);
                int found;
                cublasStatus_t st = bgrad_matmul(c, epi, d_a, d_b, d_d, d_bias, &found);
                EXPECT(found == 1 && st == CUBLAS_STATUS_SUCCESS, "%s ta %d tb %d beta %d: %s",
                       epi_b ? "BGRADB" : "BGRADA", c.ta, c.tb, beta,
                       cublasLtGetStatusString(st));
                cudaMemcpy(d, d_d, sizeof d, cudaMemcpyDeviceToHost);
                cudaMemcpy(bias, d_bias, sizeof bias, cudaMemcpyDeviceToHost);
                auto opa = [&](int i, int p) { return c.ta ? a[p + i * k] : a[i + p * m]; };
                auto opb = [&](int p, int j) { return c.tb ? b[j + p * n] : b[p + j * k]; };
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        float acc = 0.0f;
                        for (int p = 0; p < k; p++)
                            acc += opa(i, p) * opb(p, j);
                        float want = acc + (float)beta * d0[i + j * m];
                        EXPECT(d[i + j * m] == want, "D[%d,%d] = %g, want %g", i, j,
                               d[i + j * m], want);
                    }
                for (int r = 0; r < len; r++) {
                    float want = 0.0f;
                    for (int p = 0; p < k; p++)
                        want += epi_b ? opb(p, r) : opa(r, p);
                    EXPECT(bias[r] == want, "%s ta %d tb %d beta %d: bias gradient[%d] = %g, "
                           "want %g", epi_b ? "BGRADB" : "BGRADA", c.ta, c.tb, beta, r, bias[r],
                           want);
                }
            }
    /* Refused: a bias-gradient type that is none of D's, A's or fp32; alpha other than 1; the
     * heuristic finds no algorithm for the epilogues the environment names. */
    int found;
    bgrad_call c = {false, true, m, n, k, 0.0f};
    c.bias_type = CUDA_R_16BF;
    cublasStatus_t st = bgrad_matmul(c, CUBLASLT_EPILOGUE_BGRADB, d_a, d_b, d_d, d_bias, &found);
    EXPECT(st == CUBLAS_STATUS_NOT_SUPPORTED && found == 0 &&
               strstr(cublasLtGetStatusString(st), "bias gradient of CUDA_R_16BF"),
           "a bf16 bias gradient of fp32 operands: %s", cublasLtGetStatusString(st));
    c.bias_type = CUDA_R_32F;
    c.alpha = 2.0f;
    st = bgrad_matmul(c, CUBLASLT_EPILOGUE_BGRADB, d_a, d_b, d_d, d_bias, &found);
    EXPECT(st == CUBLAS_STATUS_NOT_SUPPORTED && strstr(cublasLtGetStatusString(st), "alpha"),
           "alpha 2 with BGRADB: %s", cublasLtGetStatusString(st));
    c.alpha = 1.0f;
    setenv("ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO", "BGRADA,BGRADB", 1);
    st = bgrad_matmul(c, CUBLASLT_EPILOGUE_BGRADB, d_a, d_b, d_d, d_bias, &found);
    EXPECT(st == CUBLAS_STATUS_NOT_SUPPORTED && found == 0, "no algorithm asked for: %s",
           cublasLtGetStatusString(st));
    setenv("ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO", "BGRADA", 1);
    st = bgrad_matmul(c, CUBLASLT_EPILOGUE_BGRADB, d_a, d_b, d_d, d_bias, &found);
    EXPECT(st == CUBLAS_STATUS_SUCCESS && found == 1, "BGRADB with only BGRADA refused: %s",
           cublasLtGetStatusString(st));
    unsetenv("ZTRAIN_CUDA_EMU_CUBLASLT_NO_ALGO");
    return 0;
}

/* Stream capture and CUDA graphs are not emulated (the backend uses none): each call is refused
 * with cudaErrorNotSupported and its name on stderr (the driver checks BeginCapture's), and the
 * stream a refused capture named still runs its work at once, as before. */
static int case_graphs_refused() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float in[64], out[64];
    for (int i = 0; i < 64; i++)
        in[i] = (float)(i + 1);
    float *x = dev_from(in, 64), *y = nullptr;
    cudaMalloc(&y, sizeof in);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorNotSupported,
           "a capture was begun");
    EXPECT(cudaGetLastError() == cudaErrorNotSupported, "the refusal is not the last error");
    cudaStreamCaptureStatus st;
    EXPECT(cudaStreamIsCapturing(s, &st) == cudaErrorNotSupported, "IsCapturing answered");
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&st);
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaErrorNotSupported && !graph, "a graph ended");
    cudaGraphExec_t exec = reinterpret_cast<cudaGraphExec_t>(&st);
    EXPECT(cudaGraphInstantiate(&exec, graph, 0) == cudaErrorNotSupported && !exec,
           "a graph was instantiated");
    EXPECT(cudaGraphLaunch(exec, s) == cudaErrorNotSupported, "a graph was launched");
    EXPECT(cudaGraphExecDestroy(exec) == cudaErrorNotSupported &&
               cudaGraphDestroy(graph) == cudaErrorNotSupported,
           "a graph was destroyed");
    cudaGetLastError();
    ZT_LAUNCH(twice_kernel, 1, 64, 0, s, y, x, 64, false);
    EXPECT(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++)
        EXPECT(out[i] == 2.0f * (i + 1), "y[%d] = %g, want %g", i, out[i], 2.0f * (i + 1));
    return 0;
}

/* CUDA_VISIBLE_DEVICES read as the CUDA runtime reads it, over four emulated GPUs: indices up to
 * the first that is malformed, out of range or repeated; empty hides all. Each setting in a
 * process of its own, since the device count is read once. */
/* The current device is each host thread's own, as the CUDA runtime's: a thread that has not
 * called cudaSetDevice is on device 0 whatever another thread chose, so a rank's helper thread
 * (the communication thread) must bind itself to the rank's GPU, as it would on a GPU host. */
static int case_device_per_thread() {
    setenv("ZTRAIN_CUDA_EMU_DEVICES", "2", 1);
    EXPECT(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1) with two devices");
    int mine = -1, fresh = -1, bound = -1;
    std::thread([&] { cudaGetDevice(&fresh); }).join();
    std::thread([&] {
        cudaSetDevice(1);
        cudaGetDevice(&bound);
    }).join();
    cudaGetDevice(&mine);
    EXPECT(mine == 1 && fresh == 0 && bound == 1,
           "current device: %d on the thread that set 1, %d on a new thread (want 0), %d on a "
           "thread that set 1",
           mine, fresh, bound);
    return 0;
}

/* The last error is the host thread's that made the call, as the CUDA runtime keeps it: a launch
 * refused on one thread is neither seen nor cleared by another's cudaGetLastError, and stays
 * for its own thread to read. */
static int case_last_error_per_thread() {
    float *d;
    cudaMalloc(&d, 64 * sizeof(float));
    ZT_LAUNCH(nothing_kernel, 1, 2048, 0, nullptr, d);
    cudaError_t other = cudaErrorUnknown, peeked = cudaErrorUnknown;
    std::thread([&] {
        peeked = cudaPeekAtLastError();
        other = cudaGetLastError();
    }).join();
    cudaError_t mine = cudaGetLastError();
    EXPECT(other == cudaSuccess && peeked == cudaSuccess && mine == cudaErrorInvalidConfiguration,
           "a launch of 2048 threads: another thread read %s (peeked %s), the launching thread "
           "%s",
           cudaGetErrorName(other), cudaGetErrorName(peeked), cudaGetErrorName(mine));
    return 0;
}

static int case_visible_devices() {
    static const struct {
        const char *value; /* nullptr: unset */
        int want;
    } settings[] = {{nullptr, 4}, {"0", 1},     {"2,0", 2},   {"3,2,1,0", 4}, {"", 0},
                    {"1,1", 1},   {"0,7,1", 1}, {"5", 0},     {"0,x", 1},     {"-1", 0},
                    {"GPU-8f2a", 0}, {"2x", 0}};
    int bad = 0;
    for (const auto &s : settings) {
        pid_t pid = fork();
        if (pid == 0) {
            setenv("ZTRAIN_CUDA_EMU_DEVICES", "4", 1);
            if (s.value)
                setenv("CUDA_VISIBLE_DEVICES", s.value, 1);
            else
                unsetenv("CUDA_VISIBLE_DEVICES");
            int n = -1;
            _exit(cudaGetDeviceCount(&n) == cudaSuccess && n >= 0 ? n : 99);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        int got = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (got != s.want) {
            fprintf(stderr, "CUDA_VISIBLE_DEVICES=%s: %d devices, want %d\n",
                    s.value ? s.value : "(unset)", got, s.want);
            bad++;
        }
    }
    return bad ? 1 : 0;
}

/* ---- the driver ------------------------------------------------------------------------------ */

struct test_case {
    const char *name;
    int (*run)();
    int want_signal; /* 0: the child exits 0 */
    const char *want_stderr;
};

static const test_case cases[] = {
    {"correct kernels: reverse, shuffles, ballots, atomics, 64 KiB of dynamic smem",
     case_correct_kernels, 0, nullptr},
    {"missing __syncthreads", case_missing_barrier, 0, nullptr},
    {"off-by-one index", case_off_by_one, 0, nullptr},
    {"host read of an async D2H copy before the sync", case_read_before_sync, 0, nullptr},
    {"event timing: not ready before the sync, ordered after it", case_event_timing, 0, nullptr},
    {"host dereference of device memory", case_host_dereference, SIGSEGV,
     "dereferenced device memory"},
    {"launch of 2,048 threads", case_2048_threads, 0, nullptr},
    {"__syncthreads in divergent code", case_divergent_barrier, 0, nullptr},
    {"threads at two different __syncthreads", case_two_barriers, 0, nullptr},
    {"full-mask shuffle in a 48-thread block", case_shuffle_absent_lanes, 0, nullptr},
    {"64 KiB of dynamic shared memory without the opt-in", case_dyn_smem_without_opt_in, 0,
     nullptr},
    {"host pointer given to a kernel", case_host_pointer_to_kernel, 0, nullptr},
    {"16-byte vector load and store, aligned", case_vec_aligned, 0, nullptr},
    {"16-byte vector load 4 bytes off its alignment", case_vec_misaligned_load, 0, nullptr},
    {"16-byte vector store 8 bytes off its alignment", case_vec_misaligned_store, 0, nullptr},
    {"cuBLASLt: result, alignment, refused epilogue", case_cublaslt, 0, nullptr},
    {"cuBLASLt: BGRADA/BGRADB sums over k, beta 0 and 1, refusals", case_cublaslt_bgrad, 0,
     nullptr},
    {"CUDA graphs: every call refused by name, the stream unaffected", case_graphs_refused, 0,
     "cudaStreamBeginCapture: stream capture and CUDA graphs are not emulated"},
    {"the current device: each host thread's own, device 0 until it sets one",
     case_device_per_thread, 0, nullptr},
    {"the last error: each host thread's own", case_last_error_per_thread, 0, nullptr},
    {"CUDA_VISIBLE_DEVICES: the devices it names, read as the CUDA runtime reads it",
     case_visible_devices, 0, nullptr},
};

int main() {
    for (const test_case &c : cases) {
        std::string err;
        int status = zt_emu_run_child(c.run, &err);
        if (status == -1)
            return 2;
        bool ok = zt_emu_child_as_wanted(status, c.want_signal);
        /* A fault names the allocation it touched besides. */
        if (ok && c.want_stderr)
            ok = err.find(c.want_stderr) != std::string::npos &&
                 (!c.want_signal || err.find("allocation #") != std::string::npos);
        printf("%s %s\n", ok ? "ok  " : "FAIL", c.name);
        if (!ok) {
            failures++;
            printf("  child status 0x%x; its stderr:\n%s\n", status, err.c_str());
        }
    }
    printf("test_cuda_emu: %d of %zu cases failed\n", failures, sizeof cases / sizeof *cases);
    return failures ? 1 : 0;
}
