/* How the pieces of the emulated CUDA device call each other: device memory (emu_memory.cc),
 * streams and the runtime API (emu_runtime.cc), the block scheduler (emu_block.cc) and cuBLASLt
 * (emu_cublaslt.cc). Internal to libztrain_cuda_emu.so and the emulator's own test. */
#ifndef ZTRAIN_CUDA_EMU_INTERNAL_H
#define ZTRAIN_CUDA_EMU_INTERNAL_H

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zt_emu {

/* Everything the device does (stream work, kernels, the scheduler's globals) runs under this
 * lock, by whichever host thread forced the work: one device, one queue runner at a time. */
std::recursive_mutex &device_lock();

/* ---- device memory (emu_memory.cc) --------------------------------------------------------------
 * One arena of device memory, PROT_NONE except while the device works (open/close nest), so that
 * host code dereferencing a device pointer faults, and the fault names the allocation. Each
 * allocation is 256-byte aligned, filled with 0xFF when made, and followed by a red zone whose
 * bytes are checked after every piece of device work. */
void *dev_alloc(size_t bytes, const void *caller);
/* False when p is not the start of a live allocation. */
bool dev_free(void *p);
/* Whether [p, p + bytes) lies inside one live allocation (bytes 0: p inside or at its end). */
bool dev_contains(const void *p, size_t bytes);
bool in_arena(const void *p);
/* "allocation #n (N bytes at 0x..., cudaMalloc from f)" for an address in the arena. */
std::string describe(const void *p);
size_t dev_allocated_bytes();
void arena_open();
void arena_close();
/* The live allocation holding p (its start and size); false when there is none. */
bool allocation_of(const void *p, char **base, size_t *bytes);
/* Empty when every red zone is intact, else what was overwritten, after `what`. */
std::string check_red_zones(const char *what);

void *pinned_alloc(size_t bytes);
bool pinned_free(void *p);
/* Whether [p, p + bytes) is inside pinned (page-locked) host memory. */
bool is_pinned(const void *p, size_t bytes);

/* ---- virtual memory management (emu_vmm.cc) ----------------------------------------------------
 * Reserved address ranges beside the arena, physical granules mapped into them (memfd, shared,
 * so aliases are real). The arena's calls above consult these: dev_contains and describe cover
 * reservations, dev_allocated_bytes counts physical granules, arena_open/close open and close
 * the mapped granules with the arena. */
/* Whether p lies in the region reservations are made in. */
bool vmm_in(const void *p);
/* Whether [p, p + bytes) lies in one live reservation (mapped or not). */
bool vmm_contains(const void *p, size_t bytes);
/* "byte n (granule g) of reservation #k (...)", and whether it is mapped. */
std::string vmm_describe(const void *p);
/* Empty when [p, p + bytes) is mapped with access throughout, else the account of the first
 * byte that is not: what a copy, memset or kernel touching it faults with. */
std::string vmm_unmapped(const void *p, size_t bytes);
/* Opens (or closes) the mappings with access to device work on this thread. Opening makes
 * none readable yet: each is opened by the first fault in it (vmm_open_on_fault), so a drain
 * pays for the mappings it touches, not for every one; closing protects again those it
 * opened. */
void vmm_protect(bool open);
/* From the SIGSEGV handler: whether addr lies in a mapping with access that device work on the
 * thread that opened the mappings may touch, which is now readable and writable (the faulting
 * access is retried); false for anything else (a fault to report). */
bool vmm_open_on_fault(const void *addr);
/* Whether this thread opened the mappings (vmm_protect) and has not closed them. */
bool vmm_opened_here();
size_t vmm_physical_bytes();
/* The size of the reservation holding p, 0 when none. */
size_t vmm_reservation_bytes(const void *p);
/* The accessible mapped pieces of the reservation holding p. */
void vmm_mapped_pieces(const void *p, std::vector<std::pair<char *, size_t>> &out);

/* The emulated device's memory (an H100's), what cudaMalloc and cuMemCreate are held to. */
size_t device_total_bytes();

/* ---- errors (emu_runtime.cc) --------------------------------------------------------------------
 * A fault inside device work is sticky, as a GPU context's: every later call returns it; the
 * detail is what cudaGetErrorString adds to the runtime's text. */
void set_sticky(cudaError_t e, const std::string &detail);
cudaError_t sticky();

/* ---- kernels (emu_block.cc) ------------------------------------------------------------------ */

struct grid_run {
    const char *name;
    dim3 grid, block;
    size_t dyn_smem;
    char *shared_lo, *shared_hi;
    std::function<void()> body;
};
/* Runs every block, threads in ascending (reverse = false) or descending order and blocks in the
 * same order. Empty on success, else why the kernel failed. */
std::string run_grid(const grid_run &g, bool reverse);

/* ---- stream work (emu_runtime.cc) ------------------------------------------------------------ */

/* Queues fn on stream s (0: the legacy default stream), to run when the stream is drained. fn
 * returns an error (cudaSuccess otherwise) and sets the detail. */
cudaError_t enqueue(cudaStream_t s, const char *what,
                    std::function<cudaError_t(std::string &detail)> fn);

/* The device this process has set (cudaSetDevice; 0 unless ZTRAIN_CUDA_EMU_DEVICES gives
 * several): each process is a device of its own. */
int current_device();

/* Counts one call of the host that issued work to a stream, by what it was (emu_issue_log.cc);
 * enqueue and cudaEventRecord call it. */
void note_issue(const char *what);

} // namespace zt_emu

/* Since the process began: [0] the host's waits for device work (stream, event and device
 * synchronisations, blocking copies and memsets, queries that found work pending and ran it),
 * [1] device-to-host copies, [2] host-to-device copies from pageable memory. What
 * tests/unit/test_step_syncs counts per training step; found by name through
 * zt_backend_cuda_symbol. */
extern "C" void zt_emu_sync_counts(unsigned long long out[3]);

/* Since the process began: the host's event waits (cudaEventSynchronize, and a cudaEventQuery
 * that ran pending work) that returned while a device-to-host copy issued after the event on
 * its stream was still queued. Such a wait let the host compute on what the event covered with
 * the device's next reads already issued: how tests/unit/test_cuda_emu_syncs_dp sees that the
 * offloaded update's tile copies overlap the host's Adam. */
extern "C" unsigned long long zt_emu_waits_ahead(void);

/* Since the process began, each distinct kind of work the host issued to a stream (a kernel by
 * its name, "cublasLtMatmul", "cudaMemcpyAsync", "cudaEventRecord", an NCCL call, ...) and how
 * many times: up to cap of them into names/counts; returns how many there are. The names live
 * as long as the process. */
extern "C" size_t zt_emu_issue_counts(const char **names, unsigned long long *counts, size_t cap);

#endif
