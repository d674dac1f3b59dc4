/* Small filesystem helpers shared by checkpoints, metrics and the CLI (internal). */
#ifndef ZTRAIN_FSUTIL_H
#define ZTRAIN_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/status.h"

/* mkdir -p; messages name the path. */
zt_status zt_mkdirs(const char *path);
/* rm -rf; a missing path is not an error. */
zt_status zt_remove_tree(const char *path);
/* Writes len bytes to path through path.tmp, fsync and rename. */
zt_status zt_write_file_atomic(const char *path, const void *data, size_t len);
/* Reads a whole file into a NUL-terminated heap buffer (*len excludes the NUL). */
zt_status zt_read_file(const char *path, char **data, size_t *len);
bool zt_path_exists(const char *path);
/* fsync a directory so renames inside it are durable. */
void zt_sync_dir(const char *path);

#endif
