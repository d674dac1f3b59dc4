/* The CUDA backend's watchers of its host waits (kernels/cuda/stream_watch.c), on the emulated
 * device, through the module's calls found by name (cuda_backend.h): a sync snapshots each
 * watcher's posting sequence before its wait (zt_cuda_watch_mark) and gives it back once the
 * wait covered every stream (zt_cuda_watch_settled). A communicator destroyed between the two
 * and another registered at the same address must not be given the first one's sequence: that
 * would retire work of the second that no wait covered. Here one watcher is registered,
 * snapshotted, removed, and a second registered at the same ctx before the settle, which must
 * only look at it (covered -1); a watcher left in place is given its sequence. */
#include "check.h"
#include "ztrain/backend.h"

typedef long (*mark_fn)(void *);
typedef zt_status (*watch_fn)(void *, long);
typedef zt_status (*watch_add_fn)(zt_backend *, watch_fn, mark_fn, void *);
typedef void (*watch_remove_fn)(zt_backend *, void *);
/* The marks are the module's zt_cuda_watch_marks, opaque here: a buffer far larger than it. */
typedef void (*watch_marks_fn)(zt_backend *, void *);

/* The one address both registrations use, as a communicator freed and another allocated in
 * its place would. */
static struct {
    long covered; /* what its last poll was told; -2 before any */
    int polls;
} comm;

static long old_mark(void *ctx) {
    (void)ctx;
    return 41;
}

static long new_mark(void *ctx) {
    (void)ctx;
    return 3;
}

static zt_status poll(void *ctx, long covered) {
    (void)ctx;
    comm.covered = covered;
    comm.polls++;
    return ZT_OK;
}

int main(void) {
    if (!getenv("ZTRAIN_CUDA_EMU") && !getenv("ZTRAIN_CUDA_MODULE"))
        setenv("ZTRAIN_CUDA_EMU", "1", 1);
    zt_backend *be = NULL;
    if (!zt_backend_available(ZT_DEVICE_CUDA) ||
        zt_backend_create(&be, ZT_DEVICE_CUDA, NULL) != ZT_OK) {
        printf("test_cuda_stream_watch: SKIPPED: no CUDA backend in this build\n");
        return 0;
    }
    watch_add_fn add = (watch_add_fn)zt_backend_cuda_symbol("zt_cuda_watch_add");
    watch_remove_fn remove = (watch_remove_fn)zt_backend_cuda_symbol("zt_cuda_watch_remove");
    watch_marks_fn mark = (watch_marks_fn)zt_backend_cuda_symbol("zt_cuda_watch_mark");
    watch_marks_fn settled = (watch_marks_fn)zt_backend_cuda_symbol("zt_cuda_watch_settled");
    if (!add || !remove || !mark || !settled) {
        printf("test_cuda_stream_watch: SKIPPED: the module exports no watch calls\n");
        zt_backend_destroy(be);
        return 0;
    }
    static _Alignas(16) unsigned char marks[1 << 14];

    /* A watcher registered throughout is given the sequence its mark reported. */
    CHECK(add(be, poll, old_mark, &comm) == ZT_OK, "add: %s", zt_last_error());
    mark(be, marks);
    comm.covered = -2;
    settled(be, marks);
    CHECK(comm.polls == 1 && comm.covered == 41,
          "the watcher in place at the snapshot and the settle: %d polls, covered %ld (41 "
          "expected)", comm.polls, comm.covered);

    /* Removed after the snapshot and another registered at its address: the settle only looks
     * at the new one (before: the match by address gave it the old sequence, 41). */
    mark(be, marks);
    remove(be, &comm);
    CHECK(add(be, poll, new_mark, &comm) == ZT_OK, "add again: %s", zt_last_error());
    comm.covered = -2;
    comm.polls = 0;
    settled(be, marks);
    CHECK(comm.polls == 1 && comm.covered == -1,
          "a watcher registered at a removed one's address after the snapshot: %d polls, "
          "covered %ld (-1 expected: no wait covered its work)", comm.polls, comm.covered);

    /* Its own snapshot then covers it. */
    mark(be, marks);
    comm.covered = -2;
    settled(be, marks);
    CHECK(comm.covered == 3, "the new watcher's own snapshot: covered %ld (3 expected)",
          comm.covered);
    remove(be, &comm);
    zt_backend_destroy(be);
    return check_summary("test_cuda_stream_watch");
}
