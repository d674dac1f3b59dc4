/* Run-time choice of the CPU kernels' instruction set (see isa.h). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

static const char *const names[] = {"portable", "avx2", "avx512"};

const char *zt_cpu_isa_name(zt_cpu_isa isa) { return names[isa]; }

static zt_cpu_isa widest(void) {
#if defined(__x86_64__) || defined(__i386__)
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
        return ZT_ISA_AVX512;
    if (avx2)
        return ZT_ISA_AVX2;
#endif
    return ZT_ISA_PORTABLE;
}

zt_cpu_isa zt_cpu_isa_pick(const char *override, int *cache) {
    int c = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (c)
        return (zt_cpu_isa)(c - 1);
    zt_cpu_isa isa = widest();
    const char *want = getenv(override);
    for (int i = 0; want && i <= (int)isa; i++)
        if (strcmp(want, names[i]) == 0)
            isa = (zt_cpu_isa)i;
    __atomic_store_n(cache, (int)isa + 1, __ATOMIC_RELEASE);
    return isa;
}
