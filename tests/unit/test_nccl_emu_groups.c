/* Groups of the "nccl" transport (zt_comm_create_group over engine/comm/comm_nccl.c): NCCL
 * communicators of their members alone, made from a unique id that member 0 sends to the others
 * through the parent, on the emulated device's NCCL, four ranks each a process with an emulated
 * GPU of its own. The 2 × 2 grid of tensor parallelism with data parallelism: groups {0,1} and
 * {2,3} (tp), {0,2} and {1,3} (dp), each pair of disjoint groups working at once; a group that
 * only its members make ({1,2,3}, as a pipeline's tied-weights group is its first and last
 * stages' only) and a group of that group ({1,3}, as the shards sharing a kv head are a group of
 * the TP group). Every group is the nccl transport's own (its device collectives read device
 * memory: nothing is staged through the host), and every result is checked against sums
 * computed here: all-reduce (fp32 and bf16, sum, posted on two groups back to back before one
 * wait), reduce-scatter, all-gather, broadcast and a message on device memory, and an all-reduce
 * on host memory. A member that exits ends the survivor's wait in an error naming its process,
 * the survivor's next call on the group names the group's job ranks, and the job's communicator
 * fails with it; the other group of the grid goes on. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ports.h"
#include "ztrain/backend.h"
#include "ztrain/comm.h"
#include "ztrain/nccl.h"

enum { WORLD = 4, N = 24 };

static int port;

/* Member r's value at element i: small multiples of 1/4, exact in fp32 and bf16, and their sums
 * over up to four members exact too. */
static float input(int job_rank, size_t i) {
    return (float)((job_rank + 1) * (int)(i % 7) - (int)(i % 5) + job_rank) * 0.25f;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact: the values need no rounding */
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    zt_backend *be;
    int rank;
} rank_ctx;

static void *upload(rank_ctx *x, const void *host, size_t bytes) {
    void *d = zt_backend_alloc(x->be, ZT_MEM_DEVICE, bytes);
    zt_backend_copy(x->be, d, host, bytes, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    return d;
}

static bool download(rank_ctx *x, void *host, const void *dev, size_t bytes) {
    zt_backend_copy(x->be, host, dev, bytes, ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    return check_at(__FILE__, __LINE__, zt_backend_sync(x->be) == ZT_OK, "rank %d: sync: %s",
                    x->rank, zt_last_error());
}

/* A group of the parent's members[0..n), attached to the backend. */
static zt_comm *group(rank_ctx *x, zt_comm *parent, const int *members, int n, const char *what) {
    zt_comm *g = NULL;
    if (!check_at(__FILE__, __LINE__,
                  zt_comm_create_group(&g, parent, members, n) == ZT_OK &&
                      zt_comm_attach_backend(g, x->be) == ZT_OK,
                  "rank %d: the %s group: %s", x->rank, what, zt_last_error()))
        return NULL;
    CHECK(strcmp(zt_comm_transport(g), "nccl") == 0 && zt_comm_world_size(g) == n &&
              !zt_comm_dev_staged(g),
          "rank %d: the %s group is a %s group of %d, staged %d: not an NCCL communicator of "
          "its %d members", x->rank, what, zt_comm_transport(g), zt_comm_world_size(g),
          zt_comm_dev_staged(g), n);
    return g;
}

/* Every device collective of a group against the sums of its members' inputs, jobs[] their job
 * ranks. */
static void check_group(rank_ctx *x, zt_comm *g, const int *jobs, const char *what) {
    const int n = zt_comm_world_size(g), me = zt_comm_rank(g);
    float in[N], out[N], want[N];
    for (size_t i = 0; i < N; i++) {
        in[i] = input(x->rank, i);
        want[i] = 0;
        for (int k = 0; k < n; k++)
            want[i] += input(jobs[k], i);
    }
    /* all-reduce fp32 and bf16 */
    float *d = upload(x, in, sizeof in);
    uint16_t h16[N];
    for (size_t i = 0; i < N; i++)
        h16[i] = to_bf16(in[i]);
    uint16_t *d16 = upload(x, h16, sizeof h16);
    CHECK(zt_comm_dev_all_reduce(g, d, N, ZT_F32, ZT_REDUCE_SUM) == ZT_OK &&
              zt_comm_dev_all_reduce(g, d16, N, ZT_BF16, ZT_REDUCE_SUM) == ZT_OK,
          "rank %d, %s: all_reduce: %s", x->rank, what, zt_last_error());
    if (download(x, out, d, sizeof out) && download(x, h16, d16, sizeof h16)) {
        int bad = 0;
        for (size_t i = 0; i < N; i++)
            bad += out[i] != want[i] || from_bf16(h16[i]) != want[i];
        CHECK(bad == 0, "rank %d, %s: all_reduce: %d of %d elements differ (element 1: %g and "
              "%g, expected %g)", x->rank, what, bad, N, out[1], from_bf16(h16[1]), want[1]);
    }
    /* reduce-scatter of equal pieces, in place into member me's piece */
    size_t offsets[WORLD], counts[WORLD], piece = N / (size_t)n;
    for (int k = 0; k < n; k++) {
        offsets[k] = (size_t)k * piece;
        counts[k] = piece;
    }
    zt_backend_copy(x->be, d, in, sizeof in, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    CHECK(zt_comm_dev_reduce_scatter(g, d, d + offsets[me], piece * n, offsets, counts, ZT_F32,
                                     ZT_REDUCE_SUM) == ZT_OK,
          "rank %d, %s: reduce_scatter: %s", x->rank, what, zt_last_error());
    if (download(x, out, d, sizeof out)) {
        int bad = 0;
        for (size_t i = offsets[me]; i < offsets[me] + piece; i++)
            bad += out[i] != want[i];
        CHECK(bad == 0, "rank %d, %s: reduce_scatter: %d of %zu elements of member %d's piece "
              "differ", x->rank, what, bad, piece, me);
    }
    /* all-gather: piece k from member k */
    zt_backend_copy(x->be, d, in, sizeof in, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    CHECK(zt_comm_dev_all_gather(g, d, piece * n, offsets, counts, ZT_F32) == ZT_OK,
          "rank %d, %s: all_gather: %s", x->rank, what, zt_last_error());
    if (download(x, out, d, sizeof out)) {
        int bad = 0;
        for (int k = 0; k < n; k++)
            for (size_t i = offsets[k]; i < offsets[k] + piece; i++)
                bad += out[i] != input(jobs[k], i);
        CHECK(bad == 0, "rank %d, %s: all_gather: %d elements differ", x->rank, what, bad);
    }
    /* broadcast from the last member */
    zt_backend_copy(x->be, d, in, sizeof in, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    CHECK(zt_comm_dev_broadcast(g, d, N, ZT_F32, n - 1) == ZT_OK, "rank %d, %s: broadcast: %s",
          x->rank, what, zt_last_error());
    if (download(x, out, d, sizeof out)) {
        int bad = 0;
        for (size_t i = 0; i < N; i++)
            bad += out[i] != input(jobs[n - 1], i);
        CHECK(bad == 0, "rank %d, %s: broadcast: %d elements differ", x->rank, what, bad);
    }
    /* a message around the group's ring, device to device */
    if (n > 1) {
        const int next = (me + 1) % n, prev = (me + n - 1) % n;
        zt_backend_copy(x->be, d, in, sizeof in, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
        float *dr = upload(x, want, sizeof want);
        zt_status s = me % 2 == 0 ? zt_comm_dev_send(g, d, N, ZT_F32, next) : ZT_OK;
        if (s == ZT_OK)
            s = zt_comm_dev_recv(g, dr, N, ZT_F32, prev);
        if (s == ZT_OK && me % 2 == 1)
            s = zt_comm_dev_send(g, d, N, ZT_F32, next);
        CHECK(s == ZT_OK, "rank %d, %s: send/recv: %s", x->rank, what, zt_last_error());
        if (download(x, out, dr, sizeof out)) {
            int bad = 0;
            for (size_t i = 0; i < N; i++)
                bad += out[i] != input(jobs[prev], i);
            CHECK(bad == 0, "rank %d, %s: message from member %d: %d elements differ", x->rank,
                  what, prev, bad);
        }
        zt_backend_free(x->be, ZT_MEM_DEVICE, dr, sizeof want);
    }
    /* host memory: comm.h's rules (member order) */
    memcpy(out, in, sizeof in);
    CHECK(zt_comm_all_reduce(g, out, N, ZT_F32, ZT_REDUCE_SUM) == ZT_OK &&
              memcmp(out, want, sizeof want) == 0,
          "rank %d, %s: host all_reduce: %s (element 1: %g, expected %g)", x->rank, what,
          zt_last_error(), out[1], want[1]);
    zt_comm_dev_stats st = zt_comm_dev_counts(g);
    CHECK(st.staged_waits == 0 && st.staged_uploads == 0 && st.calls >= 6,
          "rank %d, %s: %llu device calls, %llu staged copies to the host and %llu back: the "
          "group's device collectives must be NCCL's own", x->rank, what, st.calls,
          st.staged_waits, st.staged_uploads);
    zt_backend_free(x->be, ZT_MEM_DEVICE, d, sizeof in);
    zt_backend_free(x->be, ZT_MEM_DEVICE, d16, sizeof h16);
}

static zt_comm *join(int rank, const char *run) {
    zt_dist_info di = {.rank = rank, .world_size = WORLD, .local_rank = rank,
                       .local_world_size = WORLD, .master_port = port};
    snprintf(di.master_addr, sizeof di.master_addr, "127.0.0.1");
    snprintf(di.run_id, sizeof di.run_id, "groups-%d-%s", (int)getppid(), run);
    zt_comm *c = NULL;
    CHECK(zt_comm_create(&c, "nccl", &di, 30) == ZT_OK, "rank %d: %s", rank, zt_last_error());
    return c;
}

/* The grid's groups, both pairs at once, then the members-only group and its group. */
static void run_grid(rank_ctx *x, zt_comm *world) {
    const int r = x->rank;
    int tp_jobs[2] = {r / 2 * 2, r / 2 * 2 + 1}, dp_jobs[2] = {r % 2, r % 2 + 2};
    zt_comm *tp = group(x, world, tp_jobs, 2, "tp");
    zt_comm *dp = tp ? group(x, world, dp_jobs, 2, "dp") : NULL;
    if (tp && dp) {
        /* Both groups' all-reduces posted back to back, one wait for both. */
        float a[N], b[N];
        for (size_t i = 0; i < N; i++)
            a[i] = b[i] = input(r, i);
        float *da = upload(x, a, sizeof a), *db = upload(x, b, sizeof b);
        CHECK(zt_comm_dev_all_reduce(tp, da, N, ZT_F32, ZT_REDUCE_SUM) == ZT_OK &&
                  zt_comm_dev_all_reduce(dp, db, N, ZT_F32, ZT_REDUCE_SUM) == ZT_OK,
              "rank %d: posting on both groups: %s", r, zt_last_error());
        if (download(x, a, da, sizeof a) && download(x, b, db, sizeof b)) {
            int bad = 0;
            for (size_t i = 0; i < N; i++)
                bad += a[i] != input(tp_jobs[0], i) + input(tp_jobs[1], i) ||
                       b[i] != input(dp_jobs[0], i) + input(dp_jobs[1], i);
            CHECK(bad == 0, "rank %d: the tp and dp all-reduces posted together: %d elements "
                  "differ", r, bad);
        }
        zt_backend_free(x->be, ZT_MEM_DEVICE, da, sizeof a);
        zt_backend_free(x->be, ZT_MEM_DEVICE, db, sizeof b);
        check_group(x, tp, tp_jobs, "tp group");
        check_group(x, dp, dp_jobs, "dp group");
    }
    /* Made by its members only: rank 0 does not call. */
    if (r != 0) {
        int jobs[3] = {1, 2, 3}, sub_members[2] = {0, 2}, sub_jobs[2] = {1, 3};
        zt_comm *three = group(x, world, jobs, 3, "members-only");
        if (three) {
            check_group(x, three, jobs, "members-only group {1,2,3}");
            if (r != 2) {
                zt_comm *sub = group(x, three, sub_members, 2, "group of a group");
                if (sub)
                    check_group(x, sub, sub_jobs, "group {1,3} of group {1,2,3}");
                zt_comm_destroy(sub);
            }
        }
        zt_comm_destroy(three);
    }
    zt_comm_destroy(dp);
    zt_comm_destroy(tp);
}

/* Rank 2 exits once the dp groups {0,2} and {1,3} exist; rank 0 meets it. */
static void run_dead_member(rank_ctx *x, zt_comm *world, const pid_t *pids) {
    const int r = x->rank;
    int dp_jobs[2] = {r % 2, r % 2 + 2};
    zt_comm *dp = group(x, world, dp_jobs, 2, "dp");
    if (!dp)
        return;
    if (r == 2)
        _exit(0);
    float v[N];
    for (size_t i = 0; i < N; i++)
        v[i] = input(r, i);
    float *d = upload(x, v, sizeof v);
    zt_status s = zt_comm_dev_all_reduce(dp, d, N, ZT_F32, ZT_REDUCE_SUM);
    CHECK(s == ZT_OK, "rank %d: posting: %s", r, zt_last_error());
    s = zt_backend_sync(x->be);
    if (r == 0) {
        char pid[48];
        snprintf(pid, sizeof pid, "(pid %d) exited", (int)pids[2]);
        CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), pid),
              "rank 0: the wait for an all-reduce of the group {0,2} whose member 2 exited: "
              "status %d, %s (want one naming %s)", s, zt_last_error(), pid);
        printf("test_nccl_emu_groups: a member exited: %s\n", zt_last_error());
        s = zt_comm_dev_all_reduce(dp, d, N, ZT_F32, ZT_REDUCE_SUM);
        CHECK(s == ZT_ERR_IO && strstr(zt_last_error(), "the group of job ranks 0, 2"),
              "rank 0: the next call on the failed group: status %d, %s", s, zt_last_error());
        s = zt_comm_barrier(world);
        CHECK(s != ZT_OK && strstr(zt_last_error(), "job ranks 0, 2"),
              "rank 0: the job's communicator after its group failed: status %d, %s", s,
              zt_last_error());
        printf("test_nccl_emu_groups: then the job's communicator: %s\n", zt_last_error());
    } else {
        /* The other dp group {1,3} is untouched. */
        CHECK(s == ZT_OK, "rank %d: the group {1,3} beside the failed one: %s", r,
              zt_last_error());
        if (s == ZT_OK && download(x, v, d, sizeof v))
            CHECK(v[3] == input(1, 3) + input(3, 3), "rank %d: the group {1,3}: %g, expected %g",
                  r, v[3], input(1, 3) + input(3, 3));
    }
    zt_backend_free(x->be, ZT_MEM_DEVICE, d, sizeof v);
    zt_comm_destroy(dp);
}

static int rank_main(int rank, const char *run, const pid_t *pids) {
    rank_ctx x = {.rank = rank};
    zt_backend_options o = {.device_index = rank};
    if (!check_at(__FILE__, __LINE__, zt_backend_create(&x.be, ZT_DEVICE_CUDA, &o) == ZT_OK,
                  "rank %d: %s", rank, zt_last_error()))
        return 1;
    zt_comm *world = join(rank, run);
    if (world && check_at(__FILE__, __LINE__, zt_comm_attach_backend(world, x.be) == ZT_OK,
                          "rank %d: attach: %s", rank, zt_last_error())) {
        if (strcmp(run, "grid") == 0)
            run_grid(&x, world);
        else
            run_dead_member(&x, world, pids);
    }
    zt_comm_destroy(world);
    zt_backend_destroy(x.be);
    char name[64];
    snprintf(name, sizeof name, "test_nccl_emu_groups %s rank %d", run, rank);
    int rc = check_summary(name);
    fflush(stdout);
    return rc;
}

/* Four ranks, forked last to first, so that rank 0 knows the others' pids. */
static void run(const char *what) {
    port = free_port();
    pid_t pids[WORLD] = {0};
    for (int r = WORLD - 1; r >= 0; r--) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(r, what, pids));
    }
    for (int r = 0; r < WORLD; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: rank %d ended with %s %d", what, r,
              WIFSIGNALED(st) ? "signal" : "status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
}

int main(void) {
    if (!getenv("ZTRAIN_CUDA_EMU") && !getenv("ZTRAIN_CUDA_MODULE"))
        setenv("ZTRAIN_CUDA_EMU", "1", 1);
    setenv("ZTRAIN_CUDA_EMU_DEVICES", "4", 1);
    if (!zt_backend_available(ZT_DEVICE_CUDA) || !zt_backend_cuda_symbol("zt_emu_sync_counts") ||
        !zt_nccl_api_get()) {
        printf("test_nccl_emu_groups: SKIPPED: no emulated CUDA device with NCCL in this build\n");
        return 0;
    }
    run("grid");
    setenv("ZTRAIN_CUDA_EMU_NCCL_TIMEOUT", "5", 1);
    run("dead");
    return check_summary("test_nccl_emu_groups");
}
