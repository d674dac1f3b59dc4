/* Run-time choice of the CPU kernels' instruction set (see isa.h). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

static const char *const names[] = {"portable", "avx2", "avx512"};

const char *zt_cpu_isa_name(zt_cpu_isa isa) { return names[isa]; }

zt_status zt_cpu_isa_check_env(const char *override) {
    const char *want = getenv(override);
    if (!want || !*want)
        return ZT_OK;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(want, names[i]) == 0)
            return ZT_OK;
    return zt_error(ZT_ERR_INVALID,
                    "%s='%s' names no instruction-set path; the accepted values are: portable, "
                    "avx2, avx512",
                    override, want);
}

#if defined(__x86_64__) || defined(__i386__)
#if defined(__clang__)
#include <cpuid.h>
#endif

/* Clang 14 (Debian 12's, which the fuzz build uses) does not know "f16c" in
 * __builtin_cpu_supports, so it asks CPUID leaf 1 directly (ECX bit 29). */
static bool has_f16c(void) {
#if defined(__clang__)
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#else
    return __builtin_cpu_supports("f16c");
#endif
}
#endif

static zt_cpu_isa widest(void) {
#if defined(__x86_64__) || defined(__i386__)
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
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
