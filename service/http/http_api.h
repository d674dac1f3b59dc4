/* ztraind's HTTP server (libmicrohttpd): the JSON read API for dashboards and scripts, the live
 * event stream, Prometheus' /metrics, /healthz, job cancellation for the dashboard, and the
 * dashboard's static files. The routes and their JSON are listed in README.md ("HTTP API"). */
#ifndef ZTRAIN_HTTP_API_H
#define ZTRAIN_HTTP_API_H

#include <stddef.h>

#include "daemon/job_manager.h"
#include "api/page_token.h"
#include "api/tls.h"
#include "ztrain/status.h"

typedef struct {
    const char *host;             /* "127.0.0.1" (default) or "0.0.0.0", or an IPv4 address */
    int port;                     /* 0 picks a free one */
    /* NULL: no authentication; else /api/ and /metrics need "Authorization: Bearer <token>"
     * with one of these tokens (else 401) whose scope allows the request (else 403): GET and
     * HEAD need read, POST /api/v1/jobs submit, any other method admin (api/auth.h). They must
     * outlive the server. */
    const struct zt_auth_tokens *tokens;
    const char *web_dir;          /* the dashboard's files (index.html, ...) */
    const char *chartjs_dir;      /* Debian's libjs-chart.js, served under /vendor/chart.js/ */
    unsigned max_connections;     /* 0: 256. Half of them may come from one client address. A
                                     new connection past either bound displaces the one that
                                     has waited longest without sending a request; it is
                                     refused only when every slot is busy answering */
    unsigned header_timeout_s;    /* a request (head and body) must arrive within this of its
                                     connection opening or of the previous answer; 0: 10 s */
    unsigned idle_timeout_s;      /* an answer nobody reads, or a connection nothing happens on,
                                     is closed after this; 0: 30 s */
    size_t max_request_bytes;     /* request bodies; 0: 64 KiB */
    /* /metrics exports the jobs not yet over and those that ended within this many seconds
     * (0: only the jobs not yet over); per-rank series only for jobs not yet over. The others
     * stay in the API (/api/v1/jobs, series, records). Negative: the default, 3600. */
    long long metrics_window_s;
    /* The names a request's Host header may carry besides the listen address, against DNS
     * rebinding. Always served: on a loopback listen 127.x.x.x, [::1] and localhost; on any
     * other (0.0.0.0 or one address) every IP address and localhost, since such a server is
     * reached at addresses it cannot know (NAT, container port maps). Any other name is 421.
     * Each entry is a DNS name or an address without a port (the port is never checked), or
     * "*" for any Host. Copied; n_hosts entries. */
    const char *const *hosts;
    size_t n_hosts;
    /* Origins whose pages may call the server from another origin ("https://dash.example:8443",
     * exact, as browsers send them): their Origin is echoed in Access-Control-Allow-Origin
     * with Vary: Origin. A request with any other Origin than the page's own (the Host it
     * asked for) is 403. None by default: the dashboard is same-origin. Copied. */
    const char *const *origins;
    size_t n_origins;
    /* NULL, or no cert in it: plain HTTP. Else HTTPS with tls->cert and tls->key (a plain HTTP
     * request on the port then gets no answer: the TLS handshake fails). With tls->ca, every
     * request must come over a connection that presented a client certificate one of those
     * CAs signed, or it is 403 (mutual TLS, as on gRPC). Not copied: it must outlive the
     * server. */
    const zt_tls_pem *tls;
    /* Signs and checks page tokens (api/page_token.h): the state directory's key, so that
     * tokens outlive a restart and both servers read each other's. Required; copied. */
    const zt_page_key *page_key;
} zt_http_config;

typedef struct zt_http_server zt_http_server;

/* Whether `name` can be one of zt_http_config.hosts, and `origin` one of its origins:
 * ZT_ERR_INVALID with zt_last_error() saying why not (a port on a host name, a path, a
 * trailing slash or a default port on an origin, a wildcard origin). */
zt_status zt_http_check_host_name(const char *name);
zt_status zt_http_check_origin(const char *origin);

/* Starts serving on its own threads. A port in use is ZT_ERR_IO naming host:port; a malformed
 * host name or origin is ZT_ERR_INVALID naming it.
 *
 * Every request is checked before it is read: a Host that is not one of the server's names is
 * 421, an Origin that is neither the page's own nor allowed is 403 (both with a JSON error
 * naming the header); a state-changing request (POST .../cancel) without Content-Type:
 * application/json is 415, so that neither a form nor a cross-origin "simple" request can
 * change anything. */
zt_status zt_http_start(zt_http_server **out, const zt_http_config *cfg, zt_jobs *jm);
int zt_http_port(const zt_http_server *s);
/* Stops accepting, ends live streams and joins the threads. */
void zt_http_stop(zt_http_server *s);

#endif
