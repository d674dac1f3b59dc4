/* The checkpoint directory's own bookkeeping (internal; the layout is in ztrain/checkpoint.h):
 * where a tag's complete copy is, the last step of a save that puts a finished checkpoint under
 * its tag, and the repair of what a save killed half-way left behind. checkpoint.c writes and
 * reads the checkpoints themselves. */
#ifndef ZTRAIN_CKPT_DIR_H
#define ZTRAIN_CKPT_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

/* dir/.<tag><suffix>: where a save writes tag before it is complete (suffix ".tmp"), and where
 * the old copy of tag waits while a save replaces it on a filesystem without atomic exchange
 * (".old"). The leading dot keeps both out of zt_ckpt_list_dir. */
#define ZT_CKPT_TMP_SUFFIX ".tmp"
#define ZT_CKPT_OLD_SUFFIX ".old"
void zt_ckpt_aside_name(char *out, size_t size, const char *dir, const char *tag,
                        const char *suffix);

/* The directory holding tag's complete checkpoint (one with DONE), into path[size]: dir/tag, or
 * when a save that replaced tag was killed between its two renames, the new copy (.tag.tmp) or
 * else the old one (.tag.old). False, with path set to dir/tag, when there is none. Reads only:
 * every rank may call it while the others load. */
bool zt_ckpt_tag_dir(const char *dir, const char *tag, char *path, size_t size);

/* Rank 0 only, before a save, while no rank reads the directory: a tag that a killed save left
 * without a complete copy under its own name gets one back (the new copy if it was finished,
 * else the old), and every .tmp and .old directory left over is removed. */
zt_status zt_ckpt_recover(const char *dir);

/* Rank 0 only, the last step of a save: tmp, a finished checkpoint (DONE written and synced),
 * becomes dir/tag, and dir/latest names tag. A tag that exists already is replaced so that at
 * every instant `latest` leads to a complete checkpoint: with one atomic exchange where the
 * filesystem has it (dir/tag always holds the old or the new copy), else by moving the old copy
 * aside first (zt_ckpt_tag_dir finds one of the two meanwhile). The replaced copy is removed
 * last. step names the save for ZTRAIN_INJECT_CKPT_KILL, whose points are "written", "aside"
 * (two renames only), "placed" and "latest". */
zt_status zt_ckpt_install(const char *dir, const char *tag, const char *tmp, int64_t step);

#endif
