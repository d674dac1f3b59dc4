/* The op test harness: every op of every backend in this build against the CPU's, the CPU's ops
 * against double-precision references and finite differences, 16-bit activations held as ops.h
 * says, the optimizer and cast ops against plain loops, and the backend object's memory.
 * `test_ops --op NAME` runs one family (or the family of one zt_ops entry; --op may be
 * repeated); `test_ops --perf` times the ops at GPT-2 small's shapes, and the Llama family's at a
 * Llama-style model of the same width, instead (not run by ctest). The checks live in
 * tests/unit/ops/, one file per op family, with the shared pieces in harness.h. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "ops/harness.h"

static const zt_test_family *const families[] = {
    &zt_test_backend_memory,
    &zt_test_embedding,
    &zt_test_layernorm,
    &zt_test_linear,
    &zt_test_linear_gelu,
    &zt_test_linear_twin,
    &zt_test_param_twin,
    &zt_test_grad_twin,
    &zt_test_attention,
    &zt_test_gelu,
    &zt_test_add,
    &zt_test_softmax_xent,
    &zt_test_xent_partial,
    &zt_test_rmsnorm,
    &zt_test_rope,
    &zt_test_silu_mul,
    &zt_test_adam_update,
    &zt_test_sgd_update,
    &zt_test_adam_update_mixed,
    &zt_test_optim_slices,
    &zt_test_lamb,
    &zt_test_sum_squares,
    &zt_test_scale,
    &zt_test_to_half,
    &zt_test_from_half,
    &zt_test_round_to,
    &zt_test_accumulate_half,
    &zt_test_sum_squares_half,
    &zt_test_sum_to,
    &zt_test_weighted_sum_to,
};
enum { NFAMILIES = sizeof families / sizeof families[0] };

static bool covers(const zt_test_family *f, const char *entry) {
    for (const char *const *e = f->entries; *e; e++)
        if (strcmp(*e, entry) == 0)
            return true;
    return false;
}

/* The family --op names: its own name, or the name of a zt_ops entry it covers. */
static const zt_test_family *family_named(const char *name) {
    for (int i = 0; i < NFAMILIES; i++)
        if (strcmp(families[i]->name, name) == 0 || covers(families[i], name))
            return families[i];
    return NULL;
}

static int usage(const char *why) {
    if (why)
        fprintf(stderr, "test_ops: %s\n", why);
    fprintf(stderr, "usage: test_ops [--op NAME]... [--perf] [--margins]\nNAME is one of:");
    for (int i = 0; i < NFAMILIES; i++)
        fprintf(stderr, " %s", families[i]->name);
    fprintf(stderr, "\nor a zt_ops entry (layernorm_backward, ...)\n");
    return 2;
}

int main(int argc, char **argv) {
    /* Line by line even into a file: scripts/gpu-check.sh keeps what a run it kills at its time
     * limit printed (the "backends:" line says the CUDA backend ran). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* The families --op named (it may be given more than once); none: all. */
    const zt_test_family *only[NFAMILIES];
    int n_only = 0;
    bool perf = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--perf") == 0)
            perf = true;
        else if (strcmp(argv[i], "--margins") == 0)
            zt_test_margins = true;
        else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc) {
            const zt_test_family *f = family_named(argv[++i]);
            if (!f)
                return usage("no op family of that name");
            if (n_only < NFAMILIES)
                only[n_only++] = f;
        } else
            return usage(strcmp(argv[i], "--help") == 0 ? NULL : "unknown argument");
    }

    /* Every entry of the op table belongs to exactly one family, so none goes unchecked. */
    for (int e = 0; e < zt_test_entry_count(); e++) {
        int owners = 0;
        for (int i = 0; i < NFAMILIES; i++)
            owners += covers(families[i], zt_test_entry_name(e));
        CHECK_AT(owners == 1, "zt_ops entry %s belongs to %d families of test_ops, not 1",
                 zt_test_entry_name(e), owners);
    }

    zt_test_env env = {0};
    static const zt_device devices[] = {ZT_DEVICE_CPU, ZT_DEVICE_CUDA};
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        if (!zt_backend_available(devices[i]))
            continue;
        /* A build with the CUDA backend on a machine without a GPU: the comparisons against the
         * CPU need one, so they are skipped, and said to be. */
        if (zt_backend_device_count(devices[i]) == 0) {
            printf("test_ops: %s: SKIPPED: this build has the backend but no %s device is "
                   "visible\n",
                   zt_device_name(devices[i]), zt_device_name(devices[i]));
            continue;
        }
        zt_backend *be = NULL;
        zt_status s = zt_backend_create(&be, devices[i], NULL);
        if (!CHECK_AT(s == ZT_OK, "zt_backend_create(%s): %s", zt_device_name(devices[i]),
                      zt_last_error()))
            continue;
        env.be[env.n++] = be;
    }
    if (env.n == 0 || env.be[0]->device != ZT_DEVICE_CPU) {
        fprintf(stderr, "test_ops: no CPU backend to compare with\n");
        return 1;
    }
    printf("backends:");
    for (int b = 0; b < env.n; b++)
        printf(" %s", env.be[b]->name);
    printf(" (CPU: optimizer path %s, matrix products in %s%s, %d OpenMP threads)\n",
           zt_backend_cpu_optim_isa(), zt_backend_cpu_matmul(),
           zt_backend_cpu_bf16_matmul() ? " with native bf16" : "", omp_get_max_threads());

    if (perf)
        printf("%-24s %-5s %-36s %10s  %s\n", "op (fp32 activations)", "dev", "shape", "ms",
               "rate");
    for (int i = 0; i < NFAMILIES; i++) {
        const zt_test_family *f = families[i];
        bool named = n_only == 0;
        for (int k = 0; k < n_only; k++)
            named = named || only[k] == f;
        if (!named)
            continue;
        if (!perf) {
            f->check(&env);
            continue;
        }
        for (int b = 0; b < env.n && f->perf; b++)
            f->perf(env.be[b]);
    }

    for (int b = 0; b < env.n; b++)
        zt_backend_destroy(env.be[b]);
    return zt_test_summary();
}
