/* Temporary paths removed on SIGINT/SIGTERM (ztrain/tmp_paths.h). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "ztrain/fault_inject.h"
#include "ztrain/fsutil.h"
#include "ztrain/tmp_paths.h"

typedef struct tracked {
    char *path;
    struct tracked *next;
} tracked;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static tracked *paths;
static bool removing_on_signals;     /* zt_tmp_remove_on_signals ran: the signals are ours */
static atomic_bool signal_taken;     /* the signals' thread has one and is about to remove */
static int signal_fd = -1;           /* the signals' thread reads SIGINT/SIGTERM from it */
static long signal_late_ms;          /* ZTRAIN_INJECT_SIGNAL_LATE_MS (tests): a slow signals' thread */

void zt_tmp_track(const char *path) {
    tracked *t = malloc(sizeof *t);
    char *copy = strdup(path);
    if (!t || !copy) {
        free(t);
        free(copy);
        return;
    }
    t->path = copy;
    pthread_mutex_lock(&lock);
    t->next = paths;
    paths = t;
    pthread_mutex_unlock(&lock);
}

static void untrack_locked(const char *path) {
    for (tracked **p = &paths; *p; p = &(*p)->next) {
        if (strcmp((*p)->path, path) == 0) {
            tracked *t = *p;
            *p = t->next;
            free(t->path);
            free(t);
            return;
        }
    }
}

void zt_tmp_untrack(const char *path) {
    pthread_mutex_lock(&lock);
    untrack_locked(path);
    pthread_mutex_unlock(&lock);
}

static void stop_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

/* A stop signal is on its way to the signals' thread: still pending (it is blocked in every
 * thread, so a process-directed one waits in the pending set), or taken by it already. Pending
 * is asked first: the signals' thread marks a signal taken before it dequeues it, so a signal
 * sent before this call is seen by one question or the other, never missed between them. */
static bool stop_signal_arrived(void) {
    sigset_t pending;
    if (sigpending(&pending) == 0 &&
        (sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1))
        return true;
    return atomic_load(&signal_taken);
}

/* Removes what is tracked, with the lock held (and kept: nothing is tracked or untracked after
 * it), then dies of sig with its default action. */
static _Noreturn void remove_and_die(int sig) {
    for (tracked *t = paths; t; t = t->next)
        zt_remove_tree(t->path);
    signal(sig, SIG_DFL);
    /* The signal is blocked in every thread; this one unblocks it and sends it to itself. */
    sigset_t set;
    stop_signals(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    abort(); /* not reached: the default action of SIGINT and SIGTERM ends the process */
}

int zt_tmp_rename(const char *tmp, const char *path) {
    pthread_mutex_lock(&lock);
    if (removing_on_signals && stop_signal_arrived()) {
        /* Taken here when the signals' thread has not taken it: one sent to this thread (not the
         * process) is pending for this thread alone, and the signals' thread never sees it. */
        sigset_t set;
        stop_signals(&set);
        const struct timespec now = {0, 0};
        int sig = atomic_load(&signal_taken) ? -1 : sigtimedwait(&set, NULL, &now);
        if (sig > 0)
            remove_and_die(sig);
        /* The signals' thread has it: it takes the lock next, removes tmp and ends the process. */
        pthread_mutex_unlock(&lock);
        for (;;)
            pause();
    }
    int rc = rename(tmp, path);
    if (rc == 0)
        untrack_locked(tmp);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Waits for the first signal, marks it taken, dequeues it, then removes what is tracked and dies
 * of it. poll() sees the signal without taking it out of the pending set (sigwait would take it
 * first and leave a moment in which zt_tmp_rename finds it neither pending nor taken). */
static void *remover(void *arg) {
    (void)arg;
    struct pollfd p = {.fd = signal_fd, .events = POLLIN};
    while (poll(&p, 1, -1) != 1) /* only EINTR (or a passing ENOMEM) returns anything else */
        ;
    /* As a loaded machine can stall it, between seeing the signal and taking it. */
    zt_inject_sleep_ms(signal_late_ms);
    atomic_store(&signal_taken, true);
    struct signalfd_siginfo info;
    ssize_t n;
    while ((n = read(signal_fd, &info, sizeof info)) < 0 && errno == EINTR)
        ;
    /* Should zt_tmp_rename dequeue it first, read waits and that thread ends the process; a
     * failed read (not expected) ends it as SIGTERM would. */
    int sig = n == (ssize_t)sizeof info ? (int)info.ssi_signo : SIGTERM;
    pthread_mutex_lock(&lock);
    remove_and_die(sig);
}

zt_status zt_tmp_remove_on_signals(void) {
    sigset_t set;
    stop_signals(&set);
    signal_late_ms = zt_inject_signal_late_ms();
    int rc = pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (rc == 0 && (signal_fd = signalfd(-1, &set, SFD_CLOEXEC)) < 0)
        rc = errno;
    pthread_t th;
    pthread_attr_t attr;
    if (rc == 0 && (rc = pthread_attr_init(&attr)) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &attr, remover, NULL);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        if (signal_fd >= 0)
            close(signal_fd);
        signal_fd = -1;
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        return zt_error(ZT_ERR_IO, "cannot start the thread that removes temporary files on "
                        "SIGINT/SIGTERM: %s", strerror(rc));
    }
    pthread_mutex_lock(&lock);
    removing_on_signals = true;
    pthread_mutex_unlock(&lock);
    return ZT_OK;
}
