/* The CUDA backend's release and commit over granules (kernels/cuda/memory/device_vmm.c), on the
 * emulated device (ctest sets ZTRAIN_CUDA_EMU=1; on a GPU machine it runs as it is), against a
 * model of its contract kept here in plain arrays: which bytes are released, which granules are
 * live (a granule stops being live when every byte of it is released, and is live again once
 * any byte of it is committed), and what each byte reads (what was written, zero once released).
 *
 *   - a random run of releases, commits and writes over an allocation of 9½ granules: after
 *     every call the backend's allocated bytes are the most granules ever live at once (the
 *     physical granules it holds: freed ones are kept for the next commit, none made while a
 *     free one exists) plus the small allocations it had before; every few calls the live
 *     granules read back as the model says;
 *   - the steady state of training, the same granules released and committed again and again:
 *     no driver call after the first round (maps and physical granules unchanged), no wait;
 *   - a granule whose memory serves another allocation meanwhile: committing it waits once
 *     for its own old release, unmaps and maps new memory, and neither allocation's bytes
 *     change;
 *   - a copy into released memory that was not committed is an error at the next sync, naming
 *     the commit it lacks;
 *   - freeing gives every granule back;
 *   - what the host issues to the device for a release and a commit (the emulator's tally,
 *     zt_emu_issue_counts) is the same for 2 granules as for 6: a call, not a granule, costs;
 *     a commit in the steady state issues its memset alone, and the communication stream
 *     waits for the compute stream once, at its next copy, whatever the commits before it;
 *   - that wait, behind an all-reduce posted on NCCL (the emulated device's) whose peer has
 *     exited, is the communicator's watched wait: the commit fails naming the peer (before: it
 *     waited on the event unwatched, which on a GPU never returns, and here returned success);
 *   - ZTRAIN_CUDA_VMM and ZTRAIN_CUDA_VMM_MIN_BYTES values it does not understand are refused,
 *     naming the variable;
 *   - ZTRAIN_CUDA_VMM=check unmaps what a release lets go of, so device work touching released
 *     memory before its commit is an error naming the granule (last: a device error is sticky). */
#define _GNU_SOURCE
#define _XOPEN_SOURCE 700
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/backend.h"
#include "ztrain/nccl.h"

typedef void (*counts_fn)(zt_backend *be, unsigned long long out[4]);
typedef size_t (*issue_counts_fn)(const char **names, unsigned long long *counts, size_t cap);
typedef size_t (*granule_fn)(zt_backend *be);

static zt_backend *be;
static counts_fn vmm_counts;
static size_t G;

static size_t allocated(void) {
    zt_cuda_memory m;
    zt_backend_cuda_memory(be, &m);
    return m.allocated;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static size_t next(size_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (size_t)(rng >> 33) % n;
}

/* The model of one allocation of n bytes. */
typedef struct {
    size_t n, granules, most_live;
    unsigned char *want, *released, *live;
} model;

static bool granule_released(const model *m, size_t k) {
    size_t a = k * G, b = a + G < m->n ? a + G : m->n;
    for (size_t i = a; i < b; i++)
        if (!m->released[i])
            return false;
    return true;
}

static void note_live(model *m) {
    size_t live = 0;
    for (size_t k = 0; k < m->granules; k++)
        live += m->live[k];
    if (live > m->most_live)
        m->most_live = live;
}

static void model_release(model *m, size_t lo, size_t hi) {
    memset(m->released + lo, 1, hi - lo);
    memset(m->want + lo, 0, hi - lo);
    for (size_t k = lo / G; k * G < hi; k++)
        if (granule_released(m, k))
            m->live[k] = 0;
}

static void model_commit(model *m, size_t lo, size_t hi) {
    memset(m->released + lo, 0, hi - lo);
    for (size_t k = lo / G; k * G < hi; k++)
        m->live[k] = 1;
    note_live(m);
}

/* The live granules of p read back as the model says. */
static void check_bytes(const model *m, void *p, unsigned char *host, const char *when) {
    zt_backend_copy(be, host, p, m->n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    size_t bad = SIZE_MAX;
    for (size_t i = 0; i < m->n && bad == SIZE_MAX; i++)
        if (m->live[i / G] && host[i] != m->want[i])
            bad = i;
    CHECK(bad == SIZE_MAX, "%s: byte %zu (granule %zu) reads %u, the model says %u", when, bad,
          bad / G, bad == SIZE_MAX ? 0 : host[bad], bad == SIZE_MAX ? 0 : m->want[bad]);
}

static void check_random_run(size_t base_alloc) {
    model m = {0};
    m.n = 9 * G + G / 2;
    m.granules = 10;
    m.want = malloc(m.n);
    m.released = calloc(m.n, 1);
    m.live = malloc(m.granules);
    unsigned char *host = malloc(m.n), *img = malloc(m.n);
    ZT_ASSERT(m.want && m.released && m.live && host && img);
    void *p = zt_backend_alloc(be, ZT_MEM_DEVICE, m.n);
    CHECK(p != NULL, "allocating 9.5 granules");
    if (!p)
        return;
    memset(m.live, 1, m.granules);
    m.most_live = m.granules;
    CHECK(allocated() - base_alloc == m.granules * G,
          "9.5 granules hold %zu bytes, not 10 granules", allocated() - base_alloc);
    memset(m.want, 0, m.n);
    check_bytes(&m, p, host, "fresh allocation (zeroed)");
    for (size_t i = 0; i < m.n; i++)
        img[i] = m.want[i] = (unsigned char)(i * 7 + i / 4093 + 1);
    zt_backend_copy(be, p, img, m.n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    for (int step = 0; step < 300; step++) {
        size_t lo = next(m.n), hi = lo + 1 + next(m.n - lo);
        /* Often on granule boundaries, as ZeRO's layer ranges roughly are. */
        if (next(2)) {
            lo = lo / G * G;
            hi = hi / G * G > lo ? hi / G * G : (lo + G < m.n ? lo + G : m.n);
        }
        int what = (int)next(3);
        if (what == 0) {
            zt_backend_release(be, p, lo, hi);
            model_release(&m, lo, hi);
        } else {
            zt_status s = zt_backend_commit(be, p, lo, hi);
            CHECK(s == ZT_OK, "commit [%zu, %zu): %s", lo, hi, zt_last_error());
            model_commit(&m, lo, hi);
            if (what == 2) {
                /* Written after its commit, as ZeRO writes a gathered layer. */
                for (size_t i = lo; i < hi; i++)
                    img[i] = m.want[i] = (unsigned char)(step * 31 + i);
                zt_backend_copy(be, (char *)p + lo, img + lo, hi - lo, ZT_COPY_H2D,
                                ZT_STREAM_COMPUTE);
            }
        }
        size_t held = allocated() - base_alloc;
        if (!check_at(__FILE__, __LINE__, held == m.most_live * G,
                      "step %d (%s [%zu, %zu)): %zu bytes held, the model's %zu granules are %zu",
                      step, what ? "commit" : "release", lo, hi, held, m.most_live,
                      m.most_live * G))
            break;
        if (step % 25 == 24) {
            char when[64];
            snprintf(when, sizeof when, "after step %d", step);
            check_bytes(&m, p, host, when);
        }
    }
    CHECK(zt_backend_sync(be) == ZT_OK, "sync: %s", zt_last_error());
    zt_backend_free(be, ZT_MEM_DEVICE, p, m.n);
    CHECK(allocated() == base_alloc, "freed: %zu bytes still held", allocated() - base_alloc);
    free(m.want), free(m.released), free(m.live), free(host), free(img);
}

/* The same granules released and committed, step after step: after the first round the
 * granules come back with no driver call and no wait. */
static void check_steady_state(size_t base_alloc) {
    const size_t n = 8 * G;
    void *p = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    CHECK(p != NULL, "allocating 8 granules");
    if (!p)
        return;
    unsigned long long c0[4], c1[4];
    vmm_counts(be, c0);
    for (int round = 0; round < 5; round++) {
        zt_backend_release(be, p, 2 * G, 6 * G);
        CHECK(allocated() - base_alloc == n, "round %d: released granules stay held for reuse",
              round);
        CHECK(zt_backend_commit(be, p, 2 * G + 5, 6 * G - 5) == ZT_OK, "commit: %s",
              zt_last_error());
    }
    vmm_counts(be, c1);
    CHECK(c1[1] == c0[1] && c1[2] == c0[2] && c1[0] == c0[0],
          "five rounds of release and commit made %llu maps, %llu physical granules and %llu "
          "waits; the steady state makes none", c1[1] - c0[1], c1[2] - c0[2], c1[0] - c0[0]);
    CHECK(c1[3] - c0[3] == 5 * 4, "%llu granules came back by themselves, not 20",
          c1[3] - c0[3]);
    zt_backend_free(be, ZT_MEM_DEVICE, p, n);
}

/* The calls of each kind the host has issued to the device so far (the emulator's tally). */
enum { KINDS = 256 };
static unsigned long long issued(issue_counts_fn tally, const char *kind) {
    const char *names[KINDS];
    unsigned long long counts[KINDS];
    size_t n = tally(names, counts, KINDS);
    for (size_t i = 0; i < n && i < KINDS; i++)
        if (strcmp(names[i], kind) == 0)
            return counts[i];
    return 0;
}

/* A round of release and commit over `granules` granules: the memsets, event records and
 * stream waits it issued. */
static void issue_round(issue_counts_fn tally, void *p, size_t granules,
                        unsigned long long out[3]) {
    static const char *const kinds[3] = {"cudaMemsetAsync", "cudaEventRecord",
                                         "cudaStreamWaitEvent"};
    unsigned long long before[3];
    for (int i = 0; i < 3; i++)
        before[i] = issued(tally, kinds[i]);
    zt_backend_release(be, p, G, (1 + granules) * G);
    CHECK(zt_backend_commit(be, p, G, (1 + granules) * G) == ZT_OK, "commit: %s",
          zt_last_error());
    for (int i = 0; i < 3; i++)
        out[i] = issued(tally, kinds[i]) - before[i];
}

static void check_issue_per_call(issue_counts_fn tally) {
    const size_t n = 8 * G;
    void *p = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    CHECK(p != NULL, "allocating 8 granules");
    if (!p)
        return;
    unsigned long long two[3], six[3];
    issue_round(tally, p, 2, two); /* the first round of each size may map; the second not */
    issue_round(tally, p, 6, six);
    issue_round(tally, p, 2, two);
    issue_round(tally, p, 6, six);
    CHECK(two[0] == six[0] && two[1] == six[1] && two[2] == six[2] && six[0] >= 1,
          "a release and commit of 2 granules issued %llu memsets, %llu event records and %llu "
          "stream waits, of 6 granules %llu, %llu and %llu: the same were wanted", two[0],
          two[1], two[2], six[0], six[1], six[2]);
    zt_backend_free(be, ZT_MEM_DEVICE, p, n);
}

/* The calls a commit issues in the steady state of training (the granules' own memory taken
 * back): one memset for the run of granules and an event record behind it, no wait (before: a
 * stream wait for the release's mark, an event record and a wait of each stream, 5 calls); the
 * communication stream waits for that event at its next copy only, once for all the commits
 * before it, and that copy lands after the zero-fill (its bytes, not zeros, are read back). */
static void check_commit_issue(issue_counts_fn tally) {
    static const char *const kinds[4] = {"cudaMemsetAsync", "cudaEventRecord",
                                         "cudaStreamWaitEvent", "cudaMemcpyAsync"};
    const size_t n = 8 * G;
    float *p = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    CHECK(p != NULL, "allocating 8 granules");
    if (!p)
        return;
    float one[4] = {1, 2, 3, 4}, back[4] = {0};
    unsigned long long before[4], commit[4], copy[4], again[4];
    for (int round = 0; round < 2; round++) {
        zt_backend_release(be, p, G, 7 * G);
        for (int i = 0; i < 4; i++)
            before[i] = issued(tally, kinds[i]);
        /* Two commits: their zero-fills share the one wait the copy below brings. */
        CHECK(zt_backend_commit(be, p, G, 4 * G) == ZT_OK, "commit: %s", zt_last_error());
        CHECK(zt_backend_commit(be, p, 4 * G, 7 * G) == ZT_OK, "commit: %s", zt_last_error());
        for (int i = 0; i < 4; i++)
            commit[i] = issued(tally, kinds[i]) - before[i];
        zt_backend_copy(be, p + G / sizeof(float), one, sizeof one, ZT_COPY_H2D, ZT_STREAM_COMM);
        for (int i = 0; i < 4; i++)
            copy[i] = issued(tally, kinds[i]) - before[i] - commit[i];
        zt_backend_copy(be, p + 4 * G / sizeof(float), one, sizeof one, ZT_COPY_H2D,
                        ZT_STREAM_COMM);
        for (int i = 0; i < 4; i++)
            again[i] = issued(tally, kinds[i]) - before[i] - commit[i] - copy[i];
    }
    CHECK(commit[0] == 2 && commit[1] == 2 && commit[2] == 0 && commit[3] == 0,
          "two commits of 3 granules each issued %llu memsets, %llu event records, %llu stream "
          "waits and %llu copies: 2, 2, 0, 0 were wanted", commit[0], commit[1], commit[2],
          commit[3]);
    CHECK(copy[0] == 0 && copy[1] == 0 && copy[2] == 1 && copy[3] == 1,
          "the communication stream's first copy after them issued %llu memsets, %llu event "
          "records, %llu stream waits, %llu copies: 0, 0, 1, 1 were wanted", copy[0], copy[1],
          copy[2], copy[3]);
    CHECK(again[1] == 0 && again[2] == 0 && again[3] == 1,
          "its second copy issued %llu event records and %llu stream waits: none were wanted",
          again[1], again[2]);
    zt_status synced = zt_backend_sync(be);
    zt_backend_copy(be, back, p + G / sizeof(float), sizeof back, ZT_COPY_D2H,
                    ZT_STREAM_COMPUTE);
    CHECK(synced == ZT_OK && memcmp(back, one, sizeof one) == 0,
          "the copy after the commits reads back %g %g %g %g (1 2 3 4 wanted): %s", back[0],
          back[1], back[2], back[3], zt_last_error());
    zt_backend_free(be, ZT_MEM_DEVICE, p, n);
}

/* ZTRAIN_CUDA_VMM=check: a kernel over a range whose middle was released and not committed
 * fails at the sync, naming the granule it touched; over the committed part it is fine. (The
 * backend's own copies and memsets refuse released memory before they are issued.) */
static void check_check_mode(void) {
    setenv("ZTRAIN_CUDA_VMM", "check", 1);
    zt_backend *cb = NULL;
    zt_status s = zt_backend_create(&cb, ZT_DEVICE_CUDA, NULL);
    unsetenv("ZTRAIN_CUDA_VMM");
    CHECK(s == ZT_OK, "ZTRAIN_CUDA_VMM=check: %s", zt_last_error());
    if (s != ZT_OK)
        return;
    const size_t n = 4 * G;
    void *p = zt_backend_alloc(cb, ZT_MEM_DEVICE, n);
    CHECK(p != NULL, "allocating 4 granules");
    zt_backend_release(cb, p, G, 3 * G);
    CHECK(zt_backend_commit(cb, p, G, 2 * G) == ZT_OK, "commit: %s", zt_last_error());
    const zt_ctx ctx = {.be = cb, .act = ZT_F32};
    cb->ops->scale(&ctx, p, 2 * G / sizeof(float), 2.0f);
    CHECK(zt_backend_sync(cb) == ZT_OK, "scaling committed memory: %s", zt_last_error());
    cb->ops->scale(&ctx, (float *)((char *)p + 2 * G), G / sizeof(float), 2.0f);
    s = zt_backend_sync(cb);
    CHECK(s != ZT_OK && strstr(zt_last_error(), "(granule 2)"),
          "a kernel over a released granule in check mode: %s", s == ZT_OK ? "accepted" :
          zt_last_error());
    zt_backend_destroy(cb);
}

/* x's released granules serve y; committing x then waits for x's own old release, unmaps, and
 * maps new memory; y keeps its bytes, x reads zeros. */
static void check_taken_memory(size_t base_alloc) {
    const size_t n = 4 * G;
    unsigned char *img = malloc(n), *host = malloc(n);
    ZT_ASSERT(img && host);
    void *x = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    CHECK(x != NULL, "allocating x");
    memset(img, 0x5A, n);
    zt_backend_copy(be, x, img, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_backend_release(be, x, 0, n);
    unsigned long long c0[4], c1[4];
    vmm_counts(be, c0);
    void *y = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    vmm_counts(be, c1);
    CHECK(y != NULL && c1[2] == c0[2] && allocated() - base_alloc == n,
          "y took x's free granules (%llu made, %zu bytes held, want 0 and %zu)", c1[2] - c0[2],
          allocated() - base_alloc, n);
    memset(img, 0xA7, n);
    zt_backend_copy(be, y, img, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    CHECK(zt_backend_commit(be, x, 0, n) == ZT_OK, "commit x: %s", zt_last_error());
    vmm_counts(be, c0);
    CHECK(c0[0] - c1[0] == 4 && c0[2] - c1[2] == 4 && allocated() - base_alloc == 2 * n,
          "x's granules, mapped to y's memory, waited %llu times and made %llu granules (want 4 "
          "and 4), %zu bytes held", c0[0] - c1[0], c0[2] - c1[2], allocated() - base_alloc);
    zt_backend_copy(be, host, y, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    CHECK(host[0] == 0xA7 && host[n - 1] == 0xA7 && memchr(host, 0x00, n) == NULL,
          "y's bytes changed when x came back: %02x", host[0]);
    zt_backend_copy(be, host, x, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += host[i] != 0;
    CHECK(nonzero == 0, "x committed again reads %zu non-zero bytes", nonzero);
    /* A copy into released memory without a commit is refused, before it writes: the granule
     * it would land in may meanwhile be z's memory (z takes y's free granule), whose bytes
     * must survive. The refusal is the sync's error. */
    zt_backend_release(be, y, G, 2 * G);
    void *z = zt_backend_alloc(be, ZT_MEM_DEVICE, n);
    CHECK(z != NULL, "allocating z");
    memset(img, 0x3C, n);
    zt_backend_copy(be, z, img, n, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    memset(img, 0xEE, 64);
    zt_backend_copy(be, (char *)y + G, img, 64, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    zt_status s = zt_backend_sync(be);
    CHECK(s != ZT_OK && strstr(zt_last_error(), "zt_backend_commit"),
          "a copy into uncommitted released memory: %s", s == ZT_OK ? "accepted" : zt_last_error());
    memset(host, 0, n);
    zt_backend_copy(be, host, z, n, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    size_t changed = 0;
    for (size_t i = 0; i < n; i++)
        changed += host[i] != 0x3C;
    CHECK(changed == 0, "the refused copy changed %zu of z's bytes", changed);
    zt_backend_free(be, ZT_MEM_DEVICE, z, n);
    zt_backend_free(be, ZT_MEM_DEVICE, x, n);
    zt_backend_free(be, ZT_MEM_DEVICE, y, n);
    CHECK(allocated() == base_alloc, "freed: %zu bytes still held", allocated() - base_alloc);
    free(img), free(host);
}

/* Rank 0 of two on NCCL: address a's granules are released behind an all-reduce whose peer
 * (rank 1) exited, and by then another allocation holds a's memory, so committing a must wait
 * for that release before unmapping. The chain: c takes b's released memory; after the
 * all-reduce a is released and b, committed, takes a's memory; committing a then waits. */
static int revive_rank(int rank, const zt_nccl_api *api, const zt_nccl_id *id) {
    zt_backend_options o = {.device_index = rank};
    zt_backend *d = NULL;
    zt_nccl_comm *c = NULL;
    if (zt_backend_create(&d, ZT_DEVICE_CUDA, &o) != ZT_OK ||
        api->create(&c, id, 2, rank, rank, 30.0) != ZT_OK || api->attach(c, d) != ZT_OK) {
        CHECK(false, "rank %d: setup: %s", rank, zt_last_error());
        return 1;
    }
    if (rank == 1)
        _exit(0); /* the peer that dies */
    granule_fn granule = (granule_fn)zt_backend_cuda_symbol("zt_cuda_vmm_granule");
    const size_t n = 4 * (granule ? granule(d) : 0);
    void *a = zt_backend_alloc(d, ZT_MEM_DEVICE, n), *b = zt_backend_alloc(d, ZT_MEM_DEVICE, n);
    zt_backend_release(d, b, 0, n);
    void *c3 = zt_backend_alloc(d, ZT_MEM_DEVICE, n);
    float v[4] = {1, 2, 3, 4};
    float *dv = zt_backend_alloc(d, ZT_MEM_DEVICE, sizeof v);
    zt_backend_copy(d, dv, v, sizeof v, ZT_COPY_H2D, ZT_STREAM_COMM);
    zt_event *ev = zt_backend_event_create(d);
    CHECK(n && a && b && c3 && dv && ev, "rank 0: allocations");
    CHECK(api->all_reduce(c, dv, 4, ZT_F32, ZT_NCCL_SUM) == ZT_OK, "rank 0: posting: %s",
          zt_last_error());
    /* The compute stream goes on after the all-reduce, as ZeRO's does after a collective. */
    zt_backend_event_record(d, ev, ZT_STREAM_COMM);
    zt_backend_stream_wait(d, ZT_STREAM_COMPUTE, ev);
    zt_backend_release(d, a, 0, n);
    CHECK(zt_backend_commit(d, b, 0, n) == ZT_OK, "rank 0: committing b, whose release came "
          "before the all-reduce: %s", zt_last_error());
    zt_status s = zt_backend_commit(d, a, 0, n);
    CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "committing released device memory") &&
              strstr(zt_last_error(), "rank 1") && strstr(zt_last_error(), "exited"),
          "rank 0: committing a, released behind an all-reduce whose peer exited: status %d, %s",
          s, s == ZT_OK ? "success" : zt_last_error());
    api->destroy(c);
    zt_backend_destroy(d);
    fflush(stdout);
    return check_summary("test_cuda_vmm rank 0") != 0;
}

static void check_revive_watched(void) {
    const zt_nccl_api *api = zt_nccl_api_get();
    zt_nccl_id id;
    if (!api || !zt_backend_cuda_symbol("zt_emu_sync_counts")) {
        printf("test_cuda_vmm: the revive behind a dead NCCL peer: SKIPPED (no emulated NCCL)\n");
        return;
    }
    if (api->unique_id(&id) != ZT_OK) {
        CHECK(false, "unique_id: %s", zt_last_error());
        return;
    }
    fflush(stdout);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(revive_rank(r, api, &id));
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the revive behind a dead peer: rank %d "
              "ended with %s %d", r, WIFSIGNALED(st) ? "signal" : "status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
}

int main(void) {
    /* A device per rank for the two ranks of check_revive_watched (forked before this process
     * makes a backend of its own). */
    if (getenv("ZTRAIN_CUDA_EMU"))
        setenv("ZTRAIN_CUDA_EMU_DEVICES", "2", 1);
    if (!zt_backend_available(ZT_DEVICE_CUDA) || zt_backend_device_count(ZT_DEVICE_CUDA) == 0) {
        printf("test_cuda_vmm: SKIPPED: no CUDA device, real or emulated (ctest sets "
               "ZTRAIN_CUDA_EMU=1)\n");
        return 77;
    }
    check_revive_watched();
    zt_status s = zt_backend_create(&be, ZT_DEVICE_CUDA, NULL);
    if (!check_at(__FILE__, __LINE__, s == ZT_OK, "zt_backend_create(cuda): %s", zt_last_error()))
        return check_summary("test_cuda_vmm");
    vmm_counts = (counts_fn)zt_backend_cuda_symbol("zt_cuda_vmm_counts");
    granule_fn granule = (granule_fn)zt_backend_cuda_symbol("zt_cuda_vmm_granule");
    G = granule ? granule(be) : 0;
    CHECK(vmm_counts && G == 2u << 20, "the module's VMM granule is %zu bytes; an H100's is 2 MiB",
          G);
    if (vmm_counts && G) {
        size_t base_alloc = allocated();
        check_random_run(base_alloc);
        check_steady_state(base_alloc);
        issue_counts_fn tally = (issue_counts_fn)zt_backend_cuda_symbol("zt_emu_issue_counts");
        /* Before check_taken_memory, whose refused copy leaves the backend's error standing. */
        if (tally)
            check_commit_issue(tally);
        check_taken_memory(base_alloc);
        if (tally)
            check_issue_per_call(tally);
    }
    zt_backend_destroy(be);
    /* A setting the backend does not understand is refused by name, never ignored. */
    const char *bad[][2] = {{"ZTRAIN_CUDA_VMM", "maybe"}, {"ZTRAIN_CUDA_VMM_MIN_BYTES", "8M"}};
    for (int i = 0; i < 2; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        zt_backend *other = NULL;
        s = zt_backend_create(&other, ZT_DEVICE_CUDA, NULL);
        CHECK(s == ZT_ERR_INVALID && strstr(zt_last_error(), bad[i][0]),
              "%s=%s: %s", bad[i][0], bad[i][1], s == ZT_OK ? "accepted" : zt_last_error());
        if (other)
            zt_backend_destroy(other);
        unsetenv(bad[i][0]);
    }
    /* Only the emulated device reports the fault by granule; a GPU's is an illegal address. */
    if (zt_backend_cuda_symbol("zt_emu_issue_counts"))
        check_check_mode();
    return check_summary("test_cuda_vmm");
}
