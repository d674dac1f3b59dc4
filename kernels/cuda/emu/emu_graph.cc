/* CUDA graphs on the emulated device, from stream capture: between cudaStreamBeginCapture and
 * cudaStreamEndCapture a stream records its work (kernel launches with the parameters they were
 * given, copies, memsets) instead of queueing it; cudaGraphLaunch queues the recording again, in
 * order, on any stream, as many times as it is called. What a capture cannot hold is refused by
 * name and invalidates it (emu_runtime.cc): a host wait, a copy from or to pageable memory (a
 * graph's copy reads pinned memory when it runs, as DMA would), an event (forks and joins of
 * streams inside a capture are not emulated). Capturing the legacy default stream is refused. */
#include <cstdio>

#include "emu_device.h"
#include "emu_internal.h"

using namespace zt_emu;

struct CUgraph_st {
    std::vector<stream_op> ops;
};

struct CUgraphExec_st {
    std::vector<stream_op> ops;
};

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    (void)mode; /* every mode refuses host waits while a capture runs: the strictest, global */
    if (sticky() != cudaSuccess)
        return sticky();
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
        fprintf(stderr, "ztrain cuda emulator: cudaStreamBeginCapture: the legacy default stream "
                        "cannot be captured\n");
        return cudaErrorStreamCaptureUnsupported;
    }
    std::shared_ptr<capture_log> &c = capture_of(stream);
    if (c)
        return cudaErrorIllegalState;
    c = std::make_shared<capture_log>();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    *graph = nullptr;
    std::shared_ptr<capture_log> &c = capture_of(stream);
    if (!c)
        return cudaErrorIllegalState;
    std::shared_ptr<capture_log> done = std::move(c);
    c = nullptr;
    if (!done->invalid.empty()) {
        fprintf(stderr, "ztrain cuda emulator: cudaStreamEndCapture: the capture was invalidated "
                        "by %s\n", done->invalid.c_str());
        return cudaErrorStreamCaptureInvalidated;
    }
    *graph = new CUgraph_st{std::move(done->ops)};
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    const std::shared_ptr<capture_log> &c = capture_of(stream);
    *status = !c ? cudaStreamCaptureStatusNone
                 : c->invalid.empty() ? cudaStreamCaptureStatusActive
                                      : cudaStreamCaptureStatusInvalidated;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!graph || flags != 0)
        return cudaErrorInvalidValue;
    *exec = new CUgraphExec_st{graph->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(device_lock());
    if (!exec)
        return cudaErrorInvalidValue;
    if (capture_of(stream))
        return capture_refuse(capture_of(stream), "cudaGraphLaunch");
    for (const stream_op &op : exec->ops) {
        cudaError_t e = enqueue(stream, op.what, op.fn);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

} /* extern "C" */
