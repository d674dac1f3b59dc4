/* posix_spawn with the daemon's hygiene (spawn.h). */
#define _GNU_SOURCE
#include "proc_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int pidfd_open_(pid_t pid) {
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

zt_status zt_spawn(const zt_spawn_request *r, pid_t *pid, int *pidfd) {
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);

    if (!r->inherit_stdio) {
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        if (r->stdout_fd >= 0)
            posix_spawn_file_actions_adddup2(&fa, r->stdout_fd, 1);
        else
            posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        if (r->stderr_fd >= 0)
            posix_spawn_file_actions_adddup2(&fa, r->stderr_fd, 2);
        else
            posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    }
    int first_closed = 3;
    if (r->fd3 > 0) {
        posix_spawn_file_actions_adddup2(&fa, r->fd3, 3);
        first_closed = 4;
    }
    /* Whatever the daemon itself inherited (a shell's stray descriptor) must not reach ranks. */
    posix_spawn_file_actions_addclosefrom_np(&fa, first_closed);
    if (r->cwd)
        posix_spawn_file_actions_addchdir_np(&fa, r->cwd);

    sigset_t none, all_default;
    sigemptyset(&none);
    sigemptyset(&all_default);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sig < SIGRTMIN)
            sigaddset(&all_default, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all_default);
    posix_spawnattr_setpgroup(&attr, r->pgid);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                        POSIX_SPAWN_SETPGROUP);

    int rc = posix_spawn(pid, r->program, &fa, &attr, r->argv, r->envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0)
        return zt_error(ZT_ERR_IO, "%s: %s", r->program, strerror(rc));
    if (pidfd) {
        *pidfd = pidfd_open_(*pid);
        if (*pidfd < 0) {
            /* Without a pidfd the child could never be reaped by us: end it now. */
            int e = errno;
            kill(*pid, SIGKILL);
            waitpid(*pid, NULL, 0);
            return zt_error(ZT_ERR_IO, "pidfd_open(%ld): %s", (long)*pid, strerror(e));
        }
    }
    return ZT_OK;
}

int zt_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
