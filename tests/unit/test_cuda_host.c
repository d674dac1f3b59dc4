/* The CUDA backend's host-side logic, which runs on any machine: launch shapes against their
 * formulas, the released-range set against a byte map updated by brute force, the embedding
 * backward's token buckets against a scan of the tokens, and what creating the CUDA backend does
 * in this build on this machine (a GPU's absence is reported, and the GPU op tests in test_ops
 * are then skipped). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/cuda_host.h"
#include "check.h"
#include "ztrain/backend.h"

static void test_launch(void) {
    const size_t ns[] = {0, 1, 255, 256, 257, 1000000, (size_t)1 << 40};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        size_t n = ns[i];
        zt_cuda_launch l = zt_cuda_launch_1d(n, 256, 65535);
        size_t want = (n + 255) / 256;
        if (want > 65535)
            want = 65535;
        CHECK(l.block == 256 && l.grid == want, "n %zu: grid %u block %u, want %zu", n, l.grid,
              l.block, want);
        /* The grid-stride loop covers every element: grid·block threads, each stepping by it. */
        CHECK(n == 0 || (size_t)l.grid * l.block * ((n + (size_t)l.grid * l.block - 1) /
                                                    ((size_t)l.grid * l.block)) >= n);
    }
    CHECK(zt_cuda_row_threads(0) == 32 && zt_cuda_row_threads(1) == 32);
    CHECK(zt_cuda_row_threads(32) == 32 && zt_cuda_row_threads(33) == 64);
    CHECK(zt_cuda_row_threads(768) == 768 && zt_cuda_row_threads(1000) == 1024);
    CHECK(zt_cuda_row_threads(50257) == 1024);
    for (size_t w = 0; w < 5000; w += 37)
        CHECK(zt_cuda_row_threads(w) % 32 == 0 && zt_cuda_row_threads(w) <= 1024, "width %zu", w);
    CHECK(zt_cuda_sum_blocks(0) == 1 && zt_cuda_sum_blocks(256) == 1 &&
          zt_cuda_sum_blocks(257) == 2 && zt_cuda_sum_blocks((size_t)1 << 30) == 1024);
}

/* Flash attention's tiles against the shared memory of an H100 or H200 (232,448 bytes a block
 * with the opt-in), an A100 (166,912) and the 48 KiB a kernel gets without it: the dK/dV kernel
 * holds six R×hd fp32 tiles, two R×R ones, two floats and an int a row, so 32 rows fit while
 * 768·hd + 8,576 bytes do (hd <= 291 on an H100, 206 on an A100); a tile is the largest power of
 * two whose three kernels fit, and none when one row does not. */
static void test_flash_tiles(void) {
    const size_t h100 = 232448, a100 = 166912, plain = 48 << 10;
    CHECK(zt_cuda_flash_kv_smem(32, 128) == 4 * (6 * 32 * 128 + 2 * 32 * 32 + 2 * 32) + 4 * 32);
    CHECK(zt_cuda_flash_tile(64, h100) == 32 && zt_cuda_flash_tile(128, a100) == 32);
    CHECK(zt_cuda_flash_tile(256, h100) == 32 && zt_cuda_flash_tile(291, h100) == 32);
    CHECK(zt_cuda_flash_tile(292, h100) == 16, "head_dim 292 on an H100: %d rows",
          zt_cuda_flash_tile(292, h100));
    CHECK(zt_cuda_flash_tile(192, a100) == 32 && zt_cuda_flash_tile(206, a100) == 32);
    CHECK(zt_cuda_flash_tile(207, a100) == 16, "head_dim 207 on an A100: %d rows",
          zt_cuda_flash_tile(207, a100));
    CHECK(zt_cuda_flash_tile(64, plain) == 16 && zt_cuda_flash_tile(100000, plain) == 0);
    const size_t limits[] = {plain, a100, h100};
    for (int l = 0; l < 3; l++)
        for (int hd = 1; hd <= 2048; hd++) {
            int R = zt_cuda_flash_tile(hd, limits[l]);
            bool fits = R == 0 || (zt_cuda_flash_fwd_smem(R, hd) <= limits[l] &&
                                   zt_cuda_flash_dq_smem(R, hd) <= limits[l] &&
                                   zt_cuda_flash_kv_smem(R, hd) <= limits[l]);
            bool larger = R < 32 && zt_cuda_flash_kv_smem(R ? 2 * R : 1, hd) <= limits[l];
            CHECK(fits && !larger && (R & (R - 1)) == 0, "head_dim %d in %zu bytes: %d rows", hd,
                  limits[l], R);
        }
}

/* The set against a byte map of a 4096-byte region at a fake address, under random adds and
 * removes. */
static void test_ranges(void) {
    enum { SPAN = 4096 };
    const uintptr_t base = 0x10000;
    unsigned char map[SPAN] = {0};
    zt_cuda_ranges r = {0};
    uint64_t seed = 12345;
    for (int step = 0; step < 3000; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t a = (seed >> 20) % SPAN, b = (seed >> 40) % SPAN;
        if (a > b) {
            size_t t = a;
            a = b, b = t;
        }
        bool add = (seed >> 10) & 1;
        zt_status s = add ? zt_cuda_ranges_add(&r, base + a, base + b)
                          : zt_cuda_ranges_remove(&r, base + a, base + b);
        CHECK(s == ZT_OK);
        memset(map + a, add, b - a);
        /* Sorted, disjoint and not touching (touching intervals are merged by add; remove may
         * leave two that touch only if they were apart before, which it cannot). */
        for (size_t i = 0; i < r.n; i++) {
            CHECK(r.lo[i] < r.hi[i], "step %d: empty interval %zu", step, i);
            if (i)
                CHECK(r.hi[i - 1] < r.lo[i], "step %d: intervals %zu and %zu overlap or touch",
                      step, i - 1, i);
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t qa = (seed >> 20) % SPAN, qb = (seed >> 40) % SPAN;
        if (qa > qb) {
            size_t t = qa;
            qa = qb, qb = t;
        }
        size_t want = 0;
        for (size_t i = qa; i < qb; i++)
            want += map[i];
        size_t got = zt_cuda_ranges_overlap(&r, base + qa, base + qb);
        if (!check_at(__FILE__, __LINE__, got == want,
                      "step %d: overlap [%zu, %zu) = %zu, the byte map says %zu", step, qa, qb, got,
                      want))
            break;
    }
    zt_cuda_ranges_free(&r);
    CHECK(r.n == 0 && r.lo == NULL);
}

static void test_buckets(void) {
    enum { N = 500 };
    int32_t tokens[N], uniq[N + 1], start[N + 1], pos[N];
    uint64_t work[N];
    uint64_t seed = 99;
    for (int i = 0; i < N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        /* a small vocabulary, so tokens repeat, plus a few large ids */
        tokens[i] = (seed >> 33) % 7 == 0 ? (int32_t)((seed >> 20) % 50257) : (int32_t)((seed >> 40) % 40);
    }
    int k = zt_cuda_token_buckets(tokens, N, uniq, start, pos, work);
    CHECK(start[0] == 0 && start[k] == N, "start[0] %d, start[%d] %d", start[0], k, start[k]);
    int seen = 0;
    for (int i = 0; i < k; i++) {
        if (i)
            CHECK(uniq[i - 1] < uniq[i], "bucket tokens not increasing at %d", i);
        /* The bucket holds exactly the positions of uniq[i], in increasing order. */
        int at = start[i];
        for (int p = 0; p < N; p++) {
            if (tokens[p] != uniq[i])
                continue;
            CHECK(at < start[i + 1] && pos[at] == p, "token %d: position %d missing or out of order",
                  uniq[i], p);
            at++;
        }
        CHECK(at == start[i + 1], "token %d: bucket has %d extra positions", uniq[i],
              start[i + 1] - at);
        seen += start[i + 1] - start[i];
    }
    CHECK(seen == N);
    CHECK(zt_cuda_token_buckets(tokens, 0, uniq, start, pos, work) == 0 && start[0] == 0);
}

/* The CUDA op table fills every entry of zt_ops (a table of function pointers only), so no op
 * is left for a model to find missing on a GPU. The table is the CUDA module's (ops_cuda.c),
 * loaded here as kernels/backend.c loads it. */
static void test_table(void) {
#ifdef ZT_HAVE_CUDA
    void *h = dlopen(ZT_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (!check_at(__FILE__, __LINE__, h != NULL, "dlopen %s: %s", ZT_CUDA_MODULE, dlerror()))
        return;
    const zt_ops *(*table)(void);
    *(void **)&table = dlsym(h, "zt_cuda_ops");
    if (!check_at(__FILE__, __LINE__, table != NULL, "%s has no zt_cuda_ops", ZT_CUDA_MODULE))
        return;
    typedef void (*fn)(void);
    fn entries[sizeof(zt_ops) / sizeof(fn)];
    _Static_assert(sizeof(zt_ops) % sizeof(fn) == 0, "zt_ops holds function pointers only");
    memcpy(entries, table(), sizeof entries);
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        CHECK(entries[i] != NULL, "entry %zu of the CUDA op table is NULL", i);
#endif
}

static void test_create(void) {
    int gpus = zt_backend_device_count(ZT_DEVICE_CUDA);
    CHECK(zt_backend_device_count(ZT_DEVICE_CPU) == 1);
    zt_backend *cpu = NULL;
    zt_cuda_memory mem;
    CHECK(zt_backend_create(&cpu, ZT_DEVICE_CPU, NULL) == ZT_OK);
    CHECK(zt_backend_cuda_memory(cpu, &mem) == ZT_ERR_INVALID && strstr(zt_last_error(), "cpu"),
          "%s", zt_last_error());
    zt_backend_destroy(cpu);
    zt_backend *be = NULL;
    zt_status s = zt_backend_create(&be, ZT_DEVICE_CUDA, NULL);
    if (!zt_backend_available(ZT_DEVICE_CUDA)) {
        CHECK(gpus == 0 && s == ZT_ERR_INVALID && be == NULL);
        printf("test_cuda_host: this build has no CUDA backend\n");
        return;
    }
    if (gpus == 0) {
        CHECK(s == ZT_ERR_UNSUPPORTED && be == NULL && strstr(zt_last_error(), "no CUDA device"),
              "%s: %s", zt_status_name(s), zt_last_error());
        printf("test_cuda_host: CUDA backend built; no GPU here (%s): GPU tests are skipped\n",
               zt_last_error());
        return;
    }
    CHECK(s == ZT_OK && be && be->device == ZT_DEVICE_CUDA && !be->act_as_f32, "%s",
          zt_last_error());
    /* The allocator's count follows an allocation and its free to the byte. */
    zt_cuda_memory m0, m1, m2;
    CHECK(zt_backend_cuda_memory(be, &m0) == ZT_OK && m0.device_total > 0, "%s", zt_last_error());
    void *p = zt_backend_alloc(be, ZT_MEM_DEVICE, 3 << 20);
    CHECK(p && zt_backend_cuda_memory(be, &m1) == ZT_OK && m1.allocated == m0.allocated + (3 << 20)
          && m1.peak >= m1.allocated);
    zt_backend_free(be, ZT_MEM_DEVICE, p, 3 << 20);
    CHECK(zt_backend_cuda_memory(be, &m2) == ZT_OK && m2.allocated == m0.allocated &&
          m2.peak == m1.peak);
    zt_backend_options past = {.device_index = gpus};
    zt_backend *none = NULL;
    CHECK(zt_backend_create(&none, ZT_DEVICE_CUDA, &past) == ZT_ERR_INVALID && none == NULL);
    printf("test_cuda_host: %d GPU%s visible\n", gpus, gpus == 1 ? "" : "s");
    zt_backend_destroy(be);
}

int main(void) {
    test_launch();
    test_flash_tiles();
    test_ranges();
    test_buckets();
    test_table();
    test_create();
    return check_summary("test_cuda_host");
}
