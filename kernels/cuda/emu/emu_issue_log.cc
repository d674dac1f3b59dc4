/* What the host issued to the device's streams, call by call: every kernel launch (under the
 * kernel's name), cuBLASLt matmul, asynchronous copy and memset, event record, stream wait and
 * NCCL operation. Each is one node a CUDA graph would replay with a single launch, so the tally
 * per training step is what decides whether graphs could pay: the host's cost of issuing a
 * step against the device's time to run it (bench/launch_count.py, bench/README.md).
 *
 * Read in-process through zt_emu_issue_counts, or, with ZTRAIN_CUDA_EMU_ISSUE_LOG=FILE, written
 * to FILE as one JSON object {"name": count, ...} when the process exits (every "%p" in
 * FILE becomes the process id: each rank of a job its own file). */
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include <unistd.h>

#include "emu_internal.h"

namespace {

std::mutex g_lock;
std::map<std::string, unsigned long long> *g_counts; /* leaked: read by an atexit handler */

/* Names are the runtime's own or kernels' identifiers: nothing JSON would need escaped. */
void write_log() {
    const char *env = getenv("ZTRAIN_CUDA_EMU_ISSUE_LOG");
    if (!env || !*env)
        return;
    std::string path = env;
    const std::string pid = std::to_string((long)getpid());
    for (size_t at = path.find("%p"); at != std::string::npos;
         at = path.find("%p", at + pid.size()))
        path.replace(at, 2, pid);
    std::lock_guard<std::mutex> g(g_lock);
    FILE *f = fopen(path.c_str(), "w");
    if (!f) {
        fprintf(stderr, "ztrain cuda emulator: ZTRAIN_CUDA_EMU_ISSUE_LOG: cannot write %s\n",
                path.c_str());
        return;
    }
    fputc('{', f);
    const char *sep = "";
    if (g_counts)
        for (const auto &kv : *g_counts) {
            fprintf(f, "%s\n  \"%s\": %llu", sep, kv.first.c_str(), kv.second);
            sep = ",";
        }
    fputs("\n}\n", f);
    fclose(f);
}

} // namespace

namespace zt_emu {

void note_issue(const char *what) {
    std::lock_guard<std::mutex> g(g_lock);
    if (!g_counts) {
        g_counts = new std::map<std::string, unsigned long long>;
        atexit(write_log);
    }
    (*g_counts)[what]++;
}

} // namespace zt_emu

extern "C" size_t zt_emu_issue_counts(const char **names, unsigned long long *counts,
                                      size_t cap) {
    std::lock_guard<std::mutex> g(g_lock);
    size_t n = 0;
    if (g_counts)
        for (const auto &kv : *g_counts) {
            if (n < cap) {
                names[n] = kv.first.c_str();
                counts[n] = kv.second;
            }
            n++;
        }
    return n;
}
