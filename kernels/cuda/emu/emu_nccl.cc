/* NCCL on the emulated CUDA device: the calls kernels/cuda/nccl/nccl_comm.c makes, so that the "nccl"
 * transport runs in CI. Ranks are processes (each its own emulated device), so they exchange
 * through files under /dev/shm named after the unique id:
 *
 *   <id>-init-<rank>          the rank's pid and device, written when it joins
 *   <id>-c<seq>-<rank>        its contribution to collective number seq (every rank writes one,
 *                             a broadcast's non-roots an empty one, and waits for all of them)
 *   <id>-p<src>-<dst>-<seq>   message number seq from src to dst (the receiver deletes it)
 *   <id>-fin-<rank>, -left-   ncclCommFinalize's quiescence and ncclCommDestroy's departure
 *
 * Each file is written under a temporary name and renamed, so it appears whole, and carries a
 * header (call, type, op, root, count) that the readers compare with their own call: ranks that
 * disagree fail with an error naming both calls. A collective is queued on its stream with the
 * emulator's own enqueue, so it runs in stream order when the stream is forced, reading and
 * writing device memory as a kernel would. A rank deletes its file of collective seq - 2 when it
 * starts seq: every rank has started seq - 1, so has read it. A send never waits (a group of
 * sends and receives cannot deadlock); a receive waits for its file.
 *
 * A wait that passes ZTRAIN_CUDA_EMU_NCCL_TIMEOUT seconds (default 60), or finds a peer's
 * process gone (the pids are exchanged when the ranks join), sets the communicator's sticky
 * asynchronous error, which ncclCommGetAsyncError returns: a dead peer is an error naming it,
 * never a hang. The device itself stays healthy (NCCL's failures are not CUDA errors).
 *
 * Reductions run in rank order. 16-bit sums round to the type after every addition, as each step
 * of NCCL's ring does (which rank starts the ring differs per chunk on a GPU; here it is always
 * rank 0); ncclAvg scales each contribution by 1/n rounded to the type first, in the type, as
 * NCCL's pre-multiplied sum does for floating types, and divides an integer sum. fp32 and fp64
 * add in their own type, int64 exactly; ncclMax keeps a NaN.
 *
 * Strictness: a communicator whose call returned ncclInProgress accepts no other call until
 * ncclCommGetAsyncError has been polled; collectives and ncclGroupEnd return ncclInProgress every
 * other call, init and finalize always, so the caller's polling runs; buffers must be device
 * memory of the communicator's device; two ranks on one device fail the init as NCCL's duplicate
 * GPU check does; a type, op or call outside the list below is refused by name. */
#include <nccl.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <mutex>
#include <string>
#include <sys/random.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "emu_internal.h"
#include "emu_nccl.h"

using namespace zt_emu_nccl;

namespace {

constexpr char kIdMagic[] = "ztrain-emu-nccl:";
constexpr uint32_t kFileMagic = 0x7a6e636c; /* "zncl" */

enum op_kind : uint32_t { K_ALL_REDUCE = 1, K_REDUCE_SCATTER, K_ALL_GATHER, K_BROADCAST, K_REDUCE,
                          K_SEND, K_RECV };

const char *kind_name(uint32_t k) {
    static const char *const names[] = {"?", "ncclAllReduce", "ncclReduceScatter",
                                        "ncclAllGather", "ncclBroadcast", "ncclReduce",
                                        "ncclSend", "ncclRecv"};
    return k < sizeof names / sizeof *names ? names[k] : "?";
}

struct op {
    uint32_t kind;
    const void *send;
    void *recv;
    size_t count; /* the call's count: recvcount of a reduce-scatter, sendcount of an all-gather */
    ncclDataType_t type;
    ncclRedOp_t redop;
    int root; /* the root, or the peer of a send or receive */
    uint64_t seq;
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclFloat32: return 4;
    case ncclFloat64: case ncclInt64: return 8;
    default: return 0; /* not emulated */
    }
}

/* The seconds a wait for a peer may take; negative when the variable is not understood. */
double wait_limit() {
    const char *v = getenv("ZTRAIN_CUDA_EMU_NCCL_TIMEOUT");
    if (!v || !*v)
        return 60;
    char *end = nullptr;
    double s = strtod(v, &end);
    return end && *end == '\0' && s > 0 && std::isfinite(s) ? s : -1;
}

/* ---- communicators ------------------------------------------------------------------------ */

struct comm_state {
    std::string prefix; /* kDir + "zt-nccl-<hex>" */
    int nranks = 0, rank = 0, device = 0;
    double limit = 60;
    std::vector<pid_t> pids;
    std::vector<int> devices;
    bool joined = false;
    /* Issue side (the caller's thread). */
    uint64_t coll_seq = 0;
    std::vector<uint64_t> send_seq, recv_seq;
    unsigned calls = 0;
    bool settling = false;  /* a call returned ncclInProgress; not yet polled */
    int finalizing = 0;     /* 1: finalize called, 2: every rank finalized */
    /* Shared with the stream work, under mu. */
    std::mutex mu;
    ncclResult_t async = ncclSuccess;
    std::string last;
    bool aborted = false;
    unsigned pending = 0; /* queued work items not yet run */

    std::string path(const char *what, long a = -1, long b = -1, long c = -1) const {
        char tail[96];
        int at = snprintf(tail, sizeof tail, "-%s", what);
        for (long v : {a, b, c})
            if (v >= 0)
                at += snprintf(tail + at, sizeof tail - at, "-%ld", v);
        return prefix + tail;
    }
    bool failed() {
        std::lock_guard<std::mutex> g(mu);
        return aborted || async != ncclSuccess;
    }
    /* The first asynchronous error stays. */
    ncclResult_t set_error(ncclResult_t e, const std::string &msg) {
        std::lock_guard<std::mutex> g(mu);
        if (async == ncclSuccess) {
            async = e;
            last = "emulated NCCL rank " + std::to_string(rank) + ": " + msg;
        }
        return e;
    }
};

} // namespace

struct ncclComm {
    std::shared_ptr<comm_state> s;
};

namespace {

thread_local std::string t_last;
thread_local int t_group_depth = 0;
thread_local bool t_group_bad = false;
struct grouped {
    std::shared_ptr<comm_state> s;
    cudaStream_t stream;
    op o;
};
thread_local std::vector<grouped> t_group;

/* A call's own (synchronous) error: the message for ncclGetLastError. */
ncclResult_t refuse(ncclComm_t comm, ncclResult_t e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ncclResult_t refuse(ncclComm_t comm, ncclResult_t e, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t_last = std::string("emulated NCCL: ") + msg;
    if (comm) {
        std::lock_guard<std::mutex> g(comm->s->mu);
        comm->s->last = t_last;
    }
    if (t_group_depth > 0)
        t_group_bad = true;
    return e;
}

/* Waits for a peer's file; false with the communicator's error set when the peer is gone or the
 * limit passed. */
bool await_file(comm_state &s, const std::string &path, int peer, const char *what, uint64_t seq,
                std::vector<char> &out) {
    const double start = now_s();
    double pause = 20e-6, last_check = start;
    for (;;) {
        if (read_whole(path, out))
            return true;
        double t = now_s();
        if (t - last_check > 0.01) {
            last_check = t;
            if (s.failed())
                return false;
            /* The file is read once more after the peer is found gone: it may have written it
             * and exited between the read above and the look at its process. */
            if (process_gone(s.pids[peer]) && !read_whole(path, out)) {
                s.set_error(ncclRemoteError,
                            "rank " + std::to_string(peer) + " (pid " +
                                std::to_string(s.pids[peer]) + ") exited before its part of " +
                                what + " number " + std::to_string(seq));
                return false;
            }
            if (t - start > s.limit) {
                char msg[256];
                snprintf(msg, sizeof msg, "waited %g s for rank %d (pid %d) in %s number %llu: "
                         "the peer is stuck (ZTRAIN_CUDA_EMU_NCCL_TIMEOUT)", s.limit, peer,
                         (int)s.pids[peer], what, (unsigned long long)seq);
                s.set_error(ncclRemoteError, msg);
                return false;
            }
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(pause));
        pause = pause < 1e-3 ? pause * 2 : 1e-3;
    }
}

/* Whether a peer's header agrees with this rank's call; the error otherwise. */
bool same_call(comm_state &s, const op &o, const file_head &mine, const std::vector<char> &got,
               int peer) {
    file_head h;
    if (got.size() < sizeof h) {
        s.set_error(ncclInternalError, "a short file from rank " + std::to_string(peer));
        return false;
    }
    memcpy(&h, got.data(), sizeof h);
    if (h.magic == kFileMagic && h.kind == mine.kind && h.type == mine.type &&
        h.redop == mine.redop && h.root == mine.root && h.count == mine.count &&
        got.size() == sizeof h + h.bytes)
        return true;
    char msg[400];
    snprintf(msg, sizeof msg, "%s number %llu: rank %d called %s(count %llu, type %d, op %d, "
             "root %d) but rank %d called %s(count %llu, type %d, op %d, root %d)",
             o.kind == K_RECV ? "message" : "collective", (unsigned long long)o.seq, s.rank,
             kind_name(mine.kind), (unsigned long long)mine.count, mine.type, mine.redop,
             mine.root, peer, kind_name(h.kind), (unsigned long long)h.count, h.type, h.redop,
             h.root);
    s.set_error(ncclInvalidUsage, msg);
    return false;
}

/* One operation, inside the stream's work (device memory readable). */
void run_op(comm_state &s, const op &o) {
    const size_t es = type_size(o.type);
    file_head mine{kFileMagic, o.kind, (int32_t)o.type, (int32_t)o.redop, o.root, 0, o.count, 0};
    std::string why;
    if (o.kind == K_SEND) {
        mine.kind = K_RECV; /* what the receiver compares with its own call: */
        mine.root = s.rank; /* its peer, the sender */
        mine.bytes = o.count * es;
        if (!write_whole(s.path("p", s.rank, o.root, (long)o.seq), mine, o.send, mine.bytes, why))
            s.set_error(ncclSystemError, why);
        return;
    }
    if (o.kind == K_RECV) {
        std::string path = s.path("p", o.root, s.rank, (long)o.seq);
        std::vector<char> got;
        if (!await_file(s, path, o.root, "message", o.seq, got) ||
            !same_call(s, o, mine, got, o.root))
            return;
        unlink(path.c_str());
        memcpy(o.recv, got.data() + sizeof mine, o.count * es);
        return;
    }
    /* A collective: this rank's contribution, then every rank's. */
    if (o.seq >= 2)
        unlink(s.path("c", (long)o.seq - 2, s.rank).c_str());
    size_t in = o.kind == K_REDUCE_SCATTER ? o.count * s.nranks : o.count;
    if (o.kind == K_BROADCAST && s.rank != o.root)
        in = 0;
    mine.bytes = in * es;
    if (!write_whole(s.path("c", (long)o.seq, s.rank), mine, o.send, mine.bytes, why)) {
        s.set_error(ncclSystemError, why);
        return;
    }
    std::vector<std::vector<char>> files(s.nranks);
    std::vector<const char *> src(s.nranks);
    for (int r = 0; r < s.nranks; r++) {
        if (!await_file(s, s.path("c", (long)o.seq, r), r, kind_name(o.kind), o.seq, files[r]) ||
            !same_call(s, o, mine, files[r], r))
            return;
        src[r] = files[r].data() + sizeof(file_head);
    }
    switch (o.kind) {
    case K_ALL_REDUCE:
        reduce(o.recv, src, o.count, o.type, o.redop);
        break;
    case K_REDUCE:
        if (s.rank == o.root)
            reduce(o.recv, src, o.count, o.type, o.redop);
        break;
    case K_REDUCE_SCATTER:
        for (int r = 0; r < s.nranks; r++)
            src[r] += (size_t)s.rank * o.count * es;
        reduce(o.recv, src, o.count, o.type, o.redop);
        break;
    case K_ALL_GATHER:
        for (int r = 0; r < s.nranks; r++)
            memcpy((char *)o.recv + (size_t)r * o.count * es, src[r], o.count * es);
        break;
    case K_BROADCAST:
        memcpy(o.recv, src[o.root], o.count * es);
        break;
    }
}

/* Queues ops on the stream; sends first, so that a group's receives find them written. */
void enqueue_ops(std::shared_ptr<comm_state> s, cudaStream_t stream, std::vector<op> ops) {
    {
        std::lock_guard<std::mutex> g(s->mu);
        s->pending++;
    }
    cudaError_t e = zt_emu::enqueue(stream, kind_name(ops[0].kind), [s, ops](std::string &) {
        for (int pass = 0; pass < 2; pass++)
            for (const op &o : ops)
                if ((o.kind == K_SEND) == (pass == 0) && !s->failed())
                    run_op(*s, o);
        std::lock_guard<std::mutex> g(s->mu);
        s->pending--;
        return cudaSuccess;
    });
    if (e != cudaSuccess) {
        {
            std::lock_guard<std::mutex> g(s->mu);
            s->pending--;
        }
        s->set_error(ncclUnhandledCudaError, std::string("the stream refused the operation: ") +
                                                 cudaGetErrorName(e));
    }
}

/* Reads the peers' join files: true once every rank joined (or the join failed). */
bool try_join(comm_state &s) {
    std::vector<pid_t> pids(s.nranks);
    std::vector<int> devices(s.nranks);
    for (int r = 0; r < s.nranks; r++) {
        std::vector<char> f;
        if (!read_whole(s.path("init", r), f))
            return false;
        long pid = 0;
        int dev = 0;
        f.push_back('\0');
        if (sscanf(f.data(), "%ld %d", &pid, &dev) != 2) {
            s.set_error(ncclInternalError, "unreadable join file " + s.path("init", r));
            return true;
        }
        pids[r] = (pid_t)pid;
        devices[r] = dev;
    }
    for (int a = 0; a < s.nranks; a++)
        for (int b = a + 1; b < s.nranks; b++)
            if (devices[a] == devices[b]) {
                char msg[200];
                snprintf(msg, sizeof msg, "duplicate GPU: ranks %d and %d both use CUDA device "
                         "%d", a, b, devices[a]);
                s.set_error(ncclInvalidUsage, msg);
                return true;
            }
    s.pids = pids;
    s.devices = devices;
    s.joined = true;
    return true;
}

/* The checks every stream operation shares; ncclSuccess to go on. */
ncclResult_t check_call(ncclComm_t comm, const char *call, ncclDataType_t t, ncclRedOp_t redop,
                        bool reduces) {
    if (!comm)
        return refuse(nullptr, ncclInvalidArgument, "%s: NULL communicator", call);
    comm_state &s = *comm->s;
    if (s.settling)
        return refuse(comm, ncclInvalidUsage, "%s: called while the communicator's previous "
                      "call is in progress (poll ncclCommGetAsyncError until it leaves "
                      "ncclInProgress first)", call);
    if (!s.joined || s.finalizing)
        return refuse(comm, ncclInvalidUsage, "%s: the communicator is %s", call,
                      s.joined ? "finalized" : "not initialised yet");
    if (s.failed()) {
        std::string why;
        {
            std::lock_guard<std::mutex> g(s.mu);
            why = s.last;
        }
        return refuse(comm, ncclInvalidUsage, "%s: the communicator has failed: %s", call,
                      why.c_str());
    }
    if (!type_size(t))
        return refuse(comm, ncclInvalidArgument, "%s: data type %d is not emulated (float16, "
                      "bfloat16, float32, float64 and int64 are)", call, (int)t);
    if (reduces && redop != ncclSum && redop != ncclAvg && redop != ncclMax)
        return refuse(comm, ncclInvalidArgument, "%s: reduction op %d is not emulated (sum, avg "
                      "and max are)", call, (int)redop);
    int dev = -1;
    cudaGetDevice(&dev);
    if (dev != s.device)
        return refuse(comm, ncclInvalidUsage, "%s: the current CUDA device is %d, the "
                      "communicator's %d", call, dev, s.device);
    return ncclSuccess;
}

ncclResult_t check_buffer(ncclComm_t comm, const char *call, const char *which, const void *p,
                          size_t bytes) {
    if (bytes && !zt_emu::dev_contains(p, bytes))
        return refuse(comm, ncclInvalidArgument, "%s: %s %p (%zu bytes) is not device memory "
                      "of the emulated device: %s", call, which, p, bytes,
                      zt_emu::in_arena(p) ? zt_emu::describe(p).c_str() : "host memory");
    return ncclSuccess;
}

/* Issues (or, inside a group, holds) a checked operation. Outside a group every other call
 * reports ncclInProgress, so that the caller's polling runs. */
ncclResult_t issue(ncclComm_t comm, cudaStream_t stream, op o) {
    comm_state &s = *comm->s;
    if (o.kind == K_SEND)
        o.seq = s.send_seq[o.root]++;
    else if (o.kind == K_RECV)
        o.seq = s.recv_seq[o.root]++;
    else
        o.seq = s.coll_seq++;
    if (t_group_depth > 0) {
        t_group.push_back({comm->s, stream, o});
        return ncclSuccess;
    }
    enqueue_ops(comm->s, stream, {o});
    if (s.calls++ % 2 == 1) {
        s.settling = true;
        return ncclInProgress;
    }
    return ncclSuccess;
}

ncclResult_t collective(const char *call, uint32_t kind, const void *send, size_t send_n,
                        void *recv, size_t recv_n, size_t count, ncclDataType_t t,
                        ncclRedOp_t redop, int root, ncclComm_t comm, cudaStream_t stream) {
    bool reduces = kind == K_ALL_REDUCE || kind == K_REDUCE_SCATTER || kind == K_REDUCE;
    ncclResult_t e = check_call(comm, call, t, reduces ? redop : ncclSum, reduces);
    if (e != ncclSuccess)
        return e;
    comm_state &s = *comm->s;
    if ((kind == K_BROADCAST || kind == K_REDUCE) && (root < 0 || root >= s.nranks))
        return refuse(comm, ncclInvalidArgument, "%s: root %d is not a rank of %d", call, root,
                      s.nranks);
    const size_t es = type_size(t);
    if ((e = check_buffer(comm, call, "sendbuff", send, send_n * es)) != ncclSuccess ||
        (e = check_buffer(comm, call, "recvbuff", recv, recv_n * es)) != ncclSuccess)
        return e;
    return issue(comm, stream, op{kind, send, recv, count, t, reduces ? redop : ncclSum, root, 0});
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    if (!comm)
        return t_last.c_str();
    static thread_local std::string copy;
    std::lock_guard<std::mutex> g(comm->s->mu);
    copy = comm->s->last;
    return copy.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id)
        return refuse(nullptr, ncclInvalidArgument, "ncclGetUniqueId: NULL id");
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return refuse(nullptr, ncclSystemError, "ncclGetUniqueId: getrandom: %s",
                      strerror(errno));
    memset(id->internal, 0, sizeof id->internal);
    int at = snprintf(id->internal, sizeof id->internal, "%s", kIdMagic);
    for (unsigned char b : rnd)
        at += snprintf(id->internal + at, sizeof id->internal - at, "%02x", b);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    if (!out)
        return refuse(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: NULL comm");
    *out = nullptr;
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    if (config && (config->magic != init.magic || config->size != sizeof init))
        return refuse(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: the config was "
                      "not set from NCCL_CONFIG_INITIALIZER");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return refuse(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d",
                      rank, nranks);
    id.internal[sizeof id.internal - 1] = '\0';
    const size_t magic = strlen(kIdMagic);
    if (strncmp(id.internal, kIdMagic, magic) != 0 || strlen(id.internal) != magic + 32 ||
        strspn(id.internal + magic, "0123456789abcdef") != 32)
        return refuse(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: the unique id was "
                      "not made by this emulated NCCL's ncclGetUniqueId");
    const double limit = wait_limit();
    if (limit < 0)
        return refuse(nullptr, ncclInvalidArgument, "ZTRAIN_CUDA_EMU_NCCL_TIMEOUT='%s' is not "
                      "a positive number of seconds", getenv("ZTRAIN_CUDA_EMU_NCCL_TIMEOUT"));
    auto s = std::make_shared<comm_state>();
    s->prefix = std::string(kDir) + "zt-nccl-" + (id.internal + magic);
    s->nranks = nranks;
    s->rank = rank;
    s->limit = limit;
    cudaGetDevice(&s->device);
    s->send_seq.assign(nranks, 0);
    s->recv_seq.assign(nranks, 0);
    char me[64];
    int len = snprintf(me, sizeof me, "%ld %d\n", (long)getpid(), s->device);
    /* The join file is plain text: the pid, then the device. */
    std::string path = s->path("init", rank), tmp = path + ".tmp";
    int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, me, len) == len;
    ok = fd >= 0 && close(fd) == 0 && ok && rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok)
        return refuse(nullptr, ncclSystemError, "ncclCommInitRankConfig: cannot write %s: %s",
                      path.c_str(), strerror(errno));
    *out = new ncclComm{s};
    const bool blocking = !config || config->blocking != 0;
    if (!blocking) {
        s->settling = true;
        return ncclInProgress;
    }
    const double start = now_s();
    while (!try_join(*s)) {
        if (now_s() - start > limit) {
            s->set_error(ncclRemoteError, "not every rank joined within ZTRAIN_CUDA_EMU_NCCL_"
                         "TIMEOUT");
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::lock_guard<std::mutex> g(s->mu);
    return s->async;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
    if (!comm || !state)
        return refuse(comm, ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    comm_state &s = *comm->s;
    if (!s.joined && !s.failed() && !try_join(s)) {
        *state = ncclInProgress;
        return ncclSuccess;
    }
    if (s.finalizing == 1 && !s.failed()) {
        bool all = true;
        for (int r = 0; r < s.nranks && all; r++) {
            struct stat st;
            all = stat(s.path("fin", r).c_str(), &st) == 0;
            /* This rank's own file gone: a peer aborted (which removes every file), and would
             * otherwise be waited for until the caller's deadline. A peer found gone is looked
             * for once more: it may have finalized and exited between the two looks. */
            if (!all && r == s.rank)
                s.set_error(ncclRemoteError, "the communicator's files were removed during "
                                             "ncclCommFinalize: a peer aborted it");
            else if (!all && process_gone(s.pids[r]) &&
                     stat(s.path("fin", r).c_str(), &st) != 0)
                s.set_error(ncclRemoteError, "rank " + std::to_string(r) + " (pid " +
                                                 std::to_string(s.pids[r]) +
                                                 ") exited before ncclCommFinalize");
        }
        if (!all && !s.failed()) {
            *state = ncclInProgress;
            return ncclSuccess;
        }
        s.finalizing = 2;
    }
    s.settling = false;
    std::lock_guard<std::mutex> g(s.mu);
    *state = s.async;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm)
        return refuse(nullptr, ncclInvalidArgument, "ncclCommFinalize: NULL communicator");
    comm_state &s = *comm->s;
    if (s.settling || !s.joined || s.finalizing)
        return refuse(comm, ncclInvalidUsage, "ncclCommFinalize: the communicator is %s",
                      s.settling ? "busy (a call in progress)" : !s.joined ? "not initialised"
                                                                           : "finalized");
    {
        std::lock_guard<std::mutex> g(s.mu);
        if (s.pending)
            return refuse(comm, ncclInvalidUsage, "ncclCommFinalize: %u operations are still "
                          "queued on their streams (the emulator runs them only when the stream "
                          "is synchronised)", s.pending);
    }
    file_head h{};
    std::string why;
    if (!write_whole(s.path("fin", s.rank), h, nullptr, 0, why))
        return refuse(comm, ncclSystemError, "ncclCommFinalize: %s", why.c_str());
    s.finalizing = 1;
    s.settling = true;
    return ncclInProgress;
}

/* After a finalize every rank completed, the last rank to leave removes the files; otherwise
 * (no finalize, or it failed) destroy frees locally, as ncclCommAbort does. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm)
        return ncclSuccess;
    comm_state &s = *comm->s;
    if (s.finalizing == 2 && !s.failed()) {
        file_head h{};
        std::string why;
        write_whole(s.path("left", s.rank), h, nullptr, 0, why);
        bool all = true;
        for (int r = 0; r < s.nranks && all; r++) {
            struct stat st;
            all = stat(s.path("left", r).c_str(), &st) == 0;
        }
        if (all)
            remove_files(s.prefix);
        {
            std::lock_guard<std::mutex> g(s.mu);
            s.aborted = true;
        }
        delete comm;
        return ncclSuccess;
    }
    return ncclCommAbort(comm);
}

/* Queued work of the communicator is skipped when its stream runs; every file of the
 * communicator goes, so the peers' waits find this rank gone once its process ends. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm)
        return ncclSuccess;
    {
        std::lock_guard<std::mutex> g(comm->s->mu);
        comm->s->aborted = true;
    }
    remove_files(comm->s->prefix);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    if (t_group_depth++ == 0) {
        t_group.clear();
        t_group_bad = false;
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (t_group_depth == 0)
        return refuse(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t_group_depth > 0)
        return ncclSuccess;
    std::vector<grouped> group;
    group.swap(t_group);
    if (t_group_bad)
        return ncclInvalidArgument; /* the failed call said why */
    if (group.empty())
        return ncclSuccess;
    for (const grouped &g : group)
        if (g.s != group[0].s || g.stream != group[0].stream)
            return refuse(nullptr, ncclInvalidUsage, "ncclGroupEnd: a group over several "
                          "communicators or streams is not emulated");
    std::vector<op> ops;
    for (const grouped &g : group)
        ops.push_back(g.o);
    comm_state &s = *group[0].s;
    enqueue_ops(group[0].s, group[0].stream, std::move(ops));
    if (s.calls++ % 2 == 1) {
        s.settling = true;
        return ncclInProgress;
    }
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t redop, ncclComm_t comm, cudaStream_t stream) {
    return collective("ncclAllReduce", K_ALL_REDUCE, send, count, recv, count, count, t, redop,
                      0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t redop, ncclComm_t comm, cudaStream_t stream) {
    size_t n = comm ? recvcount * (size_t)comm->s->nranks : 0;
    return collective("ncclReduceScatter", K_REDUCE_SCATTER, send, n, recv, recvcount, recvcount,
                      t, redop, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t stream) {
    size_t n = comm ? sendcount * (size_t)comm->s->nranks : 0;
    return collective("ncclAllGather", K_ALL_GATHER, send, sendcount, recv, n, sendcount, t,
                      ncclSum, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t,
                           int root, ncclComm_t comm, cudaStream_t stream) {
    bool is_root = comm && comm->s->rank == root;
    return collective("ncclBroadcast", K_BROADCAST, send, is_root ? count : 0, recv, count, count,
                      t, ncclSum, root, comm, stream);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                        ncclRedOp_t redop, int root, ncclComm_t comm, cudaStream_t stream) {
    bool is_root = comm && comm->s->rank == root;
    return collective("ncclReduce", K_REDUCE, send, count, recv, is_root ? count : 0, count, t,
                      redop, root, comm, stream);
}

static ncclResult_t p2p(const char *call, uint32_t kind, const void *send, void *recv,
                        size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                        cudaStream_t stream) {
    ncclResult_t e = check_call(comm, call, t, ncclSum, false);
    if (e != ncclSuccess)
        return e;
    if (peer < 0 || peer >= comm->s->nranks)
        return refuse(comm, ncclInvalidArgument, "%s: peer %d is not a rank of %d", call, peer,
                      comm->s->nranks);
    const void *p = kind == K_SEND ? send : recv;
    if ((e = check_buffer(comm, call, "buffer", p, count * type_size(t))) != ncclSuccess)
        return e;
    return issue(comm, stream, op{kind, send, recv, count, t, ncclSum, peer, 0});
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return p2p("ncclSend", K_SEND, send, nullptr, count, t, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p("ncclRecv", K_RECV, nullptr, recv, count, t, peer, comm, stream);
}

} /* extern "C" */
