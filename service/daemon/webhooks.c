/* Webhook deliveries (webhooks.h): a bounded queue ordered by when each delivery is next due, one
 * thread that POSTs with libcurl, HMAC-SHA256 signatures with GnuTLS, and a record of every
 * attempt. */
#include <curl/curl.h>
#include <gnutls/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "webhooks.h"
#include "oplog.h"

typedef struct delivery {
    struct delivery *next;
    char *job_id, *url, *secret, *type, *body;
    char id[40];
    int attempt;               /* attempts made */
    bool operator;             /* the daemon's --webhook */
    int64_t due_ms;            /* monotonic: when the next attempt may start */
} delivery;

struct zt_webhooks {
    zt_webhooks_options o;
    zt_event_store *store;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    delivery *queue;           /* by due_ms */
    int queued;
    bool stop;
    pthread_t thread;
    uint64_t counter;
    char last_job[64];         /* the job served last: the next due delivery is another's */
};

/* Room in the queue that a job's own hooks never take: the operator's deliveries get it. */
#define OPERATOR_RESERVE 100

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void delivery_free(delivery *d) {
    free(d->job_id);
    free(d->url);
    free(d->secret);
    free(d->type);
    free(d->body);
    free(d);
}

static void record(zt_webhooks *w, const delivery *d, int http_status, const char *error,
                   const char *outcome) {
    if (!w->store)
        return;
    char url[512];
    zt_webhook_url_for_display(d->url, !d->operator, url, sizeof url);
    zt_delivery r = {.job_id = d->job_id, .delivery_id = d->id, .url = url, .type = d->type,
                     .attempt = d->attempt, .time_ms = wall_ms(), .http_status = http_status,
                     .error = error, .outcome = outcome};
    zt_status s = zt_event_store_add_delivery(w->store, &r);
    if (s != ZT_OK)
        zt_oplog(ZT_LOG_WARNING, "webhook delivery %s: %s\n", d->id, zt_last_error());
}

/* Inserts by due time (the queue's lock held). */
static void enqueue(zt_webhooks *w, delivery *d) {
    delivery **at = &w->queue;
    while (*at && (*at)->due_ms <= d->due_ms)
        at = &(*at)->next;
    d->next = *at;
    *at = d;
    w->queued++;
    pthread_cond_signal(&w->cv);
}

/* The header line: its name, "sha256=" and 64 hex digits. */
#define SIGNATURE_LINE 128

static void signature(const char *secret, const char *body, char out[SIGNATURE_LINE]) {
    unsigned char mac[32];
    int n = snprintf(out, SIGNATURE_LINE, "X-Ztrain-Signature: sha256=");
    if (gnutls_hmac_fast(GNUTLS_MAC_SHA256, secret, strlen(secret), body, strlen(body), mac) != 0)
        return;
    for (int i = 0; i < 32; i++)
        n += snprintf(out + n, (size_t)(SIGNATURE_LINE - n), "%02x", mac[i]);
}

static size_t discard(char *ptr, size_t size, size_t n, void *ctx) {
    (void)ptr;
    (void)ctx;
    return size * n;
}

/* One attempt; returns the HTTP status (0: none) and fills err ("" on 2xx). */
static int attempt(zt_webhooks *w, const delivery *d, char *err, size_t err_size) {
    CURL *c = curl_easy_init();
    if (!c) {
        snprintf(err, err_size, "libcurl could not start a request");
        return 0;
    }
    char h_event[96], h_id[96], h_attempt[64], h_sig[SIGNATURE_LINE];
    snprintf(h_event, sizeof h_event, "X-Ztrain-Event: %s", d->type);
    snprintf(h_id, sizeof h_id, "X-Ztrain-Delivery: %s", d->id);
    snprintf(h_attempt, sizeof h_attempt, "X-Ztrain-Attempt: %d", d->attempt);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "User-Agent: ztraind");
    h = curl_slist_append(h, h_event);
    h = curl_slist_append(h, h_id);
    h = curl_slist_append(h, h_attempt);
    /* No "Expect: 100-continue" (libcurl adds it to a large body: over 1 KiB in older releases,
     * over 1 MiB in 7.88): a receiver that speaks HTTP/1.0 never answers 100, and libcurl would
     * wait a second for it on every attempt. */
    h = curl_slist_append(h, "Expect:");
    if (d->secret) {
        signature(d->secret, d->body, h_sig);
        h = curl_slist_append(h, h_sig);
    }
    char curl_err[CURL_ERROR_SIZE] = "";
    long status = 0;
    /* A job's hook connects only to the address the policy passed, resolved here once: a
     * second lookup by libcurl could answer otherwise (DNS rebinding). */
    struct curl_slist *pin = NULL;
    int64_t started = mono_ms();
    if (!d->operator) {
        char entry[400], why[300];
        if (!zt_webhook_policy_pin(w->o.policy, d->url, entry, sizeof entry, why, sizeof why)) {
            snprintf(err, err_size, "%s", why);
            goto done;
        }
        pin = curl_slist_append(NULL, entry);
        curl_easy_setopt(c, CURLOPT_RESOLVE, pin);
    }
    /* The lookup above counts against the attempt's timeout: libcurl gets what is left. */
    int64_t left_ms = w->o.timeout_ms - (mono_ms() - started);
    if (left_ms <= 0) {
        snprintf(err, err_size, "resolving the host took longer than the attempt's timeout "
                 "(%d ms)", w->o.timeout_ms);
        goto done;
    }
    curl_easy_setopt(c, CURLOPT_URL, d->url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, d->body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)left_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK)
        snprintf(err, err_size, "%s", curl_err[0] ? curl_err : curl_easy_strerror(rc));
    else if (status < 200 || status > 299)
        snprintf(err, err_size, "the receiver answered HTTP %ld", status);
    else
        err[0] = '\0';
done:
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    curl_slist_free_all(pin);
    return (int)status;
}

/* The due delivery to make next (the queue's lock held), unlinked: the operator's first, else
 * the first due one of the job after the one served last (in job id order, wrapping), so that
 * jobs take turns whatever each has queued. NULL when none is due. */
static delivery *take_next(zt_webhooks *w, int64_t now) {
    delivery **pick = NULL, **wrap = NULL;
    for (delivery **at = &w->queue; *at && (*at)->due_ms <= now; at = &(*at)->next) {
        delivery *d = *at;
        if (d->operator) {
            pick = at;
            break;
        }
        int order = strcmp(d->job_id, w->last_job);
        if (order > 0 && (!pick || strcmp(d->job_id, (*pick)->job_id) < 0))
            pick = at;
        if (!wrap || strcmp(d->job_id, (*wrap)->job_id) < 0)
            wrap = at;
    }
    if (!pick)
        pick = wrap;
    if (!pick)
        return NULL;
    delivery *d = *pick;
    *pick = d->next;
    w->queued--;
    if (!d->operator)
        snprintf(w->last_job, sizeof w->last_job, "%s", d->job_id);
    return d;
}

static void *run(void *arg) {
    zt_webhooks *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        int64_t now = mono_ms();
        delivery *d = take_next(w, now);
        if (!d) {
            d = w->queue;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t wait = d ? d->due_ms - now : 1000;
            ts.tv_sec += wait / 1000;
            ts.tv_nsec += (wait % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&w->mu);
        d->attempt++;
        char err[CURL_ERROR_SIZE + 64];
        int status = attempt(w, d, err, sizeof err);
        bool ok = !err[0];
        bool last = !ok && d->attempt >= w->o.max_attempts;
        record(w, d, status, err, ok ? "delivered" : last ? "failed" : "retrying");
        pthread_mutex_lock(&w->mu);
        if (ok || last) {
            delivery_free(d);
        } else {
            d->due_ms = mono_ms() + ((int64_t)w->o.backoff_ms << (d->attempt - 1));
            enqueue(w, d);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

zt_status zt_webhooks_create(zt_webhooks **out, zt_event_store *store,
                             const zt_webhooks_options *opts) {
    zt_webhooks *w = calloc(1, sizeof *w);
    if (!w)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    w->o = opts ? *opts : (zt_webhooks_options){0};
    if (w->o.max_attempts <= 0)
        w->o.max_attempts = 5;
    if (w->o.backoff_ms <= 0)
        w->o.backoff_ms = 500;
    if (w->o.timeout_ms <= 0)
        w->o.timeout_ms = 5000;
    if (w->o.max_queue <= 0)
        w->o.max_queue = 1000;
    if (w->o.max_per_job <= 0)
        w->o.max_per_job = 64;
    w->store = store;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK ||
        pthread_create(&w->thread, NULL, run, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return zt_error(ZT_ERR_IO, "cannot start the webhook delivery thread");
    }
    *out = w;
    return ZT_OK;
}

void zt_webhooks_destroy(zt_webhooks *w) {
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    while (w->queue) {
        delivery *d = w->queue;
        w->queue = d->next;
        record(w, d, 0, "ztraind stopped before this delivery was made", "dropped");
        delivery_free(d);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    curl_global_cleanup();
    free(w);
}

/* Deliveries of job_id's own hooks in the queue (its lock held). */
static int queued_of_job(const zt_webhooks *w, const char *job_id) {
    int n = 0;
    for (const delivery *d = w->queue; d; d = d->next)
        n += !d->operator && strcmp(d->job_id, job_id) == 0;
    return n;
}

void zt_webhooks_post(zt_webhooks *w, const char *job_id, const char *url, const char *secret,
                      const char *type, const char *body, bool operator) {
    if (!w)
        return;
    delivery *d = calloc(1, sizeof *d);
    if (!d)
        return;
    d->job_id = strdup(job_id ? job_id : "");
    d->url = strdup(url);
    d->secret = secret ? strdup(secret) : NULL;
    d->type = strdup(type);
    d->body = strdup(body);
    d->operator = operator;
    if (!d->job_id || !d->url || (secret && !d->secret) || !d->type || !d->body) {
        delivery_free(d);
        return;
    }
    pthread_mutex_lock(&w->mu);
    snprintf(d->id, sizeof d->id, "%lld-%llu", (long long)wall_ms(),
             (unsigned long long)++w->counter);
    d->due_ms = mono_ms();
    const char *why = NULL;
    int job_room = w->o.max_queue > 2 * OPERATOR_RESERVE ? w->o.max_queue - OPERATOR_RESERVE
                                                         : w->o.max_queue / 2;
    char text[128];
    if (w->queued >= w->o.max_queue) {
        why = "the delivery queue was full";
    } else if (!operator && w->queued >= job_room) {
        why = "the delivery queue's room for jobs' own webhooks was full";
    } else if (!operator && queued_of_job(w, d->job_id) >= w->o.max_per_job) {
        snprintf(text, sizeof text, "this job already had %d deliveries waiting (its quota)",
                 w->o.max_per_job);
        why = text;
    }
    if (!why)
        enqueue(w, d);
    pthread_mutex_unlock(&w->mu);
    if (why) {
        record(w, d, 0, why, "dropped");
        delivery_free(d);
    }
}
