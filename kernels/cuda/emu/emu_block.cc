/* The block scheduler of the emulated device: the blocks of a grid run one after another, and the
 * threads of a block each on a fiber of one OS thread. A thread runs until it reaches
 * a barrier or a warp sync, or returns; when none can run, the scheduler releases the warps whose
 * lanes all wait at a sync with the same mask, then the block if every thread waits at the same
 * __syncthreads. Anything else is what a GPU would hang or misbehave on, and fails the launch with
 * the site named: threads waiting at different barriers, a barrier some threads skipped by
 * returning, a warp sync naming a lane that has exited or waits at a __syncthreads.
 *
 * The order in which threads run between syncs is a parameter (ascending or descending), so a
 * result that depends on it, a missing barrier, shows as a difference (emu_runtime.cc compares
 * the two). Shared memory, static and dynamic, is filled with 0xFF before every block. */
#include <sys/mman.h>
#include <xmmintrin.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_device.h"
#include "emu_internal.h"

zt_emu_thread *zt_emu_cur;
uint3 zt_emu_block_idx;
dim3 zt_emu_block_dim, zt_emu_grid_dim;

/* Switches fibers: saves the callee-saved general registers on the current stack, stores its
 * pointer in *from, and resumes the stack at `to`. glibc's swapcontext would also save the
 * signal mask, a system call per switch, which made it most of a training step's time; nothing
 * here changes the mask. The FP control words (MXCSR, x87) are callee-saved too, but no kernel
 * or emulator code changes them, so every fiber's are the thread's, which run_grid sets to the
 * defaults for the launch: saving and loading them at every switch (ldmxcsr stalls the
 * pipeline) was two thirds of a switch's time. x86-64 System V. */
extern "C" void zt_emu_switch(void **from, void *to);
asm(R"(
    .text
    .globl zt_emu_switch
    .hidden zt_emu_switch
    .type zt_emu_switch, @function
zt_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size zt_emu_switch, .-zt_emu_switch
)");

namespace zt_emu {
namespace {

/* Each fiber's stack starts kStagger · its index bytes below the top of its mapping (at most
 * 64 KiB: every fiber keeps kUsable). Stacks a power of two apart would otherwise put every
 * fiber's top frames in the same cache sets, and each switch would evict the last fiber's. */
constexpr size_t kUsable = 128 << 10, kStagger = 64, kStack = kUsable + kStagger * 1024;
constexpr int kMaxThreads = 1024;

enum state { READY, AT_BARRIER, AT_WARP, EXITED };

struct fiber {
    zt_emu_thread t;
    void *sp = nullptr; /* saved stack pointer while switched out */
    char *stack = nullptr;
    state st = READY;
    const char *site = nullptr;
    unsigned mask = 0;
};

struct block_state {
    fiber f[kMaxThreads];
    int n = 0;
    void *sched_sp = nullptr;
    fiber *cur = nullptr;
    const std::function<void()> *body = nullptr;
    bool failed = false;
    std::string why;
    uint64_t slots[kMaxThreads / 32][32];
    std::vector<unsigned char> dyn;
    size_t dyn_bytes = 0;
};

block_state &B() {
    static block_state *b = new block_state;
    return *b;
}

[[noreturn]] void fiber_main() {
    block_state &b = B();
    (*b.body)();
    b.cur->st = EXITED;
    for (;;)
        zt_emu_switch(&b.cur->sp, b.sched_sp);
}

/* A fresh fiber's stack, as zt_emu_switch leaves one: six registers and fiber_main as the
 * return address, which lands 16-byte aligned less 8 as a call would. */
void *fresh_stack(char *stack, int index) {
    uintptr_t top = ((uintptr_t)(stack + kStack - kStagger * index) & ~(uintptr_t)15) - 16;
    uint64_t *sp = (uint64_t *)top;
    *sp = (uint64_t)(uintptr_t)fiber_main; /* the return address, at a 16-byte boundary */
    sp -= 6;
    for (int i = 0; i < 6; i++)
        sp[i] = 0;
    return sp;
}

void yield() {
    block_state &b = B();
    /* A launch that fails never resumes its waiting fibers: they are remade for the next. */
    zt_emu_switch(&b.cur->sp, b.sched_sp);
}

std::string vformat(const char *fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}

/* Releases the warp groups whose named lanes all wait with the same mask. */
bool release_warps() {
    block_state &b = B();
    bool any = false;
    for (int i = 0; i < b.n; i++) {
        fiber &f = b.f[i];
        if (f.st != AT_WARP)
            continue;
        const int base = i / 32 * 32;
        bool ready = true;
        for (int l = 0; l < 32 && ready; l++) {
            if (!(f.mask >> l & 1u))
                continue;
            int j = base + l;
            ready = j < b.n && b.f[j].st == AT_WARP && b.f[j].mask == f.mask;
        }
        if (!ready)
            continue;
        for (int l = 0; l < 32; l++)
            if (f.mask >> l & 1u)
                b.f[base + l].st = READY;
        any = true;
    }
    return any;
}

/* Why the block cannot go on when nothing runs and no warp can be released. */
std::string stuck() {
    block_state &b = B();
    int at_barrier = 0, exited = 0, at_warp = 0;
    const char *site = nullptr, *other = nullptr;
    int warp_thread = -1;
    for (int i = 0; i < b.n; i++) {
        fiber &f = b.f[i];
        if (f.st == EXITED)
            exited++;
        else if (f.st == AT_WARP) {
            at_warp++;
            if (warp_thread < 0)
                warp_thread = i;
        } else if (f.st == AT_BARRIER) {
            at_barrier++;
            if (!site)
                site = f.site;
            else if (strcmp(site, f.site) != 0 && !other)
                other = f.site;
        }
    }
    char buf[1024];
    if (at_warp) {
        fiber &f = b.f[warp_thread];
        int base = warp_thread / 32 * 32;
        std::string lanes;
        for (int l = 0; l < 32; l++) {
            if (!(f.mask >> l & 1u))
                continue;
            int j = base + l;
            const char *what = j >= b.n                  ? "does not exist"
                               : b.f[j].st == EXITED     ? "has returned"
                               : b.f[j].st == AT_BARRIER ? "waits at a __syncthreads"
                               : b.f[j].mask != f.mask   ? "syncs with another mask"
                                                         : nullptr;
            if (what) {
                snprintf(buf, sizeof buf, "lane %d %s", l, what);
                lanes = buf;
                break;
            }
        }
        snprintf(buf, sizeof buf,
                 "thread %d waits at a warp sync (%s) with mask 0x%08x, which "
                 "cannot complete: %s",
                 warp_thread, f.site, f.mask, lanes.c_str());
        return buf;
    }
    if (other) {
        snprintf(buf, sizeof buf, "threads wait at two different __syncthreads (%s and %s)", site,
                 other);
        return buf;
    }
    snprintf(buf, sizeof buf,
             "__syncthreads at %s reached by %d of %d threads; the other %d "
             "returned (a barrier in divergent code)",
             site ? site : "?", at_barrier, b.n, exited);
    return buf;
}

/* Runs one block; empty on success. */
std::string run_block(const grid_run &g, bool reverse) {
    block_state &b = B();
    b.failed = false;
    b.why.clear();
    if (g.shared_lo && g.shared_hi > g.shared_lo)
        memset(g.shared_lo, 0xFF, (size_t)(g.shared_hi - g.shared_lo));
    if (b.dyn_bytes)
        memset(b.dyn.data(), 0xFF, b.dyn_bytes);
    for (int i = 0; i < b.n; i++) {
        fiber &f = b.f[i];
        f.st = READY;
        f.sp = fresh_stack(f.stack, i);
    }
    for (;;) {
        for (int k = 0; k < b.n; k++) {
            fiber &f = b.f[reverse ? b.n - 1 - k : k];
            if (f.st != READY)
                continue;
            b.cur = &f;
            zt_emu_cur = &f.t;
            zt_emu_switch(&b.sched_sp, f.sp);
            if (b.failed)
                return b.why;
        }
        if (release_warps())
            continue;
        int exited = 0, at_barrier = 0;
        const char *site = nullptr;
        bool same = true;
        for (int i = 0; i < b.n; i++) {
            if (b.f[i].st == EXITED)
                exited++;
            else if (b.f[i].st == AT_BARRIER) {
                at_barrier++;
                if (!site)
                    site = b.f[i].site;
                else if (site != b.f[i].site && strcmp(site, b.f[i].site) != 0)
                    same = false; /* one site's string is one pointer: the compare is rare */
            }
        }
        if (exited == b.n)
            return std::string();
        if (at_barrier == b.n && same) {
            for (int i = 0; i < b.n; i++)
                b.f[i].st = READY;
            continue;
        }
        return stuck();
    }
}

} // namespace

std::string run_grid(const grid_run &g, bool reverse) {
    block_state &b = B();
    b.n = (int)(g.block.x * g.block.y * g.block.z);
    for (int i = 0; i < b.n; i++) {
        fiber &f = b.f[i];
        if (!f.stack) {
            /* A guard page below each stack turns an overflow into a fault, not corruption. */
            char *p = (char *)mmap(nullptr, kStack + 4096, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED)
                return "cannot map fiber stacks";
            mprotect(p, 4096, PROT_NONE);
            f.stack = p + 4096;
        }
        f.t.tid = make_uint3(i % g.block.x, i / g.block.x % g.block.y, i / (g.block.x * g.block.y));
        f.t.linear = (unsigned)i;
        f.t.lane = (unsigned)i % 32;
        f.t.warp = (unsigned)i / 32;
    }
    b.dyn_bytes = g.dyn_smem;
    if (b.dyn.size() < g.dyn_smem)
        b.dyn.resize(g.dyn_smem);
    b.body = &g.body;
    zt_emu_block_dim = g.block;
    zt_emu_grid_dim = g.grid;
    /* The kernel's arithmetic with the default rounding and no flush to zero, as a GPU's
     * without --use_fast_math, whatever the host thread had set; the thread's own restored. */
    const unsigned host_csr = _mm_getcsr();
    _mm_setcsr(0x1F80u);
    std::string why;
    const size_t blocks = (size_t)g.grid.x * g.grid.y * g.grid.z;
    for (size_t k = 0; k < blocks && why.empty(); k++) {
        size_t i = reverse ? blocks - 1 - k : k;
        zt_emu_block_idx = make_uint3((unsigned)(i % g.grid.x), (unsigned)(i / g.grid.x % g.grid.y),
                                      (unsigned)(i / ((size_t)g.grid.x * g.grid.y)));
        why = run_block(g, reverse);
        if (!why.empty()) {
            char where[160];
            snprintf(where, sizeof where, "kernel %s, block (%u,%u,%u): ", g.name,
                     zt_emu_block_idx.x, zt_emu_block_idx.y, zt_emu_block_idx.z);
            why = where + why;
        }
    }
    _mm_setcsr(host_csr);
    return why;
}

} // namespace zt_emu

using namespace zt_emu;

void zt_emu_barrier(const char *site) {
    block_state &b = B();
    b.cur->st = AT_BARRIER;
    b.cur->site = site;
    yield();
}

void zt_emu_warp_sync(unsigned mask, const char *site) {
    block_state &b = B();
    if (!(mask >> b.cur->t.lane & 1u))
        zt_emu_kernel_fault(site, "lane %u syncs with mask 0x%08x, which does not name it",
                            b.cur->t.lane, mask);
    b.cur->st = AT_WARP;
    b.cur->site = site;
    b.cur->mask = mask;
    yield();
}

uint64_t *zt_emu_warp_slots(void) { return B().slots[B().cur->t.warp]; }

void *zt_emu_dyn_smem(void) { return B().dyn_bytes ? B().dyn.data() : nullptr; }

unsigned zt_emu_ballot(unsigned mask, int pred, const char *site) {
    uint64_t *slots = zt_emu_warp_slots();
    const unsigned lane = zt_emu_cur->lane;
    slots[lane] = pred != 0;
    zt_emu_warp_sync(mask, site);
    unsigned r = 0;
    for (unsigned l = 0; l < 32; l++)
        if ((mask >> l & 1u) && slots[l])
            r |= 1u << l;
    zt_emu_warp_sync(mask, site);
    return r;
}

void zt_emu_kernel_fault(const char *site, const char *fmt, ...) {
    block_state &b = B();
    va_list ap;
    va_start(ap, fmt);
    b.why = std::string(site) + ": " + vformat(fmt, ap);
    va_end(ap);
    b.failed = true;
    b.cur->st = EXITED;
    for (;;)
        zt_emu_switch(&b.cur->sp, b.sched_sp);
}
