/* Which SIMD instruction set the CPU kernels use, chosen at run time (the GPU machines' CPUs may
 * differ from the build machine's). Kernel files with hand-vectorised paths index their path
 * tables by this, so every file makes the same choice the same way. */
#ifndef ZTRAIN_CPU_ISA_H
#define ZTRAIN_CPU_ISA_H

#include "ztrain/status.h"

typedef enum {
    ZT_ISA_PORTABLE = 0, /* plain C */
    ZT_ISA_AVX2,         /* AVX2 + FMA + F16C */
    ZT_ISA_AVX512,       /* AVX-512 F + BW (and everything AVX2 needs) */
} zt_cpu_isa;

/* The widest instruction set this CPU has, or the one the environment variable `override` names
 * ("portable", "avx2", "avx512") when the CPU has it — how tests force each path. Decided on the
 * first call and remembered in *cache (a caller's static, initially 0); threads racing on the first
 * call compute the same answer. */
zt_cpu_isa zt_cpu_isa_pick(const char *override, int *cache);

const char *zt_cpu_isa_name(zt_cpu_isa isa);

/* ZT_OK when the environment variable `override` is unset, empty or one of the names above;
 * else ZT_ERR_INVALID naming the variable, its value and the accepted names. (A known name wider
 * than this CPU is accepted: zt_cpu_isa_pick then keeps the widest the CPU has.) */
zt_status zt_cpu_isa_check_env(const char *override);

#endif
