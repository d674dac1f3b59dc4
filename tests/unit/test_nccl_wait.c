/* NCCL's non-blocking protocol (kernels/cuda/nccl/nccl_wait.h) driven through its states without a
 * GPU, against the rules of NCCL's documentation as reference/cuda_emulation.md §9 quotes them:
 * a call returning ncclInProgress is not a failure; until ncclCommGetAsyncError leaves
 * ncclInProgress nothing may be issued; a posted call can still fail through the asynchronous
 * error; a peer that never answers ends at the deadline, not before and not never; every error
 * or timeout leaves the communicator aborted. The last check replays seeded random sequences
 * of what an NCCL could answer through the same loop the CUDA module runs (nccl_comm.c's
 * drive), against the verdict those rules give for the whole sequence. */
#include <stdint.h>
#include <stdio.h>

#include "../../kernels/cuda/nccl/nccl_wait.h"
#include "check.h"

#define S ZT_NCCL_R_SUCCESS
#define P ZT_NCCL_R_IN_PROGRESS
#define E ZT_NCCL_R_ERROR

static void test_success_at_once(void) {
    zt_nccl_wait w;
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_may_issue(&w));
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    /* What a blocking communicator, or a quick non-blocking call, answers. */
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE && zt_nccl_wait_may_issue(&w));
    /* The collective is posted: the event behind it is awaited. */
    CHECK(zt_nccl_wait_await(&w) == ZT_NCCL_POLL && !zt_nccl_wait_may_issue(&w));
    CHECK(zt_nccl_wait_poll(&w, S, P, 1.0) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, S, 2.0) == ZT_NCCL_DONE && zt_nccl_wait_may_issue(&w));
    /* A poll after the end changes nothing. */
    CHECK(zt_nccl_wait_poll(&w, S, S, 3.0) == ZT_NCCL_DONE && w.state == ZT_NCCL_READY);
}

/* Issue 27, defect 2: ncclInProgress from a collective or ncclGroupEnd was taken for a failure. */
static void test_in_progress_settles(void) {
    zt_nccl_wait w;
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    CHECK(zt_nccl_wait_issued(&w, P) == ZT_NCCL_POLL, "ncclInProgress is not a failure");
    CHECK(w.state == ZT_NCCL_SETTLING && !zt_nccl_wait_may_issue(&w),
          "nothing may be issued while the call settles");
    /* The stream's state is not read while settling: an event recorded now would be CUDA work
     * on NCCL's stream, which the protocol forbids. */
    CHECK(zt_nccl_wait_await(&w) == ZT_NCCL_FAILED && w.state == ZT_NCCL_ABORTED,
          "awaiting the stream while settling breaks the protocol");

    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    CHECK(zt_nccl_wait_issued(&w, P) == ZT_NCCL_POLL);
    for (int i = 0; i < 5; i++)
        CHECK(zt_nccl_wait_poll(&w, P, S, 0.1 * i) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, S, 0.6) == ZT_NCCL_DONE && zt_nccl_wait_may_issue(&w));
    /* Then the next call of the same operation, e.g. the payload after a header. */
    CHECK(zt_nccl_wait_issued(&w, P) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, S, 0.7) == ZT_NCCL_DONE);
    CHECK(zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, S, 0.8) == ZT_NCCL_DONE);
}

static void test_errors_abort(void) {
    zt_nccl_wait w;
    /* The call itself fails (an argument error, a group's member). */
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    CHECK(zt_nccl_wait_issued(&w, E) == ZT_NCCL_FAILED && w.state == ZT_NCCL_ABORTED);
    CHECK(!zt_nccl_wait_may_issue(&w) && !zt_nccl_wait_begin(&w, 1.0, 10.0),
          "an aborted communicator starts no operation");
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_FAILED, "nor accepts a call");
    CHECK(zt_nccl_wait_poll(&w, S, S, 2.0) == ZT_NCCL_FAILED);

    /* Settling ends in an error (a remote rank's failure seen during init or ncclGroupEnd). */
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    CHECK(zt_nccl_wait_issued(&w, P) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, P, S, 0.5) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, E, S, 0.6) == ZT_NCCL_FAILED && w.state == ZT_NCCL_ABORTED);

    /* A posted collective fails while it runs: the asynchronous error wins over a stream that
     * has not finished, and over one that has (its results are not to be trusted). */
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE && zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, E, P, 0.5) == ZT_NCCL_FAILED && w.state == ZT_NCCL_ABORTED);
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE && zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, E, S, 0.5) == ZT_NCCL_FAILED);

    /* The event's query fails (an illegal address in NCCL's kernel, a lost device). */
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 10.0));
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE && zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, E, 0.5) == ZT_NCCL_FAILED && w.state == ZT_NCCL_ABORTED);
}

/* Issue 27, defect 3: a dead peer must time out. Its collective stays posted (async success,
 * stream never done) or its init never settles; either ends at the deadline, not before. */
static void test_dead_peer_times_out(void) {
    zt_nccl_wait w;
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 100.0, 30.0));
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE && zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    for (double t = 100.0; t <= 130.0; t += 0.5)
        CHECK(zt_nccl_wait_poll(&w, S, P, t) == ZT_NCCL_POLL, "at %g s", t - 100.0);
    CHECK(zt_nccl_wait_poll(&w, S, P, 130.001) == ZT_NCCL_TIMED_OUT &&
          w.state == ZT_NCCL_ABORTED);

    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 5.0));
    CHECK(zt_nccl_wait_issued(&w, P) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, P, S, 4.9) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, P, S, 5.1) == ZT_NCCL_TIMED_OUT && w.state == ZT_NCCL_ABORTED);

    /* One deadline per operation: a slow settle leaves less time for the completion. */
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 5.0));
    CHECK(zt_nccl_wait_issued(&w, P) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, S, 4.0) == ZT_NCCL_DONE);
    CHECK(zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, P, 5.5) == ZT_NCCL_TIMED_OUT);

    /* Completion observed while a later call is still being posted does not count. */
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 5.0));
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE && zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, P, S, 1.0) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, S, 1.1) == ZT_NCCL_DONE);

    /* A new operation gets a new deadline. */
    CHECK(zt_nccl_wait_begin(&w, 50.0, 5.0) && w.deadline == 55.0 && w.polls == 0);
}

/* Posted work (device collectives left on their stream): calls go on meanwhile, and the host
 * wait that watches it gives up at the oldest posted operation's deadline, fails on an
 * asynchronous error, and is done once the work is known complete. */
static void test_posted(void) {
    zt_nccl_wait w;
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_watch(&w, S, P, false, 0.0) == ZT_NCCL_DONE, "nothing posted");
    CHECK(zt_nccl_wait_begin(&w, 10.0, 30.0) && zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE);
    zt_nccl_wait_posted(&w, 10.5, 30.0);
    CHECK(w.inflight == 1 && w.oldest == 40.5 && zt_nccl_wait_may_issue(&w),
          "a posted collective leaves the communicator ready for the next call");
    /* A second one, after a settle that took a while: the deadline stays the oldest's. */
    CHECK(zt_nccl_wait_begin(&w, 20.0, 30.0) && zt_nccl_wait_issued(&w, P) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_poll(&w, S, S, 21.0) == ZT_NCCL_DONE);
    zt_nccl_wait_posted(&w, 21.0, 30.0);
    CHECK(w.inflight == 2 && w.oldest == 40.5);
    CHECK(!zt_nccl_wait_overdue(&w, 40.5) && zt_nccl_wait_overdue(&w, 40.6));
    for (double t = 21.0; t <= 40.5; t += 0.5)
        CHECK(zt_nccl_wait_watch(&w, S, P, false, t) == ZT_NCCL_POLL, "at %g s", t);
    /* Past the deadline, an event that fired means done, not lost. */
    CHECK(zt_nccl_wait_watch(&w, S, S, false, 41.0) == ZT_NCCL_DONE && w.state == ZT_NCCL_READY);
    zt_nccl_wait_retire(&w);
    CHECK(w.inflight == 0 && !zt_nccl_wait_overdue(&w, 1e9));

    /* A wait that covered every stream: done without asking the event. */
    zt_nccl_wait_posted(&w, 50.0, 30.0);
    CHECK(w.oldest == 80.0, "a new batch of posted work gets a new deadline");
    CHECK(zt_nccl_wait_watch(&w, S, P, true, 60.0) == ZT_NCCL_DONE);
    /* ... unless NCCL reports an error or is still settling a call. */
    CHECK(zt_nccl_wait_watch(&w, P, P, true, 61.0) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_watch(&w, E, S, true, 62.0) == ZT_NCCL_FAILED &&
          w.state == ZT_NCCL_ABORTED, "an asynchronous error fails even completed work");
    CHECK(zt_nccl_wait_watch(&w, S, S, true, 63.0) == ZT_NCCL_FAILED, "aborted stays aborted");
    CHECK(!zt_nccl_wait_begin(&w, 64.0, 30.0), "nothing is issued after the abort");

    /* Long posted work that progresses: past the deadline, the mark behind what was posted when
     * it began has fired, so it runs again from then; only a whole timeout without progress
     * ends it. */
    zt_nccl_wait_init(&w);
    zt_nccl_wait_posted(&w, 0.0, 5.0);
    zt_nccl_wait_posted(&w, 4.0, 5.0);
    CHECK(zt_nccl_wait_overdue(&w, 5.5));
    zt_nccl_wait_progress(&w, 5.5, 5.0);
    CHECK(w.oldest == 10.5 && !zt_nccl_wait_overdue(&w, 10.0) &&
              zt_nccl_wait_watch(&w, S, P, false, 10.0) == ZT_NCCL_POLL,
          "progress moves the deadline to 10.5 s: %g", w.oldest);
    CHECK(zt_nccl_wait_watch(&w, S, P, false, 10.6) == ZT_NCCL_TIMED_OUT,
          "no progress for a whole timeout after it ends it");
    zt_nccl_wait_init(&w);
    zt_nccl_wait_progress(&w, 3.0, 5.0);
    CHECK(w.inflight == 0 && !zt_nccl_wait_overdue(&w, 1e9), "progress with nothing posted");

    /* A dead peer: the event never fires and NCCL says nothing; the deadline ends it. */
    zt_nccl_wait_init(&w);
    zt_nccl_wait_posted(&w, 0.0, 5.0);
    CHECK(zt_nccl_wait_watch(&w, S, P, false, 4.9) == ZT_NCCL_POLL);
    CHECK(zt_nccl_wait_watch(&w, S, P, false, 5.1) == ZT_NCCL_TIMED_OUT &&
          w.state == ZT_NCCL_ABORTED);
    /* A failed stream fails it too. */
    zt_nccl_wait_init(&w);
    zt_nccl_wait_posted(&w, 0.0, 5.0);
    CHECK(zt_nccl_wait_watch(&w, S, E, false, 1.0) == ZT_NCCL_FAILED &&
          w.state == ZT_NCCL_ABORTED);
}

/* A host wait that covered every stream retires only what was posted before it began: work
 * another thread posted meanwhile (after the streams were joined) is still watched, with its
 * deadline running from the wait's end, and times out if it never completes. */
static void test_retire_to(void) {
    zt_nccl_wait w;
    zt_nccl_wait_init(&w);
    zt_nccl_wait_posted(&w, 0.0, 5.0);
    zt_nccl_wait_posted(&w, 1.0, 5.0);
    long upto = w.seq; /* the wait begins: its snapshot */
    CHECK(upto == 2, "two posted: sequence %ld", upto);
    zt_nccl_wait_posted(&w, 2.0, 5.0); /* another thread, during the wait */
    zt_nccl_wait_retire_to(&w, upto, 3.0, 5.0);
    CHECK(w.inflight == 1 && w.oldest == 8.0,
          "the one posted after the snapshot stays in flight (%ld) with its deadline from the "
          "wait's end (%g)", w.inflight, w.oldest);
    CHECK(zt_nccl_wait_watch(&w, S, P, false, 7.9) == ZT_NCCL_POLL &&
              zt_nccl_wait_watch(&w, S, P, false, 8.1) == ZT_NCCL_TIMED_OUT,
          "the later one is still held to its deadline");
    /* A snapshot at or past everything posted retires it all; an older one changes nothing. */
    zt_nccl_wait_init(&w);
    zt_nccl_wait_posted(&w, 0.0, 5.0);
    zt_nccl_wait_retire_to(&w, w.seq, 1.0, 5.0);
    CHECK(w.inflight == 0 && !zt_nccl_wait_overdue(&w, 1e9));
    zt_nccl_wait_posted(&w, 2.0, 5.0);
    zt_nccl_wait_retire_to(&w, 1, 3.0, 5.0);
    CHECK(w.inflight == 1 && w.oldest == 7.0, "a snapshot older than what is in flight: %ld, %g",
          w.inflight, w.oldest);
}

static void test_pause(void) {
    zt_nccl_wait w;
    zt_nccl_wait_init(&w);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 1e9));
    CHECK(zt_nccl_wait_issued(&w, S) == ZT_NCCL_DONE && zt_nccl_wait_await(&w) == ZT_NCCL_POLL);
    for (int i = 0; i < ZT_NCCL_SPIN_POLLS; i++) {
        CHECK(zt_nccl_wait_pause_s(&w) == 0.0, "poll %d", i);
        zt_nccl_wait_poll(&w, S, P, 1.0);
    }
    CHECK(zt_nccl_wait_pause_s(&w) == ZT_NCCL_PAUSE_S);
    CHECK(zt_nccl_wait_begin(&w, 0.0, 1.0) == false, "still RUNNING: no new operation");
}

/* xorshift64*, seeded: the sequences are the same on every run. */
static uint64_t rng = 0x9e3779b97f4a7c15u;
static unsigned next(unsigned n) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (unsigned)((rng * 0x2545f4914f6cdd1du) >> 33) % n;
}

/* A scripted NCCL: the call's own answer, then per poll the asynchronous state and the event's.
 * The loop is nccl_comm.c's (issue; settle; record the event and await; poll until a verdict)
 * with a clock that advances 1 s a poll. The expected verdict is read off the script by the
 * rules in the order NCCL's documentation gives them: an error anywhere fails; a settling call
 * needs the asynchronous state to leave ncclInProgress before the stream is looked at; the
 * stream's completion counts only with the communicator settled; what is not done by the
 * deadline times out. A script that runs out before any of these is a peer still silent. */
static void test_random_sequences(void) {
    for (int run = 0; run < 20000; run++) {
        zt_nccl_result call = (zt_nccl_result)next(3);
        int n = 1 + (int)next(12);
        zt_nccl_result async[16], stream[16];
        for (int i = 0; i < n; i++) {
            unsigned a = next(20), b = next(8);
            async[i] = a == 0 ? ZT_NCCL_R_ERROR : a < 8 ? ZT_NCCL_R_IN_PROGRESS : ZT_NCCL_R_SUCCESS;
            stream[i] = b < 2 ? ZT_NCCL_R_SUCCESS : b == 2 && next(4) == 0 ? ZT_NCCL_R_ERROR
                                                                           : ZT_NCCL_R_IN_PROGRESS;
        }
        double timeout = 0.5 + next(10);

        zt_nccl_verdict want = ZT_NCCL_POLL;
        int want_polls = n;
        enum { SETTLE, RUN } phase = call == ZT_NCCL_R_IN_PROGRESS ? SETTLE : RUN;
        if (call == ZT_NCCL_R_ERROR)
            want = ZT_NCCL_FAILED, want_polls = 0;
        for (int i = 0; i < n && want == ZT_NCCL_POLL; i++) {
            double t = i + 1;
            if (async[i] == ZT_NCCL_R_ERROR)
                want = ZT_NCCL_FAILED;
            else if (phase == SETTLE && async[i] == ZT_NCCL_R_SUCCESS)
                phase = RUN;
            else if (phase == RUN && stream[i] == ZT_NCCL_R_ERROR)
                want = ZT_NCCL_FAILED;
            else if (phase == RUN && stream[i] == ZT_NCCL_R_SUCCESS &&
                     async[i] == ZT_NCCL_R_SUCCESS)
                want = ZT_NCCL_DONE;
            else if (t > timeout)
                want = ZT_NCCL_TIMED_OUT;
            if (want != ZT_NCCL_POLL)
                want_polls = i + 1;
        }

        zt_nccl_wait w;
        zt_nccl_wait_init(&w);
        zt_nccl_wait_begin(&w, 0.0, timeout);
        zt_nccl_verdict v = zt_nccl_wait_issued(&w, call);
        if (v == ZT_NCCL_DONE)
            v = zt_nccl_wait_await(&w);
        int polls = 0;
        bool issued_while_busy = false;
        while (v == ZT_NCCL_POLL && polls < n) {
            bool settling = w.state == ZT_NCCL_SETTLING;
            v = zt_nccl_wait_poll(&w, async[polls], stream[polls], polls + 1.0);
            polls++;
            if (v == ZT_NCCL_POLL && zt_nccl_wait_may_issue(&w))
                issued_while_busy = true;
            if (v == ZT_NCCL_DONE && settling)
                v = zt_nccl_wait_await(&w);
        }
        CHECK(v == want && polls == want_polls && !issued_while_busy,
              "run %d: verdict %d after %d polls, want %d after %d", run, v, polls, want,
              want_polls);
        CHECK((v == ZT_NCCL_FAILED || v == ZT_NCCL_TIMED_OUT) == (w.state == ZT_NCCL_ABORTED),
              "run %d: verdict %d leaves state %d", run, v, w.state);
    }
}

int main(void) {
    test_success_at_once();
    test_in_progress_settles();
    test_errors_abort();
    test_dead_peer_times_out();
    test_posted();
    test_retire_to();
    test_pause();
    test_random_sequences();
    return check_summary("test_nccl_wait");
}
