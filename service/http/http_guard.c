/* Who may talk to ztraind's HTTP server (http_internal.h): the Host header against the names the
 * server answers to, which defeats DNS rebinding; the Origin header against the page origins
 * allowed to call it from another origin (CORS, never a wildcard); and the JSON content type
 * that a state-changing request must carry, which neither an HTML form nor a "simple"
 * cross-origin fetch can send without a preflight. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http_internal.h"

/* The longest DNS name (RFC 1035), and so the longest name a Host or an origin can carry. */
#define NAME_MAX_LEN 253

/* ---- names --------------------------------------------------------------------------------- */

typedef enum { NAME_BAD, NAME_DNS, NAME_IPV4, NAME_IPV6 } name_kind;

/* The host part of `s` up to `end`: a DNS name of letters, digits, '-', '_' and '.', an IPv4
 * address, or an IPv6 address in brackets. Into out (lowercase, one trailing dot dropped, so
 * that "Example.COM." and "example.com" are one name). */
static name_kind parse_name(const char *s, const char *end, char out[NAME_MAX_LEN + 3]) {
    size_t n = (size_t)(end - s);
    if (n == 0 || n > NAME_MAX_LEN + 2)
        return NAME_BAD;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)tolower((unsigned char)s[i]);
    out[n] = '\0';
    if (out[0] == '[') {
        char inner[NAME_MAX_LEN + 3];
        struct in6_addr a6;
        if (n < 3 || out[n - 1] != ']')
            return NAME_BAD;
        memcpy(inner, out + 1, n - 2);
        inner[n - 2] = '\0';
        return inet_pton(AF_INET6, inner, &a6) == 1 ? NAME_IPV6 : NAME_BAD;
    }
    if (n > 1 && out[n - 1] == '.')
        out[--n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)out[i]) && out[i] != '-' && out[i] != '_' && out[i] != '.')
            return NAME_BAD;
    struct in_addr a4;
    return inet_pton(AF_INET, out, &a4) == 1 ? NAME_IPV4 : NAME_DNS;
}

/* Whether [p, end) is a port: 1 to 5 digits. */
static bool is_port(const char *p, const char *end) {
    if (p >= end || end - p > 5)
        return false;
    for (; p < end; p++)
        if (!isdigit((unsigned char)*p))
            return false;
    return true;
}

/* Splits "host[:port]" (a Host header, or an origin after its scheme) into its name, parsed by
 * parse_name; a malformed port or a colon in an unbracketed name is NAME_BAD. *has_port says
 * whether a port was there. */
static name_kind parse_authority(const char *a, char out[NAME_MAX_LEN + 3], bool *has_port) {
    const char *end = a + strlen(a);
    const char *colon = a[0] == '[' ? strstr(a, "]:") : strchr(a, ':');
    if (a[0] == '[' && colon)
        colon++;
    *has_port = colon != NULL;
    if (colon && !is_port(colon + 1, end))
        return NAME_BAD;
    return parse_name(a, colon ? colon : end, out);
}

static bool is_loopback(name_kind kind, const char *name) {
    if (kind == NAME_DNS)
        return strcmp(name, "localhost") == 0;
    if (kind == NAME_IPV4)
        return strncmp(name, "127.", 4) == 0;
    if (kind == NAME_IPV6) {
        struct in6_addr a6;
        char inner[NAME_MAX_LEN + 3];
        size_t n = strlen(name);
        memcpy(inner, name + 1, n - 2);
        inner[n - 2] = '\0';
        return inet_pton(AF_INET6, inner, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
    }
    return false;
}

zt_status zt_http_check_host_name(const char *name) {
    char buf[NAME_MAX_LEN + 3];
    bool has_port;
    if (strcmp(name, "*") == 0)
        return ZT_OK;
    if (parse_authority(name, buf, &has_port) == NAME_BAD)
        return zt_error(ZT_ERR_INVALID, "'%.300s' is not a host name, an IPv4 address or an "
                                        "[IPv6] address", name);
    if (has_port)
        return zt_error(ZT_ERR_INVALID, "'%.300s' has a port: give the name alone (any port "
                                        "is accepted with it)", name);
    return ZT_OK;
}

/* An origin as a browser sends it: "http://" or "https://", a host and an optional port that
 * is not the scheme's default, nothing after. */
zt_status zt_http_check_origin(const char *origin) {
    const char *rest = NULL;
    bool https = false;
    if (strncmp(origin, "http://", 7) == 0)
        rest = origin + 7;
    else if (strncmp(origin, "https://", 8) == 0)
        rest = origin + 8, https = true;
    if (!rest)
        return zt_error(ZT_ERR_INVALID, "'%.300s' is not an origin: expected http://HOST[:PORT] "
                                        "or https://HOST[:PORT] (a wildcard is not allowed)",
                        origin);
    char buf[NAME_MAX_LEN + 3];
    bool has_port;
    if (parse_authority(rest, buf, &has_port) == NAME_BAD)
        return zt_error(ZT_ERR_INVALID, "'%.300s' is not an origin: expected SCHEME://HOST[:PORT] "
                                        "with nothing after (no path, no trailing slash)",
                        origin);
    const char *port = has_port ? strrchr(rest, ':') + 1 : NULL;
    if (port && strcmp(port, https ? "443" : "80") == 0)
        return zt_error(ZT_ERR_INVALID, "'%.300s' names the default port, which browsers leave "
                                        "out of the Origin header: drop ':%s'", origin, port);
    return ZT_OK;
}

/* ---- the server's rules -------------------------------------------------------------------- */

static char **dup_list(const char *const *v, size_t n) {
    char **out = calloc(n ? n : 1, sizeof *out);
    for (size_t i = 0; out && i < n; i++) {
        out[i] = strdup(v[i]);
        if (!out[i]) {
            while (i--)
                free(out[i]);
            free(out);
            return NULL;
        }
    }
    return out;
}

static void free_list(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

zt_status zt_http_guard_init(zt_http_guard *g, const char *listen_host,
                             const char *const *hosts, size_t n_hosts,
                             const char *const *origins, size_t n_origins) {
    *g = (zt_http_guard){0};
    for (size_t i = 0; i < n_hosts; i++)
        if (zt_http_check_host_name(hosts[i]) != ZT_OK)
            return zt_error_prefix(ZT_ERR_INVALID, "HTTP host name: ");
    for (size_t i = 0; i < n_origins; i++)
        if (zt_http_check_origin(origins[i]) != ZT_OK)
            return zt_error_prefix(ZT_ERR_INVALID, "HTTP allowed origin: ");
    char name[NAME_MAX_LEN + 3];
    g->loopback = is_loopback(parse_name(listen_host, listen_host + strlen(listen_host), name),
                              name);
    g->hosts = dup_list(hosts, n_hosts);
    g->origins = dup_list(origins, n_origins);
    g->n_hosts = n_hosts;
    g->n_origins = n_origins;
    if (!g->hosts || !g->origins) {
        zt_http_guard_free(g);
        return ZT_ERR_NOMEM;
    }
    /* Names are compared in the form parse_name gives them, which is never longer. */
    for (size_t i = 0; i < n_hosts; i++) {
        char norm[NAME_MAX_LEN + 3];
        bool has_port;
        if (strcmp(hosts[i], "*") == 0) {
            g->any_host = true;
        } else {
            parse_authority(hosts[i], norm, &has_port);
            strcpy(g->hosts[i], norm);
        }
    }
    return ZT_OK;
}

void zt_http_guard_free(zt_http_guard *g) {
    free_list(g->hosts, g->n_hosts);
    free_list(g->origins, g->n_origins);
    *g = (zt_http_guard){0};
}

bool zt_http_host_ok(const zt_http_guard *g, const char *host) {
    if (g->any_host)
        return true;
    char name[NAME_MAX_LEN + 3];
    bool has_port;
    name_kind kind = parse_authority(host, name, &has_port);
    if (kind == NAME_BAD)
        return false;
    for (size_t i = 0; i < g->n_hosts; i++)
        if (strcmp(g->hosts[i], name) == 0)
            return true;
    /* A rebinding attack always arrives with the attacker's DNS name in Host, so an address
     * is safe to serve; on loopback only loopback addresses can be meant. The port is not
     * checked: it is ours whatever it says, and tunnels and port maps change it. */
    if (is_loopback(kind, name))
        return true;
    return !g->loopback && kind != NAME_DNS;
}

bool zt_http_origin_allowed(const zt_http_guard *g, const char *origin) {
    for (size_t i = 0; i < g->n_origins; i++)
        if (strcasecmp(g->origins[i], origin) == 0)
            return true;
    return false;
}

/* ---- requests ------------------------------------------------------------------------------ */

static const char *header(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* Whether the Origin is the page's own: the Host it asked for, under either scheme (only this
 * server answers at that host and port, so an origin naming them is a page it served). */
static bool same_origin(const char *origin, const char *host) {
    const char *rest = !strncmp(origin, "http://", 7)    ? origin + 7
                       : !strncmp(origin, "https://", 8) ? origin + 8
                                                         : NULL;
    return rest && host && strcasecmp(rest, host) == 0;
}

bool zt_http_guard_request(const zt_http_server *s, struct MHD_Connection *c,
                           const char *version, enum MHD_Result *ret) {
    /* RFC 9112 3.2: an HTTP/1.1 request without Host is a 400 (libmicrohttpd, at its default
     * strictness, lets it through). An HTTP/1.0 request without one does not come from a
     * browser, the only client that can be rebound, and HTTP/1.0 has no Host to require. */
    const char *host = header(c, MHD_HTTP_HEADER_HOST);
    if (!host && version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0) {
        *ret = zt_http_send_error(c, MHD_HTTP_BAD_REQUEST,
                                  "Host: an HTTP/1.1 request must carry a Host header "
                                  "(RFC 9112 section 3.2)");
        return false;
    }
    if (host && !zt_http_host_ok(&s->guard, host)) {
        *ret = zt_http_send_refusal(c, MHD_HTTP_MISDIRECTED_REQUEST, "HOST_NOT_ALLOWED",
                                    "Host header '%.200s' is not a name of this server: "
                                    "ztraind answers to %s, localhost and the names given "
                                    "with --http-host", host,
                                    s->guard.loopback ? "127.0.0.1, [::1]" : "IP addresses");
        return false;
    }
    const char *origin = header(c, "Origin");
    if (origin && !same_origin(origin, host) && !zt_http_origin_allowed(&s->guard, origin)) {
        *ret = zt_http_send_refusal(c, MHD_HTTP_FORBIDDEN, "ORIGIN_NOT_ALLOWED",
                                    "Origin header '%.200s' is not allowed: pages on other "
                                    "origins need ztraind --http-allow-origin", origin);
        return false;
    }
    return true;
}

bool zt_http_guard_json(struct MHD_Connection *c, const char *method, enum MHD_Result *ret) {
    const char *type = header(c, MHD_HTTP_HEADER_CONTENT_TYPE);
    const char *p = type ? type : "";
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strlen("application/json");
    if (strncasecmp(p, "application/json", n) == 0 &&
        (p[n] == '\0' || p[n] == ';' || p[n] == ' ' || p[n] == '\t'))
        return true;
    *ret = zt_http_send_error(c, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE,
                              "%s needs the header Content-Type: application/json (got %s%.100s%s)",
                              method, type ? "'" : "", type ? type : "none", type ? "'" : "");
    return false;
}

void zt_http_add_cors(struct MHD_Connection *c, struct MHD_Response *r) {
    /* Every answer may depend on the Origin (echoed, or refused), so no cache may reuse it for
     * another origin. */
    MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
    const zt_http_server *s = zt_http_conns_owner(c);
    const char *origin = header(c, "Origin");
    if (!s || !origin || !zt_http_origin_allowed(&s->guard, origin))
        return;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, Last-Event-ID");
}
