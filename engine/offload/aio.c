/* Asynchronous file I/O: io_uring when available, else a pool of pread/pwrite threads (aio.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aio.h"

#ifdef ZT_HAVE_LIBURING
#include <liburing.h>
#endif

enum { POOL_THREADS = 2 };

struct zt_aio {
    bool uring;
#ifdef ZT_HAVE_LIBURING
    struct io_uring ring;
#endif
    /* The thread pool: a FIFO of requests, and `busy` flags cleared under the lock. */
    pthread_t threads[POOL_THREADS];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t work, finished;
    zt_aio_req *head, *tail;
    bool stop;
};

const char *zt_aio_backend(const zt_aio *a) { return a->uring ? "io_uring" : "threads"; }

/* ---- thread pool --------------------------------------------------------------------------- */

/* Moves the whole request, resuming short transfers; returns 0 or an errno value. */
static int transfer(zt_aio_req *r) {
    while (r->done < r->len) {
        char *p = (char *)r->buf + r->done;
        size_t left = r->len - r->done;
        off_t at = r->off + (off_t)r->done;
        ssize_t got = r->write ? pwrite(r->fd, p, left, at) : pread(r->fd, p, left, at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return errno;
        if (got == 0)
            return r->write ? ENOSPC : EIO;
        r->done += (size_t)got;
    }
    return 0;
}

static void *pool_main(void *arg) {
    zt_aio *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && !a->head)
            pthread_cond_wait(&a->work, &a->mu);
        if (!a->head)
            break; /* stopping, and nothing left */
        zt_aio_req *r = a->head;
        a->head = r->next;
        if (!a->head)
            a->tail = NULL;
        pthread_mutex_unlock(&a->mu);
        int err = transfer(r);
        pthread_mutex_lock(&a->mu);
        r->err = err;
        r->busy = false;
        pthread_cond_broadcast(&a->finished);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static zt_status pool_start(zt_aio *a) {
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_cond_init(&a->finished, NULL);
    for (int i = 0; i < POOL_THREADS; i++) {
        if (pthread_create(&a->threads[i], NULL, pool_main, a) != 0)
            return zt_error(ZT_ERR_NOMEM, "offload: cannot start the I/O threads");
        a->n_threads++;
    }
    return ZT_OK;
}

static void pool_stop(zt_aio *a) {
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_broadcast(&a->work);
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < a->n_threads; i++)
        pthread_join(a->threads[i], NULL);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->finished);
}

/* ---- io_uring ------------------------------------------------------------------------------ */

#ifdef ZT_HAVE_LIBURING
/* Queues the part of r that has not moved yet. */
static void uring_queue(zt_aio *a, zt_aio_req *r) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&a->ring);
    if (!sqe) {
        /* Cannot happen while no more than `depth` requests are in flight. */
        r->err = EAGAIN;
        r->busy = false;
        return;
    }
    char *p = (char *)r->buf + r->done;
    if (r->write)
        io_uring_prep_write(sqe, r->fd, p, (unsigned)(r->len - r->done), r->off + (off_t)r->done);
    else
        io_uring_prep_read(sqe, r->fd, p, (unsigned)(r->len - r->done), r->off + (off_t)r->done);
    io_uring_sqe_set_data(sqe, r);
    int ret;
    do
        ret = io_uring_submit(&a->ring);
    while (ret == -EINTR);
    if (ret < 0) {
        r->err = -ret;
        r->busy = false;
    }
}

/* Takes one completion and applies it to its request (which may be resubmitted). */
static int uring_reap(zt_aio *a) {
    struct io_uring_cqe *cqe;
    int ret = io_uring_wait_cqe(&a->ring, &cqe);
    if (ret < 0)
        return ret;
    zt_aio_req *r = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&a->ring, cqe);
    if (res == -EAGAIN || res == -EINTR) {
        uring_queue(a, r);
    } else if (res < 0) {
        r->err = -res;
        r->busy = false;
    } else if (res == 0) {
        r->err = r->write ? ENOSPC : EIO;
        r->busy = false;
    } else {
        r->done += (size_t)res;
        if (r->done < r->len)
            uring_queue(a, r);
        else
            r->busy = false;
    }
    return 0;
}
#endif

/* ---- interface ----------------------------------------------------------------------------- */

zt_status zt_aio_create(zt_aio **out, unsigned depth) {
    zt_aio *a = calloc(1, sizeof *a);
    if (!a)
        return zt_error(ZT_ERR_NOMEM, "offload: out of memory");
    const char *want = getenv("ZTRAIN_AIO");
    bool threads_only = want && strcmp(want, "threads") == 0;
#ifdef ZT_HAVE_LIBURING
    /* io_uring may be compiled in and still refused by the kernel or a seccomp policy (ENOSYS,
     * EPERM): then the threads do the work. */
    if (!threads_only && io_uring_queue_init(depth < 8 ? 8 : depth, &a->ring, 0) == 0)
        a->uring = true;
#else
    (void)depth;
    (void)threads_only;
#endif
    if (!a->uring) {
        zt_status s = pool_start(a);
        if (s != ZT_OK) {
            zt_aio_destroy(a);
            return s;
        }
    }
    *out = a;
    return ZT_OK;
}

void zt_aio_destroy(zt_aio *a) {
    if (!a)
        return;
#ifdef ZT_HAVE_LIBURING
    if (a->uring)
        io_uring_queue_exit(&a->ring);
#endif
    if (!a->uring)
        pool_stop(a);
    free(a);
}

void zt_aio_submit(zt_aio *a, zt_aio_req *r) {
    r->busy = true;
    r->err = 0;
    r->done = 0;
    r->next = NULL;
#ifdef ZT_HAVE_LIBURING
    if (a->uring) {
        uring_queue(a, r);
        return;
    }
#endif
    pthread_mutex_lock(&a->mu);
    if (a->tail)
        a->tail->next = r;
    else
        a->head = r;
    a->tail = r;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->mu);
}

void zt_aio_wait(zt_aio *a, zt_aio_req *r) {
#ifdef ZT_HAVE_LIBURING
    if (a->uring) {
        while (r->busy) {
            int ret = uring_reap(a);
            if (ret < 0 && ret != -EINTR) {
                /* The ring itself failed: nothing more will complete. */
                r->err = -ret;
                r->busy = false;
            }
        }
        return;
    }
#endif
    pthread_mutex_lock(&a->mu);
    while (r->busy)
        pthread_cond_wait(&a->finished, &a->mu);
    pthread_mutex_unlock(&a->mu);
}
