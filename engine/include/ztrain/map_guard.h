/* Reads from file mappings (zt_map_file) that survive the file shrinking under them.
 *
 * A token file mapped for training can be truncated or rewritten in place while the job runs (a
 * `prepare` into the same directory, a copy that is still arriving, a full disk's cleanup).
 * Touching a mapped page that now lies wholly past the file's end raises SIGBUS, which killed the
 * rank without a word. zt_map_guarded runs a read through a guard instead: a SIGBUS handler,
 * installed once for the process, jumps back (siglongjmp) to the guard of the faulting thread when
 * that thread is inside one, and the read fails with the faulting address, from which the caller
 * names the file and its new size. A SIGBUS outside any guard keeps its former disposition (the
 * handler restores it and the faulting access is repeated).
 *
 * Why a guard and not a size check before each read: a size check (fstat) leaves a window between
 * the check and the read, where the truncation still kills the process, and costs a system call
 * per file a batch touches (a glob of many shards). The guard costs one sigsetjmp per batch and
 * catches every fault. What it cannot see is a truncation that stays inside the page holding the
 * new end of file: those bytes read as zeros, as the kernel gives them. The guard is per thread
 * (the jump buffer is thread-local), so every reading thread may hold one; a read inside the
 * guard must hold no lock and own no allocation that the jump would leak, which plain copies out
 * of the mapping satisfy. Guards do not nest. */
#ifndef ZTRAIN_MAP_GUARD_H
#define ZTRAIN_MAP_GUARD_H

#include "ztrain/status.h"

/* Calls read(ctx). Returns ZT_OK when it returned, or ZT_ERR_IO with *fault set to the address
 * whose access raised SIGBUS (read did not finish; the caller words the message through
 * zt_error, naming the file that holds *fault). ZT_ERR_IO also when the handler cannot be
 * installed (message set, *fault NULL). */
zt_status zt_map_guarded(void (*read)(void *ctx), void *ctx, const void **fault);

#endif
