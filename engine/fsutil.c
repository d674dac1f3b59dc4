/* Filesystem helpers: recursive mkdir/remove and atomic whole-file writes. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

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

zt_status zt_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = errno;
            close(fd);
            unlink(tmp);
            return zt_error(ZT_ERR_IO, "%s: write failed: %s", tmp, strerror(err));
        }
        p += n;
        left -= (size_t)n;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int err = errno;
        unlink(tmp);
        return zt_error(ZT_ERR_IO, "%s: cannot flush: %s", tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return zt_error(ZT_ERR_IO, "%s: cannot rename into place: %s", path, strerror(err));
    }
    return ZT_OK;
}

zt_status zt_read_file(const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return zt_error(ZT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory reading the file", path);
    if (err) {
        free(buf);
        return zt_error(ZT_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *data = buf;
    if (len)
        *len = n;
    return ZT_OK;
}

bool zt_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void zt_sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}
