/* Filesystem helpers: recursive mkdir/remove, atomic whole-file writes, whole-file reads and
 * read-only mappings, directory syncs and atomic swaps. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ztrain/fsutil.h"
#include "ztrain/tmp_paths.h"

zt_status zt_mkdirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return zt_error(ZT_ERR_INVALID, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return zt_error(ZT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return zt_error(ZT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return zt_error(ZT_ERR_IO, "%s: exists and is not a directory", buf);
    return ZT_OK;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    return remove(path);
}

zt_status zt_remove_tree(const char *path) {
    if (!zt_path_exists(path))
        return ZT_OK;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return zt_error(ZT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return ZT_OK;
}

zt_status zt_write_all(int fd, const void *buf, size_t n, const char *path) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return zt_error(ZT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return ZT_OK;
}

zt_status zt_atomic_write_begin(const char *path, char **tmp, int *fd) {
    *fd = -1;
    size_t plen = strlen(path);
    *tmp = malloc(plen + 5);
    if (!*tmp)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory", path);
    memcpy(*tmp, path, plen);
    memcpy(*tmp + plen, ".tmp", 5);
    zt_tmp_track(*tmp);
    *fd = open(*tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0) {
        zt_status s = zt_error(ZT_ERR_IO, "%s: cannot create: %s", *tmp, strerror(errno));
        zt_tmp_untrack(*tmp);
        free(*tmp);
        *tmp = NULL;
        return s;
    }
    return ZT_OK;
}

zt_status zt_atomic_write_end(int fd, char *tmp, const char *path, zt_status s) {
    if (s == ZT_OK && fsync(fd) != 0)
        s = zt_error(ZT_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == ZT_OK)
        s = zt_error(ZT_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (s == ZT_OK && zt_tmp_rename(tmp, path) != 0)
        s = zt_error(ZT_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    if (s != ZT_OK)
        unlink(tmp);
    zt_tmp_untrack(tmp);
    free(tmp);
    /* Without syncing the directory a crash can bring back the old name. */
    return s != ZT_OK ? s : zt_sync_parent_dir(path);
}

zt_status zt_write_file_atomic(const char *path, const void *data, size_t len) {
    char *tmp;
    int fd;
    ZT_TRY(zt_atomic_write_begin(path, &tmp, &fd));
    return zt_atomic_write_end(fd, tmp, path, zt_write_all(fd, data, len, tmp));
}

/* Reads fd to EOF into a NUL-terminated heap buffer, refusing more than max bytes (0: no limit);
 * closes fd. */
static zt_status read_fd(int fd, const char *path, const struct stat *st, size_t max, char **data,
                         size_t *len) {
    /* Read until EOF rather than trusting st_size, so pipes and /proc files work too. */
    size_t cap = st->st_size > 0 ? (size_t)st->st_size + 1 : 4096, n = 0;
    if (max && cap > max + 1)
        cap = max + 1;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            close(fd);
            return zt_error(ZT_ERR_NOMEM, "%s: out of memory reading the file", path);
        }
        if (max && n > max) {
            free(buf);
            close(fd);
            return zt_error(ZT_ERR_IO, "%s: larger than %zu MiB, the most read for this "
                            "file", path, max >> 20);
        }
        if (n + 1 >= cap) {
            /* One byte past max is enough to know the file is too large. */
            size_t next = max && cap * 2 > max + 2 ? max + 2 : cap * 2;
            char *bigger = realloc(buf, next);
            if (!bigger)
                free(buf);
            buf = bigger;
            cap = next;
            continue;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int err = errno;
            free(buf);
            close(fd);
            return zt_error(ZT_ERR_IO, "%s: cannot read: %s", path, strerror(err));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    if (len)
        *len = n;
    return ZT_OK;
}

zt_status zt_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int e = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
    if (e) {
        close(fd);
        return zt_error(ZT_ERR_IO, "%s: cannot read: %s", path, strerror(e));
    }
    return read_fd(fd, path, &st, 0, data, len);
}

zt_status zt_read_regular_file(const char *path, size_t max, char **data, size_t *len) {
    *data = NULL;
    /* O_NONBLOCK so that opening a FIFO without a writer returns at once to be refused; it has
     * no effect on a regular file's reads. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return zt_error(ZT_ERR_IO, "%s: cannot read: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zt_error(ZT_ERR_IO, "%s: not a regular file (%s)", path,
                        S_ISDIR(st.st_mode)    ? "a directory"
                        : S_ISFIFO(st.st_mode) ? "a pipe"
                        : S_ISCHR(st.st_mode)  ? "a character device"
                        : S_ISBLK(st.st_mode)  ? "a block device"
                        : S_ISSOCK(st.st_mode) ? "a socket"
                                               : "a special file");
    }
    if (max && (uint64_t)st.st_size > max) {
        close(fd);
        return zt_error(ZT_ERR_IO, "%s: larger than %zu MiB, the most read for this file",
                        path, max >> 20);
    }
    return read_fd(fd, path, &st, max, data, len);
}

zt_status zt_map_file(const char *path, void **map, size_t *size) {
    *map = NULL;
    *size = 0;
    /* O_NONBLOCK: a FIFO (or a device) put where a file was expected must not hold the caller
     * until some writer appears; fstat below refuses it. A regular file ignores the flag. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return zt_error(ZT_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zt_error(ZT_ERR_IO, "%s: not a regular file", path);
    }
    /* mmap refuses a zero length; an empty file is left for the caller to judge. */
    if (st.st_size == 0) {
        close(fd);
        return ZT_OK;
    }
    size_t n = (size_t)st.st_size;
    void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    /* The mapping keeps its own reference to the file, so the descriptor can go now. */
    if (close(fd) != 0 && p != MAP_FAILED) {
        int err = errno;
        munmap(p, n);
        return zt_error(ZT_ERR_IO, "%s: close failed: %s", path, strerror(err));
    }
    if (p == MAP_FAILED)
        return zt_error(ZT_ERR_IO, "%s: cannot map %zu bytes: %s", path, n, strerror(map_errno));
    *map = p;
    *size = n;
    return ZT_OK;
}

void zt_unmap_file(void *map, size_t size) {
    if (map)
        munmap(map, size);
}

bool zt_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void zt_path_beside(const char *file, const char *name, char *out, size_t cap) {
    const char *slash = strrchr(file, '/');
    snprintf(out, cap, "%.*s%s", slash ? (int)(slash - file + 1) : 0, file, name);
}

zt_status zt_sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: cannot open the directory to sync it: %s", path,
                        strerror(errno));
    /* A filesystem that cannot sync a directory says EINVAL (or ENOTSUP): its renames are as
     * durable as they will get, which is not a failure of the write. */
    int err = fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP ? errno : 0;
    if (close(fd) != 0 && !err)
        err = errno;
    if (err)
        return zt_error(ZT_ERR_IO, "%s: cannot sync the directory: %s", path, strerror(err));
    return ZT_OK;
}

zt_status zt_sync_parent_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        return zt_sync_dir(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir)
        return zt_error(ZT_ERR_INVALID, "%s: path too long", path);
    memcpy(dir, path, n);
    dir[n] = '\0';
    return zt_sync_dir(dir);
}

zt_status zt_rename_exchange(const char *a, const char *b) {
    if (renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0)
        return ZT_OK;
    int err = errno;
    if (err == EINVAL || err == ENOSYS || err == ENOTSUP)
        return zt_error(ZT_ERR_UNSUPPORTED, "%s: the filesystem cannot exchange it with %s "
                        "atomically: %s", b, a, strerror(err));
    return zt_error(ZT_ERR_IO, "%s: cannot exchange it with %s: %s", b, a, strerror(err));
}
