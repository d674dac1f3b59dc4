/* What the operator lets a job's webhooks do (issue 34): which hosts a job may name, whether
 * those may be loopback, link-local or private addresses, and which of ztraind's environment
 * variables a job may name as its secret.
 *
 *     ztraind --webhook-allow hooks.example.com --webhook-allow '*.slack.com' \
 *             --webhook-secret-prefix ZTRAIN_JOB_HOOK_
 *
 * - A job's webhook URL must name a host the operator allows with --webhook-allow PATTERN
 *   (repeatable): "host" exactly, "*.example.com" any name under it (not the name itself), "*"
 *   any host, each optionally with ":PORT" to allow that port only. Without --webhook-allow a
 *   job may have no webhooks at all. Names are compared without case.
 * - Whatever the name, a job's deliveries go only to public addresses: the host is resolved
 *   when each attempt is made, and an address that is loopback, private (RFC 1918, unique local),
 *   link-local, carrier-grade NAT, unspecified, multicast or broadcast refuses the attempt; the
 *   address checked is the one connected to (no second lookup can change it). The operator opens
 *   this with --webhook-allow-private (a lab's own receiver on 10.x or on this host).
 * - "secret_env" must start with the prefix the operator grants (--webhook-secret-prefix) and may
 *   never be the operator's own --webhook-secret-env: a job cannot have bodies signed with the
 *   operator's key, nor learn which other variables ztraind has. Without the prefix, a job may
 *   not name a secret at all.
 * The operator's own --webhook is not judged by this policy. */
#ifndef ZTRAIN_WEBHOOK_POLICY_H
#define ZTRAIN_WEBHOOK_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "ztrain/status.h"

#define ZT_WEBHOOK_ALLOW_MAX 32

typedef struct zt_webhook_policy_s {
    const char *allow[ZT_WEBHOOK_ALLOW_MAX]; /* --webhook-allow patterns; they must outlive it */
    int n_allow;
    bool allow_private;                      /* --webhook-allow-private */
    const char *secret_prefix;               /* --webhook-secret-prefix; NULL: no job secrets */
    const char *operator_secret_env;         /* --webhook-secret-env; never a job's */
} zt_webhook_policy;

/* Whether a --webhook-allow pattern is well formed; an error names it. */
zt_status zt_webhook_pattern_check(const char *pattern);

/* Whether a job may name `url` (http or https already checked). On refusal ZT_ERR_INVALID with
 * the reason after "field: " ("host 10.0.0.5 is not among the hosts this server allows ..."). A
 * NULL policy allows nothing. */
zt_status zt_webhook_policy_url(const zt_webhook_policy *p, const char *url, const char *field);

/* Whether a job may name the environment variable `name` as its secret_env. */
zt_status zt_webhook_policy_secret(const zt_webhook_policy *p, const char *name,
                                   const char *field);

/* Whether an address is one a job's delivery may not reach by default: loopback, private,
 * link-local, CGNAT, unspecified, multicast, broadcast (IPv4 and IPv6), and an IPv6 address that
 * carries such an IPv4 one (IPv4-mapped or -compatible, NAT64 64:ff9b::/96, 6to4, Teredo) or
 * is NAT64's local-use 64:ff9b:1::/48, whose IPv4 address it cannot tell. */
bool zt_webhook_address_private(const struct sockaddr *sa);

/* For one delivery attempt to a job's `url`: resolves its host and picks the first address the
 * policy allows, written as libcurl's CURLOPT_RESOLVE entry "host:port:address" into pin (so
 * that the connection goes to that very address). Returns false with why filled when no address
 * is allowed or the name does not resolve. */
bool zt_webhook_policy_pin(const zt_webhook_policy *p, const char *url, char *pin,
                           size_t pin_size, char *why, size_t why_size);

#endif
