/* Defects of the CUDA backend that the emulated CUDA device shows (ctest runs this with
 * ZTRAIN_CUDA_EMU=1; on a GPU machine it runs as it is):
 *   - cuBLASLt told nothing of alignment assumes 256-byte operands, which activations at an
 *     element offset inside a larger buffer are not: a dense layer on such slices must still
 *     match the formula (issue 27, defect 7);
 *   - the released-range set is shared by the ZeRO communication thread and the main thread:
 *     two threads releasing, committing and measuring at once must leave exact counts (defect 5);
 *   - NVMe offload with pinned buffers: what goes through the bounce buffer to the file and back
 *     must be the device's bytes, which the emulator's deferred copies make stale when the host
 *     does not wait (defect 6);
 *   - a device error during training is reported by the step that meets it (defect 1), with the
 *     device's message: an injected fault (ZTRAIN_CUDA_EMU_FAULT) fails zt_backend_sync;
 *   - the host's wait for one event (zt_backend_event_wait, issue 28's offloaded update): it
 *     covers the copies before the event (their bytes are there), counts as one host wait, and on
 *     the emulator leaves the copies issued after the event queued; a failure recorded before it
 *     (a copy refused into released memory) is its error, once; and a device fault (injected,
 *     in a process of its own) fails it naming the device;
 *   - ops on the communication stream (zt_ctx.stream, ZeRO's communication thread): an
 *     element-wise op computes there, in order with the stream's copies; an op that uses the
 *     backend's shared scratch (a matmul) refuses, the next sync naming it; and the stream-order
 *     counters (zt_cuda_waits) count the compute stream's waits for the communication stream
 *     and only the work another thread puts on the compute stream. */
#define _GNU_SOURCE
#define _XOPEN_SOURCE 700
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/backend.h"
#include "ztrain/ds_config.h"
#include "ztrain/offload.h"

static zt_backend *be;

static void *dev_copy_of(const void *host, size_t bytes) {
    void *d = zt_backend_alloc(be, ZT_MEM_DEVICE, bytes);
    ZT_ASSERT(d);
    zt_backend_copy(be, d, host, bytes, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    return d;
}

static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* out[N,OC] = inp[N,C]·W[C,OC] + bias with inp, out and W one element into their allocations. */
static void check_misaligned_linear(zt_dtype act) {
    enum { N = 5, C = 7, OC = 3 };
    const size_t es = act == ZT_F32 ? 4 : 2;
    float inp[N * C], w[1 + C * OC], bias[OC];
    for (int i = 0; i < N * C; i++)
        inp[i] = bf16_round((float)((i * 7) % 11) / 8.0f - 0.5f);
    for (int i = 0; i < 1 + C * OC; i++)
        w[i] = bf16_round((float)((i * 5) % 13) / 16.0f - 0.375f);
    for (int o = 0; o < OC; o++)
        bias[o] = bf16_round(0.25f * (float)o - 0.25f);
    /* Host images of the activations, one element of padding first. */
    unsigned char in_img[(1 + N * C) * 4] = {0};
    for (int i = 0; i < N * C; i++) {
        if (act == ZT_F32) {
            memcpy(in_img + (1 + i) * 4, &inp[i], 4);
        } else {
            uint32_t u;
            memcpy(&u, &inp[i], 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(in_img + (1 + i) * 2, &h, 2);
        }
    }
    unsigned char *d_in = dev_copy_of(in_img, (1 + N * C) * es);
    float *d_w = dev_copy_of(w, sizeof w), *d_bias = dev_copy_of(bias, sizeof bias);
    unsigned char *d_out = zt_backend_alloc(be, ZT_MEM_DEVICE, (1 + N * OC) * es);
    zt_ctx x = {.be = be, .act = act};
    be->ops->linear_forward(&x, d_out + es, d_in + es, d_w + 1, d_bias, NULL, N, C, OC,
                            ZT_W_IN_OUT);
    unsigned char out_img[(1 + N * OC) * 4];
    zt_backend_copy(be, out_img, d_out, (1 + N * OC) * es, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_status s = zt_backend_sync(be);
    const char *name = act == ZT_F32 ? "fp32" : "bf16";
    if (check_at(__FILE__, __LINE__, s == ZT_OK, "%s linear on operands one element off 256-byte alignment: %s", name,
                 zt_last_error())) {
        double worst = 0.0;
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double want = bias[o];
                for (int c = 0; c < C; c++)
                    want += (double)inp[n * C + c] * bf16_round(w[1 + c * OC + o]);
                float got;
                if (act == ZT_F32) {
                    memcpy(&got, out_img + (1 + n * OC + o) * 4, 4);
                } else {
                    uint16_t h;
                    memcpy(&h, out_img + (1 + n * OC + o) * 2, 2);
                    uint32_t u = (uint32_t)h << 16;
                    memcpy(&got, &u, 4);
                }
                worst = fmax(worst, fabs(got - want));
            }
        check_at(__FILE__, __LINE__, worst <= (act == ZT_F32 ? 1e-5 : 2e-2), "%s misaligned linear: off by %g", name,
                 worst);
    }
    zt_backend_free(be, ZT_MEM_DEVICE, d_in, (1 + N * C) * es);
    zt_backend_free(be, ZT_MEM_DEVICE, d_w, sizeof w);
    zt_backend_free(be, ZT_MEM_DEVICE, d_bias, sizeof bias);
    zt_backend_free(be, ZT_MEM_DEVICE, d_out, (1 + N * OC) * es);
}

/* ---- defect 5 ---------------------------------------------------------------------------------- */

enum { RANGE_BYTES = 1 << 16, PIECES = 64, ROUNDS = 2000 };

typedef struct {
    unsigned char *p; /* this thread's own buffer */
    bool ok;
} release_job;

/* Releases every other piece of its buffer, then commits them again, many times, checking the
 * resident count of its own buffer at each turn: the other thread's ranges must not leak in. */
static void *release_worker(void *arg) {
    release_job *j = arg;
    const size_t piece = RANGE_BYTES / PIECES;
    j->ok = true;
    for (int r = 0; r < ROUNDS && j->ok; r++) {
        for (int i = 0; i < PIECES; i += 2)
            zt_backend_release(be, j->p, i * piece, (i + 1) * piece);
        for (int k = 0; k < 20; k++)
            j->ok &= zt_backend_resident_bytes(be, j->p, 0, RANGE_BYTES) == RANGE_BYTES / 2;
        for (int i = 0; i < PIECES; i += 2) {
            j->ok &= zt_backend_commit(be, j->p, i * piece, (i + 1) * piece) == ZT_OK;
            j->ok &= zt_backend_resident_bytes(be, j->p, 0, RANGE_BYTES) ==
                     RANGE_BYTES / 2 + (size_t)(i / 2 + 1) * piece;
        }
        j->ok &= zt_backend_resident_bytes(be, j->p, 0, RANGE_BYTES) == RANGE_BYTES;
    }
    return NULL;
}

static void check_release_two_threads(void) {
    release_job jobs[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        jobs[i].p = zt_backend_alloc(be, ZT_MEM_DEVICE, RANGE_BYTES);
        pthread_create(&t[i], NULL, release_worker, &jobs[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    check_at(__FILE__, __LINE__, jobs[0].ok && jobs[1].ok, "two threads releasing and committing at once: counts "
             "went wrong (thread 0 %s, thread 1 %s)", jobs[0].ok ? "ok" : "wrong",
             jobs[1].ok ? "ok" : "wrong");
    check_at(__FILE__, __LINE__, zt_backend_sync(be) == ZT_OK, "sync after the release threads: %s", zt_last_error());
    for (int i = 0; i < 2; i++)
        zt_backend_free(be, ZT_MEM_DEVICE, jobs[i].p, RANGE_BYTES);
}

/* ---- defect 6 ---------------------------------------------------------------------------------- */

static void check_nvme_pinned(void) {
    char dir[] = "/tmp/ztrain_cuda_nvme_XXXXXX";
    if (!check_at(__FILE__, __LINE__, mkdtemp(dir) != NULL, "mkdtemp"))
        return;
    zt_offload_config opt = {.device = ZT_OFFLOAD_NVME, .buffer_count = 2, .pin_memory = true,
                             .ratio = 1.0};
    snprintf(opt.nvme_path, sizeof opt.nvme_path, "%s", dir);
    zt_offload_config param = {.device = ZT_OFFLOAD_NONE};
    const size_t n = 300000; /* more than the 1 MiB bounce buffer holds */
    zt_offload_spec spec = {.be = be, .rank = 0, .job_name = "cuda_nvme", .n = n,
                            .optimizer = &opt, .param = &param};
    spec.streams[ZT_OFFLOAD_MASTER] = (zt_offload_stream_spec){ZT_PLACE_FILE, "fp32_master", 4,
                                                               NULL, false};
    zt_offload *f = NULL;
    if (!check_at(__FILE__, __LINE__, zt_offload_create(&f, &spec) == ZT_OK, "zt_offload_create: %s",
                  zt_last_error())) {
        rmdir(dir);
        return;
    }
    float *host = malloc(n * sizeof *host), *back = malloc(n * sizeof *back);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)i * 0.5f + 1.0f;
    float *d = dev_copy_of(host, n * sizeof *host);
    float *d_back = zt_backend_alloc(be, ZT_MEM_DEVICE, n * sizeof *back);
    zt_status s = zt_offload_write_device(f, ZT_OFFLOAD_MASTER, 0, d, n, ZT_STREAM_COMPUTE);
    check_at(__FILE__, __LINE__, s == ZT_OK, "zt_offload_write_device: %s", zt_last_error());
    /* Read back to the host through the file: what pwrite wrote. */
    s = zt_offload_read(f, ZT_OFFLOAD_MASTER, 0, back, n);
    check_at(__FILE__, __LINE__, s == ZT_OK, "zt_offload_read: %s", zt_last_error());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += back[i] != host[i];
    check_at(__FILE__, __LINE__, bad == 0, "NVMe offload with pinned buffers: %zu of %zu elements in the file are not "
             "the device's (the D2H copy was not waited for before pwrite)", bad, n);
    /* And from the file to the device: what the H2D copies took, here on the communication
     * stream, as ZeRO's communication thread reads (the event wait behind each copy covers it). */
    s = zt_offload_read_device(f, ZT_OFFLOAD_MASTER, 0, d_back, n, ZT_STREAM_COMM);
    check_at(__FILE__, __LINE__, s == ZT_OK, "zt_offload_read_device: %s", zt_last_error());
    zt_backend_copy(be, back, d_back, n * sizeof *back, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    check_at(__FILE__, __LINE__, zt_backend_sync(be) == ZT_OK, "sync: %s", zt_last_error());
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += back[i] != host[i];
    check_at(__FILE__, __LINE__, bad == 0, "NVMe offload with pinned buffers: %zu of %zu elements read to the device "
             "are wrong (the H2D copy was not waited for before the next pread)", bad, n);
    zt_backend_free(be, ZT_MEM_DEVICE, d, n * sizeof *host);
    zt_backend_free(be, ZT_MEM_DEVICE, d_back, n * sizeof *back);
    free(host), free(back);
    zt_offload_destroy(f);
    rmdir(dir);
}

/* ---- the host's wait for an event ---------------------------------------------------------- */

typedef unsigned long long (*ahead_fn)(void);

static void check_event_wait(void) {
    enum { N = 4096 };
    const size_t bytes = N * sizeof(float);
    float a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)i + 0.25f;
        b[i] = -(float)i;
    }
    float *d = dev_copy_of(a, bytes);
    float *h1 = zt_backend_alloc(be, ZT_MEM_PINNED, bytes);
    float *h2 = zt_backend_alloc(be, ZT_MEM_PINNED, bytes);
    zt_event *ev = zt_backend_event_create(be), *never = zt_backend_event_create(be);
    ZT_ASSERT(d && h1 && h2 && ev && never);
    /* The emulated device's count of event waits that left reads queued (absent on a GPU). */
    ahead_fn ahead = (ahead_fn)zt_backend_cuda_symbol("zt_emu_waits_ahead");
    check_at(__FILE__, __LINE__, zt_backend_sync(be) == ZT_OK, "sync: %s", zt_last_error());
    zt_cuda_waits w0, w1;
    unsigned long long a0 = ahead ? ahead() : 0;
    zt_backend_copy(be, h1, d, bytes, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_event_record(be, ev, ZT_STREAM_COMPUTE);
    zt_backend_copy(be, d, b, bytes, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_backend_copy(be, h2, d, bytes, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    zt_backend_cuda_waits(be, &w0);
    zt_status s = zt_backend_event_wait(be, ev);
    zt_backend_cuda_waits(be, &w1);
    check_at(__FILE__, __LINE__, s == ZT_OK, "event wait: %s", zt_last_error());
    check_at(__FILE__, __LINE__, memcmp(h1, a, bytes) == 0,
             "the copy before the event had not landed when its wait returned");
    CHECK(w1.waits == w0.waits + 1, "an event wait counted %llu host waits, not 1",
          w1.waits - w0.waits);
    if (ahead) {
        /* The emulator runs queued work only when the host waits for it: the copy after the
         * event is still queued, as it may still be running on a GPU. */
        float zero[N] = {0};
        check_at(__FILE__, __LINE__, memcmp(h2, zero, bytes) == 0,
                 "the event wait ran the copy issued after the event");
        CHECK(ahead() == a0 + 1, "the emulator saw %llu event waits with reads queued behind "
              "them, not 1", ahead() - a0);
    }
    check_at(__FILE__, __LINE__, zt_backend_sync(be) == ZT_OK, "sync: %s", zt_last_error());
    CHECK(memcmp(h2, b, bytes) == 0, "the copy after the event: wrong bytes after sync");
    check_at(__FILE__, __LINE__, zt_backend_event_wait(be, never) == ZT_OK,
             "an event never recorded: %s", zt_last_error());

    /* A failure the backend recorded (a copy refused into released memory not committed again)
     * is the next wait's, as it would be sync's, and is reported once. Large allocations are
     * granules of the emulator's VMM, which refuses such a copy; on a GPU without VMM nothing
     * is refused, so this part runs on the emulator. */
    if (ahead) {
        const size_t big = (size_t)16 << 20;
        unsigned char *r = zt_backend_alloc(be, ZT_MEM_DEVICE, big);
        ZT_ASSERT(r);
        zt_backend_release(be, r, 0, big);
        zt_backend_copy(be, r, a, bytes, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
        zt_backend_event_record(be, ev, ZT_STREAM_COMPUTE);
        s = zt_backend_event_wait(be, ev);
        const char *msg = zt_last_error();
        CHECK(s == ZT_ERR_IO && strstr(msg, "cuda device 0") && strstr(msg, "released"),
              "a copy refused before the event: the wait returned %s: %s", zt_status_name(s),
              msg);
        CHECK(zt_backend_sync(be) == ZT_OK, "the refused copy was reported twice: %s",
              zt_last_error());
        CHECK(zt_backend_commit(be, r, 0, big) == ZT_OK, "commit: %s", zt_last_error());
        zt_backend_free(be, ZT_MEM_DEVICE, r, big);
    }
    zt_backend_event_destroy(be, ev);
    zt_backend_event_destroy(be, never);
    zt_backend_free(be, ZT_MEM_PINNED, h1, bytes);
    zt_backend_free(be, ZT_MEM_PINNED, h2, bytes);
    zt_backend_free(be, ZT_MEM_DEVICE, d, bytes);
}

/* In a process of its own (a device fault is sticky): an add kernel faults, and the wait for an
 * event after it fails naming the device and the fault. */
static int event_fault_child(void) {
    zt_backend *fb = NULL;
    if (zt_backend_create(&fb, ZT_DEVICE_CUDA, NULL) != ZT_OK) {
        fprintf(stderr, "zt_backend_create: %s\n", zt_last_error());
        return 1;
    }
    enum { N = 256 };
    float x[N] = {0};
    float *d = zt_backend_alloc(fb, ZT_MEM_DEVICE, sizeof x);
    zt_backend_copy(fb, d, x, sizeof x, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_ctx c = {.be = fb, .act = ZT_F32};
    fb->ops->add(&c, d, d, d, N);
    zt_event *ev = zt_backend_event_create(fb);
    zt_backend_event_record(fb, ev, ZT_STREAM_COMPUTE);
    zt_status s = zt_backend_event_wait(fb, ev);
    const char *msg = zt_last_error();
    bool ok = check_at(__FILE__, __LINE__, s == ZT_ERR_IO && strstr(msg, "cuda device 0") &&
                       strstr(msg, "ZTRAIN_CUDA_EMU_FAULT"),
                       "the wait for an event after a faulting kernel returned %s: %s",
                       zt_status_name(s), msg);
    return ok ? 0 : 1;
}

static void check_event_fault(const char *self) {
    if (!zt_backend_cuda_symbol("zt_emu_waits_ahead"))
        return; /* faults are injected by the emulator */
    pid_t pid = fork();
    if (pid == 0) {
        setenv("ZTRAIN_CUDA_EMU_FAULT", "add_kernel:1", 1);
        execl(self, self, "event-fault", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    check_at(__FILE__, __LINE__, WIFEXITED(st) && WEXITSTATUS(st) == 0,
             "the event wait after an injected fault (child status %d)", st);
}

typedef struct {
    void *p;
    zt_stream on;
} zero_job;

static void *zero_on(void *arg) {
    const zero_job *j = arg;
    zt_backend_zero(be, j->p, 64, j->on);
    return NULL;
}

static void check_comm_stream_ops(void) {
    enum { N = 1000 };
    float a[N], b[N], out[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)i * 0.5f;
        b[i] = 3.0f - (float)i;
    }
    zt_cuda_waits w0, w1;
    CHECK(zt_backend_cuda_waits(be, &w0) == ZT_OK, "%s", zt_last_error());
    /* The add reads what the communication stream's own copies wrote, and the compute stream
     * waits for it before the read-back: one wait for the communication stream. */
    float *da = zt_backend_alloc(be, ZT_MEM_DEVICE, sizeof a);
    float *db = zt_backend_alloc(be, ZT_MEM_DEVICE, sizeof b);
    zt_backend_copy(be, da, a, sizeof a, ZT_COPY_H2D, ZT_STREAM_COMM);
    zt_backend_copy(be, db, b, sizeof b, ZT_COPY_H2D, ZT_STREAM_COMM);
    const zt_ctx comm = {.be = be, .act = ZT_F32, .stream = ZT_STREAM_COMM};
    be->ops->add(&comm, da, da, db, N);
    zt_event *done = zt_backend_event_create(be);
    zt_backend_event_record(be, done, ZT_STREAM_COMM);
    zt_backend_stream_wait(be, ZT_STREAM_COMPUTE, done);
    zt_backend_copy(be, out, da, sizeof out, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    CHECK(zt_backend_sync(be) == ZT_OK, "%s", zt_last_error());
    int wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += out[i] != a[i] + b[i];
    CHECK(wrong == 0, "an add on the communication stream: %d of %d sums wrong", wrong, N);
    /* Work on the compute stream from another thread counts; on the communication stream it
     * does not, nor does this thread's. */
    zero_job jobs[2] = {{da, ZT_STREAM_COMPUTE}, {db, ZT_STREAM_COMM}};
    for (int i = 0; i < 2; i++) {
        pthread_t t;
        ZT_ASSERT(pthread_create(&t, NULL, zero_on, &jobs[i]) == 0);
        pthread_join(t, NULL);
    }
    CHECK(zt_backend_sync(be) == ZT_OK, "%s", zt_last_error());
    CHECK(zt_backend_cuda_waits(be, &w1) == ZT_OK, "%s", zt_last_error());
    CHECK(w1.compute_waits_on_comm - w0.compute_waits_on_comm == 1 &&
              w1.compute_issued_elsewhere - w0.compute_issued_elsewhere == 1,
          "stream order: %llu compute waits for the communication stream (1 expected), %llu "
          "pieces of compute work from another thread (1 expected)",
          w1.compute_waits_on_comm - w0.compute_waits_on_comm,
          w1.compute_issued_elsewhere - w0.compute_issued_elsewhere);
    /* A matmul shares cuBLASLt's workspace with every other: not on the communication stream. */
    float *dw = zt_backend_alloc(be, ZT_MEM_DEVICE, 4 * 4 * sizeof(float));
    zt_backend_zero(be, dw, 4 * 4 * sizeof(float), ZT_STREAM_COMPUTE);
    be->ops->linear_forward(&comm, db, da, dw, NULL, NULL, 4, 4, 4, ZT_W_IN_OUT);
    zt_status st = zt_backend_sync(be);
    CHECK(st != ZT_OK && strstr(zt_last_error(), "a matmul") &&
              strstr(zt_last_error(), "communication stream"),
          "a matmul on the communication stream: %s", st ? zt_last_error() : "accepted");
    zt_backend_event_destroy(be, done);
    zt_backend_free(be, ZT_MEM_DEVICE, da, sizeof a);
    zt_backend_free(be, ZT_MEM_DEVICE, db, sizeof b);
    zt_backend_free(be, ZT_MEM_DEVICE, dw, 4 * 4 * sizeof(float));
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "event-fault") == 0)
        return event_fault_child();
    if (!zt_backend_available(ZT_DEVICE_CUDA) || zt_backend_device_count(ZT_DEVICE_CUDA) == 0) {
        printf("test_cuda_backend: SKIPPED: no CUDA device, real or emulated (ctest sets "
               "ZTRAIN_CUDA_EMU=1)\n");
        return 77;
    }
    zt_status s = zt_backend_create(&be, ZT_DEVICE_CUDA, NULL);
    if (!check_at(__FILE__, __LINE__, s == ZT_OK, "zt_backend_create(cuda): %s", zt_last_error()))
        return check_summary("test_cuda_backend");
    check_misaligned_linear(ZT_F32);
    check_misaligned_linear(ZT_BF16);
    check_release_two_threads();
    check_nvme_pinned();
    check_event_wait();
    check_event_fault("/proc/self/exe");
    check_comm_stream_ops();
    zt_backend_destroy(be);
    return check_summary("test_cuda_backend");
}
