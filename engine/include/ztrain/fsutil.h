/* Small filesystem helpers shared by checkpoints, metrics, datasets, safetensors, JSON files and
 * the CLI (internal). */
#ifndef ZTRAIN_FSUTIL_H
#define ZTRAIN_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/status.h"

/* mkdir -p; messages name the path. */
zt_status zt_mkdirs(const char *path);
/* rm -rf; a missing path is not an error. */
zt_status zt_remove_tree(const char *path);
/* Writes all n bytes to fd, retrying short writes and EINTR; messages name path. */
zt_status zt_write_all(int fd, const void *buf, size_t n, const char *path);
/* Writes len bytes to path through path.tmp, fsync, rename, and a sync of the directory that
 * makes the rename durable. */
zt_status zt_write_file_atomic(const char *path, const void *data, size_t len);
/* The same for a writer that streams, in two calls. zt_atomic_write_begin creates path.tmp and
 * opens it for writing: *tmp (its name, on the heap) and *fd. The caller writes fd, then hands
 * its status s to zt_atomic_write_end, which, when s is ZT_OK, fsyncs and closes fd, renames
 * tmp into place and syncs the directory; otherwise, or when one of those steps fails, it
 * closes fd and removes tmp. Either way it frees tmp, and returns s or the first failure after
 * it, naming tmp or path. */
zt_status zt_atomic_write_begin(const char *path, char **tmp, int *fd);
zt_status zt_atomic_write_end(int fd, char *tmp, const char *path, zt_status s);
/* Reads a whole file into a NUL-terminated heap buffer the caller frees (*len, if not NULL,
 * excludes the NUL); *data is NULL on failure. Messages: "PATH: cannot open: REASON",
 * "PATH: cannot read: REASON" (a directory is "Is a directory"). */
zt_status zt_read_file(const char *path, char **data, size_t *len);
/* The same for a file that must be a regular file of at most max bytes (0: any size): a FIFO, a
 * device or a directory is ZT_ERR_IO "PATH: not a regular file (a pipe)", without reading
 * or waiting on it; a larger file is ZT_ERR_IO "PATH: larger than N MiB, ...". */
zt_status zt_read_regular_file(const char *path, size_t max, char **data, size_t *len);
/* Maps a regular file read-only and whole; the caller releases it with zt_unmap_file, and the
 * mapping outlives the descriptor, which is closed before returning. An empty file succeeds with
 * *map == NULL and *size == 0, so the caller words its own "empty" message. Failures are ZT_ERR_IO
 * naming the path and the reason ("PATH: cannot open: REASON", "PATH: not a regular file",
 * "PATH: cannot map N bytes: REASON") and leave *map NULL. */
zt_status zt_map_file(const char *path, void **map, size_t *size);
/* Unmaps what zt_map_file mapped; a NULL map (an empty file, or none) is a no-op. */
void zt_unmap_file(void *map, size_t size);
bool zt_path_exists(const char *path);
/* The path of `name` in the directory that holds `file` (just `name` for a bare file name), into
 * out (cap bytes, cut to fit): the tokenizer_config.json beside a tokenizer.json. */
void zt_path_beside(const char *file, const char *name, char *out, size_t cap);
/* fsync a directory so renames inside it are durable. A filesystem that does not sync
 * directories (fsync says EINVAL or ENOTSUP) is not an error; any other failure is ZT_ERR_IO
 * naming the directory. */
zt_status zt_sync_dir(const char *path);
/* zt_sync_dir of the directory that holds path ("." for a bare name). */
zt_status zt_sync_parent_dir(const char *path);
/* Swaps two existing paths in one step (renameat2 with RENAME_EXCHANGE): a reader sees either
 * name holding one of the two, never a missing one. ZT_ERR_UNSUPPORTED when the filesystem or
 * kernel cannot (NFS, for one: the caller falls back to two renames), ZT_ERR_IO otherwise;
 * messages name both paths. */
zt_status zt_rename_exchange(const char *a, const char *b);

#endif
