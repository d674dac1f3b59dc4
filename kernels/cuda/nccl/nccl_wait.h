/* NCCL's non-blocking protocol as a state machine that needs neither NCCL nor a GPU, so that
 * tests/unit/test_nccl_wait.c drives every state on any machine and the CUDA module
 * (nccl_comm.c) only feeds it what NCCL and CUDA report.
 *
 * The protocol (NCCL's "Non-blocking communicators" and "Group calls" documentation; nccl.h
 * 2.28): a communicator made with config.blocking = 0 returns ncclInProgress from any call that
 * could not finish at once (init, collectives, send/recv, ncclGroupEnd, ncclCommFinalize). The
 * caller then polls ncclCommGetAsyncError until it leaves ncclInProgress, and until then issues
 * no other NCCL call on that communicator and no CUDA work on the streams NCCL uses. A call that
 * returned ncclSuccess is only posted: its kernels may still fail or wait forever for a dead
 * peer, which shows as an asynchronous error or as a stream that never completes. Timeouts are
 * the caller's, and any error or timeout is answered with ncclCommAbort.
 *
 * States of one communicator:
 *   READY     nothing pending: an NCCL call, or CUDA work on NCCL's stream, may be issued
 *   SETTLING  a call returned ncclInProgress: poll the asynchronous error, issue nothing
 *   RUNNING   posted work is awaited on the stream (an event recorded after it): poll both
 *   ABORTED   an error or a timeout: the communicator must be (and is, by the module) aborted;
 *             it stays aborted
 * Each operation (a collective with its staging copies) starts with a deadline; every wait of
 * the operation counts against that one deadline.
 *
 * Posted work. A collective on device memory is not awaited: once its call settled (READY
 * again), it is left running on its stream in order with the compute that follows, as PyTorch's
 * and DeepSpeed's NCCL paths leave it, and counted as posted (inflight) with the deadline of the
 * oldest posted operation. Whoever then waits for those streams on the host (the backend's
 * synchronisation, through zt_nccl_wait_watch) polls the asynchronous error meanwhile and gives
 * up at that deadline; an awaited operation (RUNNING to DONE) retires them all
 * (zt_nccl_wait_retire), and a wait that covered every stream those posted before it began
 * (zt_nccl_wait_retire_to: another thread may post while it waits). */
#ifndef ZTRAIN_NCCL_WAIT_H
#define ZTRAIN_NCCL_WAIT_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a call reports, reduced to what the protocol distinguishes. */
typedef enum {
    ZT_NCCL_R_SUCCESS = 0, /* ncclSuccess, cudaSuccess */
    ZT_NCCL_R_IN_PROGRESS, /* ncclInProgress; cudaErrorNotReady from cudaEventQuery */
    ZT_NCCL_R_ERROR        /* anything else */
} zt_nccl_result;

typedef enum { ZT_NCCL_READY = 0, ZT_NCCL_SETTLING, ZT_NCCL_RUNNING, ZT_NCCL_ABORTED } zt_nccl_state;

typedef enum {
    ZT_NCCL_POLL = 0,  /* not yet: pause (zt_nccl_wait_pause_s), then poll again */
    ZT_NCCL_DONE,      /* back to READY */
    ZT_NCCL_FAILED,    /* NCCL or CUDA reported an error: abort */
    ZT_NCCL_TIMED_OUT  /* the operation's deadline passed: abort (a dead or stuck peer) */
} zt_nccl_verdict;

typedef struct {
    zt_nccl_state state;
    double deadline; /* of the current operation, in the caller's clock (seconds) */
    long polls;      /* polls of the current operation */
    long inflight;   /* operations posted and not known complete */
    double oldest;   /* the deadline of the oldest of them */
    long seq;        /* operations ever posted: the last one's sequence number */
} zt_nccl_wait;

/* A fresh communicator's machine: READY. */
void zt_nccl_wait_init(zt_nccl_wait *w);

/* Starts an operation at time now with timeout_s to finish it. False when the communicator is
 * not READY (aborted, or a wait was left unfinished): nothing may be issued. */
bool zt_nccl_wait_begin(zt_nccl_wait *w, double now, double timeout_s);

/* Whether an NCCL call or CUDA work on NCCL's stream may be issued now (READY). */
bool zt_nccl_wait_may_issue(const zt_nccl_wait *w);

/* After an NCCL call issued while READY returned r: SUCCESS → DONE (still READY);
 * IN_PROGRESS → POLL (SETTLING); ERROR → FAILED (ABORTED). Issued while not READY it is a
 * protocol violation, answered FAILED (ABORTED). */
zt_nccl_verdict zt_nccl_wait_issued(zt_nccl_wait *w, zt_nccl_result r);

/* From READY, after recording an event behind the posted work: RUNNING, and POLL. Not READY:
 * FAILED (ABORTED). */
zt_nccl_verdict zt_nccl_wait_await(zt_nccl_wait *w);

/* One poll at time now: async is ncclCommGetAsyncError's state (an error of the call itself
 * counts as ERROR), stream the event's completion (read only while RUNNING; pass SUCCESS when
 * SETTLING). An asynchronous error fails in either state; SETTLING is done once async leaves
 * IN_PROGRESS; RUNNING is done once the stream completed with async SUCCESS; past the deadline
 * what is not done times out. In READY or ABORTED a poll changes nothing and answers DONE or
 * FAILED. */
zt_nccl_verdict zt_nccl_wait_poll(zt_nccl_wait *w, zt_nccl_result async, zt_nccl_result stream,
                                  double now);

/* After a settled operation was left running on its stream at time now: one more posted; the
 * first of them sets the deadline that zt_nccl_wait_watch holds them to. */
void zt_nccl_wait_posted(zt_nccl_wait *w, double now, double timeout_s);

/* Every posted operation is known complete (an event behind them fired). */
void zt_nccl_wait_retire(zt_nccl_wait *w);

/* The operations posted up to sequence number upto (seq as it was when a host wait began that
 * has now covered their streams) are complete; those posted since are not known to be and stay
 * in flight, their deadline running again from now (the covering wait finished: progress, as in
 * zt_nccl_wait_progress). No-op when none of what is in flight was posted by upto. */
void zt_nccl_wait_retire_to(zt_nccl_wait *w, long upto, double now, double timeout_s);

/* Posted work that is still running has nevertheless progressed at time now: an event recorded
 * behind the work posted when its deadline began has fired. The deadline then runs again from
 * now, so that a long span of posted collectives between two full synchronisations (a long
 * step, many micro-batches) is not taken for a stuck peer: only timeout_s without any progress
 * is. No-op when nothing is posted. */
void zt_nccl_wait_progress(zt_nccl_wait *w, double now, double timeout_s);

/* Whether posted work has passed its deadline at time now: the caller should then ask its
 * stream whether it completed (pass that as posted below) before calling it lost. */
bool zt_nccl_wait_overdue(const zt_nccl_wait *w, double now);

/* One look at posted work from a host wait for its streams, at time now: async is
 * ncclCommGetAsyncError's state; posted the completion of an event recorded behind the posted
 * work (IN_PROGRESS when not asked); covered whether the host's wait has finished and covered
 * their streams. DONE when nothing is posted, or it completed (covered, or posted SUCCESS, with
 * no asynchronous error): the caller retires it. FAILED (ABORTED) on an asynchronous error or a
 * failed stream, or when the communicator was aborted; TIMED_OUT (ABORTED) past the oldest
 * deadline; POLL otherwise. The state of calls (READY, SETTLING, RUNNING) is not changed: this
 * runs beside them. */
zt_nccl_verdict zt_nccl_wait_watch(zt_nccl_wait *w, zt_nccl_result async, zt_nccl_result posted,
                                   bool covered, double now);

/* Seconds to pause before the next poll: none for the first ZT_NCCL_SPIN_POLLS polls of an
 * operation (a small collective finishes within microseconds), then ZT_NCCL_PAUSE_S, which
 * bounds the time a waiting rank takes from the cores of the others. */
enum { ZT_NCCL_SPIN_POLLS = 1000 };
#define ZT_NCCL_PAUSE_S 1e-4
double zt_nccl_wait_pause_s(const zt_nccl_wait *w);

#ifdef __cplusplus
}
#endif

#endif
