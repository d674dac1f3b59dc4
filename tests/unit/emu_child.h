/* The emulated CUDA device's own tests (test_cuda_emu.cc, test_cuda_emu_vmm.cc) run each case in a
 * child process, since a fault is sticky for the process and a signal ends it: what the child
 * exited with or was killed by, and what it wrote to stderr, are what a case is judged by. */
#ifndef ZTRAIN_TEST_EMU_CHILD_H
#define ZTRAIN_TEST_EMU_CHILD_H

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

/* Runs run() in a forked child with its stderr captured into *err; returns the child's wait
 * status, or -1 when no child could be made. */
static inline int zt_emu_run_child(int (*run)(), std::string *err) {
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        _exit(run());
    }
    close(fds[1]);
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0)
        err->append(buf, (size_t)n);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

/* Whether a child's status is what a case wants: killed by want_signal, or exit 0 when it is 0. */
static inline bool zt_emu_child_as_wanted(int status, int want_signal) {
    return status != -1 && (want_signal ? WIFSIGNALED(status) && WTERMSIG(status) == want_signal
                                        : WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

#endif
