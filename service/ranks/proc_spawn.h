/* Starting one child process the way a daemon should: posix_spawn (no fork of a threaded
 * process), an explicit environment, chosen descriptors and nothing else inherited, default
 * signal dispositions and an empty mask, in a given process group, and a pidfd to wait on. */
#ifndef ZTRAIN_PROC_SPAWN_H
#define ZTRAIN_PROC_SPAWN_H

#include <stdbool.h>
#include <sys/types.h>

#include "ztrain/status.h"

typedef struct {
    const char *program;     /* absolute path; PATH is not searched */
    char *const *argv;       /* NULL-terminated, argv[0] included */
    char *const *envp;       /* NULL-terminated; exactly the child's environment */
    const char *cwd;         /* NULL: the caller's */
    pid_t pgid;              /* 0: a new group led by the child; else join this group */
    int stdout_fd;           /* becomes fd 1; -1: /dev/null */
    int stderr_fd;           /* becomes fd 2; -1: /dev/null */
    int fd3;                 /* becomes fd 3 when > 0 (the metrics pipe) */
    bool inherit_stdio;      /* fds 0-2 stay the caller's (`ztrain run`, whose ranks write to
                                the user's terminal); stdout_fd and stderr_fd are then unused */
} zt_spawn_request;

/* Starts the child; stdin is /dev/null (unless inherit_stdio), descriptors above 3 are closed.
 * *pidfd (if not NULL) is a close-on-exec pidfd for poll() and waitid(P_PIDFD). glibc's
 * posix_spawn reports the exec's errno itself, so a missing program is an error here, not an
 * exit status 127: ZT_ERR_IO names the program and the reason ("/x/ztrain-worker: No such file
 * or directory"). */
zt_status zt_spawn(const zt_spawn_request *r, pid_t *pid, int *pidfd);

/* The CPUs this process may run on (its affinity mask, so taskset and cgroup cpusets count),
 * at least 1: what ranks started from here share. */
int zt_cpu_count(void);

#endif
