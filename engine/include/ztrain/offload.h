/* Offloaded model state of one rank (ZeRO-Offload and ZeRO-Infinity; internal to the engine).
 *
 * The optimizer updates a rank's slice of n elements through up to four streams of the same
 * length: the parameters it writes (fp32, or 16-bit in mixed precision), the fp32 master weights
 * (mixed precision), and the optimizer's moments (Adam's exp_avg and exp_avg_sq, SGD's momentum
 * buffer). Each stream lives in one place:
 *   memory  the caller's buffer (not offloaded: a parameter slice, or state nobody offloads);
 *   host    host memory the store allocates: offload_optimizer.device "cpu" (on a GPU backend this
 *           is where pinned memory would come from; the CPU backend computes there anyway);
 *   file    a file in a per-run, per-rank directory under nvme_path: "nvme". With
 *           offload_optimizer.ratio < 1 only the first int(ratio × tiles) tiles of the state are
 *           in the file and the rest in host memory.
 *
 * zt_offload_step runs one update over the slice in tiles of sub_group_size elements (capped at
 * ZT_OFFLOAD_MAX_TILE, a multiple of ZT_OFFLOAD_ALIGN), streaming the file-backed part through
 * buffer_count sets of aligned buffers with asynchronous I/O (aio.h): with pipeline_read the next
 * tile is read while one is updated, with pipeline_write the previous one is written meanwhile.
 * Files are opened with O_DIRECT where the filesystem allows it (else through the page cache),
 * allocated in full when the store is created, so a disk without room fails at startup, and
 * removed with their directory by zt_offload_destroy. Nothing of a file-backed stream is resident
 * but its buffers. */
#ifndef ZTRAIN_OFFLOAD_H
#define ZTRAIN_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/backend.h"
#include "ztrain/ds_config.h"
#include "ztrain/status.h"

enum { ZT_OFFLOAD_PARAMS, ZT_OFFLOAD_MASTER, ZT_OFFLOAD_EXP_AVG, ZT_OFFLOAD_EXP_AVG_SQ,
       ZT_OFFLOAD_STREAMS };

/* Tiles are multiples of ZT_OFFLOAD_ALIGN elements, so a tile of 16-bit or fp32 elements starts
 * and ends on a 4 KiB boundary of its file, as O_DIRECT requires. */
#define ZT_OFFLOAD_ALIGN ((size_t)2048)
#define ZT_OFFLOAD_MAX_TILE ((size_t)1 << 20)
#define ZT_OFFLOAD_MAX_SLOTS 8

typedef enum {
    ZT_PLACE_ABSENT = 0,
    ZT_PLACE_MEMORY,
    ZT_PLACE_HOST,
    ZT_PLACE_FILE,
} zt_offload_place;

typedef struct {
    zt_offload_place place;
    const char *name;   /* file name and messages: "exp_avg", "fp32_master", ... */
    size_t elem;        /* bytes per element: 4, or 2 for 16-bit parameters */
    void *mem;          /* ZT_PLACE_MEMORY: the caller's n elements, which must outlive the store */
    bool write_only;    /* the update overwrites it without reading it (16-bit parameters): a
                           file-backed tile is written back but never read for the update */
} zt_offload_stream_spec;

typedef struct {
    zt_backend *be;                     /* allocates the host state and I/O buffers; the data
                                           pointers of reads, writes and tiles are host memory
                                           that this backend can copy */
    int rank;                           /* the process's rank in the job (not its place in a
                                           data-parallel group): the directory name, the messages
                                           and ZTRAIN_INJECT_NVME_FULL's RANK */
    const char *job_name;               /* part of the directory name; NULL: "job" */
    size_t n;                           /* elements of every stream */
    zt_offload_stream_spec streams[ZT_OFFLOAD_STREAMS];
    /* The DeepSpeed sections: the optimizer's nvme_path, buffer_count, pipeline_read/write and
     * ratio apply to the master and moment streams, the param section's nvme_path to the
     * parameter stream. */
    const zt_offload_config *optimizer, *param;
    int64_t sub_group_size;
} zt_offload_spec;

typedef struct zt_offload zt_offload;

/* The environment variable that names the file where a rank records each offload directory it
 * makes, one line "RANK PATH" appended before the directory is made (the file must exist), and
 * "RANK -PATH" should the name turn out taken: set by the process that starts the ranks
 * (service/ranks/rank_group.h, zt_rank_record), which removes the directories a rank killed with
 * SIGKILL could not. Unset: nothing is recorded. */
#define ZT_OFFLOAD_RECORD_ENV "ZTRAIN_OFFLOAD_RECORD"

/* One tile of an update: elements [first, first + count) of the slice, and where each present
 * stream's elements are for the duration of the callback (a buffer, or the memory itself). */
typedef struct {
    size_t first, count;
    void *p[ZT_OFFLOAD_STREAMS];
} zt_offload_tile;

/* The calls of one update (zt_offload_step), all on the calling thread. */
typedef struct {
    /* Each tile once, in order: its new values go into the tile's pointers. */
    void (*update)(void *ctx, const zt_offload_tile *t);
    /* NULL, or each tile once before its update, one tile ahead: tile 0 before the loop, and
     * tile i + 1 before the store waits for tile i's reads and updates it. A caller that stages
     * tiles through buffers of its own (ZeRO's copies from a GPU) issues the next tile's
     * transfers here, so they run while it updates this one. Only next->first, next->count and
     * the pointers of the streams not in a file are set: those elements are where the update
     * will find them, and may be read now; a file-backed stream's pointer is NULL (its read may
     * still be in flight). Not called again for a tile when the update stops early (an I/O
     * failure): what it issued is the caller's to settle. */
    void (*ahead)(void *ctx, const zt_offload_tile *next);
    void *ctx;
} zt_offload_pass;

/* Creates the store: allocates host streams (zeroed), creates the directories and files (zeroed,
 * allocated in full) and the buffers. Errors name the nvme_path key, the path and the rank: a
 * path that does not exist or is not writable, a disk without room. Free with
 * zt_offload_destroy, which also removes the files and directories. */
zt_status zt_offload_create(zt_offload **out, const zt_offload_spec *spec);
void zt_offload_destroy(zt_offload *f);

/* Whether the stream exists, and whether any of it is in a file. */
bool zt_offload_has(const zt_offload *f, int stream);
bool zt_offload_in_file(const zt_offload *f, int stream);

/* Copies elements [first, first + count) of a stream out of (read) or into (write) the store,
 * whatever their place; for files, synchronously through a bounce buffer. Safe to call from the
 * ZeRO communication thread, but not during zt_offload_step. */
zt_status zt_offload_read(zt_offload *f, int stream, size_t first, void *dst, size_t count);
zt_status zt_offload_write(zt_offload *f, int stream, size_t first, const void *src,
                           size_t count);
/* The same with the caller's buffer in the backend's device memory (ZeRO's flat buffers): the
 * copies are host-to-device and device-to-host, which on the CPU backend are plain copies. They
 * are issued on the backend's stream `on`, the caller's (ZeRO's communication thread gives its
 * own, so that nothing of it lands on the compute stream), and from pinned memory waited for
 * with an event on that stream, not for the whole device. */
zt_status zt_offload_read_device(zt_offload *f, int stream, size_t first, void *dst,
                                 size_t count, zt_stream on);
zt_status zt_offload_write_device(zt_offload *f, int stream, size_t first, const void *src,
                                  size_t count, zt_stream on);

/* One update over the slice: calls pass->update once per tile, in order (and pass->ahead one
 * tile ahead of it), and writes back every file-backed tile. A failed read or write stops the
 * update and is returned (naming the file, the rank and the error) after all I/O in flight has
 * finished: the caller must then not publish the parameters. ZTRAIN_INJECT_NVME_FULL=
 * "STEP[:RANK]" makes the first write of update STEP (from 1) on RANK (default 0) fail with
 * ENOSPC, as a disk that fills up mid-run would. */
zt_status zt_offload_step(zt_offload *f, const zt_offload_pass *pass);

/* Bytes of host memory the store holds for a stream: its host part and its buffers (the bounce
 * buffer counts with the parameters when they are in a file, else with the first state stream in
 * one). 0 for a stream in the caller's memory. */
double zt_offload_resident_bytes(const zt_offload *f, int stream);

/* For messages and logs: the tile length and the I/O backend and mode. */
size_t zt_offload_tile_elems(const zt_offload *f);
const char *zt_offload_describe(const zt_offload *f);

#endif
