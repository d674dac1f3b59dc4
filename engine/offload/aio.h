/* Asynchronous file I/O for NVMe offload (internal to the engine): reads and writes of whole
 * aligned buffers at file offsets, submitted now and waited for later, so the optimizer can update
 * one tile while the next is read and the previous one written.
 *
 * Two backends behind one interface: io_uring (Debian's liburing, when the library was found at
 * build time and the kernel allows it; containers often forbid io_uring_setup) and, otherwise, a
 * small pool of threads running pread/pwrite. ZTRAIN_AIO=threads picks the pool on purpose (tests
 * check that both give the same bits). */
#ifndef ZTRAIN_AIO_H
#define ZTRAIN_AIO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "ztrain/status.h"

typedef struct zt_aio zt_aio;

/* One transfer. The caller owns it and its buffer, fills fd..off, and must not touch either while
 * it is in flight (between zt_aio_submit and the zt_aio_wait that sees it finished). */
typedef struct zt_aio_req {
    int fd;
    bool write;
    void *buf;
    size_t len;
    off_t off;
    /* Set by the backend. err is 0 or an errno value (EIO for a read that met the end of the
     * file); done counts the bytes transferred. */
    bool busy;
    int err;
    size_t done;
    struct zt_aio_req *next; /* the thread pool's queue */
} zt_aio_req;

/* Creates a context with room for `depth` requests in flight. Free with zt_aio_destroy, after
 * every submitted request has been waited for. */
zt_status zt_aio_create(zt_aio **out, unsigned depth);
void zt_aio_destroy(zt_aio *a);

/* Starts r. A submission that fails completes r at once with the error in r->err. Requests are
 * submitted and waited for from one thread at a time. */
void zt_aio_submit(zt_aio *a, zt_aio_req *r);

/* Waits until r (submitted earlier, or never submitted) is finished. Short transfers are resumed
 * until the whole length has moved or an error occurs. */
void zt_aio_wait(zt_aio *a, zt_aio_req *r);

/* "io_uring" or "threads". */
const char *zt_aio_backend(const zt_aio *a);

#endif
