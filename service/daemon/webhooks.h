/* Webhooks: ztraind POSTs a JSON body to the URLs a job's "alerts" section (and the daemon's
 * --webhook flag) name, on the job's end, its failure and its anomaly events.
 *
 *     "alerts": {"webhooks": [{"url": "https://hooks.example.com/ztrain",
 *                              "secret_env": "ZTRAIN_HOOK_SECRET",
 *                              "on": ["end", "failure", "event"]}]}
 *
 * "on" (default: all three): "end" is a job that SUCCEEDED or was CANCELLED, "failure" one that
 * FAILED, "event" each anomaly event (ztrain/anomaly.h). "secret_env" names an environment
 * variable of ztraind holding the secret (the spec itself is readable through the API, so a
 * secret is never written in it: an inline "secret" is refused). With a secret, each request
 * carries X-Ztrain-Signature: sha256=<hex HMAC-SHA256 of the body with the secret>, as GitHub's
 * webhooks do; every request carries X-Ztrain-Event (the type), X-Ztrain-Delivery (one id for
 * every attempt of a delivery) and X-Ztrain-Attempt.
 *
 * Deliveries never block the caller: they are queued (bounded) for one delivery thread, which
 * makes each attempt with a time limit and retries a failed one (no answer, or not 2xx) after
 * backoff_ms, doubling each time, at most max_attempts times. Each attempt is recorded in the
 * event store (event_store.h), which keeps a bounded number of rows per job. A receiver that is
 * slow to give up on costs the others at most timeout_ms per attempt.
 *
 * One job cannot crowd out the others (issue 34): a job's own hooks may hold at most
 * max_per_job deliveries in the queue (more are dropped, recorded so), the operator's --webhook
 * has room kept for it, and of the deliveries that are due the operator's go first, then one job
 * after the other in turn. A job's hooks are judged by the operator's policy (webhook_policy.h)
 * at submit and again, on the address connected to, at each attempt. */
#ifndef ZTRAIN_WEBHOOKS_H
#define ZTRAIN_WEBHOOKS_H

#include <stdbool.h>

#include "event_store.h"
#include "webhook_policy.h"
#include "ztrain/status.h"

enum { ZT_HOOK_END = 1, ZT_HOOK_FAILURE = 2, ZT_HOOK_EVENT = 4, ZT_HOOK_ALL = 7 };

typedef struct {
    char *url;
    char *secret;      /* the value of secret_env when it was read; NULL: unsigned */
    unsigned on;       /* ZT_HOOK_* bits */
} zt_webhook_target;

typedef struct {
    zt_webhook_target *t;
    int n;
} zt_webhook_list;

/* The webhooks of a job spec's JSON text (its "alerts" section; none when absent), reading each
 * secret_env from this process's environment. Bad input, and a URL or secret_env the policy
 * does not allow, is ZT_ERR_INVALID naming "source: key 'alerts.webhooks[i].key'". Free with
 * zt_webhook_list_free. */
zt_status zt_webhook_list_from_spec(zt_webhook_list *out, const char *spec_json,
                                    const char *source, const zt_webhook_policy *policy);
void zt_webhook_list_free(zt_webhook_list *l);

/* A URL as deliveries are recorded and shown: without user info or query string, which may hold
 * credentials, and without its path unless whole_path (the operator's URL is shown as scheme,
 * host and port only: services put their token in the path, /services/T../B../<token>). buf gets
 * at most size - 1 bytes. */
void zt_webhook_url_for_display(const char *url, bool whole_path, char *buf, size_t size);

typedef struct {
    int max_attempts;  /* default 5 */
    int backoff_ms;    /* before the second attempt, doubling; default 500 */
    int timeout_ms;    /* of one attempt; default 5000 */
    int max_queue;     /* deliveries waiting at once; beyond it one is dropped (recorded); 1000 */
    int max_per_job;   /* of them, from one job's own hooks; default 64 */
    const zt_webhook_policy *policy; /* judges each attempt of a job's hook; must outlive it */
} zt_webhooks_options;

typedef struct zt_webhooks zt_webhooks;

/* Starts the delivery thread; store (may be NULL) records the attempts and must outlive it. */
zt_status zt_webhooks_create(zt_webhooks **out, zt_event_store *store,
                             const zt_webhooks_options *opts);
/* Stops the thread: the attempt in flight finishes; what waits is dropped and recorded so. */
void zt_webhooks_destroy(zt_webhooks *w);

/* Queues one delivery of body (copied) to url, signed with secret (NULL: unsigned). type is
 * "job.end", "job.failure" or "job.event"; job_id names the job in the record; operator says
 * the URL is the daemon's --webhook (not judged by the policy, shown without its path, served
 * first). Never blocks on the network. */
void zt_webhooks_post(zt_webhooks *w, const char *job_id, const char *url, const char *secret,
                      const char *type, const char *body, bool operator);

#endif
