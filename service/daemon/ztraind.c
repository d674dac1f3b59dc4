/* ztraind: the training coordinator. It takes jobs over gRPC, runs each as a process group of
 * ztrain-worker ranks, keeps jobs, metric history and logs in SQLite, and serves the read side
 * (JSON API, live events, Prometheus /metrics, the dashboard) over HTTP.
 *
 *   ztraind [--grpc-addr HOST:PORT] [--http-addr HOST:PORT] [--http-host NAME]...
 *           [--http-allow-origin ORIGIN]... [--state-dir DIR]
 *           [--data-root DIR] [--runs-root DIR] [--max-ranks N] [--token-file FILE]
 *           [--max-rank-memory SIZE] [--max-job-memory SIZE] [--max-device-memory SIZE]
 *           [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]
 *           [--launcher local|slurm [--slurm-partition P] [--metrics-host HOST]] ...
 *           [--config FILE]
 *
 * Every flag may also be written --flag=value, and a config file lists flags one a line
 * (daemon_args.h).
 * SIGINT/SIGTERM stop it gracefully: running jobs finish their step, write a checkpoint and are
 * recorded as CANCELLED; queued jobs stay queued for the next start. Exit status: 0 after a
 * clean stop, 1 when it cannot start (the message says why), 2 bad usage. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/auth.h"
#include "grpc/grpc_server.h"
#include "api/grpc_util.h"
#include "http/http_api.h"
#include "daemon_args.h"
#include "job_manager.h"
#include "oplog.h"
#include "webhooks.h"
#include "ranks/metrics_listener.h"
#include "ranks/proc_spawn.h"
#include "ztrain/admission.h"
#include "api/tls.h"
#include "ztrain/comm.h"
#include "ztrain/fault_inject.h"
#include "ztrain/gpu.h"
#include "ztrain/fsutil.h"
#include "ztrain/text.h"

#ifndef ZT_WEB_DIR
#define ZT_WEB_DIR "/usr/share/ztrain/web"
#endif
#ifndef ZT_CHARTJS_DIR
#define ZT_CHARTJS_DIR "/usr/share/javascript/chart.js"
#endif

/* ZT_MAX_WORLD as a string literal, for the usage text. */
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const char usage[] =
    "usage: ztraind [options]\n"
    "\n"
    "  --grpc-addr HOST:PORT   gRPC listen address (default 127.0.0.1:50051; port 0: any free)\n"
    "  --http-addr HOST:PORT   HTTP listen address (default 127.0.0.1:8080; port 0: any free)\n"
    "  --http-host NAME        a name the HTTP server answers to (the Host header; any other\n"
    "                          gets 421, against DNS rebinding); repeatable. Always served:\n"
    "                          127.0.0.1, [::1], localhost, and when not listening on\n"
    "                          loopback any IP address; '*': any name\n"
    "  --http-allow-origin ORIGIN\n"
    "                          a web origin (https://dash.example:8443) whose pages may call\n"
    "                          the HTTP API from another origin (CORS); repeatable. Default\n"
    "                          none: the dashboard is served from the same origin\n"
    "  --state-dir DIR         the SQLite state file lives here (default ./ztraind-state)\n"
    "  --data-root DIR         job data and init_from paths resolve inside it\n"
    "                          (default STATE_DIR/data)\n"
    "  --runs-root DIR         run directories and checkpoints (default STATE_DIR/runs)\n"
    "  --max-ranks N           ranks running at once (default: the CPU count)\n"
    "  --gpus N                GPUs handed to \"device\": \"cuda\" jobs, min(world_size, N)\n"
    "                          per job through CUDA_VISIBLE_DEVICES (default: every visible\n"
    "                          GPU; 0 in a build without CUDA, which refuses such jobs)\n"
    "  --max-world-size N      largest world_size a job may ask for (default 64, at most "
    STRINGIFY(ZT_MAX_WORLD) ")\n"
    "  --max-jobs N            jobs queued or running at once (default 100)\n"
    "  --max-rank-memory SIZE  refuse a job whose estimated memory per rank is above SIZE\n"
    "                          (512M, 64G, 1.5T: units of 1024; default: no limit beyond the host's)\n"
    "  --max-job-memory SIZE   the same for all of a job's ranks together (default: the host's\n"
    "                          memory, MemTotal or the cgroup's limit, with the local launcher)\n"
    "  --max-device-memory SIZE  refuse a \"cuda\" job whose estimated device memory per rank\n"
    "                          is above SIZE (default: no limit beyond the smallest GPU handed\n"
    "                          out, with the local launcher)\n"
    "  --threads-per-rank N    OMP_NUM_THREADS of each rank (default CPUs / world_size; with\n"
    "                          --launcher slurm 1, else also srun --cpus-per-task N)\n"
    "  --grace SECONDS         graceful cancel: time before the ranks are killed (default 30)\n"
    "  --metrics-window SECONDS  /metrics shows jobs that ended this recently, besides those\n"
    "                          not yet over (default 3600; 0: only those)\n"
    "  --restart-backoff SECONDS  wait before a job's first automatic restart, doubling for\n"
    "                          each next one, at most 300 s (default 1)\n"
    "  --token-file FILE       require 'authorization: Bearer <token>': one token a line, each\n"
    "                          with a scope (read, submit or admin; alone: admin) (default:\n"
    "                          the file $ZTRAIN_TOKEN_FILE names, else the token $ZTRAIN_TOKEN\n"
    "                          as admin, else no authentication)\n"
    "  --tls-cert FILE         serve gRPC and HTTP over TLS (HTTPS) with this PEM certificate\n"
    "                          chain, leaf first (default: plaintext)\n"
    "  --tls-key FILE          the certificate's PEM private key, unencrypted\n"
    "  --tls-client-ca FILE    mutual TLS: gRPC and HTTP clients must present a certificate\n"
    "                          that a CA in this PEM file signed\n"
    "  --worker PATH           the rank program (default: ztrain-worker beside ztraind)\n"
    "  --launcher local|slurm  where ranks run: local processes (default), or one srun per job\n"
    "                          on a Slurm cluster (srun and scancel from PATH; SLURM_CONF is\n"
    "                          passed on). Slurm queues the jobs: --max-ranks defaults to 4096\n"
    "  --slurm-partition P     the partition jobs go to (default: the cluster's default)\n"
    "  --metrics-host HOST     address of this host that a job's rank 0 sends its metrics to\n"
    "                          over TCP, on a port per job (slurm; checked at startup; default\n"
    "                          127.0.0.1: reachable from every node only when they all are\n"
    "                          this host)\n"
    "  --web-dir DIR           the dashboard's files (default " ZT_WEB_DIR ")\n"
    "  --max-grpc-connections N  gRPC connections open at once; more are closed as they come\n"
    "                          (default: from the open-file limit, at most 1024)\n"
    "  --max-http-connections N  HTTP connections open at once, half of them per client\n"
    "                          address (default: from the open-file limit, at most 256)\n"
    "  --header-timeout SECONDS  an HTTP request must arrive whole, and a gRPC connection\n"
    "                          start HTTP/2, within this of connecting or of the last answer\n"
    "                          (default 10)\n"
    "  --idle-timeout SECONDS  a connection doing nothing is closed after this (default 30)\n"
    "  --webhook URL           also POST every job's end, failure and anomaly events here\n"
    "                          (docs/metrics-and-events.md)\n"
    "  --webhook-secret-env NAME  sign --webhook's requests with the secret in $NAME\n"
    "  --webhook-allow PATTERN  a host jobs' webhooks may name: host, *.domain or *, optionally\n"
    "                          :PORT (repeatable; without it jobs may have no webhooks)\n"
    "  --webhook-allow-private  let jobs' webhooks reach loopback, private and link-local\n"
    "                          addresses (refused by default)\n"
    "  --webhook-secret-prefix P  jobs' secret_env must start with P (without it, jobs may\n"
    "                          name no secret)\n"
    "  --webhook-attempts N    delivery attempts per webhook before giving up (default 5)\n"
    "  --webhook-backoff-ms N  wait before the first retry, doubling after (default 500)\n"
    "  --config FILE           read flags from FILE, one a line without its dashes\n"
    "                          ('max-ranks = 8'; '#' comments); flags after it override it\n"
    "  --help, --version       (every flag also takes the form --flag=value)\n";

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

/* Whether on_hangup's line, which zt_oplog cannot write from a signal handler, carries its
 * journald priority as zt_oplog's lines do. */
static bool hangup_to_journal;

/* SIGHUP (the terminal ztraind was started from closed, or a `kill -HUP` meant as "reload")
 * must not end the daemon at once and every running job with it: flags and the --config file are
 * read once, at start, so it is ignored, saying so. write(2): the one way to say it from a
 * handler. */
static void on_hangup(int sig) {
    (void)sig;
    static const char msg[] = "<4>ztraind: SIGHUP ignored: flags and the --config file are read "
                              "only at start, a change takes a restart (SIGTERM or SIGINT stop "
                              "ztraind)\n";
    size_t skip = hangup_to_journal ? 0 : 3;
    ssize_t w = write(STDERR_FILENO, msg + skip, sizeof msg - 1 - skip);
    (void)w;
}

/* gRPC core's own messages (a failed TLS handshake, a refused connection) are warnings. */
static void log_grpc_line(const char *text) {
    zt_oplog(ZT_LOG_WARNING, "%s\n", text);
}

/* The most --http-host or --http-allow-origin values: each request is checked against them. */
#define MAX_HTTP_NAMES 32

typedef struct {
    const char *grpc_addr, *http_addr, *state_dir, *data_root, *runs_root, *token_file;
    const char *tls_cert, *tls_key, *tls_client_ca;
    const char *http_hosts[MAX_HTTP_NAMES], *http_origins[MAX_HTTP_NAMES];
    size_t n_http_hosts, n_http_origins;
    const char *worker, *web_dir, *launcher, *slurm_partition, *metrics_host;
    long max_ranks, max_world_size, max_jobs, threads_per_rank, gpus;
    long max_grpc_conns, max_http_conns, header_timeout_s, idle_timeout_s;
    const char *webhook, *webhook_secret_env;
    long webhook_attempts, webhook_backoff_ms, metrics_window_s;
    zt_webhook_policy webhook_policy;
    bool max_ranks_given;
    int metrics_host_arg;  /* argv index of --metrics-host's value, for its origin */
    uint64_t max_rank_bytes, max_job_bytes, max_device_bytes;
    double grace_s, restart_backoff_s;
} options;

/* After a bad flag or value, where the flags are listed (the whole list would bury the
 * message). */
static const char usage_hint[] = "(ztraind --help lists the options)\n";

static int parse_long(const char *flag, const char *v, long min, long max, long *out) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < min || n > max) {
        zt_oplog(ZT_LOG_ERR, "%s expects an integer in [%ld, %ld], got '%s'\n%s", flag, min,
                 max, v, usage_hint);
        return -1;
    }
    *out = n;
    return 0;
}

/* Appends a repeatable flag's value after checking it (check returns ZT_ERR_INVALID with a
 * message saying why a value cannot be used). */
static int add_name(const char *flag, const char *v, zt_status (*check)(const char *),
                    const char **list, size_t *n) {
    if (check(v) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "%s %s\n", flag, zt_last_error());
        return -1;
    }
    if (*n == MAX_HTTP_NAMES) {
        zt_oplog(ZT_LOG_ERR, "%s: at most %d values ('%s' is one too many)\n", flag,
                 MAX_HTTP_NAMES, v);
        return -1;
    }
    list[(*n)++] = v;
    return 0;
}

/* Whether a is one of the flags --help lists. */
static bool known_flag(const char *a) {
    size_t n = strlen(a);
    for (const char *p = strstr(usage, a); p; p = strstr(p + 1, a))
        if ((p == usage || p[-1] == ' ' || p[-1] == '\n') &&
            (p[n] == ' ' || p[n] == '\n' || p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

/* An unknown flag: a config file's key is named as written there, with the file and line
 * (origin), since "--bogus" is nowhere in the file the reader has to fix. */
static void unknown_flag(const char *a, const char *origin) {
    char near[64];
    bool hint = zt_text_suggest(a, usage, near, sizeof near) != NULL;
    if (origin)
        zt_oplog(ZT_LOG_ERR, "%s: unknown key '%s'%s%s%s (see ztraind --help for the flags a "
                 "config file may set, written without their dashes)\n", origin,
                 strncmp(a, "--", 2) == 0 ? a + 2 : a, hint ? " (did you mean " : "",
                 hint ? near + 2 : "", hint ? "?)" : "");
    else if (a[0] != '-')
        /* ztraind takes no operands: a word that is not an option is named as ztrain names a
         * stray argument, not as an option it is not. */
        zt_oplog(ZT_LOG_ERR, "unexpected argument '%s' (ztraind takes only options)\n%s", a,
                 usage_hint);
    else
        zt_oplog(ZT_LOG_ERR, "unknown option '%s'%s%s%s\n%s", a,
                 hint ? " (did you mean " : "", hint ? near : "", hint ? "?)" : "", usage_hint);
}

/* Parses the flags into o; origins[i] is where argv[i] was read (daemon_args.h). On an error,
 * *bad is the index of the flag at fault (0: a combination of flags, or a message that
 * already names its origin). */
static int parse_args(int argc, char **argv, char **origins, options *o, int *bad) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        if (strcmp(a, "--webhook-allow-private") == 0) {
            o->webhook_policy.allow_private = true;
            continue;
        }
        if (strcmp(a, "--version") == 0) {
            printf("ztraind %s\n", ZTRAIN_VERSION);
            exit(0);
        }
        if (i + 1 >= argc) {
            if (known_flag(a))
                zt_oplog(ZT_LOG_ERR, "%s needs a value\n%s", a, usage_hint);
            else
                unknown_flag(a, NULL);
            *bad = i;
            return -1;
        }
        const char *v = argv[++i];
        int rc = 0;
        if (strcmp(a, "--grpc-addr") == 0)
            o->grpc_addr = v;
        else if (strcmp(a, "--http-addr") == 0)
            o->http_addr = v;
        else if (strcmp(a, "--http-host") == 0)
            rc = add_name(a, v, zt_http_check_host_name, o->http_hosts, &o->n_http_hosts);
        else if (strcmp(a, "--http-allow-origin") == 0)
            rc = add_name(a, v, zt_http_check_origin, o->http_origins, &o->n_http_origins);
        else if (strcmp(a, "--state-dir") == 0)
            o->state_dir = v;
        else if (strcmp(a, "--data-root") == 0)
            o->data_root = v;
        else if (strcmp(a, "--runs-root") == 0)
            o->runs_root = v;
        else if (strcmp(a, "--token-file") == 0)
            o->token_file = v;
        else if (strcmp(a, "--tls-cert") == 0)
            o->tls_cert = v;
        else if (strcmp(a, "--tls-key") == 0)
            o->tls_key = v;
        else if (strcmp(a, "--tls-client-ca") == 0)
            o->tls_client_ca = v;
        else if (strcmp(a, "--worker") == 0)
            o->worker = v;
        else if (strcmp(a, "--web-dir") == 0)
            o->web_dir = v;
        else if (strcmp(a, "--launcher") == 0)
            o->launcher = v;
        else if (strcmp(a, "--slurm-partition") == 0)
            o->slurm_partition = v;
        else if (strcmp(a, "--metrics-host") == 0) {
            o->metrics_host = v;
            o->metrics_host_arg = i - 1;
        }
        else if (strcmp(a, "--max-ranks") == 0) {
            rc = parse_long(a, v, 1, 4096, &o->max_ranks);
            o->max_ranks_given = true;
        } else if (strcmp(a, "--gpus") == 0)
            rc = parse_long(a, v, 0, 64, &o->gpus);
        else if (strcmp(a, "--max-world-size") == 0)
            rc = parse_long(a, v, 1, ZT_MAX_WORLD, &o->max_world_size);
        else if (strcmp(a, "--max-jobs") == 0)
            rc = parse_long(a, v, 1, 1000000, &o->max_jobs);
        else if (strcmp(a, "--max-rank-memory") == 0 || strcmp(a, "--max-job-memory") == 0 ||
                 strcmp(a, "--max-device-memory") == 0) {
            uint64_t *limit = strcmp(a, "--max-rank-memory") == 0  ? &o->max_rank_bytes
                              : strcmp(a, "--max-job-memory") == 0 ? &o->max_job_bytes
                                                                   : &o->max_device_bytes;
            if (zt_parse_bytes(v, a, limit) != ZT_OK) {
                zt_oplog(ZT_LOG_ERR, "%s\n%s", zt_last_error(), usage_hint);
                rc = -1;
            }
        } else if (strcmp(a, "--threads-per-rank") == 0)
            rc = parse_long(a, v, 1, 1024, &o->threads_per_rank);
        else if (strcmp(a, "--max-grpc-connections") == 0)
            rc = parse_long(a, v, 1, 1000000, &o->max_grpc_conns);
        else if (strcmp(a, "--max-http-connections") == 0)
            rc = parse_long(a, v, 1, 100000, &o->max_http_conns);
        else if (strcmp(a, "--header-timeout") == 0)
            rc = parse_long(a, v, 1, 3600, &o->header_timeout_s);
        else if (strcmp(a, "--idle-timeout") == 0)
            rc = parse_long(a, v, 1, 86400, &o->idle_timeout_s);
        else if (strcmp(a, "--webhook") == 0)
            o->webhook = v;
        else if (strcmp(a, "--webhook-secret-env") == 0)
            o->webhook_secret_env = v;
        else if (strcmp(a, "--webhook-allow") == 0) {
            size_t n = (size_t)o->webhook_policy.n_allow;
            rc = add_name(a, v, zt_webhook_pattern_check, o->webhook_policy.allow, &n);
            o->webhook_policy.n_allow = (int)n;
        } else if (strcmp(a, "--webhook-secret-prefix") == 0) {
            o->webhook_policy.secret_prefix = v;
            if (!v[0]) {
                zt_oplog(ZT_LOG_ERR, "--webhook-secret-prefix must not be empty: it would "
                         "grant jobs every variable of ztraind's environment\n");
                rc = -1;
            }
        }
        else if (strcmp(a, "--webhook-attempts") == 0)
            rc = parse_long(a, v, 1, 100, &o->webhook_attempts);
        else if (strcmp(a, "--webhook-backoff-ms") == 0)
            rc = parse_long(a, v, 1, 3600000, &o->webhook_backoff_ms);
        else if (strcmp(a, "--metrics-window") == 0)
            rc = parse_long(a, v, 0, 365L * 86400, &o->metrics_window_s);
        else if (strcmp(a, "--restart-backoff") == 0) {
            char *end;
            o->restart_backoff_s = strtod(v, &end);
            if (end == v || *end || !(o->restart_backoff_s >= 0.01 &&
                                      o->restart_backoff_s <= 300)) {
                zt_oplog(ZT_LOG_ERR, "--restart-backoff expects seconds in [0.01, 300], got "
                         "'%s'\n", v);
                rc = -1;
            }
        } else if (strcmp(a, "--grace") == 0) {
            char *end;
            o->grace_s = strtod(v, &end);
            if (end == v || *end || !(o->grace_s > 0 && o->grace_s < 86400)) {
                zt_oplog(ZT_LOG_ERR, "--grace expects seconds in (0, 86400), got '%s'\n%s",
                         v, usage_hint);
                rc = -1;
            }
        } else {
            unknown_flag(a, origins[i - 1]);
            *bad = 0;
            return -1;
        }
        if (rc != 0) {
            *bad = i - 1;
            return -1;
        }
    }
    if (o->webhook && strncmp(o->webhook, "http://", 7) != 0 &&
        strncmp(o->webhook, "https://", 8) != 0) {
        zt_oplog(ZT_LOG_ERR, "--webhook expects an http:// or https:// URL, got '%s'\n",
                 o->webhook);
        return -1;
    }
    o->webhook_policy.operator_secret_env = o->webhook_secret_env;
    const char *secret = o->webhook_secret_env ? getenv(o->webhook_secret_env) : NULL;
    if (o->webhook_secret_env && (!secret || !*secret)) {
        zt_oplog(ZT_LOG_ERR, "--webhook-secret-env: $%s is not set\n", o->webhook_secret_env);
        return -1;
    }
    if (strcmp(o->launcher, "local") != 0 && strcmp(o->launcher, "slurm") != 0) {
        zt_oplog(ZT_LOG_ERR, "--launcher expects 'local' or 'slurm', got '%s'\n", o->launcher);
        return -1;
    }
    if (strcmp(o->launcher, "slurm") != 0 && (o->slurm_partition || o->metrics_host)) {
        zt_oplog(ZT_LOG_ERR, "--slurm-partition and --metrics-host need --launcher slurm\n");
        return -1;
    }
    if (!o->tls_cert != !o->tls_key) {
        zt_oplog(ZT_LOG_ERR, "%s needs %s too: a certificate and its key come together\n",
                 o->tls_cert ? "--tls-cert" : "--tls-key",
                 o->tls_cert ? "--tls-key" : "--tls-cert");
        return -1;
    }
    if (o->tls_client_ca && !o->tls_cert) {
        zt_oplog(ZT_LOG_ERR, "--tls-client-ca needs --tls-cert and --tls-key: client "
                             "certificates are checked in the server's TLS handshake\n");
        return -1;
    }
    return 0;
}

/* The absolute path of `name` from PATH, into buf; false when it is not there. */
static bool find_in_path(const char *name, char *buf, size_t size) {
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && (int)n < (int)size - 2) {
            snprintf(buf, size, "%.*s/%s", (int)n, p, name);
            if (buf[0] == '/' && access(buf, X_OK) == 0)
                return true;
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return false;
}

/* --launcher slurm: srun and scancel must be there; setpriv (util-linux) ties each srun to
 * ztraind's life when it is. */
typedef struct {
    char srun[PATH_MAX], scancel[PATH_MAX], setpriv[PATH_MAX];
} slurm_paths;

static int slurm_setup(const options *o, slurm_paths *p, zt_slurm_config *cfg) {
    if (!find_in_path("srun", p->srun, sizeof p->srun) ||
        !find_in_path("scancel", p->scancel, sizeof p->scancel)) {
        zt_oplog(ZT_LOG_ERR, "--launcher slurm needs srun and scancel in PATH (Debian: apt "
                             "install slurm-client)\n");
        return -1;
    }
    bool setpriv = find_in_path("setpriv", p->setpriv, sizeof p->setpriv);
    if (!setpriv)
        zt_oplog(ZT_LOG_WARNING, "warning: setpriv (util-linux) is not in PATH: a ztraind that "
                                 "dies leaves its sruns running until it is restarted\n");
    *cfg = (zt_slurm_config){.srun = p->srun, .scancel = p->scancel,
                             .setpriv = setpriv ? p->setpriv : NULL,
                             .partition = o->slurm_partition,
                             .metrics_host = o->metrics_host ? o->metrics_host : "127.0.0.1"};
    return 0;
}

/* --metrics-host is where ztraind listens for each Slurm job's rank 0: a name that does not
 * resolve, or an address that is not this host's, would start and then fail every job with
 * the same message, so one listener is made and dropped here instead. Returns 0, or -1 after
 * saying why (with the config file and line the value came from). */
static int check_metrics_host(const options *o, char **argv, char **origins) {
    zt_metrics_listener *l = NULL;
    if (zt_metrics_listener_create(&l, o->metrics_host) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "%s\n", zt_last_error());
        int at = o->metrics_host_arg;
        if (origins[at])
            zt_oplog(ZT_LOG_ERR, "(%s came from %s)\n", argv[at], origins[at]);
        return -1;
    }
    zt_metrics_listener_destroy(l);
    return 0;
}

/* "HOST:PORT" -> host and port for the HTTP server. */
static int split_addr(const char *addr, char *host, size_t size, int *port) {
    const char *colon = strrchr(addr, ':');
    char *end;
    long p = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == addr || *end || p < 0 || p > 65535 || (size_t)(colon - addr) >= size) {
        zt_oplog(ZT_LOG_ERR, "--http-addr expects HOST:PORT, got '%s'\n", addr);
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    *port = (int)p;
    return 0;
}

/* Whether ztraind can listen on addr (--grpc-addr or --http-addr: HOST:PORT, [V6]:PORT), tried
 * with a socket of its own before anything is written to the state directory: a port in use
 * then stops the start with one message naming the address, not gRPC core's error text, and
 * leaves no new state directory behind. Only "in use" is judged here, when no address HOST
 * resolves to could be taken; anything else (a unix socket, port 0, a host that does not
 * resolve) is left to the server's own bind, which names its error. The sockets are closed
 * again at once: another program may still take the port before the servers bind it, and
 * main then removes what this start created. */
static int check_listen(const char *flag, const char *addr) {
    const char *colon = strrchr(addr, ':');
    if (strncmp(addr, "unix", 4) == 0 || !colon || strcmp(colon + 1, "0") == 0)
        return 0;
    char host[256];
    size_t len = (size_t)(colon - addr);
    if (len >= sizeof host)
        return 0;
    memcpy(host, addr, len);
    host[len] = '\0';
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        memmove(host, host + 1, len - 2);
        host[len - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res;
    if (getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &res) != 0)
        return 0;
    bool taken = false, in_use = false;
    for (struct addrinfo *ai = res; ai && !taken; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        /* As the servers bind: past TIME_WAIT, never beside a listener. */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1) == 0)
            taken = true;
        else if (errno == EADDRINUSE)
            in_use = true;
        close(fd);
    }
    freeaddrinfo(res);
    if (taken || !in_use)
        return 0;
    zt_oplog(ZT_LOG_ERR, "%s %s: cannot listen there: the address is in use (another ztraind "
                         "or another program listens on it); choose another port, or stop that "
                         "program\n", flag, addr);
    return -1;
}

/* The soft open-file limit raised to the hard one: every connection costs a descriptor, and
 * the usual soft 1024 is far below what the system allows the process. Returns the limit in
 * force, and the one it started with in *was. ztraind polls with poll and epoll only, so
 * descriptors past FD_SETSIZE are fine. */
static long raise_fd_limit(long *was) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        *was = 1024;
        return 1024;
    }
    *was = rl.rlim_cur == RLIM_INFINITY ? LONG_MAX : (long)rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        struct rlimit want = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        /* An unlimited hard limit is still capped by fs.nr_open, which setrlimit enforces. */
        if (want.rlim_cur == RLIM_INFINITY)
            want.rlim_cur = 1 << 20;
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = want.rlim_cur;
        else
            zt_oplog(ZT_LOG_WARNING, "warning: cannot raise the open-file limit from %ld: %s\n",
                     *was, strerror(errno));
    }
    return rl.rlim_cur == RLIM_INFINITY ? LONG_MAX : (long)rl.rlim_cur;
}

static long clamp_long(long v, long lo, long hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Connection bounds that fit the descriptors: libmicrohttpd may briefly hold twice its bound
 * (connections being closed), and FDS_RESERVED are left for the jobs, SQLite and gRPC's own. */
#define FDS_RESERVED 128
static void size_connection_bounds(options *o, long fd_limit) {
    if (!o->max_http_conns)
        o->max_http_conns = clamp_long(fd_limit / 8, 16, 256);
    if (!o->max_grpc_conns)
        o->max_grpc_conns = clamp_long((fd_limit - FDS_RESERVED - 2 * o->max_http_conns) / 2,
                                       16, 1024);
}

/* ztrain-worker from the directory ztraind was started from. */
static void default_worker(char *buf, size_t size) {
    char self[PATH_MAX - 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(buf, size, "%s/ztrain-worker", n > 0 ? self : ".");
}

/* Says which GPUs the daemon schedules and the peak its MFU figures assume. */
static void describe_gpus(int gpus) {
    zt_gpu_props p;
    if (gpus == 0 || zt_gpu_props_get(0, &p) != ZT_OK) {
        zt_oplog(ZT_LOG_INFO, "gpus: %d (%s)\n", gpus,
                 zt_gpu_built() ? "device \"cuda\" jobs are refused" : "built without CUDA");
        return;
    }
    const char *label;
    zt_gpu_peak_bf16(p.name, p.major, p.minor, &label);
    zt_oplog(ZT_LOG_INFO, "gpus: %d of %d visible, %s (compute capability %d.%d), MFU peak %s\n",
             gpus, zt_gpu_count(), p.name, p.major, p.minor, label);
}

/* One daemon per state directory: a second would take the first's running jobs for orphans of
 * a crash, fail them and run its queue again. The lock is an flock on DIR/ztraind.lock, held
 * for the process's life (the kernel drops it however the daemon ends), which holds the pid of
 * the daemon that has it. Returns the open descriptor, or -1 after saying why on stderr. */
static int lock_state_dir(const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/ztraind.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        zt_oplog(ZT_LOG_ERR, "--state-dir %s: %s: %s\n", dir, path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = errno == EWOULDBLOCK ? pread(fd, pid, sizeof pid - 1, 0) : -1;
        if (n > 0)
            pid[strcspn(pid, "\n")] = '\0';
        if (n > 0)
            zt_oplog(ZT_LOG_ERR, "--state-dir %s is in use by another ztraind (pid %s, "
                                 "%s): one daemon per state directory\n", dir, pid, path);
        else
            zt_oplog(ZT_LOG_ERR, "--state-dir %s: cannot lock %s: %s\n", dir, path,
                     errno == EWOULDBLOCK ? "held by another ztraind" : strerror(errno));
        close(fd);
        return -1;
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        zt_oplog(ZT_LOG_WARNING, "warning: %s: cannot write this daemon's pid: %s\n", path,
                 strerror(errno));
    return fd;
}

/* After a start that failed before serving (a port taken between check_listen and the servers'
 * bind): removes the state directory, and the data and runs roots, that this start made. One
 * that existed before is left as it is, new files in it included: it holds someone's state. */
static void remove_what_start_made(const char *state_dir, bool made_state, const char *data_root,
                                   bool made_data, const char *runs_root, bool made_runs) {
    const char *dirs[] = {made_data ? data_root : NULL, made_runs ? runs_root : NULL,
                          made_state ? state_dir : NULL};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
        if (dirs[i] && zt_remove_tree(dirs[i]) != ZT_OK)
            zt_oplog(ZT_LOG_ERR, "cannot remove %s, which this start made: %s\n", dirs[i],
                     zt_last_error());
}

int main(int argc, char **argv) {
    options o = {.grpc_addr = "127.0.0.1:50051", .http_addr = "127.0.0.1:8080",
                 .metrics_window_s = 3600,
                 .state_dir = "ztraind-state", .web_dir = ZT_WEB_DIR, .max_ranks = zt_cpu_count(),
                 .max_world_size = 64, .max_jobs = 100, .grace_s = 30, .launcher = "local",
                 .header_timeout_s = 10, .idle_timeout_s = 30, .gpus = -1};
    static const char *const switches[] = {"--help", "-h", "--version",
                                           "--webhook-allow-private", NULL};
    char **origins;
    int bad = 0;
    if (zt_daemon_args_expand(argc, argv, switches, &argc, &argv, &origins) != 0)
        return 2;
    if (parse_args(argc, argv, origins, &o, &bad) != 0) {
        if (bad > 0 && origins[bad])
            zt_oplog(ZT_LOG_ERR, "(%s came from %s)\n", argv[bad], origins[bad]);
        return 2;
    }
    bool slurm = strcmp(o.launcher, "slurm") == 0;
    if (o.metrics_host && check_metrics_host(&o, argv, origins) != 0)
        return 2;
    slurm_paths sp;
    zt_slurm_config slurm_cfg;
    if (slurm && slurm_setup(&o, &sp, &slurm_cfg) != 0)
        return 1;
    if (slurm && !o.max_ranks_given)
        o.max_ranks = 4096;
    char host[256];
    int http_port;
    if (split_addr(o.http_addr, host, sizeof host, &http_port) != 0)
        return 2;

    long fd_limit_was, fd_limit = raise_fd_limit(&fd_limit_was);
    size_connection_bounds(&o, fd_limit);

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    hangup_to_journal = zt_oplog_to_journal(STDERR_FILENO);
    struct sigaction hup = {.sa_handler = on_hangup, .sa_flags = SA_RESTART};
    sigemptyset(&hup.sa_mask);
    sigaction(SIGHUP, &hup, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Unless GRPC_VERBOSITY or GRPC_TRACE asks for gRPC's own log as it is. */
    if (!getenv("GRPC_VERBOSITY") && !getenv("GRPC_TRACE"))
        zt_grpc_log_limit(log_grpc_line, 20);

    zt_auth_tokens *token = NULL;
    if (zt_auth_load_tokens(o.token_file, &token) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "%s\n", zt_last_error());
        return 1;
    }
    /* Before the job manager starts queued jobs: a TLS file at fault stops ztraind at once. */
    zt_tls_pem tls;
    if (zt_tls_load(&tls, (zt_tls_file){o.tls_cert, "--tls-cert"},
                    (zt_tls_file){o.tls_key, "--tls-key"},
                    (zt_tls_file){o.tls_client_ca, "--tls-client-ca"}) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "%s\n", zt_last_error());
        zt_auth_tokens_free(token);
        return 1;
    }
    char db[PATH_MAX], data_root[PATH_MAX], runs_root[PATH_MAX], worker[PATH_MAX];
    snprintf(db, sizeof db, "%s/ztraind.db", o.state_dir);
    snprintf(data_root, sizeof data_root, "%s", o.data_root ? o.data_root : "");
    snprintf(runs_root, sizeof runs_root, "%s", o.runs_root ? o.runs_root : "");
    if (!o.data_root)
        snprintf(data_root, sizeof data_root, "%s/data", o.state_dir);
    if (!o.runs_root)
        snprintf(runs_root, sizeof runs_root, "%s/runs", o.state_dir);
    if (o.worker)
        snprintf(worker, sizeof worker, "%s", o.worker);
    else
        default_worker(worker, sizeof worker);
    if (access(worker, X_OK) != 0) {
        zt_oplog(ZT_LOG_ERR, "the worker program %s: %s\n", worker, strerror(errno));
        zt_auth_tokens_free(token);
        zt_tls_pem_free(&tls);
        return 1;
    }
    /* Before the state directory is made or touched (check_listen). */
    if (check_listen("--grpc-addr", o.grpc_addr) != 0 ||
        check_listen("--http-addr", o.http_addr) != 0) {
        zt_auth_tokens_free(token);
        zt_tls_pem_free(&tls);
        return 1;
    }
    /* A start that fails after this removes the state directory again if it made it (and never
     * one that was there before), and the data and runs roots likewise. */
    bool made_data = !zt_path_exists(data_root), made_runs = !zt_path_exists(runs_root);
    bool made_state = mkdir(o.state_dir, 0700) == 0;
    if (!made_state && errno != EEXIST) {
        zt_oplog(ZT_LOG_ERR, "--state-dir %s: %s\n", o.state_dir, strerror(errno));
        zt_auth_tokens_free(token);
        zt_tls_pem_free(&tls);
        return 1;
    }
    const int state_lock = lock_state_dir(o.state_dir);
    if (state_lock < 0) {
        zt_auth_tokens_free(token);
        zt_tls_pem_free(&tls);
        return 1;
    }
    /* Made once per state directory, with the directory locked: tokens outlive a restart. */
    zt_page_key page_key;
    if (zt_page_key_load(&page_key, o.state_dir) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "--state-dir %s: %s\n", o.state_dir, zt_last_error());
        zt_auth_tokens_free(token);
        zt_tls_pem_free(&tls);
        close(state_lock);
        return 1;
    }

    /* Admission: with the local launcher every rank of a job runs on this host, so a job must
     * fit its memory (ranks of other jobs come and go: the supervisor's queue handles them). */
    zt_host_memory hm = {0};
    const char *host_name = NULL;
    if (!slurm && zt_host_memory_read(&hm) != ZT_OK)
        zt_oplog(ZT_LOG_WARNING, "warning: %s; jobs are admitted by --max-rank-memory and "
                                 "--max-job-memory alone\n", zt_last_error());
    else if (!slurm)
        host_name = hm.cgroup_limited ? "this host's memory as ztraind's memory cgroup limits it"
                                      : "this host's memory (MemTotal)";
    /* A "cuda" job's ranks take GPUs 0 .. gpus - 1 of the pool (the local launcher): each
     * rank's estimate must fit the smallest of them. Under Slurm the GPUs are another host's. */
    const int pool = o.gpus >= 0 ? (int)o.gpus : zt_gpu_count();
    uint64_t gpu_bytes = 0;
    static char gpu_name[320];
    for (int i = 0; !slurm && i < pool && i < zt_gpu_count(); i++) {
        zt_gpu_props p;
        if (zt_gpu_props_get(i, &p) != ZT_OK || (gpu_bytes && p.total_bytes >= gpu_bytes))
            continue;
        gpu_bytes = p.total_bytes;
        snprintf(gpu_name, sizeof gpu_name, "this server's GPU %d (%s)", i, p.name);
    }
    zt_jobs_config jc = {.data_root = data_root, .runs_root = runs_root, .db_path = db,
                         .worker_path = worker, .max_ranks = (int)o.max_ranks,
                         .max_world_size = (int)o.max_world_size, .max_jobs = (int)o.max_jobs,
                         .threads_per_rank = (int)o.threads_per_rank,
                         .default_grace_s = o.grace_s,
                         .restart_backoff_s = o.restart_backoff_s, .slurm = slurm ? &slurm_cfg : NULL,
                         .max_rank_bytes = o.max_rank_bytes, .max_job_bytes = o.max_job_bytes,
                         .host_bytes = host_name ? hm.total : 0, .host_name = host_name,
                         .max_device_bytes = o.max_device_bytes, .gpu_bytes = gpu_bytes,
                         .gpu_name = gpu_bytes ? gpu_name : NULL,
                         .gpus = o.gpus >= 0 ? (int)o.gpus : zt_gpu_count(),
                         .gpu_visible = getenv("CUDA_VISIBLE_DEVICES"),
                         .webhook_url = o.webhook, .webhook_on = ZT_HOOK_ALL,
                         .webhook_attempts = (int)o.webhook_attempts,
                         .webhook_backoff_ms = (int)o.webhook_backoff_ms,
                         .webhook_secret = o.webhook_secret_env ? getenv(o.webhook_secret_env)
                                                                : NULL,
                         .webhook_policy = &o.webhook_policy};
    if (jc.gpus > 64)
        jc.gpus = 64;
    zt_jobs *jm = NULL;
    zt_grpc_server *grpc = NULL;
    zt_http_server *http = NULL;
    int rc = 1;
    if (zt_jobs_create(&jm, &jc) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "%s\n", zt_last_error());
        goto out;
    }
    zt_inject_listen_race();
    zt_grpc_server_config gc = {.addr = o.grpc_addr, .tokens = token,
                                .max_connections = (int)o.max_grpc_conns,
                                .handshake_timeout_ms = (int)o.header_timeout_s * 1000,
                                .idle_timeout_ms = (int)o.idle_timeout_s * 1000, .tls = &tls,
                                .page_key = &page_key};
    if (zt_grpc_server_create(&grpc, &gc, jm) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "%s\n", zt_last_error());
        goto out;
    }
    zt_http_config hc = {.host = host, .port = http_port, .tokens = token, .web_dir = o.web_dir,
                         .chartjs_dir = ZT_CHARTJS_DIR, .hosts = o.http_hosts,
                         .n_hosts = o.n_http_hosts, .origins = o.http_origins,
                         .n_origins = o.n_http_origins,
                         .max_connections = (unsigned)o.max_http_conns,
                         .header_timeout_s = (unsigned)o.header_timeout_s,
                         .idle_timeout_s = (unsigned)o.idle_timeout_s, .tls = &tls,
                         .metrics_window_s = o.metrics_window_s, .page_key = &page_key};
    if (zt_http_start(&http, &hc, jm) != ZT_OK) {
        zt_oplog(ZT_LOG_ERR, "%s\n", zt_last_error());
        goto out;
    }
    char grpc_host[256];
    snprintf(grpc_host, sizeof grpc_host, "%s", o.grpc_addr);
    char *colon = strrchr(grpc_host, ':');
    if (colon)
        *colon = '\0';
    zt_oplog(ZT_LOG_INFO, "limits: open files %ld (was %ld), grpc connections %ld, http "
             "connections %ld, header timeout %ld s, idle timeout %ld s\n",
             fd_limit, fd_limit_was, o.max_grpc_conns, o.max_http_conns, o.header_timeout_s,
             o.idle_timeout_s);
    describe_gpus(jc.gpus);
    /* One line that scripts (and the tests) read to learn the ports that were picked. */
    zt_oplog(ZT_LOG_INFO, "ready grpc=%s:%d http=%s://%s:%d state=%s data=%s runs=%s max_ranks=%ld "
             "launcher=%s%s%s\n",
             grpc_host, zt_grpc_server_port(grpc), tls.cert ? "https" : "http", host,
             zt_http_port(http), db, zt_jobs_get_config(jm)->data_root,
             zt_jobs_get_config(jm)->runs_root, o.max_ranks, o.launcher,
             token ? " auth=bearer" : "", tls.ca ? " tls=mutual" : tls.cert ? " tls=on" : "");
    fflush(stdout);

    zt_grpc_server_run(grpc, &stop_requested);
    zt_oplog(ZT_LOG_INFO, "stopping: running jobs are cancelled with a checkpoint\n");
    fflush(stdout);
    rc = 0;
out:
    /* The front ends go first: their watches must be gone before the job manager is. */
    if (http)
        zt_http_stop(http);
    if (grpc)
        zt_grpc_server_destroy(grpc);
    zt_jobs_destroy(jm);
    zt_auth_tokens_free(token);
    zt_tls_pem_free(&tls);
    close(state_lock);
    if (rc == 0)
        zt_oplog(ZT_LOG_INFO, "stopped\n");
    else if (!grpc || !http)
        remove_what_start_made(o.state_dir, made_state, data_root, made_data, runs_root,
                               made_runs);
    return rc;
}
