/* ztraind's HTTP server (libmicrohttpd): the JSON read API for dashboards and scripts, the live
 * event stream, Prometheus' /metrics, /healthz, job cancellation for the dashboard, and the
 * dashboard's static files. The routes and their JSON are listed in README.md ("HTTP API"). */
#ifndef ZTRAIN_HTTP_API_H
#define ZTRAIN_HTTP_API_H

#include <stddef.h>

#include "job_manager.h"
#include "ztrain/status.h"

typedef struct {
    const char *host;             /* "127.0.0.1" (default) or "0.0.0.0", or an IPv4 address */
    int port;                     /* 0 picks a free one */
    const char *token;            /* NULL: no authentication; else /api/ and /metrics need
                                     "Authorization: Bearer <token>" or get 401 */
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
} zt_http_config;

typedef struct zt_http_server zt_http_server;

/* Starts serving on its own threads. A port in use is ZT_ERR_IO naming host:port. */
zt_status zt_http_start(zt_http_server **out, const zt_http_config *cfg, zt_jobs *jm);
int zt_http_port(const zt_http_server *s);
/* Stops accepting, ends live streams and joins the threads. */
void zt_http_stop(zt_http_server *s);

#endif
