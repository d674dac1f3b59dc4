/* NCCL's non-blocking protocol (nccl_wait.h): the transitions, kept apart from the NCCL calls so
 * that a test drives them without a GPU. */
#include "nccl_wait.h"

void zt_nccl_wait_init(zt_nccl_wait *w) {
    w->state = ZT_NCCL_READY;
    w->deadline = 0;
    w->polls = 0;
    w->inflight = 0;
    w->oldest = 0;
    w->seq = 0;
}

bool zt_nccl_wait_begin(zt_nccl_wait *w, double now, double timeout_s) {
    if (w->state != ZT_NCCL_READY)
        return false;
    w->deadline = now + timeout_s;
    w->polls = 0;
    return true;
}

bool zt_nccl_wait_may_issue(const zt_nccl_wait *w) { return w->state == ZT_NCCL_READY; }

static zt_nccl_verdict abort_with(zt_nccl_wait *w, zt_nccl_verdict v) {
    w->state = ZT_NCCL_ABORTED;
    return v;
}

zt_nccl_verdict zt_nccl_wait_issued(zt_nccl_wait *w, zt_nccl_result r) {
    /* A call made while SETTLING or RUNNING breaks the protocol: NCCL's state is then unknown. */
    if (w->state != ZT_NCCL_READY)
        return abort_with(w, ZT_NCCL_FAILED);
    switch (r) {
    case ZT_NCCL_R_SUCCESS:
        return ZT_NCCL_DONE;
    case ZT_NCCL_R_IN_PROGRESS:
        w->state = ZT_NCCL_SETTLING;
        return ZT_NCCL_POLL;
    default:
        return abort_with(w, ZT_NCCL_FAILED);
    }
}

zt_nccl_verdict zt_nccl_wait_await(zt_nccl_wait *w) {
    if (w->state != ZT_NCCL_READY)
        return abort_with(w, ZT_NCCL_FAILED);
    w->state = ZT_NCCL_RUNNING;
    return ZT_NCCL_POLL;
}

zt_nccl_verdict zt_nccl_wait_poll(zt_nccl_wait *w, zt_nccl_result async, zt_nccl_result stream,
                                  double now) {
    if (w->state == ZT_NCCL_READY)
        return ZT_NCCL_DONE;
    if (w->state == ZT_NCCL_ABORTED)
        return ZT_NCCL_FAILED;
    w->polls++;
    if (async == ZT_NCCL_R_ERROR)
        return abort_with(w, ZT_NCCL_FAILED);
    if (w->state == ZT_NCCL_SETTLING) {
        if (async == ZT_NCCL_R_SUCCESS) {
            w->state = ZT_NCCL_READY;
            return ZT_NCCL_DONE;
        }
    } else {
        if (stream == ZT_NCCL_R_ERROR)
            return abort_with(w, ZT_NCCL_FAILED);
        /* Completion counts only with the communicator settled: work still being posted
         * (IN_PROGRESS) is not finished even if the event recorded before it has fired. */
        if (stream == ZT_NCCL_R_SUCCESS && async == ZT_NCCL_R_SUCCESS) {
            w->state = ZT_NCCL_READY;
            return ZT_NCCL_DONE;
        }
    }
    if (now > w->deadline)
        return abort_with(w, ZT_NCCL_TIMED_OUT);
    return ZT_NCCL_POLL;
}

void zt_nccl_wait_posted(zt_nccl_wait *w, double now, double timeout_s) {
    w->seq++;
    if (w->inflight++ == 0)
        w->oldest = now + timeout_s;
}

void zt_nccl_wait_retire(zt_nccl_wait *w) { w->inflight = 0; }

void zt_nccl_wait_retire_to(zt_nccl_wait *w, long upto, double now, double timeout_s) {
    long after = w->seq - upto; /* posted after upto: still in flight */
    if (after < 0)
        after = 0;
    if (after >= w->inflight)
        return;
    w->inflight = after;
    if (after > 0)
        w->oldest = now + timeout_s;
}

void zt_nccl_wait_progress(zt_nccl_wait *w, double now, double timeout_s) {
    if (w->inflight > 0)
        w->oldest = now + timeout_s;
}

bool zt_nccl_wait_overdue(const zt_nccl_wait *w, double now) {
    return w->inflight > 0 && now > w->oldest;
}

zt_nccl_verdict zt_nccl_wait_watch(zt_nccl_wait *w, zt_nccl_result async, zt_nccl_result posted,
                                   bool covered, double now) {
    if (w->state == ZT_NCCL_ABORTED)
        return ZT_NCCL_FAILED;
    if (w->inflight == 0)
        return ZT_NCCL_DONE;
    /* An error counts even when the work completed: NCCL's result may be wrong then. */
    if (async == ZT_NCCL_R_ERROR || posted == ZT_NCCL_R_ERROR)
        return abort_with(w, ZT_NCCL_FAILED);
    if (async == ZT_NCCL_R_SUCCESS && (covered || posted == ZT_NCCL_R_SUCCESS))
        return ZT_NCCL_DONE;
    if (now > w->oldest)
        return abort_with(w, ZT_NCCL_TIMED_OUT);
    return ZT_NCCL_POLL;
}

double zt_nccl_wait_pause_s(const zt_nccl_wait *w) {
    return w->polls < ZT_NCCL_SPIN_POLLS ? 0.0 : ZT_NCCL_PAUSE_S;
}
