/* The offload store: where a rank's optimizer streams live (memory, host, NVMe files), the
 * synchronous copies in and out, and the tiled update that streams the files through aligned
 * buffers (offload.h). */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "aio.h"
#include "ztrain/admission.h"
#include "ztrain/fault_inject.h"
#include "ztrain/offload.h"

/* O_DIRECT transfers start, end and sit in memory on this boundary (the largest logical block
 * size in common use). */
#define BLOCK ((size_t)4096)
/* The bounce buffer of the synchronous copies (checkpoints, stage-3 parameter fetches). */
#define SYNC_BYTES ((size_t)1 << 20)

typedef struct {
    zt_offload_place place;
    const char *name;
    size_t elem;
    /* MEMORY and HOST: element i at mem + i·elem. FILE: elements [0, n_file) are in the file and
     * element i ≥ n_file at mem + (i − n_file)·elem (host memory, ratio < 1). */
    void *mem;
    bool owns_mem;
    size_t host_bytes;
    bool write_only;
    double resident;
    size_t n_file;
    int fd;
    bool direct;
    int dir;
    char path[PATH_MAX];
    void *buf[ZT_OFFLOAD_MAX_SLOTS];
    zt_aio_req rd[ZT_OFFLOAD_MAX_SLOTS], wr[ZT_OFFLOAD_MAX_SLOTS];
} stream;

typedef struct {
    const char *key;       /* the config key, for messages */
    const char *what;      /* "optimizer state" or "parameters" */
    const char *root;      /* nvme_path */
    char path[PATH_MAX];   /* the directory this run created under it */
    bool made;
} directory;

struct zt_offload {
    zt_backend *be;      /* whose host memory the state and the I/O buffers are */
    zt_mem host_kind;    /* ZT_MEM_PINNED when pin_memory is set, else ZT_MEM_HOST */
    int rank;
    size_t n, tile;
    int slots;
    bool pipeline_read, pipeline_write;
    stream s[ZT_OFFLOAD_STREAMS];
    directory dirs[2];
    zt_aio *aio;
    unsigned char *sync;
    pthread_mutex_t sync_mu;
    /* Per backend stream: recorded behind a device copy to or from pinned memory, which the
     * host then waits for (each stream's copies come from one thread: the training thread's
     * on the compute stream, ZeRO's communication thread's on its own). */
    zt_event *copied[ZT_STREAMS];
    int64_t updates;
    int64_t full_at; /* ZTRAIN_INJECT_NVME_FULL */
    char describe[160];
};

/* The first I/O failure of an update. */
typedef struct {
    int err;
    const stream *s;
    bool write;
    size_t len;
    off_t off;
    zt_aio_req *injected; /* the write that fault injection failed, if any */
    bool from_injection;
} step_error;

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static void *at(const stream *s, size_t i) {
    size_t base = s->place == ZT_PLACE_FILE ? s->n_file : 0;
    return (char *)s->mem + (i - base) * s->elem;
}

static bool tile_in_file(const stream *s, size_t first) {
    return s->place == ZT_PLACE_FILE && first < s->n_file;
}

static size_t file_bytes(const stream *s) {
    return round_up(s->n_file, ZT_OFFLOAD_ALIGN) * s->elem;
}

/* Host memory for offloaded state, from the backend: zeroed and page-aligned (so O_DIRECT can use
 * it), pinned when pin_memory asks (for a GPU's DMA; on the CPU backend pinned memory is plain
 * host memory, so pin_memory has no effect there; README). */
static void *host_alloc(zt_offload *f, size_t bytes) {
    return zt_backend_alloc(f->be, f->host_kind, bytes);
}

static void host_free(zt_offload *f, void *p, size_t bytes) {
    zt_backend_free(f->be, f->host_kind, p, bytes);
}

/* Copies between the caller's buffer (device memory when dev, on stream `on`) and the store's
 * host memory: write takes the caller's data in, read hands it out. A copy between the device
 * and pinned memory is asynchronous (backend.h): it is waited for here, with an event behind it
 * on its stream, since the host uses the pinned side at once (pwrite of the bounce buffer, the
 * next window's pread over it, the update's tiles), and a device error it meets is returned.
 * Host to host is a plain copy: no stream has a part in it. */
static zt_status caller_copy(zt_offload *f, bool dev, bool write, void *dst, const void *src,
                             size_t bytes, zt_stream on) {
    if (!dev) {
        memcpy(dst, src, bytes);
        return ZT_OK;
    }
    zt_backend_copy(f->be, dst, src, bytes, write ? ZT_COPY_D2H : ZT_COPY_H2D, on);
    if (f->host_kind != ZT_MEM_PINNED)
        return ZT_OK;
    if (!f->copied[on])
        return zt_backend_sync(f->be);
    zt_backend_event_record(f->be, f->copied[on], on);
    return zt_backend_event_wait(f->be, f->copied[on]);
}

/* ---- directories and files ------------------------------------------------------------------ */

/* The job name as it may appear in a directory name. */
static void safe_name(char *out, size_t size, const char *name) {
    size_t n = 0;
    for (const char *p = name && *name ? name : "job"; *p && n + 1 < size && n < 48; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.';
        out[n++] = ok ? c : '_';
    }
    out[n] = '\0';
}

/* Tells the process that started this rank (`ztrain run`'s launcher, ztraind's supervisor) which
 * directory it makes, by one line "RANK PATH" appended to the file ZT_OFFLOAD_RECORD_ENV names: a
 * rank killed with SIGKILL cannot remove it, and its keeper, which knows its own record file,
 * then removes exactly the directories its own ranks made, never another run's beside them.
 * The name is recorded before the directory is made (make_dir), so no kill leaves a directory
 * the record does not name; a recorded name that never came to be is nothing to the keeper. A
 * name found taken after all is withdrawn by a line "RANK -PATH". One write with O_APPEND keeps
 * lines of ranks that share the file whole. A path with a newline in it is not recorded (its
 * line could not be read back). */
static void record_line(const zt_offload *f, const directory *d, bool withdrawn) {
    const char *record = getenv(ZT_OFFLOAD_RECORD_ENV);
    if (!record || !*record || strchr(d->path, '\n'))
        return;
    /* Absolute, since the keeper's working directory need not be the rank's. */
    char cwd[PATH_MAX] = "";
    if (d->path[0] != '/' && !getcwd(cwd, sizeof cwd))
        return;
    char line[2 * PATH_MAX + 32];
    int n = snprintf(line, sizeof line, "%d %s%s%s%s\n", f->rank, withdrawn ? "-" : "", cwd,
                     cwd[0] ? "/" : "", d->path);
    int fd = open(record, O_WRONLY | O_APPEND | O_CLOEXEC);
    ssize_t w = fd >= 0 && n > 0 && (size_t)n < sizeof line ? write(fd, line, (size_t)n) : -1;
    if (w != n && !withdrawn)
        fprintf(stderr, "[ztrain] rank %d: warning: cannot record its offload directory %s in "
                "%s: %s; if the rank is killed, remove the directory by hand\n", f->rank,
                d->path, record, w < 0 ? strerror(errno) : "short write");
    if (fd >= 0)
        close(fd);
}

/* Six random characters from [A-Za-z0-9] over the XXXXXX that ends path, as mkdtemp picks them;
 * the clock and the pid where the kernel has no randomness to give. */
static void pick_name(char *path, unsigned attempt) {
    static const char chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[6];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ attempt;
        for (size_t i = 0; i < sizeof r; i++, x = x * 6364136223846793005u + 1442695040888963407u)
            r[i] = (unsigned char)(x >> 56);
    }
    char *x = path + strlen(path) - 6;
    for (size_t i = 0; i < sizeof r; i++)
        x[i] = chars[r[i] % (sizeof chars - 1)];
}

/* Makes this run's directory under nvme_path: the path must exist and be writable; a new
 * directory per run and rank, so concurrent jobs and ranks never share files. mkdtemp would make
 * the directory before its name could be recorded, and a kill in between would leave it behind
 * unrecorded; so the name is picked, checked free, recorded, and only then made with mkdir,
 * which fails on a name that exists as O_EXCL does. A name taken in between (another process
 * picking the same six characters in that instant) is withdrawn from the record and another one
 * picked. */
static zt_status make_dir(zt_offload *f, directory *d, const char *job) {
    struct stat st;
    if (stat(d->root, &st) != 0)
        return zt_error(ZT_ERR_IO, "%s '%s': %s (rank %d keeps its offloaded %s there)", d->key,
                        d->root, strerror(errno), f->rank, d->what);
    if (!S_ISDIR(st.st_mode))
        return zt_error(ZT_ERR_IO, "%s '%s' is not a directory (rank %d keeps its offloaded %s "
                        "there)", d->key, d->root, f->rank, d->what);
    char name[64];
    safe_name(name, sizeof name, job);
    size_t len = strlen(d->root);
    while (len > 1 && d->root[len - 1] == '/')
        len--;
    int w = snprintf(d->path, sizeof d->path, "%.*s/ztrain-%s-rank%d-XXXXXX", (int)len, d->root,
                     name, f->rank);
    if (w < 0 || (size_t)w >= sizeof d->path)
        return zt_error(ZT_ERR_INVALID, "%s '%s' is too long", d->key, d->root);
    int err = EEXIST;
    for (unsigned attempt = 0; attempt < 100 && err == EEXIST; attempt++) {
        pick_name(d->path, attempt);
        if (lstat(d->path, &st) == 0)
            continue;
        record_line(f, d, false);
        zt_inject_offload_kill("recorded");
        err = mkdir(d->path, 0700) == 0 ? 0 : errno;
        if (err == EEXIST)
            record_line(f, d, true);
    }
    if (err)
        return zt_error(ZT_ERR_IO, "%s '%s' is not writable: rank %d cannot create its offload "
                        "directory there: %s", d->key, d->root, f->rank, strerror(err));
    d->made = true;
    zt_inject_offload_kill("made");
    return ZT_OK;
}

static zt_status full_io(int fd, bool write, void *buf, size_t len, off_t off, const char *path) {
    size_t done = 0;
    while (done < len) {
        ssize_t got = write ? pwrite(fd, (char *)buf + done, len - done, off + (off_t)done)
                            : pread(fd, (char *)buf + done, len - done, off + (off_t)done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int e = got < 0 ? errno : write ? ENOSPC : EIO;
            return zt_error(ZT_ERR_IO, "%s %s failed (%zu bytes at offset %lld): %s",
                            write ? "writing" : "reading", path, len - done,
                            (long long)(off + (off_t)done), strerror(e));
        }
        done += (size_t)got;
    }
    return ZT_OK;
}

/* Creates and allocates a stream's file. O_DIRECT keeps the state out of the page cache; a
 * filesystem that refuses it (at open, or at the first aligned transfer) gets buffered I/O. */
static zt_status open_file(zt_offload *f, stream *s) {
    directory *d = &f->dirs[s->dir];
    int w = snprintf(s->path, sizeof s->path, "%s/%s.bin", d->path, s->name);
    if (w < 0 || (size_t)w >= sizeof s->path)
        return zt_error(ZT_ERR_INVALID, "%s '%s' is too long", d->key, d->root);
    /* The directory is this run's own, so the name is free; a filesystem that refuses O_DIRECT
     * may have created the file before refusing. */
    s->fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
    s->direct = s->fd >= 0;
    if (s->fd < 0 && errno == EINVAL)
        s->fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->fd < 0)
        return zt_error(ZT_ERR_IO, "%s '%s' is not writable: rank %d cannot create %s: %s", d->key,
                        d->root, f->rank, s->path, strerror(errno));
    size_t bytes = file_bytes(s);
    int e = posix_fallocate(s->fd, 0, (off_t)bytes);
    if ((e == EINVAL || e == EOPNOTSUPP) && s->direct) {
        /* Without fallocate in the filesystem glibc writes a byte per block, which O_DIRECT
         * refuses: such a filesystem gets buffered I/O. */
        close(s->fd);
        s->direct = false;
        s->fd = open(s->path, O_RDWR | O_CLOEXEC);
        if (s->fd < 0)
            return zt_error(ZT_ERR_IO, "%s: cannot reopen: %s", s->path, strerror(errno));
        e = posix_fallocate(s->fd, 0, (off_t)bytes);
    }
    /* In binary units: a small file is "48.0 KiB", not "0.0 MB". */
    char size[32];
    zt_format_bytes(bytes, size, sizeof size);
    if (e == ENOSPC || e == EDQUOT || e == EFBIG)
        return zt_error(ZT_ERR_IO, "%s '%s': no room for rank %d's offloaded %s (%s needs %s): "
                        "%s", d->key, d->root, f->rank, d->what, s->path, size, strerror(e));
    if (e != 0)
        return zt_error(ZT_ERR_IO, "%s '%s': cannot allocate %s for %s: %s", d->key, d->root,
                        size, s->path, strerror(e));
    if (s->direct && bytes > 0) {
        memset(f->sync, 0, BLOCK);
        if (pwrite(s->fd, f->sync, BLOCK, 0) != (ssize_t)BLOCK) {
            if (errno != EINVAL)
                return zt_error(ZT_ERR_IO, "%s '%s': cannot write %s: %s", d->key, d->root,
                                s->path, strerror(errno));
            close(s->fd);
            s->fd = open(s->path, O_RDWR | O_CLOEXEC);
            s->direct = false;
            if (s->fd < 0)
                return zt_error(ZT_ERR_IO, "%s: cannot reopen: %s", s->path, strerror(errno));
        }
    }
    return ZT_OK;
}

/* ---- creation -------------------------------------------------------------------------------- */

static zt_status setup_stream(zt_offload *f, stream *s, const zt_offload_stream_spec *sp,
                              const zt_offload_spec *spec, int index) {
    s->place = sp->place;
    s->name = sp->name;
    s->elem = sp->elem;
    s->write_only = sp->write_only;
    s->fd = -1;
    if (s->place == ZT_PLACE_ABSENT)
        return ZT_OK;
    if (s->place == ZT_PLACE_MEMORY) {
        s->mem = sp->mem;
        return ZT_OK;
    }
    if (s->place == ZT_PLACE_FILE) {
        s->dir = index == ZT_OFFLOAD_PARAMS ? 1 : 0;
        s->n_file = f->n;
        if (index != ZT_OFFLOAD_PARAMS && spec->optimizer->ratio < 1.0) {
            /* Partial offload: the first int(ratio × tiles) tiles go to the file. */
            size_t tiles = (f->n + f->tile - 1) / f->tile;
            s->n_file = min_sz(f->n, (size_t)(spec->optimizer->ratio * (double)tiles) * f->tile);
            if (s->n_file == 0)
                s->place = ZT_PLACE_HOST;
        }
    }
    size_t host_n = f->n - (s->place == ZT_PLACE_FILE ? s->n_file : 0);
    if (host_n > 0 || s->place == ZT_PLACE_HOST) {
        s->host_bytes = host_n * s->elem;
        s->mem = host_alloc(f, s->host_bytes);
        if (!s->mem)
            return zt_error(ZT_ERR_NOMEM, "offload: cannot allocate %.1f MB of host memory for %s",
                            s->host_bytes / 1e6, s->name);
        s->owns_mem = true;
        s->resident += (double)s->host_bytes;
    }
    return ZT_OK;
}

zt_status zt_offload_create(zt_offload **out, const zt_offload_spec *spec) {
    zt_offload *f = calloc(1, sizeof *f);
    if (!f)
        return zt_error(ZT_ERR_NOMEM, "offload: out of memory");
    pthread_mutex_init(&f->sync_mu, NULL);
    f->be = spec->be;
    f->host_kind = spec->optimizer->pin_memory ? ZT_MEM_PINNED : ZT_MEM_HOST;
    /* Without them (no event could be made) a pinned copy waits for the whole device. */
    for (int i = 0; i < ZT_STREAMS; i++)
        f->copied[i] = zt_backend_event_create(f->be);
    f->rank = spec->rank;
    f->n = spec->n;
    f->full_at = zt_inject_step("ZTRAIN_INJECT_NVME_FULL", spec->rank);
    for (int i = 0; i < ZT_OFFLOAD_STREAMS; i++)
        f->s[i].fd = -1;
    f->dirs[0] = (directory){"zero_optimization.offload_optimizer.nvme_path", "optimizer state",
                             spec->optimizer->nvme_path, "", false};
    f->dirs[1] = (directory){"zero_optimization.offload_param.nvme_path", "parameters",
                             spec->param->nvme_path, "", false};

    bool state_in_file = false, any_file = false;
    for (int i = 0; i < ZT_OFFLOAD_STREAMS; i++) {
        bool file = spec->streams[i].place == ZT_PLACE_FILE;
        any_file |= file;
        state_in_file |= file && i != ZT_OFFLOAD_PARAMS;
    }
    /* Tiles are DeepSpeed's sub groups, bounded so the buffers stay small whatever the default. */
    size_t tile = spec->sub_group_size > 0 ? (size_t)spec->sub_group_size : ZT_OFFLOAD_MAX_TILE;
    tile = min_sz(tile, ZT_OFFLOAD_MAX_TILE) / ZT_OFFLOAD_ALIGN * ZT_OFFLOAD_ALIGN;
    if (tile < ZT_OFFLOAD_ALIGN)
        tile = ZT_OFFLOAD_ALIGN;
    f->tile = min_sz(tile, round_up(f->n ? f->n : 1, ZT_OFFLOAD_ALIGN));
    /* The optimizer section's knobs govern the update's streaming; with only the parameters in a
     * file (offload_param alone) the param section's buffer_count applies and both directions
     * are pipelined. */
    const zt_offload_config *io = state_in_file ? spec->optimizer : spec->param;
    f->slots = io->buffer_count < 1 ? 1 : io->buffer_count > ZT_OFFLOAD_MAX_SLOTS
                                              ? ZT_OFFLOAD_MAX_SLOTS : io->buffer_count;
    /* Reading ahead needs a second set of buffers. */
    f->pipeline_read = (state_in_file ? io->pipeline_read : true) && f->slots > 1;
    f->pipeline_write = state_in_file ? io->pipeline_write : true;

    zt_status st = ZT_OK;
    for (int i = 0; i < ZT_OFFLOAD_STREAMS && st == ZT_OK; i++)
        st = setup_stream(f, &f->s[i], &spec->streams[i], spec, i);
    if (st == ZT_OK && any_file) {
        f->sync = host_alloc(f, SYNC_BYTES);
        if (!f->sync)
            st = zt_error(ZT_ERR_NOMEM, "offload: out of memory for the I/O buffers");
        for (int i = 0; i < ZT_OFFLOAD_STREAMS; i++)
            if (f->s[i].place == ZT_PLACE_FILE) {
                f->s[i].resident += (double)SYNC_BYTES;
                break;
            }
    }
    int n_files = 0;
    for (int i = 0; i < ZT_OFFLOAD_STREAMS && st == ZT_OK; i++) {
        stream *s = &f->s[i];
        if (s->place != ZT_PLACE_FILE)
            continue;
        n_files++;
        directory *d = &f->dirs[s->dir], *other = &f->dirs[1 - s->dir];
        /* One directory per nvme_path: the two sections may name the same one. */
        if (!d->made && other->made && strcmp(d->root, other->root) == 0) {
            s->dir = 1 - s->dir;
            d = other;
        }
        if (!d->made)
            st = make_dir(f, d, spec->job_name);
        if (st == ZT_OK)
            st = open_file(f, s);
        for (int k = 0; k < f->slots && st == ZT_OK; k++) {
            s->buf[k] = host_alloc(f, f->tile * s->elem);
            if (!s->buf[k])
                st = zt_error(ZT_ERR_NOMEM, "offload: out of memory for the I/O buffers");
            s->resident += (double)(f->tile * s->elem);
        }
    }
    if (st == ZT_OK && n_files > 0)
        st = zt_aio_create(&f->aio, (unsigned)(2 * f->slots * n_files));
    if (st != ZT_OK) {
        zt_offload_destroy(f);
        return st;
    }
    bool direct = true;
    for (int i = 0; i < ZT_OFFLOAD_STREAMS; i++)
        if (f->s[i].place == ZT_PLACE_FILE && !f->s[i].direct)
            direct = false;
    if (n_files > 0)
        snprintf(f->describe, sizeof f->describe, "%s, %s, tiles of %zu elements, %d buffer%s, "
                 "%s reads, %s writes", zt_aio_backend(f->aio), direct ? "O_DIRECT" : "page cache",
                 f->tile, f->slots, f->slots == 1 ? "" : "s",
                 f->pipeline_read ? "pipelined" : "serial",
                 f->pipeline_write ? "pipelined" : "serial");
    else
        snprintf(f->describe, sizeof f->describe, "host memory, tiles of %zu elements", f->tile);
    *out = f;
    return ZT_OK;
}

void zt_offload_destroy(zt_offload *f) {
    if (!f)
        return;
    zt_aio_destroy(f->aio);
    for (int i = 0; i < ZT_OFFLOAD_STREAMS; i++) {
        stream *s = &f->s[i];
        if (s->fd >= 0)
            close(s->fd);
        if (s->path[0])
            unlink(s->path);
        if (s->owns_mem)
            host_free(f, s->mem, s->host_bytes);
        for (int k = 0; k < ZT_OFFLOAD_MAX_SLOTS; k++)
            host_free(f, s->buf[k], f->tile * s->elem);
    }
    for (int d = 0; d < 2; d++)
        if (f->dirs[d].made)
            rmdir(f->dirs[d].path);
    host_free(f, f->sync, SYNC_BYTES);
    for (int i = 0; i < ZT_STREAMS; i++)
        if (f->copied[i])
            zt_backend_event_destroy(f->be, f->copied[i]);
    pthread_mutex_destroy(&f->sync_mu);
    free(f);
}

bool zt_offload_has(const zt_offload *f, int stream) {
    return f->s[stream].place != ZT_PLACE_ABSENT;
}

bool zt_offload_in_file(const zt_offload *f, int stream) {
    return f->s[stream].place == ZT_PLACE_FILE;
}

double zt_offload_resident_bytes(const zt_offload *f, int stream) { return f->s[stream].resident; }
size_t zt_offload_tile_elems(const zt_offload *f) { return f->tile; }
const char *zt_offload_describe(const zt_offload *f) { return f->describe; }

/* ---- synchronous copies ------------------------------------------------------------------- */

/* Moves elements [first, first + count) of a file-backed stream through the bounce buffer in
 * aligned windows; a window only partly written is read first. */
static zt_status file_copy(zt_offload *f, stream *s, bool write, size_t first,
                           unsigned char *data, size_t count, bool dev, zt_stream on) {
    size_t lo = first * s->elem, hi = (first + count) * s->elem;
    zt_status st = ZT_OK;
    pthread_mutex_lock(&f->sync_mu);
    for (size_t pos = lo; pos < hi && st == ZT_OK;) {
        size_t a = pos / BLOCK * BLOCK;
        size_t b = min_sz(round_up(hi, BLOCK), a + SYNC_BYTES);
        size_t end = min_sz(hi, b);
        if (!write || pos > a || end < b)
            st = full_io(s->fd, false, f->sync, b - a, (off_t)a, s->path);
        if (st == ZT_OK && write) {
            st = caller_copy(f, dev, true, f->sync + (pos - a), data + (pos - lo), end - pos,
                             on);
            if (st == ZT_OK)
                st = full_io(s->fd, true, f->sync, b - a, (off_t)a, s->path);
        } else if (st == ZT_OK) {
            st = caller_copy(f, dev, false, data + (pos - lo), f->sync + (pos - a), end - pos,
                             on);
        }
        pos = end;
    }
    pthread_mutex_unlock(&f->sync_mu);
    return st;
}

static zt_status copy(zt_offload *f, int index, bool write, size_t first, unsigned char *data,
                      size_t count, bool dev, zt_stream on) {
    stream *s = &f->s[index];
    ZT_ASSERT(s->place != ZT_PLACE_ABSENT && first + count <= f->n);
    size_t in_file = tile_in_file(s, first) ? min_sz(count, s->n_file - first) : 0;
    if (in_file)
        ZT_TRY(file_copy(f, s, write, first, data, in_file, dev, on));
    size_t rest = count - in_file;
    if (rest) {
        void *mem = at(s, first + in_file);
        unsigned char *d = data + in_file * s->elem;
        if (write)
            return caller_copy(f, dev, true, mem, d, rest * s->elem, on);
        return caller_copy(f, dev, false, d, mem, rest * s->elem, on);
    }
    return ZT_OK;
}

zt_status zt_offload_read(zt_offload *f, int stream, size_t first, void *dst, size_t count) {
    return copy(f, stream, false, first, dst, count, false, ZT_STREAM_COMPUTE);
}

zt_status zt_offload_write(zt_offload *f, int stream, size_t first, const void *src,
                           size_t count) {
    return copy(f, stream, true, first, (unsigned char *)src, count, false, ZT_STREAM_COMPUTE);
}

zt_status zt_offload_read_device(zt_offload *f, int stream, size_t first, void *dst,
                                 size_t count, zt_stream on) {
    return copy(f, stream, false, first, dst, count, true, on);
}

zt_status zt_offload_write_device(zt_offload *f, int stream, size_t first, const void *src,
                                  size_t count, zt_stream on) {
    return copy(f, stream, true, first, (unsigned char *)src, count, true, on);
}

/* ---- the tiled update --------------------------------------------------------------------- */

/* Waits for a request and keeps the first failure. */
static void finish(zt_offload *f, const stream *s, zt_aio_req *r, step_error *e) {
    zt_aio_wait(f->aio, r);
    if (r->err && !e->err) {
        e->err = r->err;
        e->s = s;
        e->write = r->write;
        e->len = r->len;
        e->off = r->off;
        e->from_injection = r == e->injected;
    }
    r->err = 0;
}

static void tile_range(const zt_offload *f, size_t i, size_t *first, size_t *count) {
    *first = i * f->tile;
    *count = min_sz(f->tile, f->n - *first);
}

/* The transfer of tile i of a stream between its file and the tile's buffer. The length is
 * rounded up to whole aligned blocks, which the file holds (file_bytes). */
static zt_aio_req tile_req(const zt_offload *f, const stream *s, size_t i, bool write) {
    size_t first, count;
    tile_range(f, i, &first, &count);
    return (zt_aio_req){.fd = s->fd, .write = write, .buf = s->buf[i % (size_t)f->slots],
                        .len = round_up(count, ZT_OFFLOAD_ALIGN) * s->elem,
                        .off = (off_t)(first * s->elem)};
}

/* Starts reading tile i into its buffers, once their previous tile is written back. */
static void start_read(zt_offload *f, size_t i, step_error *e) {
    int slot = (int)(i % (size_t)f->slots);
    for (int k = 0; k < ZT_OFFLOAD_STREAMS; k++) {
        stream *s = &f->s[k];
        if (!tile_in_file(s, i * f->tile))
            continue;
        finish(f, s, &s->wr[slot], e);
        if (s->write_only)
            continue;
        if (e->err)
            return;
        s->rd[slot] = tile_req(f, s, i, false);
        zt_aio_submit(f->aio, &s->rd[slot]);
    }
}

static void start_write(zt_offload *f, size_t i, bool inject, step_error *e) {
    int slot = (int)(i % (size_t)f->slots);
    for (int k = 0; k < ZT_OFFLOAD_STREAMS; k++) {
        stream *s = &f->s[k];
        if (!tile_in_file(s, i * f->tile))
            continue;
        zt_aio_req *r = &s->wr[slot];
        *r = tile_req(f, s, i, true);
        if (inject && !e->injected) {
            /* Fault injection: this write fails as on a full disk, and nothing is written. */
            e->injected = r;
            r->err = ENOSPC;
            continue;
        }
        zt_aio_submit(f->aio, r);
    }
}

static void finish_tile(zt_offload *f, size_t i, bool write, step_error *e) {
    int slot = (int)(i % (size_t)f->slots);
    for (int k = 0; k < ZT_OFFLOAD_STREAMS; k++)
        if (tile_in_file(&f->s[k], i * f->tile))
            finish(f, &f->s[k], write ? &f->s[k].wr[slot] : &f->s[k].rd[slot], e);
}

/* Tile i as the update sees it: each present stream's elements in memory, or for a file-backed
 * one its slot's buffer (in_file), which an ahead call leaves NULL. */
static zt_offload_tile tile_at(const zt_offload *f, size_t i, bool in_file) {
    zt_offload_tile t = {0};
    tile_range(f, i, &t.first, &t.count);
    int slot = (int)(i % (size_t)f->slots);
    for (int k = 0; k < ZT_OFFLOAD_STREAMS; k++) {
        const stream *s = &f->s[k];
        if (s->place == ZT_PLACE_ABSENT)
            continue;
        if (!tile_in_file(s, t.first))
            t.p[k] = at(s, t.first);
        else if (in_file)
            t.p[k] = s->buf[slot];
    }
    return t;
}

static void tell_ahead(const zt_offload *f, const zt_offload_pass *pass, size_t i) {
    if (!pass->ahead)
        return;
    zt_offload_tile next = tile_at(f, i, false);
    pass->ahead(pass->ctx, &next);
}

zt_status zt_offload_step(zt_offload *f, const zt_offload_pass *pass) {
    f->updates++;
    bool inject = f->full_at == f->updates;
    size_t tiles = (f->n + f->tile - 1) / f->tile;
    step_error e = {0};
    if (tiles > 0) {
        start_read(f, 0, &e);
        tell_ahead(f, pass, 0);
    }
    for (size_t i = 0; i < tiles && !e.err; i++) {
        if (f->pipeline_read && i + 1 < tiles)
            start_read(f, i + 1, &e);
        /* The caller's transfers of the next tile start before this one's reads are waited
         * for, so they overlap the file I/O too. */
        if (i + 1 < tiles && !e.err)
            tell_ahead(f, pass, i + 1);
        finish_tile(f, i, false, &e);
        if (e.err)
            break;
        zt_offload_tile t = tile_at(f, i, true);
        pass->update(pass->ctx, &t);
        start_write(f, i, inject, &e);
        if (!f->pipeline_write)
            finish_tile(f, i, true, &e);
        if (!f->pipeline_read && i + 1 < tiles && !e.err)
            start_read(f, i + 1, &e);
    }
    /* Nothing may still be moving when the caller looks at the result. */
    for (int k = 0; k < ZT_OFFLOAD_STREAMS; k++)
        for (int slot = 0; slot < f->slots && f->s[k].place == ZT_PLACE_FILE; slot++) {
            finish(f, &f->s[k], &f->s[k].rd[slot], &e);
            finish(f, &f->s[k], &f->s[k].wr[slot], &e);
        }
    if (!e.err)
        return ZT_OK;
    return zt_error(ZT_ERR_IO, "%s %s failed (%zu bytes at offset %lld) in offloaded update "
                    "%lld%s: %s; the update is not applied",
                    e.write ? "writing" : "reading", e.s->path, e.len, (long long)e.off,
                    (long long)f->updates, e.from_injection ? " (ZTRAIN_INJECT_NVME_FULL)" : "",
                    strerror(e.err));
}
