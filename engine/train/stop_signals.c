/* SIGINT and SIGTERM taken by a thread of their own (ztrain/stop_signals.h says why). */
#define _GNU_SOURCE /* pthread_setname_np */
#include "ztrain/stop_signals.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

static void stop_set(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Ends the process the way the signal's default action would: only this thread can take it
 * (every other one blocks it), so it is unblocked here, and raise() sends it to this thread. */
static void die_of(int sig) {
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
}

static void *wait_for_signals(void *arg) {
    volatile sig_atomic_t *flag = arg;
    sigset_t set;
    stop_set(&set);
    double first = 0.0;
    for (;;) {
        int sig = sigwaitinfo(&set, NULL);
        if (sig < 0)
            continue; /* EINTR: a signal this thread does not wait for */
        if (!*flag) {
            first = now_s();
            __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        if (sig == SIGTERM && now_s() - first < ZT_STOP_REPEATED_TERM_S)
            continue;
        die_of(sig);
    }
    return NULL;
}

zt_status zt_stop_signals_start(volatile sig_atomic_t *flag) {
    sigset_t set, old;
    stop_set(&set);
    int rc = pthread_sigmask(SIG_BLOCK, &set, &old);
    if (rc != 0)
        return zt_error(ZT_ERR_INVALID, "blocking SIGINT and SIGTERM: %s", strerror(rc));
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    rc = pthread_create(&t, &attr, wait_for_signals, (void *)flag);
    pthread_attr_destroy(&attr);
    if (rc == 0)
        pthread_setname_np(t, ZT_STOP_SIGNALS_THREAD);
    if (rc != 0) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return zt_error(ZT_ERR_NOMEM, "starting the thread that takes SIGINT and SIGTERM: %s",
                        strerror(rc));
    }
    return ZT_OK;
}
