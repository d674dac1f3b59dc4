/* A SIGBUS guard around reads from file mappings (ztrain/map_guard.h). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>

#include "ztrain/map_guard.h"

typedef struct {
    sigjmp_buf env;
    volatile bool active;
    const void *volatile fault;
} guard;

static __thread guard *current;
static struct sigaction former;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_errno;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    guard *g = current;
    if (g && g->active) {
        g->active = false;
        g->fault = si->si_addr;
        siglongjmp(g->env, 1);
    }
    /* Not a guarded read: the former disposition takes the repeated fault (the default kills the
     * process with SIGBUS, as before the guard existed). */
    sigaction(sig, &former, NULL);
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &former) != 0)
        install_errno = errno;
}

zt_status zt_map_guarded(void (*read)(void *ctx), void *ctx, const void **fault) {
    *fault = NULL;
    pthread_once(&once, install);
    if (install_errno)
        return zt_error(ZT_ERR_IO, "cannot install the SIGBUS handler for mapped reads: %s",
                        strerror(install_errno));
    guard g;
    g.active = false;
    g.fault = NULL;
    current = &g;
    /* Saving the signal mask restores it after the jump; SA_NODEFER leaves SIGBUS unblocked
     * anyway, so a second fault in a later read is caught too. */
    if (sigsetjmp(g.env, 1) != 0) {
        current = NULL;
        *fault = g.fault;
        return ZT_ERR_IO;
    }
    g.active = true;
    read(ctx);
    g.active = false;
    current = NULL;
    return ZT_OK;
}
