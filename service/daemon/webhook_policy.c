/* The operator's rules for job webhooks (webhook_policy.h): allowed hosts, public addresses
 * only, and a namespace for job secrets. URLs are taken apart by libcurl's own URL parser, the
 * one that later makes the request, so that both read the same host. */
#define _GNU_SOURCE
#include "webhook_policy.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The host (lower case, IPv6 without brackets) and port of an http(s) URL. */
static bool url_host_port(const char *url, char *host, size_t host_size, long *port) {
    CURLU *u = curl_url();
    char *h = NULL, *p = NULL;
    bool ok = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_HOST, &h, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_PORT, &p, CURLU_DEFAULT_PORT) == CURLUE_OK;
    if (ok) {
        const char *s = h;
        size_t n = strlen(s);
        if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
            s++;
            n -= 2;
        }
        ok = n > 0 && n < host_size;
        for (size_t i = 0; ok && i < n; i++)
            host[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
        if (ok)
            host[n] = '\0';
        *port = ok ? strtol(p, NULL, 10) : 0;
    }
    curl_free(h);
    curl_free(p);
    curl_url_cleanup(u);
    return ok;
}

zt_status zt_webhook_pattern_check(const char *pattern) {
    const char *colon = strrchr(pattern, ':');
    size_t n = colon ? (size_t)(colon - pattern) : strlen(pattern);
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || port < 1 || port > 65535)
            return zt_error(ZT_ERR_INVALID, "'%s': the port after ':' must be a "
                            "number from 1 to 65535", pattern);
    }
    if (n == 0 || strchr(pattern, '/') || (strchr(pattern, '*') &&
        !(n == 1 || (pattern[0] == '*' && pattern[1] == '.' && n > 2 &&
                     !memchr(pattern + 1, '*', n - 1)))))
        return zt_error(ZT_ERR_INVALID, "'%s': a pattern is a host name or "
                        "address, \"*.domain\" or \"*\", optionally with \":PORT\"", pattern);
    return ZT_OK;
}

static bool pattern_matches(const char *pattern, const char *host, long port) {
    const char *colon = strrchr(pattern, ':');
    size_t n = colon ? (size_t)(colon - pattern) : strlen(pattern);
    if (colon && strtol(colon + 1, NULL, 10) != port)
        return false;
    if (n == 1 && pattern[0] == '*')
        return true;
    if (pattern[0] == '*') {
        /* "*.example.com": a name ending in ".example.com", at least one label before it. */
        size_t suffix = n - 1, h = strlen(host);
        return h > suffix && strncasecmp(host + h - suffix, pattern + 1, suffix) == 0;
    }
    return strlen(host) == n && strncasecmp(host, pattern, n) == 0;
}

/* The IPv4 address an IPv6 one carries to an IPv4 host, written into v4: IPv4-mapped
 * (::ffff:0:0/96), IPv4-compatible (::/96, but :: and ::1), NAT64's well-known prefix
 * (64:ff9b::/96, RFC 6052), 6to4 (2002::/16, RFC 3056) and Teredo's client (2001::/32, its
 * bits inverted, RFC 4380). A host with such a route reaches that IPv4 address through it. */
static bool embedded_ipv4(const uint8_t a[16], uint8_t v4[4]) {
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};
    static const uint8_t zero[12] = {0};
    bool compat = memcmp(a, zero, 12) == 0 && (a[12] | a[13] | a[14] || a[15] > 1);
    if (memcmp(a, mapped, 12) == 0 || memcmp(a, nat64, 12) == 0 || compat) {
        memcpy(v4, a + 12, 4);
        return true;
    }
    if (a[0] == 0x20 && a[1] == 0x02) {
        memcpy(v4, a + 2, 4);
        return true;
    }
    if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0 && a[3] == 0) {
        for (int i = 0; i < 4; i++)
            v4[i] = (uint8_t)~a[12 + i];
        return true;
    }
    return false;
}

bool zt_webhook_address_private(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        struct sockaddr_in v4 = {.sin_family = AF_INET};
        if (embedded_ipv4(a, (uint8_t *)&v4.sin_addr))
            return zt_webhook_address_private((const struct sockaddr *)&v4);
        static const uint8_t zero[15] = {0};
        static const uint8_t nat64_local[6] = {0, 0x64, 0xff, 0x9b, 0, 1};
        bool loop_or_any = memcmp(a, zero, 15) == 0 && (a[15] == 0 || a[15] == 1);
        return loop_or_any || memcmp(a, nat64_local, 6) == 0 /* 64:ff9b:1::/48, RFC 8215 */ ||
               (a[0] & 0xfe) == 0xfc /* fc00::/7 */ ||
               (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) /* fe80::/10 */ ||
               (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0) /* fec0::/10, site-local */ ||
               a[0] == 0xff /* multicast */;
    }
    if (sa->sa_family != AF_INET)
        return true;
    uint32_t x = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
    return (x >> 24) == 0 || (x >> 24) == 10 || (x >> 24) == 127 ||
           (x >> 20) == (172u << 4 | 1) /* 172.16/12 */ || (x >> 16) == (192u << 8 | 168) ||
           (x >> 16) == (169u << 8 | 254) || (x >> 22) == (100u << 2 | 1) /* 100.64/10 */ ||
           (x >> 28) >= 14 /* multicast, reserved, broadcast */;
}

/* The address of an IP literal host, when it is one. */
static bool literal_address(const char *host, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        return true;
    }
    if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        return true;
    }
    return false;
}

zt_status zt_webhook_policy_url(const zt_webhook_policy *p, const char *url, const char *field) {
    char host[256];
    long port;
    if (!url_host_port(url, host, sizeof host, &port))
        return zt_error(ZT_ERR_INVALID, "%s: \"%.100s\" is not a URL with a host", field, url);
    if (!p || p->n_allow == 0)
        return zt_error(ZT_ERR_INVALID, "%s: this server takes no job webhooks (its operator "
                        "allows hosts with --webhook-allow)", field);
    bool allowed = false;
    for (int i = 0; i < p->n_allow && !allowed; i++)
        allowed = pattern_matches(p->allow[i], host, port);
    if (!allowed)
        return zt_error(ZT_ERR_INVALID, "%s: host %s port %ld is not among the hosts this "
                        "server allows for job webhooks (--webhook-allow)", field, host, port);
    struct sockaddr_storage ss;
    if (!p->allow_private && literal_address(host, &ss) &&
        zt_webhook_address_private((struct sockaddr *)&ss))
        return zt_error(ZT_ERR_INVALID, "%s: %s is a loopback, private or link-local address, "
                        "which job webhooks may not reach on this server "
                        "(--webhook-allow-private)", field, host);
    return ZT_OK;
}

zt_status zt_webhook_policy_secret(const zt_webhook_policy *p, const char *name,
                                   const char *field) {
    const char *prefix = p ? p->secret_prefix : NULL;
    /* One message for every refused name, set or not: the answer tells nothing of what
     * ztraind's environment holds. */
    if (!prefix || !*prefix || strncmp(name, prefix, strlen(prefix)) != 0 ||
        !name[strlen(prefix)] ||
        (p->operator_secret_env && strcmp(name, p->operator_secret_env) == 0))
        return zt_error(ZT_ERR_INVALID, "%s: \"%.64s\" is not a name this server grants to job "
                        "secrets (%s%s%s)", field, name,
                        prefix && *prefix ? "names start with " : "the operator grants a prefix "
                        "with --webhook-secret-prefix", prefix && *prefix ? prefix : "",
                        prefix && *prefix ? " and are not the operator's own" : "");
    return ZT_OK;
}

bool zt_webhook_policy_pin(const zt_webhook_policy *p, const char *url, char *pin,
                           size_t pin_size, char *why, size_t why_size) {
    char host[256];
    long port;
    if (!url_host_port(url, host, sizeof host, &port)) {
        snprintf(why, why_size, "the URL has no host");
        return false;
    }
    char service[16];
    snprintf(service, sizeof service, "%ld", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        snprintf(why, why_size, "cannot resolve %s: %s", host, gai_strerror(rc));
        return false;
    }
    bool found = false, refused = false;
    for (struct addrinfo *a = res; a && !found; a = a->ai_next) {
        if (!p->allow_private && zt_webhook_address_private(a->ai_addr)) {
            refused = true;
            continue;
        }
        char text[INET6_ADDRSTRLEN];
        const void *addr = a->ai_family == AF_INET
                               ? (const void *)&((struct sockaddr_in *)a->ai_addr)->sin_addr
                               : (const void *)&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
        if (!inet_ntop(a->ai_family, addr, text, sizeof text))
            continue;
        /* CURLOPT_RESOLVE wants IPv6 addresses in brackets. */
        snprintf(pin, pin_size, a->ai_family == AF_INET6 ? "%s:%ld:[%s]" : "%s:%ld:%s", host,
                 port, text);
        found = true;
    }
    freeaddrinfo(res);
    if (!found)
        snprintf(why, why_size, refused ? "refused: %s resolves only to loopback, private or "
                 "link-local addresses (--webhook-allow-private)" : "no address for %s", host);
    return found;
}
