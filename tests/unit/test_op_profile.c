/* The op profile's own bookkeeping (kernels/op_profile.c) on the CPU backend: the wrapped table
 * computes what the backend's does (results checked against plain loops, a double-returning entry
 * included); only the step's thread's calls inside a step are timed, the others counted as
 * other_calls; a step of more calls than the event pool holds still counts every one; an entry
 * the backend lacks stays NULL; destroying the profile puts the backend's table back; and a
 * backend without timing events is refused by name. */
#include <pthread.h>
#include <string.h>

#include "../unit/check.h"
#include "ztrain/backend.h"
#include "ztrain/op_profile.h"

enum { N = 1000, MANY = 5000 };

static float buf[N];

static void *scale_from_another_thread(void *arg) {
    zt_ctx *x = arg;
    x->be->ops->scale(x, buf, N, 2.0f);
    return NULL;
}

int main(void) {
    zt_backend *be;
    CHECK(zt_backend_create(&be, ZT_DEVICE_CPU, NULL) == ZT_OK, "cpu backend: %s", zt_last_error());
    const zt_ops *own = be->ops;
    zt_ctx x = {.be = be, .act = ZT_F32};
    for (int i = 0; i < N; i++)
        buf[i] = (float)(i % 7) - 3.0f;

    zt_op_profile *p;
    CHECK(zt_op_profile_create(&p, be) == ZT_OK, "create: %s", zt_last_error());
    CHECK(be->ops != own && be->ops->scale && be->ops->sum_squares, "the profile's table is in use");
    CHECK((be->ops->xent_partial_stats == NULL) == (own->xent_partial_stats == NULL) &&
              (be->ops->lamb_apply == NULL) == (own->lamb_apply == NULL),
          "entries follow the backend's: present or NULL alike");
    /* Every entry of the op table has an id and a name, and the profile wraps it: an op added
     * to zt_ops but not to the profile would run unprofiled (or, left NULL, change the path a
     * model takes when profiled). zt_ops holds only function pointers. */
    typedef void (*any_fn)(void);
    enum { SLOTS = sizeof(zt_ops) / sizeof(any_fn) };
    CHECK((int)SLOTS == (int)ZT_OP_COUNT, "zt_ops has %d entries, the profile knows %d", (int)SLOTS,
          (int)ZT_OP_COUNT);
    int unwrapped = 0;
    for (int i = 0; i < SLOTS; i++) {
        any_fn mine, theirs;
        memcpy(&mine, (const char *)be->ops + i * sizeof(any_fn), sizeof mine);
        memcpy(&theirs, (const char *)own + i * sizeof(any_fn), sizeof theirs);
        if ((mine == NULL) != (theirs == NULL) || (theirs && mine == theirs))
            unwrapped++;
    }
    for (int i = 0; i < ZT_OP_COUNT; i++)
        CHECK(zt_op_name((zt_op_id)i) && strcmp(zt_op_name((zt_op_id)i), "?") != 0,
              "op %d has a name", i);
    CHECK(unwrapped == 0, "every entry the backend has is wrapped (%d not)", unwrapped);
    CHECK_STR(zt_op_profile_clock(p), "monotonic");
    CHECK_STR(zt_op_name(ZT_OP_LINEAR_BACKWARD), "linear_backward");
    CHECK_STR(zt_op_name(ZT_OP_SUM_SQUARES_HALF), "sum_squares_half");
    CHECK_STR(zt_op_name(ZT_OP_SUM_TO), "sum_to");

    /* Outside a step: computed, not timed. */
    be->ops->scale(&x, buf, N, 2.0f);
    CHECK(zt_op_profile_other_calls(p) == 1, "a call outside a step: %ld other calls",
          zt_op_profile_other_calls(p));

    zt_op_profile_begin_step(p);
    be->ops->scale(&x, buf, N, 0.5f);
    be->ops->scale(&x, buf, N, 0.5f);
    pthread_t th;
    pthread_create(&th, NULL, scale_from_another_thread, &x);
    pthread_join(th, NULL);
    double want = 0.0;
    for (int i = 0; i < N; i++)
        want += (double)buf[i] * buf[i];
    double got = be->ops->sum_squares(&x, buf, N);
    zt_op_time t[ZT_OP_COUNT];
    CHECK(zt_op_profile_end_step(p, t) == ZT_OK, "end: %s", zt_last_error());
    CHECK(got == want, "sum_squares through the profile: %.17g, a plain loop %.17g", got, want);
    CHECK(t[ZT_OP_SCALE].calls == 2 && t[ZT_OP_SUM_SQUARES].calls == 1,
          "the step's calls: scale %ld (want 2), sum_squares %ld (want 1)", t[ZT_OP_SCALE].calls,
          t[ZT_OP_SUM_SQUARES].calls);
    CHECK(t[ZT_OP_SCALE].ms >= 0 && t[ZT_OP_SUM_SQUARES].ms >= 0, "times %g %g",
          t[ZT_OP_SCALE].ms, t[ZT_OP_SUM_SQUARES].ms);
    long others = 0;
    for (int i = 0; i < ZT_OP_COUNT; i++)
        others += i == ZT_OP_SCALE || i == ZT_OP_SUM_SQUARES ? 0 : t[i].calls;
    CHECK(others == 0, "%ld calls of ops never called", others);
    CHECK(zt_op_profile_other_calls(p) == 2, "the other thread's call: %ld other calls (want 2)",
          zt_op_profile_other_calls(p));
    /* ×2, ×0.5, ×0.5, ×2 from the other thread: back where it started. */
    bool same = true;
    for (int i = 0; i < N; i++)
        same &= buf[i] == (float)(i % 7) - 3.0f;
    CHECK(same, "every call computed, whichever thread made it");

    /* More calls than the pool holds: read in the middle of the step, none lost. */
    zt_op_profile_begin_step(p);
    for (int i = 0; i < MANY; i++)
        be->ops->scale(&x, buf, 8, 1.0f);
    CHECK(zt_op_profile_end_step(p, t) == ZT_OK, "end: %s", zt_last_error());
    CHECK(t[ZT_OP_SCALE].calls == MANY && t[ZT_OP_SUM_SQUARES].calls == 0,
          "a step of %d calls counted %ld (sums start again each step: sum_squares %ld)", MANY,
          t[ZT_OP_SCALE].calls, t[ZT_OP_SUM_SQUARES].calls);

    zt_op_profile_destroy(p);
    CHECK(be->ops == own, "destroying the profile puts the backend's table back");

    /* A backend without timing events (one built before them) is refused, named. */
    zt_backend_iface no_timers = *be->iface;
    no_timers.timer_create = NULL;
    no_timers.timer_elapsed = NULL;
    const zt_backend_iface *real = be->iface;
    be->iface = &no_timers;
    zt_status s = zt_op_profile_create(&p, be);
    CHECK(s == ZT_ERR_UNSUPPORTED && strstr(zt_last_error(), "\"cpu\"") &&
              strstr(zt_last_error(), "timing events") && be->ops == own,
          "no timing events: %d %s", (int)s, zt_last_error());
    be->iface = real;
    zt_backend_destroy(be);
    return check_summary("test_op_profile");
}
