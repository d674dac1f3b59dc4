/* The Llama family's entries (rmsnorm, rope, silu_mul): ops.h gives their interfaces, which no
 * backend implements yet, so each backend reports them "not implemented". The Llama issue adds
 * their checks here with their references; until then a backend that fills one in fails this
 * test, so that no op enters a table unchecked. */
#include "harness.h"

static void unchecked(const char *family, zt_backend *be, zt_dtype act) {
    CHECK_AT(false,
             "%s on %s at %s: the op is implemented but test_ops has no check for it yet (add one "
             "in tests/unit/ops/op_llama.c)",
             family, be->name, zt_dtype_name(act));
}

static void rmsnorm_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)cpu, (void)r;
    unchecked("rmsnorm", be, act);
}

static void rope_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)cpu, (void)r;
    unchecked("rope", be, act);
}

static void silu_mul_compare(zt_backend *cpu, zt_backend *be, zt_dtype act, zt_test_rng *r) {
    (void)cpu, (void)r;
    unchecked("silu_mul", be, act);
}

static const char *const rmsnorm_entries[] = {"rmsnorm_forward", "rmsnorm_backward", NULL};
static const char *const rope_entries[] = {"rope_forward", "rope_backward", NULL};
static const char *const silu_mul_entries[] = {"silu_mul_forward", "silu_mul_backward", NULL};

static void rmsnorm_check(const zt_test_env *env) {
    zt_test_each_backend(env, "rmsnorm", rmsnorm_entries, false, rmsnorm_compare);
}

static void rope_check(const zt_test_env *env) {
    zt_test_each_backend(env, "rope", rope_entries, false, rope_compare);
}

static void silu_mul_check(const zt_test_env *env) {
    zt_test_each_backend(env, "silu_mul", silu_mul_entries, false, silu_mul_compare);
}

const zt_test_family zt_test_rmsnorm = {"rmsnorm", rmsnorm_entries, rmsnorm_check, NULL};
const zt_test_family zt_test_rope = {"rope", rope_entries, rope_check, NULL};
const zt_test_family zt_test_silu_mul = {"silu_mul", silu_mul_entries, silu_mul_check, NULL};
