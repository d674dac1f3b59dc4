/* Tests for collectives on device buffers (zt_comm_dev_* in ztrain/comm.h) over the shm
 * transport, as ranks sharing one GPU use it: a stand-in backend whose "device" memory the host
 * cannot touch (PROT_NONE pages, opened only inside its copy entry) shows that every device
 * buffer travels through the host staging copies, in the directions and numbers the header
 * implies, with results equal to the formulas; on the CPU backend the buffers pass as they are. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/backend.h"
#include "ztrain/comm.h"

/* ---- a backend whose device memory the host cannot read ---------------------------------- */

typedef struct {
    int copies[4]; /* by zt_copy_kind */
    int records, waits;
} fake_state;

static fake_state fake;
static const size_t PAGE = 4096;

static size_t pages(size_t bytes) { return (bytes + PAGE - 1) / PAGE * PAGE + PAGE; }

static void *fake_alloc(zt_backend *be, zt_mem kind, size_t bytes) {
    void *p = mmap(NULL, pages(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (kind == ZT_MEM_DEVICE)
        mprotect(p, pages(bytes), PROT_NONE);
    return p;
}

static void fake_free(zt_backend *be, zt_mem kind, void *p, size_t bytes) {
    if (p)
        munmap(p, pages(bytes));
}

/* Device pages are opened for the copy alone: the page-aligned span around the device side. */
static void open_span(void *p, size_t bytes, int prot) {
    char *lo = (char *)((unsigned long)p / PAGE * PAGE);
    char *hi = (char *)p + bytes;
    mprotect(lo, (size_t)(hi - lo) + PAGE, prot);
}

static void fake_copy(zt_backend *be, void *dst, const void *src, size_t bytes, zt_copy_kind k,
                      zt_stream s) {
    fake.copies[k]++;
    void *dev = k == ZT_COPY_H2D ? dst : k == ZT_COPY_D2H ? (void *)src : NULL;
    if (dev)
        open_span(dev, bytes, PROT_READ | PROT_WRITE);
    memcpy(dst, src, bytes);
    if (dev)
        open_span(dev, bytes, PROT_NONE);
}

static zt_event *fake_event_create(zt_backend *be) { return malloc(1); }
static void fake_event_destroy(zt_backend *be, zt_event *ev) { free(ev); }
static void fake_record(zt_backend *be, zt_event *ev, zt_stream s) { fake.records++; }
static void fake_wait(zt_backend *be, zt_stream s, zt_event *ev) { fake.waits++; }

static const zt_backend_iface fake_iface = {
    .alloc = fake_alloc,
    .free = fake_free,
    .copy = fake_copy,
    .event_create = fake_event_create,
    .event_destroy = fake_event_destroy,
    .event_record = fake_record,
    .stream_wait = fake_wait,
};

static zt_backend fake_be = {.name = "fake-gpu", .device = ZT_DEVICE_CUDA, .iface = &fake_iface};

/* Writes host values into device memory and reads them back, as a GPU program would. */
static float *dev_floats(const float *host, size_t n) {
    float *d = zt_backend_alloc(&fake_be, ZT_MEM_DEVICE, n * sizeof(float));
    zt_backend_copy(&fake_be, d, host, n * sizeof(float), ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    return d;
}

static void read_floats(float *host, const float *d, size_t n) {
    zt_backend_copy(&fake_be, host, d, n * sizeof(float), ZT_COPY_D2H, ZT_STREAM_COMPUTE);
}

/* ---- one rank --------------------------------------------------------------------------- */

enum { N = 10 };

static int rank_main(int rank, int world, const char *run_id, bool fake_device) {
    zt_dist_info d = {.rank = rank, .world_size = world, .local_rank = rank,
                      .local_world_size = world};
    snprintf(d.run_id, sizeof d.run_id, "%s", run_id);
    zt_comm *c = NULL;
    if (zt_comm_create(&c, "shm", &d, 20) != ZT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, zt_last_error());
        return 1;
    }
    zt_backend *cpu = NULL;
    if (!fake_device && zt_backend_create(&cpu, ZT_DEVICE_CPU, NULL) != ZT_OK)
        return 1;
    zt_backend *be = fake_device ? &fake_be : cpu;
    CHECK(zt_comm_attach_backend(c, be) == ZT_OK, "%s", zt_last_error());
    CHECK(zt_comm_dev_staged(c) == fake_device, "staged %d on %s", zt_comm_dev_staged(c),
          be->name);

    float host[N], got[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)(i + 1) * (float)(rank + 1);
    /* All-reduce (sum): element i is (i+1) · (1 + 2 + ... + world). */
    float tri = (float)(world * (world + 1) / 2);
    float *buf = fake_device ? dev_floats(host, N) : memcpy(malloc(sizeof host), host,
                                                            sizeof host);
    fake = (fake_state){0};
    CHECK(zt_comm_dev_all_reduce(c, buf, N, ZT_F32, ZT_REDUCE_SUM) == ZT_OK, "%s",
          zt_last_error());
    if (fake_device) {
        CHECK(fake.copies[ZT_COPY_D2H] == 1 && fake.copies[ZT_COPY_H2D] == 1,
              "all_reduce copies D2H %d H2D %d, expected 1 and 1", fake.copies[ZT_COPY_D2H],
              fake.copies[ZT_COPY_H2D]);
        CHECK(fake.records == 2 && fake.waits == 2, "events %d/%d, expected 2/2", fake.records,
              fake.waits);
        read_floats(got, buf, N);
    } else {
        memcpy(got, buf, sizeof got);
    }
    for (int i = 0; i < N; i++)
        CHECK(got[i] == (float)(i + 1) * tri, "all_reduce[%d] = %g on rank %d", i, got[i], rank);

    /* Reduce-scatter (avg) of the same input into this rank's piece, written where it lies. */
    size_t offsets[2] = {0, 4}, counts[2] = {4, N - 4};
    if (fake_device) {
        zt_backend_copy(be, buf, host, sizeof host, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    } else {
        memcpy(buf, host, sizeof host);
    }
    fake = (fake_state){0};
    CHECK(zt_comm_dev_reduce_scatter(c, buf, buf + offsets[rank], N, offsets, counts, ZT_F32,
                                     ZT_REDUCE_AVG) == ZT_OK, "%s", zt_last_error());
    if (fake_device) {
        CHECK(fake.copies[ZT_COPY_D2H] == 1 && fake.copies[ZT_COPY_H2D] == 1,
              "reduce_scatter copies D2H %d H2D %d", fake.copies[ZT_COPY_D2H],
              fake.copies[ZT_COPY_H2D]);
        read_floats(got, buf, N);
    } else {
        memcpy(got, buf, sizeof got);
    }
    for (size_t i = offsets[rank]; i < offsets[rank] + counts[rank]; i++)
        CHECK(got[i] == (float)(i + 1) * tri / (float)world, "reduce_scatter[%zu] = %g", i,
              got[i]);
    /* Outside its piece the input is left as it was. */
    size_t other = offsets[1 - rank];
    CHECK(got[other] == host[other], "reduce_scatter changed [%zu]: %g", other, got[other]);

    /* All-gather: rank r's piece holds 100·r + i; the rest of the buffer is -1 everywhere. */
    float mine[N];
    for (int i = 0; i < N; i++)
        mine[i] = -1;
    counts[0] = 3; /* element 3 belongs to no piece and must stay -1 */
    for (size_t i = offsets[rank]; i < offsets[rank] + counts[rank]; i++)
        mine[i] = (float)(100 * rank) + (float)i;
    if (fake_device)
        zt_backend_copy(be, buf, mine, sizeof mine, ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    else
        memcpy(buf, mine, sizeof mine);
    CHECK(zt_comm_dev_all_gather(c, buf, N, offsets, counts, ZT_F32) == ZT_OK, "%s",
          zt_last_error());
    if (fake_device)
        read_floats(got, buf, N);
    else
        memcpy(got, buf, sizeof got);
    for (int r = 0; r < world; r++)
        for (size_t i = offsets[r]; i < offsets[r] + counts[r]; i++)
            CHECK(got[i] == (float)(100 * r) + (float)i, "all_gather[%zu] = %g", i, got[i]);
    CHECK(got[3] == -1, "all_gather wrote element 3, in no piece: %g", got[3]);

    /* Broadcast from rank 1, then a message from rank 0 to rank 1. */
    float b[3] = {(float)rank, 7, 9};
    float *bd = fake_device ? dev_floats(b, 3) : b;
    CHECK(zt_comm_dev_broadcast(c, bd, 3, ZT_F32, 1) == ZT_OK, "%s", zt_last_error());
    if (fake_device)
        read_floats(b, bd, 3);
    CHECK(b[0] == 1 && b[1] == 7 && b[2] == 9, "broadcast gave %g %g %g", b[0], b[1], b[2]);
    float msg[2] = {rank == 0 ? 3.5f : 0, rank == 0 ? -2 : 0};
    float *md = fake_device ? dev_floats(msg, 2) : msg;
    zt_status s = rank == 0 ? zt_comm_dev_send(c, md, 2, ZT_F32, 1)
                            : zt_comm_dev_recv(c, md, 2, ZT_F32, 0);
    CHECK(s == ZT_OK, "%s", zt_last_error());
    if (fake_device)
        read_floats(msg, md, 2);
    if (rank == 1)
        CHECK(msg[0] == 3.5f && msg[1] == -2, "recv gave %g %g", msg[0], msg[1]);

    /* A NULL device buffer is refused like a NULL host one, before anything is copied. */
    CHECK(zt_comm_barrier(c) == ZT_OK, "%s", zt_last_error());
    if (fake_device) {
        fake = (fake_state){0};
        CHECK(zt_comm_dev_all_reduce(c, NULL, 4, ZT_F32, ZT_REDUCE_SUM) == ZT_ERR_INVALID &&
                  strstr(zt_last_error(), "NULL"),
              "NULL buffer: %s", zt_last_error());
        CHECK(fake.copies[ZT_COPY_D2H] == 0, "a NULL buffer was copied");
    }
    if (fake_device) {
        zt_backend_free(be, ZT_MEM_DEVICE, buf, sizeof host);
        zt_backend_free(be, ZT_MEM_DEVICE, bd, sizeof b);
        zt_backend_free(be, ZT_MEM_DEVICE, md, sizeof msg);
    } else {
        free(buf);
    }
    zt_comm_destroy(c);
    if (cpu)
        zt_backend_destroy(cpu);
    return check_failures ? 1 : 0;
}

/* Forks two ranks and reports how each ended (a segfault means the host touched device memory). */
static void run(bool fake_device) {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "devtest-%d-%d", (int)getpid(), fake_device);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(60);
            _exit(rank_main(r, 2, run_id, fake_device));
        }
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s backend: rank %d ended with %s %d",
              fake_device ? "device-memory" : "CPU", r,
              WIFSIGNALED(st) ? "signal" : "status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
}

int main(void) {
    run(true);
    run(false);
    return check_summary("test_comm_device");
}
