/* Temporary paths removed on SIGINT/SIGTERM (ztrain/tmp_paths.h). */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* A stop signal is on its way to the signals' thread: taken by it already, or still pending (it
 * is blocked in every thread, so a process-directed one waits in the pending set for sigwait). */
static bool stop_signal_arrived(void) {
    if (atomic_load(&signal_taken))
        return true;
    sigset_t pending;
    return sigpending(&pending) == 0 &&
           (sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1);
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
         * process) is pending for this thread alone, and sigwait there would never see it. */
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

/* Waits for the first signal, then removes what is tracked and dies of it. */
static void *remover(void *arg) {
    (void)arg;
    sigset_t set;
    stop_signals(&set);
    int sig;
    while (sigwait(&set, &sig) != 0)
        ;
    atomic_store(&signal_taken, true);
    pthread_mutex_lock(&lock);
    remove_and_die(sig);
}

zt_status zt_tmp_remove_on_signals(void) {
    sigset_t set;
    stop_signals(&set);
    int rc = pthread_sigmask(SIG_BLOCK, &set, NULL);
    pthread_t th;
    pthread_attr_t attr;
    if (rc == 0 && (rc = pthread_attr_init(&attr)) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &attr, remover, NULL);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        return zt_error(ZT_ERR_IO, "cannot start the thread that removes temporary files on "
                        "SIGINT/SIGTERM: %s", strerror(rc));
    }
    pthread_mutex_lock(&lock);
    removing_on_signals = true;
    pthread_mutex_unlock(&lock);
    return ZT_OK;
}
