/* GET /api/v1/jobs/{id}/tensorboard.tar (http_internal.h): the TensorBoard event files rank 0
 * writes into the job's run directory (ztrain/metrics.h, ZT_METRICS_TB_DIR), as one ustar
 * archive streamed from the files, entries named <job id>/<file> so that archives of several
 * jobs unpack side by side into one TensorBoard log directory, one run per job.
 *
 * A running job's event files grow: each entry holds a file as long as it was when the
 * request came, which may end inside a record being written; TensorBoard's reader takes such
 * a last record as not there yet. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_internal.h"
#include "ztrain/metrics.h"

#define TAR_BLOCK 512
/* Event files of one job: one per run of rank 0 (a resumed or restarted job adds one). */
#define TAR_MAX_FILES 256

typedef struct {
    char name[256];
    uint64_t size;
    int64_t mtime;
} tar_file;

typedef struct {
    char dir[4200];
    tar_file files[TAR_MAX_FILES];
    int n_files;
    char id[32];
    int cur;               /* the entry being sent */
    uint64_t at;           /* bytes of it sent: its header block, then its data and padding */
    int fd;                /* the current entry's file, -1 when none is open */
} tar_stream;

static uint64_t padded(uint64_t n) {
    return (n + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
}

/* A numeric field of width bytes: width - 1 octal digits, zero-padded, and a NUL. */
static void put_octal(char *field, size_t width, uint64_t v) {
    field[width - 1] = '\0';
    for (size_t i = width - 1; i-- > 0; v >>= 3)
        field[i] = (char)('0' + (v & 7));
}

/* A ustar header: the name is split into prefix (the job id) and name (the file), sizes and
 * times in octal, the checksum computed over the block with its own field as spaces. */
static void tar_header(const tar_stream *t, const tar_file *f, char h[TAR_BLOCK]) {
    memset(h, 0, TAR_BLOCK);
    snprintf(h, 100, "%s", f->name);
    put_octal(h + 100, 8, 0644);
    put_octal(h + 108, 8, 0);
    put_octal(h + 116, 8, 0);
    put_octal(h + 124, 12, f->size);
    put_octal(h + 136, 12, (uint64_t)(f->mtime > 0 ? f->mtime : 0));
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    snprintf(h + 345, 155, "%s", t->id);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < TAR_BLOCK; i++)
        sum += (unsigned char)h[i];
    put_octal(h + 148, 7, sum);
    h[155] = ' ';
}

/* Fills buf with up to max bytes of the current entry's data from offset `off`; a file that
 * has become shorter than its header says is padded with zeros. */
static size_t tar_data(tar_stream *t, const tar_file *f, uint64_t off, char *buf, size_t max) {
    if (t->fd < 0) {
        char path[4500];
        snprintf(path, sizeof path, "%s/%s", t->dir, f->name);
        t->fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    uint64_t left = padded(f->size) - off;
    size_t n = left < max ? (size_t)left : max;
    size_t got = 0;
    if (off < f->size && t->fd >= 0) {
        size_t want = f->size - off < n ? (size_t)(f->size - off) : n;
        ssize_t k = pread(t->fd, buf, want, (off_t)off);
        got = k > 0 ? (size_t)k : 0;
    }
    memset(buf + got, 0, n - got);
    return n;
}

static ssize_t tar_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    tar_stream *t = cls;
    if (t->cur == t->n_files) {
        /* Two zero blocks end the archive; pos counts them from the end of the last entry. */
        if (t->at >= 2 * TAR_BLOCK)
            return MHD_CONTENT_READER_END_OF_STREAM;
        size_t n = 2 * TAR_BLOCK - t->at < max ? (size_t)(2 * TAR_BLOCK - t->at) : max;
        memset(buf, 0, n);
        t->at += n;
        return (ssize_t)n;
    }
    const tar_file *f = &t->files[t->cur];
    size_t n;
    if (t->at < TAR_BLOCK) {
        char h[TAR_BLOCK];
        tar_header(t, f, h);
        n = TAR_BLOCK - t->at < max ? (size_t)(TAR_BLOCK - t->at) : max;
        memcpy(buf, h + t->at, n);
    } else {
        n = tar_data(t, f, t->at - TAR_BLOCK, buf, max);
    }
    t->at += n;
    if (t->at == TAR_BLOCK + padded(f->size)) {
        if (t->fd >= 0)
            close(t->fd);
        t->fd = -1;
        t->cur++;
        t->at = 0;
    }
    return (ssize_t)n;
}

static void tar_free(void *cls) {
    tar_stream *t = cls;
    if (t->fd >= 0)
        close(t->fd);
    free(t);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const tar_file *)a)->name, ((const tar_file *)b)->name);
}

/* The event files of dir, oldest name first (their names start with their creation time). */
static void list_event_files(tar_stream *t) {
    DIR *d = opendir(t->dir);
    for (struct dirent *e; d && (e = readdir(d)) && t->n_files < TAR_MAX_FILES;) {
        tar_file *f = &t->files[t->n_files];
        struct stat sb;
        char path[4500];
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0 || strlen(e->d_name) >= 100)
            continue;
        snprintf(path, sizeof path, "%s/%s", t->dir, e->d_name);
        /* A ustar size field holds at most 8 GiB. */
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size >= (off_t)1 << 33)
            continue;
        snprintf(f->name, sizeof f->name, "%s", e->d_name);
        f->size = (uint64_t)sb.st_size;
        f->mtime = (int64_t)sb.st_mtime;
        t->n_files++;
    }
    if (d)
        closedir(d);
    qsort(t->files, (size_t)t->n_files, sizeof t->files[0], by_name);
}

enum MHD_Result zt_http_job_tensorboard(zt_http_server *s, struct MHD_Connection *c,
                                        const char *id) {
    zt_job_info info;
    zt_status st = zt_jobs_get(s->jm, id, &info);
    if (st != ZT_OK)
        return zt_http_send_status(c, st, id);
    tar_stream *t = calloc(1, sizeof *t);
    if (!t) {
        zt_job_info_free(&info);
        return MHD_NO;
    }
    t->fd = -1;
    snprintf(t->id, sizeof t->id, "%s", info.id);
    if (info.run_dir)
        snprintf(t->dir, sizeof t->dir, "%s/%s", info.run_dir, ZT_METRICS_TB_DIR);
    zt_job_info_free(&info);
    if (t->dir[0])
        list_event_files(t);
    if (t->n_files == 0) {
        free(t);
        return zt_http_send_error(c, MHD_HTTP_NOT_FOUND, "jobs/%s has no TensorBoard event files "
                                  "(its rank 0 writes them once it trains)", id);
    }
    uint64_t total = 2 * TAR_BLOCK;
    for (int i = 0; i < t->n_files; i++)
        total += TAR_BLOCK + padded(t->files[i].size);
    struct MHD_Response *r = MHD_create_response_from_callback(total, 64 * 1024, tar_read, t,
                                                               tar_free);
    if (!r) {
        tar_free(t);
        return MHD_NO;
    }
    char disposition[96];
    snprintf(disposition, sizeof disposition, "attachment; filename=\"%s-tensorboard.tar\"", id);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-tar");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disposition);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    return zt_http_queue(c, MHD_HTTP_OK, r);
}
