/* The CUDA module's NCCL (ztrain/nccl.h, kernels/cuda/nccl/nccl_comm.c) on the emulated device's NCCL
 * (kernels/cuda/emu/emu_nccl.cc): two and three ranks, each a process with an emulated device of
 * its own, run every operation nccl_comm.c offers, on device memory and, where the table takes it,
 * on host memory, for fp32, bf16, fp16 and fp64, sum, avg and max, with equal pieces (NCCL's own
 * reduce-scatter and all-gather) and uneven ones (its group paths: one reduce or broadcast per
 * piece), and send/recv around a ring (whose header travels as int64). Every result is checked
 * against values computed here: the ranks' inputs reduced in rank order, a 16-bit sum rounded to
 * its type after every addition and an average scaling each input by 1/n rounded to the type (the
 * rules the emulation states; the inputs are small multiples of 1/4, so every other step is
 * exact). A peer that exits, and one that never joins the collective, end the survivor's call in
 * an error naming the peer within ZTRAIN_CUDA_EMU_NCCL_TIMEOUT; a posted receive expecting
 * another count than was sent fails the receiver's next wait with the header's message naming
 * both ranks; an all-reduce posted while a sync waits (after its streams were joined) is not
 * retired by that sync, so the next one fails naming its dead peer; and no file of any
 * communicator is left under /dev/shm. An abort from another thread while a call waits for a
 * stuck peer does not wait behind that call: the call ends naming the abort, not the peer's
 * timeout it would otherwise have reached first. */
#include <pthread.h>
#include <stdatomic.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/backend.h"
#include "ztrain/nccl.h"

static const zt_nccl_api *api;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the reference's arithmetic -------------------------------------------------------------- */

/* x (exact in float) rounded to nearest even in t. */
static double round_to(zt_dtype t, double x) {
    if (t == ZT_F64)
        return x;
    float f = (float)x;
    if (t == ZT_F32)
        return f;
    if (t == ZT_F16)
        return (double)(_Float16)f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}

static void put(zt_dtype t, void *p, size_t i, double v) {
    if (t == ZT_F64) {
        ((double *)p)[i] = v;
    } else if (t == ZT_F32) {
        ((float *)p)[i] = (float)v;
    } else if (t == ZT_F16) {
        ((_Float16 *)p)[i] = (_Float16)(float)v;
    } else {
        float f = (float)round_to(t, v);
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    }
}

static double get(zt_dtype t, const void *p, size_t i) {
    if (t == ZT_F64)
        return ((const double *)p)[i];
    if (t == ZT_F32)
        return ((const float *)p)[i];
    if (t == ZT_F16)
        return ((const _Float16 *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rank r's input at element i: small multiples of 1/4, exact in every type. Element 0 is 1 on
 * rank 0 and half a unit in the last place of 1 elsewhere, so that a sum rounded at every step
 * (1 + h rounds to even, 1) differs from one rounded once (1 + 2h) at three ranks. */
static double input(zt_dtype t, int r, size_t i) {
    if (i == 0)
        return r == 0 ? 1.0 : t == ZT_BF16 ? ldexp(1, -8) : t == ZT_F16 ? ldexp(1, -11) : 0.25;
    return (double)((r + 1) * (int)(i % 7) - (int)(i % 5) - r) * 0.25;
}

/* The reduction of element i over the world's ranks, in rank order. */
static double reduced(zt_dtype t, zt_nccl_op op, int world, size_t i) {
    const double scale = round_to(t, 1.0 / world);
    double acc = 0;
    for (int r = 0; r < world; r++) {
        double x = input(t, r, i);
        if (op == ZT_NCCL_AVG)
            x = round_to(t, x * scale);
        if (r == 0)
            acc = x;
        else if (op == ZT_NCCL_MAX)
            acc = x > acc ? x : acc;
        else
            acc = round_to(t, acc + x);
    }
    return acc;
}

/* ---- one rank ------------------------------------------------------------------------------- */

typedef struct {
    zt_backend *be;
    zt_nccl_comm *c;
    int rank, world;
} rank_ctx;

static const char *dtype_name(zt_dtype t) {
    return t == ZT_F32 ? "f32" : t == ZT_BF16 ? "bf16" : t == ZT_F16 ? "f16" : "f64";
}

static void *upload(rank_ctx *x, const void *host, size_t bytes) {
    void *d = zt_backend_alloc(x->be, ZT_MEM_DEVICE, bytes ? bytes : 1);
    zt_backend_copy(x->be, d, host, bytes, ZT_COPY_H2D, ZT_STREAM_COMM);
    CHECK(zt_backend_sync(x->be) == ZT_OK, "rank %d: upload: %s", x->rank, zt_last_error());
    return d;
}

/* Device memory back into host (after the work on the communication stream). */
static void download(rank_ctx *x, void *host, void *dev, size_t bytes) {
    zt_backend_copy(x->be, host, dev, bytes, ZT_COPY_D2H, ZT_STREAM_COMM);
    CHECK(zt_backend_sync(x->be) == ZT_OK, "rank %d: download: %s", x->rank, zt_last_error());
}

/* A layout of pieces: equal ones, or uneven ones with an empty piece and gaps. */
typedef struct {
    size_t n, offsets[3], counts[3];
} pieces;

static pieces layout(int world, bool even) {
    pieces p = {0};
    if (even) {
        for (int r = 0; r < world; r++) {
            p.offsets[r] = 6 * (size_t)r;
            p.counts[r] = 6;
        }
        p.n = 6 * (size_t)world;
    } else if (world == 2) {
        p = (pieces){13, {0, 9}, {7, 4}};
    } else {
        p = (pieces){13, {0, 5, 5}, {5, 0, 8}};
    }
    return p;
}

static void check_all_reduce(rank_ctx *x, zt_dtype t, zt_nccl_op op) {
    enum { N = 37 };
    char host[N * 8];
    for (size_t i = 0; i < N; i++)
        put(t, host, i, input(t, x->rank, i));
    size_t bytes = N * zt_dtype_size(t);
    void *d = upload(x, host, bytes);
    zt_status s = api->all_reduce(x->c, d, N, t, op);
    CHECK(s == ZT_OK, "rank %d: all_reduce %s op %d: %s", x->rank, dtype_name(t), op,
          zt_last_error());
    download(x, host, d, bytes);
    int bad = 0;
    for (size_t i = 0; i < N; i++)
        bad += get(t, host, i) != reduced(t, op, x->world, i);
    CHECK(bad == 0, "rank %d of %d: all_reduce %s op %d: %d of %d elements differ (element 1: "
          "%g, expected %g)", x->rank, x->world, dtype_name(t), op, bad, N, get(t, host, 1),
          reduced(t, op, x->world, 1));
    /* The rounding rule made visible: at three ranks 1 + h + h is 1 stepwise, 1 + 2h at once. */
    if (op == ZT_NCCL_SUM && x->world == 3 && (t == ZT_BF16 || t == ZT_F16))
        CHECK(get(t, host, 0) == 1.0, "rank %d: %s sum of 1, h, h is %.9g: not rounded at each "
              "step", x->rank, dtype_name(t), get(t, host, 0));
    zt_backend_free(x->be, ZT_MEM_DEVICE, d, bytes ? bytes : 1);
}

static void check_reduce_scatter(rank_ctx *x, zt_dtype t, zt_nccl_op op, bool even) {
    pieces p = layout(x->world, even);
    const size_t es = zt_dtype_size(t), mine = p.counts[x->rank];
    char in[32 * 8], out[32 * 8];
    for (size_t i = 0; i < p.n; i++)
        put(t, in, i, input(t, x->rank, i));
    for (size_t i = 0; i < mine; i++)
        put(t, out, i, -7);
    void *din = upload(x, in, p.n * es), *dout = upload(x, out, mine * es);
    zt_status s = api->reduce_scatter(x->c, din, dout, p.offsets, p.counts, t, op);
    CHECK(s == ZT_OK, "rank %d: reduce_scatter %s op %d %s: %s", x->rank, dtype_name(t), op,
          even ? "even" : "uneven", zt_last_error());
    download(x, out, dout, mine * es);
    int bad = 0;
    for (size_t j = 0; j < mine; j++)
        bad += get(t, out, j) != reduced(t, op, x->world, p.offsets[x->rank] + j);
    CHECK(bad == 0, "rank %d of %d: reduce_scatter %s op %d, %s pieces: %d of %zu elements "
          "differ", x->rank, x->world, dtype_name(t), op, even ? "equal" : "uneven", bad, mine);
    zt_backend_free(x->be, ZT_MEM_DEVICE, din, p.n * es);
    zt_backend_free(x->be, ZT_MEM_DEVICE, dout, mine ? mine * es : 1);
}

/* Element i as rank r holds it before an all-gather or broadcast. */
static double held(zt_dtype t, int r, size_t i) { return round_to(t, input(t, r, i) + 4 * (r + 1)); }

/* buf[0, n) = rank r's values. */
static void fill_held(zt_dtype t, void *buf, size_t n, int r) {
    for (size_t i = 0; i < n; i++)
        put(t, buf, i, held(t, r, i));
}

/* How many of buf[0, n) are not rank r's values. */
static int unlike_held(zt_dtype t, const void *buf, size_t n, int r) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += get(t, buf, i) != held(t, r, i);
    return bad;
}

static void check_all_gather(rank_ctx *x, zt_dtype t, bool even, zt_nccl_mem mem) {
    pieces p = layout(x->world, even);
    const size_t bytes = p.n * zt_dtype_size(t);
    char buf[32 * 8];
    fill_held(t, buf, p.n, x->rank);
    void *d = mem == ZT_NCCL_DEVICE ? upload(x, buf, bytes) : buf;
    zt_status s = api->all_gather(x->c, d, p.n, p.offsets, p.counts, t, mem);
    CHECK(s == ZT_OK, "rank %d: all_gather: %s", x->rank, zt_last_error());
    if (mem == ZT_NCCL_DEVICE)
        download(x, buf, d, bytes);
    int bad = 0;
    for (size_t i = 0; i < p.n; i++) {
        int from = x->rank; /* elements in no piece keep their values */
        for (int r = 0; r < x->world; r++)
            if (i >= p.offsets[r] && i < p.offsets[r] + p.counts[r])
                from = r;
        bad += get(t, buf, i) != held(t, from, i);
    }
    CHECK(bad == 0, "rank %d of %d: all_gather %s, %s pieces, %s memory: %d of %zu elements "
          "differ", x->rank, x->world, dtype_name(t), even ? "equal" : "uneven",
          mem == ZT_NCCL_DEVICE ? "device" : "host", bad, p.n);
    if (mem == ZT_NCCL_DEVICE)
        zt_backend_free(x->be, ZT_MEM_DEVICE, d, bytes);
}

static void check_broadcast(rank_ctx *x, zt_dtype t, zt_nccl_mem mem) {
    enum { N = 19 };
    const int root = x->world - 1;
    const size_t bytes = N * zt_dtype_size(t);
    char buf[N * 8];
    fill_held(t, buf, N, x->rank);
    void *d = mem == ZT_NCCL_DEVICE ? upload(x, buf, bytes) : buf;
    CHECK(api->broadcast(x->c, d, N, t, root, mem) == ZT_OK, "rank %d: broadcast: %s", x->rank,
          zt_last_error());
    if (mem == ZT_NCCL_DEVICE)
        download(x, buf, d, bytes);
    int bad = unlike_held(t, buf, N, root);
    CHECK(bad == 0, "rank %d of %d: broadcast %s from rank %d, %s memory: %d elements differ",
          x->rank, x->world, dtype_name(t), root, mem == ZT_NCCL_DEVICE ? "device" : "host", bad);
    if (mem == ZT_NCCL_DEVICE)
        zt_backend_free(x->be, ZT_MEM_DEVICE, d, bytes);
}

/* Around the ring: each rank sends to the next and receives from the previous. */
static void check_send_recv(rank_ctx *x, zt_dtype t, zt_nccl_mem mem) {
    enum { N = 11 };
    const int next = (x->rank + 1) % x->world, prev = (x->rank + x->world - 1) % x->world;
    const size_t bytes = N * zt_dtype_size(t);
    char out[N * 8], in[N * 8];
    fill_held(t, out, N, x->rank);
    for (size_t i = 0; i < N; i++)
        put(t, in, i, -1);
    void *dout = mem == ZT_NCCL_DEVICE ? upload(x, out, bytes) : out;
    void *din = mem == ZT_NCCL_DEVICE ? upload(x, in, bytes) : in;
    CHECK(api->send(x->c, dout, N, t, next, mem) == ZT_OK, "rank %d: send: %s", x->rank,
          zt_last_error());
    CHECK(api->recv(x->c, din, N, t, prev, mem) == ZT_OK, "rank %d: recv: %s", x->rank,
          zt_last_error());
    if (mem == ZT_NCCL_DEVICE)
        download(x, in, din, bytes);
    int bad = unlike_held(t, in, N, prev);
    CHECK(bad == 0, "rank %d of %d: recv %s from rank %d, %s memory: %d elements differ",
          x->rank, x->world, dtype_name(t), prev, mem == ZT_NCCL_DEVICE ? "device" : "host", bad);
    if (mem == ZT_NCCL_DEVICE) {
        zt_backend_free(x->be, ZT_MEM_DEVICE, dout, bytes);
        zt_backend_free(x->be, ZT_MEM_DEVICE, din, bytes);
    }
}

/* Posted back to back without a wait between them, more messages than nccl_comm.c has header
 * slots for, then one wait: each lands where it should. */
static void check_posted_burst(rank_ctx *x) {
    enum { MSGS = 70, N = 3 };
    const int next = (x->rank + 1) % x->world, prev = (x->rank + x->world - 1) % x->world;
    float out[MSGS * N], in[MSGS * N], sum[N];
    for (int i = 0; i < MSGS * N; i++) {
        out[i] = (float)(x->rank * 1000 + i);
        in[i] = -1;
    }
    for (int i = 0; i < N; i++)
        sum[i] = (float)(x->rank + i);
    float *dout = upload(x, out, sizeof out), *din = upload(x, in, sizeof in);
    float *dsum = upload(x, sum, sizeof sum);
    for (int m = 0; m < MSGS; m++) {
        CHECK(api->send(x->c, dout + m * N, N, ZT_F32, next, ZT_NCCL_DEVICE) == ZT_OK &&
                  api->recv(x->c, din + m * N, N, ZT_F32, prev, ZT_NCCL_DEVICE) == ZT_OK,
              "rank %d: message %d: %s", x->rank, m, zt_last_error());
        if (m % 10 == 0)
            CHECK(api->all_reduce(x->c, dsum, N, ZT_F32, ZT_NCCL_SUM) == ZT_OK, "rank %d: %s",
                  x->rank, zt_last_error());
    }
    download(x, in, din, sizeof in);
    download(x, sum, dsum, sizeof sum);
    int bad = 0;
    for (int i = 0; i < MSGS * N; i++)
        bad += in[i] != (float)(prev * 1000 + i);
    CHECK(bad == 0, "rank %d: %d of %d elements of %d posted messages differ", x->rank, bad,
          MSGS * N, MSGS);
    /* Seven all-reduces of the running sum: each multiplies by the world and adds nothing else. */
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int r = 0; r < x->world; r++)
            want += r + i;
        for (int k = 1; k < 7; k++)
            want *= x->world;
        CHECK(sum[i] == (float)want, "rank %d: posted all-reduces: %g, expected %g", x->rank,
              sum[i], want);
    }
    zt_backend_free(x->be, ZT_MEM_DEVICE, dout, sizeof out);
    zt_backend_free(x->be, ZT_MEM_DEVICE, din, sizeof in);
    zt_backend_free(x->be, ZT_MEM_DEVICE, dsum, sizeof sum);
}

/* What a rank of a run does. */
typedef enum {
    RUN_ALL,
    RUN_PEER_EXITS,
    RUN_PEER_STUCK,
    RUN_MISMATCH,
    RUN_POSTED_DURING_SYNC,
    RUN_ABORT_STUCK
} run_mode;

/* A message whose receiver expects another count: the receiver's next wait fails at once with
 * the header's mismatch naming both ranks (before: only when its posted work was retired, so
 * NCCL's own failure of the payload, or on a GPU its timeout, came first). */
static void check_mismatch(rank_ctx *x) {
    float v[5] = {1, 2, 3, 4, 5};
    void *d = upload(x, v, sizeof v);
    if (x->rank == 0) {
        CHECK(api->send(x->c, d, 3, ZT_F32, 1, ZT_NCCL_DEVICE) == ZT_OK, "rank 0: send: %s",
              zt_last_error());
        CHECK(zt_backend_sync(x->be) == ZT_OK, "rank 0: the sync after a send: %s",
              zt_last_error());
    } else {
        CHECK(api->recv(x->c, d, 5, ZT_F32, 0, ZT_NCCL_DEVICE) == ZT_OK,
              "rank 1: posting the recv: %s", zt_last_error());
        zt_status s = zt_backend_sync(x->be);
        CHECK(s != ZT_OK && strstr(zt_last_error(), "rank 0 sent 3 elements of fp32 but rank 1 "
                                                    "expects 5 of fp32"),
              "rank 1: the sync after a recv of 5 values where 3 were sent: status %d, %s", s,
              s == ZT_OK ? "accepted" : zt_last_error());
    }
    zt_backend_free(x->be, ZT_MEM_DEVICE, d, sizeof v);
}

/* A second watcher of the backend (cuda_backend.h's zt_cuda_watch_add, found by name), standing
 * for ZeRO's communication thread: at its first look during the armed sync's wait, after the
 * streams were joined, it posts an all-reduce that the peer never joins. */
typedef long (*mark_fn)(void *);
typedef zt_status (*watch_fn)(void *, long);
typedef zt_status (*watch_add_fn)(zt_backend *, watch_fn, mark_fn, void *);
typedef void (*watch_remove_fn)(zt_backend *, void *);

static struct {
    rank_ctx *x;
    void *buf;
    bool armed, posted;
} late;

static long late_mark(void *ctx) {
    (void)ctx;
    return 0;
}

static zt_status late_poll(void *ctx, long covered) {
    (void)ctx;
    if (late.armed && !late.posted && covered < 0) {
        late.posted = true;
        CHECK(api->all_reduce(late.x->c, late.buf, 4, ZT_F32, ZT_NCCL_SUM) == ZT_OK,
              "rank 0: the all_reduce posted during the sync: %s", zt_last_error());
    }
    return ZT_OK;
}

/* A sync retires only what was posted before its streams were joined: the all-reduce posted
 * during its wait, which the peer (gone) never joins, is still watched, so the next sync fails
 * naming the peer (before: the first sync retired it unseen, and the next returned success). */
static void check_posted_during_sync(rank_ctx *x) {
    float v[4] = {1, 2, 3, 4};
    void *a = upload(x, v, sizeof v), *b = upload(x, v, sizeof v);
    CHECK(api->all_reduce(x->c, a, 4, ZT_F32, ZT_NCCL_SUM) == ZT_OK, "rank %d: %s", x->rank,
          zt_last_error());
    if (x->rank == 1) {
        CHECK(zt_backend_sync(x->be) == ZT_OK, "rank 1: %s", zt_last_error());
        fflush(stdout);
        _exit(check_summary("test_nccl_emu rank 1 of 2"));
    }
    watch_add_fn add = (watch_add_fn)zt_backend_cuda_symbol("zt_cuda_watch_add");
    watch_remove_fn remove = (watch_remove_fn)zt_backend_cuda_symbol("zt_cuda_watch_remove");
    CHECK(add && remove, "the module has no zt_cuda_watch_add/remove");
    if (!add || !remove || add(x->be, late_poll, late_mark, &late) != ZT_OK)
        return;
    late.x = x;
    late.buf = b;
    late.armed = true;
    zt_status s = zt_backend_sync(x->be);
    late.armed = false;
    CHECK(s == ZT_OK && late.posted, "rank 0: the sync whose wait saw a late all_reduce: %s, %s",
          s == ZT_OK ? "ok" : zt_last_error(), late.posted ? "posted" : "not posted");
    s = zt_backend_sync(x->be);
    CHECK(s != ZT_OK && strstr(zt_last_error(), "rank 1 (pid") && strstr(zt_last_error(),
                                                                        "exited"),
          "rank 0: the next sync, with the late all_reduce's peer gone: status %d, %s", s,
          s == ZT_OK ? "success" : zt_last_error());
    remove(x->be, &late);
}

/* A host all-gather (awaited: the host needs its result) on another thread, whose peer never
 * joins. */
typedef struct {
    rank_ctx *x;
    atomic_int started;
    zt_status s;
    char error[512];
} stuck_call;

static void *call_stuck(void *arg) {
    stuck_call *k = arg;
    float v[4] = {1, 2, 3, 4};
    size_t offsets[2] = {0, 2}, counts[2] = {2, 2};
    atomic_store(&k->started, 1);
    k->s = api->all_gather(k->x->c, v, 4, offsets, counts, ZT_F32, ZT_NCCL_HOST);
    snprintf(k->error, sizeof k->error, "%s", zt_last_error());
    return NULL;
}

/* The call waits for a peer that is alive but never joins, until ZTRAIN_CUDA_EMU_NCCL_TIMEOUT
 * (3 s here); the main thread aborts the communicator meanwhile. The abort must not wait for
 * the call (it holds the communicator's lock), and the call must then end naming the abort: had
 * the abort waited, the call would have ended first, naming the stuck peer. */
static void check_abort_stuck(rank_ctx *x) {
    stuck_call k = {.x = x};
    atomic_init(&k.started, 0);
    pthread_t th;
    if (!check_at(__FILE__, __LINE__, pthread_create(&th, NULL, call_stuck, &k) == 0,
                  "rank 0: no thread"))
        return;
    while (!atomic_load(&k.started))
        usleep(1000);
    usleep(500000); /* the call is waiting now (it takes its lock at once) */
    double t0 = now_s();
    api->abort(x->c);
    double took = now_s() - t0;
    pthread_join(th, NULL);
    double ended = now_s() - t0;
    CHECK(k.s == ZT_ERR_IO && strstr(k.error, "aborted") &&
              strstr(k.error, "while the call waited") && !strstr(k.error, "is stuck"),
          "rank 0: a host all_gather whose peer never joins, aborted from another thread: "
          "status %d, %s", k.s, k.error);
    printf("test_nccl_emu: abort from another thread returned after %.3f s, the waiting call "
           "ended after %.3f s: %s\n", took, ended, k.error);
    fflush(stdout);
    CHECK(api->all_reduce(x->c, NULL, 0, ZT_F32, ZT_NCCL_SUM) == ZT_ERR_IO &&
              strstr(zt_last_error(), "was aborted"),
          "rank 0: a call after the abort: %s", zt_last_error());
}

static int rank_main(int rank, int world, const zt_nccl_id *id, run_mode mode) {
    rank_ctx x = {.rank = rank, .world = world};
    zt_backend_options o = {.device_index = rank};
    if (zt_backend_create(&x.be, ZT_DEVICE_CUDA, &o) != ZT_OK ||
        api->create(&x.c, id, world, rank, rank, 30.0) != ZT_OK ||
        api->attach(x.c, x.be) != ZT_OK) {
        CHECK(false, "rank %d of %d: setup: %s", rank, world, zt_last_error());
        return 1;
    }
    if (mode == RUN_ALL) {
        static const zt_dtype types[] = {ZT_F32, ZT_BF16, ZT_F16, ZT_F64};
        static const zt_nccl_op ops[] = {ZT_NCCL_SUM, ZT_NCCL_AVG, ZT_NCCL_MAX};
        for (int ti = 0; ti < 4; ti++) {
            zt_dtype t = types[ti];
            for (int oi = 0; oi < 3; oi++) {
                check_all_reduce(&x, t, ops[oi]);
                check_reduce_scatter(&x, t, ops[oi], true);
                check_reduce_scatter(&x, t, ops[oi], false);
            }
            for (int mem = 0; mem < 2; mem++) {
                check_all_gather(&x, t, true, (zt_nccl_mem)mem);
                check_all_gather(&x, t, false, (zt_nccl_mem)mem);
                check_broadcast(&x, t, (zt_nccl_mem)mem);
                check_send_recv(&x, t, (zt_nccl_mem)mem);
            }
        }
        check_posted_burst(&x);
    } else if (mode == RUN_MISMATCH) {
        check_mismatch(&x);
    } else if (mode == RUN_POSTED_DURING_SYNC) {
        check_posted_during_sync(&x);
    } else if (rank == 1) {
        /* The peer that fails: gone at once, or alive but never joining the collective. */
        if (mode == RUN_PEER_EXITS)
            _exit(0);
        sleep(60);
        _exit(0);
    } else if (mode == RUN_ABORT_STUCK) {
        check_abort_stuck(&x);
    } else {
        float v[4] = {1, 2, 3, 4};
        void *d = upload(&x, v, sizeof v);
        double t0 = now_s();
        /* Posted without a wait: the backend's next wait meets the failure. */
        zt_status s = api->all_reduce(x.c, d, 4, ZT_F32, ZT_NCCL_SUM);
        CHECK(s == ZT_OK, "rank 0: posting an all_reduce: %s", zt_last_error());
        s = zt_backend_sync(x.be);
        double took = now_s() - t0;
        const char *want = mode == RUN_PEER_EXITS ? "exited" : "is stuck";
        CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "rank 1 (pid") &&
                  strstr(zt_last_error(), want),
              "rank 0: the sync after an all_reduce whose peer %s: status %d, %s", want, s,
              zt_last_error());
        printf("test_nccl_emu: the peer %s: the survivor's sync failed after %.2f s: "
               "%s\n", want, took, zt_last_error());
        fflush(stdout);
        CHECK(api->all_reduce(x.c, d, 4, ZT_F32, ZT_NCCL_SUM) == ZT_ERR_IO &&
                  strstr(zt_last_error(), "was aborted"),
              "rank 0: a call after the failure: %s", zt_last_error());
        zt_backend_free(x.be, ZT_MEM_DEVICE, d, sizeof v);
    }
    api->destroy(x.c);
    zt_backend_destroy(x.be);
    char name[64];
    snprintf(name, sizeof name, "test_nccl_emu rank %d of %d", rank, world);
    int rc = check_summary(name);
    fflush(stdout); /* the rank ends in _exit */
    return rc;
}

/* The files of the communicator made from id left under /dev/shm. */
static int files_left(const zt_nccl_id *id) {
    const char *hex = strchr(id->bytes, ':');
    char prefix[80];
    snprintf(prefix, sizeof prefix, "zt-nccl-%s", hex ? hex + 1 : "?");
    int n = 0;
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* Runs world ranks of a fresh communicator; the stuck peer of RUN_PEER_STUCK is killed once
 * rank 0 is done. */
static void run(int world, run_mode mode) {
    zt_nccl_id id;
    if (api->unique_id(&id) != ZT_OK) {
        CHECK(false, "unique_id: %s", zt_last_error());
        return;
    }
    pid_t pids[3];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(r, world, &id, mode));
    }
    for (int r = 0; r < world; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (r == 0 && (mode == RUN_PEER_STUCK || mode == RUN_ABORT_STUCK))
            kill(pids[1], SIGKILL);
        bool killed = (mode == RUN_PEER_STUCK || mode == RUN_ABORT_STUCK) && r == 1;
        CHECK(killed || (WIFEXITED(st) && WEXITSTATUS(st) == 0),
              "%d ranks, run %d: rank %d ended with %s %d", world, mode, r,
              WIFSIGNALED(st) ? "signal" : "status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
    CHECK(files_left(&id) == 0, "%d ranks, run %d: %d files of the communicator are left in "
          "/dev/shm", world, mode, files_left(&id));
}

int main(void) {
    if (!getenv("ZTRAIN_CUDA_EMU") && !getenv("ZTRAIN_CUDA_MODULE"))
        setenv("ZTRAIN_CUDA_EMU", "1", 1);
    /* A device per rank, as NCCL needs; each process is its own emulated device. */
    setenv("ZTRAIN_CUDA_EMU_DEVICES", "3", 1);
    if (!zt_backend_available(ZT_DEVICE_CUDA) || !zt_backend_cuda_symbol("zt_emu_sync_counts") ||
        !(api = zt_nccl_api_get())) {
        printf("test_nccl_emu: SKIPPED: no emulated CUDA device with NCCL in this build\n");
        return 0;
    }
    CHECK(api->nccl_version() == 22809, "nccl_version %d: the emulation's is nccl.h's 2.28.9",
          api->nccl_version());
    run(2, RUN_ALL);
    run(3, RUN_ALL);
    setenv("ZTRAIN_CUDA_EMU_NCCL_TIMEOUT", "3", 1);
    run(2, RUN_PEER_EXITS);
    run(2, RUN_PEER_STUCK);
    run(2, RUN_MISMATCH);
    run(2, RUN_POSTED_DURING_SYNC);
    run(2, RUN_ABORT_STUCK);
    return check_summary("test_nccl_emu");
}
