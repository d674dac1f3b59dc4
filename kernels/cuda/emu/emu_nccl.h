/* The emulated NCCL's pieces (emu_nccl.cc): the files ranks exchange through
 * (emu_nccl_files.cc) and the reductions (emu_nccl_reduce.cc). Internal to the emulated device. */
#ifndef ZTRAIN_CUDA_EMU_NCCL_H
#define ZTRAIN_CUDA_EMU_NCCL_H

#include <nccl.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zt_emu_nccl {

/* Where the communicators' files live: shared memory, so a file costs no disk. */
constexpr char kDir[] = "/dev/shm/";

/* What every contribution and message file starts with: the call that wrote it. */
struct file_head {
    uint32_t magic, kind;
    int32_t type, redop, root, pad;
    uint64_t count, bytes;
};

/* Writes h then bytes of data to path, under another name first, renamed when whole; false with
 * why set otherwise. */
bool write_whole(const std::string &path, const file_head &h, const void *data, size_t bytes,
                 std::string &why);
/* Reads a whole file into out; false while it does not exist. */
bool read_whole(const std::string &path, std::vector<char> &out);
/* Removes every file under kDir whose name starts with prefix's (without kDir) and a dash. */
void remove_files(const std::string &prefix);
/* Whether process pid has exited (gone, or a zombie its parent has not reaped). */
bool process_gone(pid_t pid);

/* out[0, n) = redop over the contributions src[0], src[1], ... in that order, with the rounding
 * of emu_nccl.cc's top comment; t and redop are among the emulated ones. */
void reduce(void *out, const std::vector<const char *> &src, size_t n, ncclDataType_t t,
            ncclRedOp_t redop);

} // namespace zt_emu_nccl

#endif
