/* Temporary outputs removed on SIGINT/SIGTERM (engine/util/tmp_paths.c), each case in a child:
 *
 *   a. a signal that arrives before the writer's rename wins: the child sends itself SIGINT (or
 *      SIGTERM) and at once puts its temporary file into place with zt_tmp_rename. The signals'
 *      thread is usually still waking then, so a plain rename() ran first and left a finished
 *      final file behind (`ztrain export` interrupted in CI did exactly that). The child must die
 *      of the signal with neither the temporary file nor the final one left, also when the
 *      signals' thread has seen the signal and not yet acted on it (200 rounds give that moment
 *      its chances; case e holds it open);
 *   b. without a signal, zt_tmp_rename renames and untracks: a signal afterwards leaves the final
 *      file alone and ends the process;
 *   c. without zt_tmp_remove_on_signals (a training rank, whose stop signals are its own), a
 *      pending SIGINT does not hold the rename back: zt_tmp_rename is rename();
 *   d. a signal sent to the writing thread itself (pthread_kill, raise), pending for that thread
 *      alone where the signals' thread never sees it, is taken by the writer: it
 *      removes and dies, rather than waiting forever for the signals' thread;
 *   e. case a with the signals' thread held up for 200 ms after it has seen the signal
 *      (ZTRAIN_INJECT_SIGNAL_LATE_MS=200), so the writer renames while the signal is on its way
 *      (the child marks that it lived past the signal, so the hook is seen to hold): the writer
 *      must still find it and die with nothing left (a sigwait-based thread, which dequeues
 *      first, loses this case every time). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/tmp_paths.h"

static bool exists(const char *path) { return access(path, F_OK) == 0; }

static void make_file(const char *path) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("partial output\n", f);
        fclose(f);
    }
}

/* Runs body(tmp, final) in a child; returns its wait status, or -1 when it was still running
 * after 20 s (then killed). */
static int in_child(void (*body)(const char *, const char *, int), const char *tmp,
                    const char *final, int sig) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        body(tmp, final, sig);
        _exit(0);
    }
    int status = 0;
    for (int i = 0; i < 2000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return status;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static void signal_then_rename(const char *tmp, const char *final, int sig) {
    if (zt_tmp_remove_on_signals() != ZT_OK)
        _exit(3);
    make_file(tmp);
    zt_tmp_track(tmp);
    kill(getpid(), sig);
    zt_tmp_rename(tmp, final);
    _exit(4); /* not reached when the signal wins */
}

static void rename_then_signal(const char *tmp, const char *final, int sig) {
    if (zt_tmp_remove_on_signals() != ZT_OK)
        _exit(3);
    make_file(tmp);
    zt_tmp_track(tmp);
    if (zt_tmp_rename(tmp, final) != 0)
        _exit(5);
    kill(getpid(), sig);
    for (;;)
        pause();
}

static void signal_late_then_rename(const char *tmp, const char *final, int sig) {
    setenv("ZTRAIN_INJECT_SIGNAL_LATE_MS", "200", 1);
    if (zt_tmp_remove_on_signals() != ZT_OK)
        _exit(3);
    make_file(tmp);
    zt_tmp_track(tmp);
    kill(getpid(), sig);
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL); /* the thread has seen it by now */
    make_file(check_tmp_path("lived"));
    zt_tmp_rename(tmp, final);
    _exit(4);
}

static void signal_this_thread(const char *tmp, const char *final, int sig) {
    if (zt_tmp_remove_on_signals() != ZT_OK)
        _exit(3);
    make_file(tmp);
    zt_tmp_track(tmp);
    pthread_kill(pthread_self(), sig);
    zt_tmp_rename(tmp, final);
    _exit(4);
}

static void untaken_signals(const char *tmp, const char *final, int sig) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* as a rank's stop signals do */
    make_file(tmp);
    zt_tmp_track(tmp);
    kill(getpid(), sig);
    _exit(zt_tmp_rename(tmp, final) == 0 ? 0 : 5);
}

int main(void) {
    check_tmpdir_create("test_tmp_paths");
    const char *tmp = check_tmp_path("out.tmp"), *final = check_tmp_path("out");
    const char *lived = check_tmp_path("lived"); /* case e's child writes it */
    int sigs[] = {SIGINT, SIGTERM};

    for (int round = 0; round < 200; round++) { /* a: each round a fresh race */
        int sig = sigs[round % 2];
        int status = in_child(signal_then_rename, tmp, final, sig);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sig,
              "round %d: the child ended with status %#x, not killed by signal %d", round, status,
              sig);
        CHECK(!exists(tmp), "round %d: %s left behind", round, tmp);
        CHECK(!exists(final), "round %d: %s put into place after signal %d had arrived", round,
              final, sig);
        unlink(tmp);
        unlink(final);
    }

    int status = in_child(rename_then_signal, tmp, final, SIGTERM); /* b */
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %#x", status);
    CHECK(exists(final) && !exists(tmp), "the renamed output is kept, no temporary one remains");
    unlink(final);

    status = in_child(untaken_signals, tmp, final, SIGINT); /* c */
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
    CHECK(exists(final) && !exists(tmp), "renamed with the signal pending and not ours");
    unlink(final);

    for (int i = 0; i < 2; i++) { /* e */
        status = in_child(signal_late_then_rename, tmp, final, sigs[i]);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sigs[i],
              "late signals' thread: status %#x, not killed by signal %d", status, sigs[i]);
        CHECK(exists(lived), "late signals' thread, signal %d: the child did not live 50 ms past "
              "it (ZTRAIN_INJECT_SIGNAL_LATE_MS did not hold the signals' thread)", sigs[i]);
        unlink(lived);
        CHECK(!exists(tmp) && !exists(final), "late signals' thread, signal %d: %s%s left",
              sigs[i], exists(tmp) ? "the temporary file " : "",
              exists(final) ? "the final file" : "");
        unlink(tmp);
        unlink(final);
    }

    for (int i = 0; i < 2; i++) { /* d */
        status = in_child(signal_this_thread, tmp, final, sigs[i]);
        CHECK(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == sigs[i],
              "a signal sent to the writing thread: status %#x (-1: hung)", status);
        CHECK(!exists(tmp) && !exists(final), "thread-directed signal %d: nothing left", sigs[i]);
        unlink(tmp);
        unlink(final);
    }

    check_tmpdir_remove();
    return check_summary("test_tmp_paths");
}
