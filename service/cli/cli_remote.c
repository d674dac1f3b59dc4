/* The ztrain CLI's remote commands (cli_remote.h): each parses its options, makes one or two
 * calls through grpc_client.h and prints for people, or for scripts where that is the point
 * (`submit` prints only the job id on stdout; `status --json`). Every string the server sent is
 * escaped before it is printed (engine/include/ztrain/text.h): ztraind refuses names that could drive a terminal,
 * but an older daemon may hold some, and a rank's log line may carry anything. */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/auth.h"
#include "cli_args.h"
#include "cli_commands.h"
#include "cli_remote.h"
#include "grpc_client.h"
#include "api/job_proto.h"
#include "api/proto_json.h"
#include "daemon/job_manager.h"
#include "ztrain/job_overrides.h"
#include "ztrain/json_util.h"
#include "ztrain/text.h"
#include "ztrain.pb-c.h"

#define DEFAULT_SERVER "127.0.0.1:50051"
#define EXIT_CANCELLED 3
#define BAR_WIDTH 30
#define RATE_WINDOW 20

/* ---- options ----------------------------------------------------------------------------- */

typedef struct {
    const char *command;
    const char *server;
    const char *token_file;
    const char *tls_ca, *tls_cert, *tls_key;
    const char *arg;            /* the first positional argument: a job file or id */
    const char *more[64];       /* cancel's further ids */
    size_t n_more;
    const char *sets[64];       /* submit's --set overrides */
    size_t n_sets;
    const char *output;         /* -o json|wide|name */
    bool wait, watch, json, follow, force, dry_run;
    const char *state;
    const char *idempotency_key;
    const char *fork_from;      /* "job-000042@8" */
    long limit, tail;
    bool tail_given;  /* --tail was given: its 0 asks for no lines, its absence for 100 */
    int64_t from_step;
    double grace_s;
} options;

static int usage_error(const options *o, const char *fmt, const char *what) {
    fprintf(stderr, "ztrain: %s: ", o->command);
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    zt_cli_print_short_usage(stderr, o->command);
    return 2;
}

/* Which flags each command takes besides --server and --token-file. */
static bool flag_allowed(const char *command, const char *flag) {
    static const struct {
        const char *command, *flags;
    } allowed[] = {
        {"submit", " --wait --watch --idempotency-key --fork-from --set --dry-run "},
        {"list", " --state --limit -o --output --json "},
        {"status", " --json -o --output "},               {"watch", " --from-step "},
        {"logs", " -f --follow --tail "},                 {"cancel", " --force --grace "},
    };
    char padded[64];
    snprintf(padded, sizeof padded, " %s ", flag);
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        if (strcmp(allowed[i].command, command) == 0)
            return strstr(allowed[i].flags, padded) != NULL;
    return false;
}

/* A flag with a value; returns -1 after printing a usage error. */
static int value_flag(options *o, const char *flag, const char *v) {
    long n;
    if (strcmp(flag, "--server") == 0)
        o->server = v;
    else if (strcmp(flag, "--token-file") == 0)
        o->token_file = v;
    else if (strcmp(flag, "--tls-ca") == 0)
        o->tls_ca = v;
    else if (strcmp(flag, "--tls-cert") == 0)
        o->tls_cert = v;
    else if (strcmp(flag, "--tls-key") == 0)
        o->tls_key = v;
    else if (strcmp(flag, "--state") == 0)
        o->state = v;
    else if (strcmp(flag, "--idempotency-key") == 0)
        o->idempotency_key = v;
    else if (strcmp(flag, "--fork-from") == 0)
        o->fork_from = v;
    else if (strcmp(flag, "-o") == 0 || strcmp(flag, "--output") == 0) {
        /* wide is list's alone; status explains its refusal of wide once the options are
         * read. */
        bool list = strcmp(o->command, "list") == 0;
        if (strcmp(v, "json") != 0 && strcmp(v, "wide") != 0 && strcmp(v, "name") != 0) {
            usage_error(o, list ? "-o expects json, wide or name, got '%s'"
                                : "-o expects json or name, got '%s'", v);
            return -1;
        }
        o->output = v;
    } else if (strcmp(flag, "--set") == 0) {
        if (o->n_sets == sizeof o->sets / sizeof o->sets[0]) {
            usage_error(o, "at most %s --set overrides", "64");
            return -1;
        }
        o->sets[o->n_sets++] = v;
    }
    else if (strcmp(flag, "--limit") == 0) {
        if (zt_cli_parse_long(flag, v, 1, INT32_MAX, &n))
            return -1;
        o->limit = n;
    } else if (strcmp(flag, "--tail") == 0) {
        /* 0 is a tail too: no kept lines (with -f, only new ones), as kubectl's --tail=0. */
        if (zt_cli_parse_long(flag, v, 0, INT32_MAX, &n))
            return -1;
        o->tail = n;
        o->tail_given = true;
    } else if (strcmp(flag, "--from-step") == 0) {
        if (zt_cli_parse_long(flag, v, 0, LONG_MAX, &n))
            return -1;
        o->from_step = n;
    } else if (strcmp(flag, "--grace") == 0) {
        if (zt_cli_parse_double(flag, v, 0, ZT_JOBS_MAX_GRACE_S, &o->grace_s))
            return -1;
    }
    return 0;
}

static bool takes_value(const char *flag) {
    static const char *const with_value[] = {"--server", "--token-file", "--tls-ca", "--tls-cert",
                                             "--tls-key", "--state", "--limit", "--tail",
                                             "--from-step", "--grace", "--idempotency-key",
                                             "--fork-from", "-o", "--output", "--set", NULL};
    for (const char *const *f = with_value; *f; f++)
        if (strcmp(*f, flag) == 0)
            return true;
    return false;
}

/* A job as an operand or in --fork-from: its id, or its resource name "jobs/ID", the form the
 * server's messages name jobs by (docs/api.md), which the Python client takes too. */
static const char *job_id(const char *a) {
    return strncmp(a, "jobs/", 5) == 0 ? a + 5 : a;
}

static int parse_options(options *o, int argc, char **argv) {
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int kind = zt_cli_word_kind(a, &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            if (strcmp(o->command, "submit") != 0)  /* submit's operand is a file */
                a = job_id(a);
            if (!o->arg)
                o->arg = a;
            else if (strcmp(o->command, "cancel") == 0 &&
                     o->n_more < sizeof o->more / sizeof o->more[0])
                o->more[o->n_more++] = a;
            else
                return usage_error(o, "unexpected argument '%s'", a);
            continue;
        }
        bool common = strcmp(a, "--server") == 0 || strcmp(a, "--token-file") == 0 ||
                      strcmp(a, "--tls-ca") == 0 || strcmp(a, "--tls-cert") == 0 ||
                      strcmp(a, "--tls-key") == 0;
        if (!common && !flag_allowed(o->command, a))
            return zt_cli_unknown_option(o->command, a);
        if (takes_value(a)) {
            if (i + 1 >= argc)
                return usage_error(o, "%s needs a value", a);
            if (value_flag(o, a, argv[++i]))
                return 2;
            continue;
        }
        o->wait |= strcmp(a, "--wait") == 0;
        o->watch |= strcmp(a, "--watch") == 0;
        o->json |= strcmp(a, "--json") == 0;
        o->follow |= strcmp(a, "-f") == 0 || strcmp(a, "--follow") == 0;
        o->force |= strcmp(a, "--force") == 0;
        o->dry_run |= strcmp(a, "--dry-run") == 0;
    }
    if (o->json && o->output && strcmp(o->output, "json") != 0)
        return usage_error(o, "--json and -o %s ask for two formats", o->output);
    if (o->json)
        o->output = "json";
    return 0;
}

/* ---- connection -------------------------------------------------------------------------- */

/* A TLS file from its flag, else from its environment variable; the source names which. */
static zt_tls_file tls_file(const char *flag_value, const char *flag, const char *env_name,
                            const char *either) {
    if (flag_value)
        return (zt_tls_file){flag_value, flag};
    const char *env = getenv(env_name);
    return env && *env ? (zt_tls_file){env, env_name} : (zt_tls_file){NULL, either};
}

/* Whether addr is an address the channel can dial: HOST:PORT (a name, an IPv4 address or a
 * bracketed IPv6 one, the port 1-65535) or unix:PATH. gRPC itself would take a port past
 * 65535 modulo 65536, and an empty address as a name to resolve. */
static bool server_ok(const char *addr) {
    if (strncmp(addr, "unix:", 5) == 0)
        return addr[5] != '\0';
    for (const char *p = addr; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f || *p == '/')
            return false;
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return false;
    if (addr[0] == '[' ? colon[-1] != ']' || colon - addr < 3
                       : memchr(addr, ':', (size_t)(colon - addr)) != NULL)
        return false;
    const char *port = colon + 1;
    if (!*port || strlen(port) > 5 || strspn(port, "0123456789") != strlen(port))
        return false;
    long n = strtol(port, NULL, 10);
    return n >= 1 && n <= 65535;
}

/* The server to dial: --server, else ZTRAIN_SERVER (empty: unset), else the default; NULL
 * after a usage message naming the source of an address that is not one. */
static const char *server_address(const options *o) {
    const char *env = getenv("ZTRAIN_SERVER");
    const char *server = o->server ? o->server : env && *env ? env : DEFAULT_SERVER;
    if (server_ok(server))
        return server;
    const char *what = o->server ? "--server" : "ZTRAIN_SERVER";
    char *shown_addr = zt_text_escape_dup(server, 0);
    fprintf(stderr, "ztrain: %s: %s '%s' is not an address: expected HOST:PORT with a port "
                    "1-65535 (%s) or unix:PATH\n",
            o->command, what, shown_addr ? shown_addr : "", DEFAULT_SERVER);
    free(shown_addr);
    return NULL;
}

static int connect_client(const options *o, zt_rpc_client **c) {
    const char *server = server_address(o);
    if (!server)
        return 2;
    zt_tls_file ca = tls_file(o->tls_ca, "--tls-ca", "ZTRAIN_TLS_CA",
                              "--tls-ca (or ZTRAIN_TLS_CA)");
    zt_tls_file cert = tls_file(o->tls_cert, "--tls-cert", "ZTRAIN_TLS_CERT",
                                "--tls-cert (or ZTRAIN_TLS_CERT)");
    zt_tls_file key = tls_file(o->tls_key, "--tls-key", "ZTRAIN_TLS_KEY",
                               "--tls-key (or ZTRAIN_TLS_KEY)");
    zt_tls_pem tls;
    if (zt_tls_load(&tls, cert, key, ca) != ZT_OK)
        return zt_cli_fail(NULL);
    bool use_tls = ca.path || cert.path;
    char *token = NULL;
    zt_status s = zt_auth_load_token(o->token_file, &token);
    if (s == ZT_OK)
        s = zt_rpc_client_create(c, server, token, use_tls ? &tls : NULL, 0);
    free(token);
    zt_tls_pem_free(&tls);
    return s == ZT_OK ? 0 : zt_cli_fail(NULL);
}

static zt_status get_job(zt_rpc_client *c, const char *id, Ztrain__V1__Job **job) {
    Ztrain__V1__GetJobRequest req = ZTRAIN__V1__GET_JOB_REQUEST__INIT;
    req.id = (char *)id;
    return zt_rpc_call(c, "/ztrain.v1.Trainer/GetJob", &req.base, &ztrain__v1__job__descriptor,
                       (ProtobufCMessage **)job);
}

/* ---- formatting -------------------------------------------------------------------------- */

/* A string from the server as a terminal may see it; the caller frees it. */
static char *shown(const char *s) {
    char *t = zt_text_escape_dup(s ? s : "", 0);
    ZT_ASSERT(t);
    return t;
}

/* The same into a buffer, cut short if need be: for ids and other short fields. */
static const char *shown_in(const char *s, char *buf, size_t size) {
    zt_text_escape(s ? s : "", 0, buf, size);
    return buf;
}

static void format_rate(double v, char *buf, size_t n) {
    if (!(v > 0))
        snprintf(buf, n, "-");
    else if (v >= 1e6)
        snprintf(buf, n, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, n, "%.1fk", v / 1e3);
    else
        snprintf(buf, n, "%.0f", v);
}

static void format_duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

static void format_time(int64_t unix_ms, char *buf, size_t n) {
    if (unix_ms <= 0) {
        snprintf(buf, n, "-");
        return;
    }
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
}

static void format_step(int64_t step, int64_t max_steps, char *buf, size_t n) {
    if (max_steps > 0)
        snprintf(buf, n, "%lld/%lld", (long long)step, (long long)max_steps);
    else
        snprintf(buf, n, "%lld", (long long)step);
}

static void format_loss(const Ztrain__V1__Job *j, char *buf, size_t n) {
    if (j->step > 0 && isfinite(j->loss))
        snprintf(buf, n, "%.4f", j->loss);
    else
        snprintf(buf, n, "-");
}

static void format_rank(const Ztrain__V1__RankStatus *r, char *buf, size_t n) {
    if (r->pid == 0)
        snprintf(buf, n, "rank %d: not started", r->rank);
    else if (r->running)
        snprintf(buf, n, "rank %d: pid %d, running", r->rank, r->pid);
    else if (r->exit_unknown)
        snprintf(buf, n, "rank %d: pid %d, end unknown (ztraind was restarted while it ran)",
                 r->rank, r->pid);
    else if (r->signal)
        snprintf(buf, n, "rank %d: pid %d, killed by signal %d (%s)", r->rank, r->pid, r->signal,
                 strsignal(r->signal));
    else
        snprintf(buf, n, "rank %d: pid %d, exited with status %d", r->rank, r->pid, r->exit_code);
    /* The rank's figures of the last logged step, once the job reported them (NaN before). */
    size_t len = strlen(buf);
    if (isfinite(r->step_time_ms) && len < n)
        snprintf(buf + len, n - len, "; step %.1f ms (comm %.1f), cpu %.2f, rss %.1f MiB",
                 r->step_time_ms, r->comm_ms, r->cpu_util, r->rss_bytes / 1048576.0);
}

/* The exit status a finished job gives watch and submit --wait. */
static int outcome(Ztrain__V1__JobState s) {
    return s == ZTRAIN__V1__JOB_STATE__JOB_STATE_SUCCEEDED   ? 0
           : s == ZTRAIN__V1__JOB_STATE__JOB_STATE_CANCELLED ? EXIT_CANCELLED
                                                              : 1;
}

static bool terminal(Ztrain__V1__JobState s) {
    return s == ZTRAIN__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
           s == ZTRAIN__V1__JOB_STATE__JOB_STATE_FAILED ||
           s == ZTRAIN__V1__JOB_STATE__JOB_STATE_CANCELLED;
}

/* ---- watching ---------------------------------------------------------------------------- */

/* What `watch` knows of the job and shows: a redrawn bar on a terminal, lines otherwise. */
typedef struct {
    FILE *out;
    bool tty, quiet, bar_drawn;
    char id[32];
    Ztrain__V1__JobState state;
    char reason[512];
    int64_t step, max_steps;
    double loss, tps;
    int64_t win_step[RATE_WINDOW], win_ms[RATE_WINDOW]; /* recent records, for the ETA */
    int n_win;
    int64_t last_seq;           /* the seq of the last record: a cut watch resumes after it */
    int64_t last_anomaly;       /* the seq of the last anomaly shown: a cut watch resumes
                                 * after it too */
    /* A stream opens with the job's state and ends with it after what it replays, so an ended
     * job's end state also opens its stream: the watch is over only when a stream has given
     * the end state after its other events (ended), not when one was cut after its first. */
    int stream_events;
    bool ended;
    int32_t attempt; /* the last attempt seen (Job.attempts), 0 before the first Job */
    struct timespec last_draw;
} watch_view;

static double metric(const Ztrain__V1__MetricRecord *r, const char *key, double dflt) {
    for (size_t i = 0; i < r->n_values; i++)
        if (strcmp(r->values[i]->key, key) == 0)
            return r->values[i]->value;
    return dflt;
}

/* Seconds left at the rate of the last RATE_WINDOW records; < 0 when unknown. */
static double eta_seconds(const watch_view *v) {
    if (v->max_steps <= 0 || v->n_win < 2)
        return -1;
    int first = v->n_win > RATE_WINDOW ? v->n_win % RATE_WINDOW : 0;
    int last = (v->n_win - 1) % RATE_WINDOW;
    double steps = (double)(v->win_step[last] - v->win_step[first]);
    double ms = (double)(v->win_ms[last] - v->win_ms[first]);
    if (steps <= 0 || ms <= 0)
        return -1;
    return (double)(v->max_steps - v->step) * ms / steps / 1000.0;
}

static void progress_text(const watch_view *v, char *buf, size_t n) {
    char step[48], rate[32], eta[32] = "-", bar[BAR_WIDTH + 3] = "";
    format_step(v->step, v->max_steps, step, sizeof step);
    format_rate(v->tps, rate, sizeof rate);
    double left = eta_seconds(v);
    if (left >= 0)
        format_duration(left, eta, sizeof eta);
    if (v->tty && v->max_steps > 0) {
        int filled = (int)(BAR_WIDTH * (double)v->step / (double)v->max_steps);
        filled = filled < 0 ? 0 : filled > BAR_WIDTH ? BAR_WIDTH : filled;
        bar[0] = '[';
        for (int i = 0; i < BAR_WIDTH; i++)
            bar[1 + i] = i < filled ? '#' : '.';
        bar[BAR_WIDTH + 1] = ']';
        bar[BAR_WIDTH + 2] = '\0';
    }
    char loss[32] = "-";
    if (isfinite(v->loss))
        snprintf(loss, sizeof loss, "%.4f", v->loss);
    snprintf(buf, n, "%s%sstep %s  loss %s  %s tok/s  ETA %s", bar, bar[0] ? " " : "", step, loss,
             rate, eta);
}

static void clear_bar(watch_view *v) {
    if (v->tty && v->bar_drawn) {
        fputs("\r\033[K", v->out);
        v->bar_drawn = false;
    }
}

static double since_ms(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) * 1e3 + (double)(now.tv_nsec - t->tv_nsec) / 1e6;
}

/* On a terminal the bar is redrawn at most 10 times a second (a replayed history would
 * otherwise flood it); elsewhere every record is a line. */
static void show_progress(watch_view *v, bool force) {
    if (v->quiet)
        return;
    char text[256];
    progress_text(v, text, sizeof text);
    if (!v->tty) {
        fprintf(v->out, "%s: %s\n", v->id, text);
        fflush(v->out);
        return;
    }
    if (!force && v->bar_drawn && since_ms(&v->last_draw) < 100)
        return;
    clock_gettime(CLOCK_MONOTONIC, &v->last_draw);
    fprintf(v->out, "\r\033[K%s", text);
    v->bar_drawn = true;
    fflush(v->out);
}

/* A new attempt (a restart after a rank failed, or a requeue after ztraind restarted): one line
 * naming it and how the one before it ended, which the state alone does not show (a restart
 * can go RUNNING to RUNNING). The first Job a watch sees only sets where it starts from. */
static void on_attempt(watch_view *v, const Ztrain__V1__Job *j) {
    if (j->n_attempts == 0)
        return;
    const Ztrain__V1__JobAttempt *now = j->attempts[j->n_attempts - 1];
    bool first = v->attempt == 0, changed = now->attempt > v->attempt;
    if (changed)
        v->attempt = now->attempt;
    if (first || !changed || v->quiet)
        return;
    clear_bar(v);
    fprintf(v->out, "%s: attempt %d started from step %lld", v->id, now->attempt,
            (long long)now->resumed_from_step);
    if (j->n_attempts >= 2) {
        const Ztrain__V1__JobAttempt *last = j->attempts[j->n_attempts - 2];
        char *reason = shown(last->reason);
        fprintf(v->out, "; attempt %d %s at step %lld%s%s", last->attempt,
                last->failed ? "failed" : "ended", (long long)last->step, reason[0] ? ": " : "",
                reason);
        free(reason);
    }
    fputc('\n', v->out);
    fflush(v->out);
}

static void on_job(watch_view *v, const Ztrain__V1__Job *j) {
    on_attempt(v, j);
    bool changed = j->state != v->state;
    v->state = j->state;
    if (j->max_steps > 0)
        v->max_steps = j->max_steps;
    shown_in(j->id, v->id, sizeof v->id);
    shown_in(j->reason, v->reason, sizeof v->reason);
    if (j->step > v->step)
        v->step = j->step;
    if (j->step > 0 && isfinite(j->loss))
        v->loss = j->loss;
    if (!changed || v->quiet || terminal(j->state))
        return;
    clear_bar(v);
    fprintf(v->out, "%s: %s%s%s\n", v->id, zt_job_proto_state_name(j->state),
            v->reason[0] ? " - " : "", v->reason);
    fflush(v->out);
}

/* An evaluation's record (eval/loss and no train/loss) is a line of its own above the bar:
 * it is not progress, and its loss is not the training loss the bar shows. */
static void on_eval_record(watch_view *v, const Ztrain__V1__MetricRecord *r) {
    if (v->quiet)
        return;
    char step[48], loss[32] = "-";
    format_step((int64_t)metric(r, "train/global_step", (double)r->step), v->max_steps, step,
                sizeof step);
    double eval_loss = metric(r, "eval/loss", NAN);
    if (isfinite(eval_loss))
        snprintf(loss, sizeof loss, "%.4f", eval_loss);
    clear_bar(v);
    fprintf(v->out, "%s: step %s  eval loss %s\n", v->id, step, loss);
    fflush(v->out);
    if (v->tty && v->n_win)
        show_progress(v, true);
}

static void on_record(watch_view *v, const Ztrain__V1__MetricRecord *r) {
    if (r->seq > v->last_seq)
        v->last_seq = r->seq;
    bool has_train_loss = false, has_eval_loss = false;
    for (size_t i = 0; i < r->n_values; i++) {
        has_train_loss |= strcmp(r->values[i]->key, "train/loss") == 0;
        has_eval_loss |= strcmp(r->values[i]->key, "eval/loss") == 0;
    }
    if (has_eval_loss && !has_train_loss) {
        on_eval_record(v, r);
        return;
    }
    v->step = (int64_t)metric(r, "train/global_step", (double)r->step);
    v->loss = metric(r, "train/loss", v->loss);
    v->tps = metric(r, "perf/tokens_per_second", v->tps);
    int slot = v->n_win % RATE_WINDOW;
    v->win_step[slot] = v->step;
    v->win_ms[slot] = zt_job_proto_time_ms(r->time);
    v->n_win++;
    show_progress(v, v->max_steps > 0 && v->step >= v->max_steps);
}

static bool on_event(void *ctx, const ProtobufCMessage *m) {
    watch_view *v = ctx;
    const Ztrain__V1__JobEvent *ev = (const Ztrain__V1__JobEvent *)m;
    v->stream_events++;
    if (ev->event_case == ZTRAIN__V1__JOB_EVENT__EVENT_JOB) {
        on_job(v, ev->job);
        if (terminal(ev->job->state) && v->stream_events > 1)
            v->ended = true;
    }
    else if (ev->event_case == ZTRAIN__V1__JOB_EVENT__EVENT_METRICS)
        on_record(v, ev->metrics);
    else if (ev->event_case == ZTRAIN__V1__JOB_EVENT__EVENT_ANOMALY &&
             ev->anomaly->seq > v->last_anomaly) {
        v->last_anomaly = ev->anomaly->seq;
        /* An anomaly event gets a line of its own above the progress bar. */
        clear_bar(v);
        fprintf(v->out, "%s: event %s: %s\n", v->id, ev->anomaly->kind, ev->anomaly->message);
        fflush(v->out);
    }
    return true;
}

/* The closing line: the outcome on out, a failure's reason on stderr. */
static int report_outcome(watch_view *v) {
    clear_bar(v);
    char step[48], loss[32] = "-";
    format_step(v->step, v->max_steps, step, sizeof step);
    if (isfinite(v->loss))
        snprintf(loss, sizeof loss, "%.4f", v->loss);
    FILE *f = v->state == ZTRAIN__V1__JOB_STATE__JOB_STATE_FAILED ? stderr : v->out;
    const char *state = zt_job_proto_state_name(v->state);
    if (v->quiet && f != stderr)
        return outcome(v->state);
    if (v->state == ZTRAIN__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
        fprintf(f, "%s %s: step %s, loss %s\n", v->id, state, step, loss);
    else
        fprintf(f, "%s%s %s at step %s%s%s\n", f == stderr ? "ztrain: " : "", v->id, state, step,
                v->reason[0] ? ": " : "", v->reason);
    fflush(f);
    return outcome(v->state);
}

/* How a watch rides out a daemon that cannot be reached (it restarts): it dials again after
 * WATCH_RETRY_FIRST_MS, doubling up to WATCH_RETRY_LONGEST_MS, for at most WATCH_RECONNECT_S
 * seconds in a row, and goes on after the last record it showed. */
#define WATCH_RETRY_FIRST_MS 250
#define WATCH_RETRY_LONGEST_MS 5000
#define WATCH_RECONNECT_S 300

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int watch_job(zt_rpc_client *c, const char *id, int64_t from_step, FILE *out, bool quiet) {
    watch_view v = {.out = out, .quiet = quiet, .tty = isatty(fileno(out)), .loss = NAN,
                    .tps = NAN};
    shown_in(id, v.id, sizeof v.id);
    /* The job's step count is asked first so that replayed records show "step N/M". */
    Ztrain__V1__Job *job = NULL;
    if (get_job(c, id, &job) != ZT_OK)
        return zt_cli_fail(NULL);
    v.max_steps = job->max_steps;
    protobuf_c_message_free_unpacked(&job->base, NULL);
    Ztrain__V1__WatchJobRequest req = ZTRAIN__V1__WATCH_JOB_REQUEST__INIT;
    req.id = (char *)id;
    req.since_step = from_step;
    long pause_ms = WATCH_RETRY_FIRST_MS;
    struct timespec down = {0};
    bool is_down = false;
    zt_status s;
    for (;;) {
        int64_t seen = v.last_seq;
        /* A stream that is resumed goes on after the last record and the last anomaly event
         * shown; since_step still filters what follows. */
        req.after_seq = v.last_seq;
        req.after_anomaly_seq = v.last_anomaly;
        v.stream_events = 0;
        s = zt_rpc_stream(c, "/ztrain.v1.Trainer/WatchJob", &req.base,
                          &ztrain__v1__job_event__descriptor, on_event, &v);
        if (s == ZT_OK || zt_rpc_last_code(c) != GRPC_STATUS_UNAVAILABLE || v.ended)
            break;
        if (!is_down || v.last_seq != seen) {
            clock_gettime(CLOCK_MONOTONIC, &down);
            is_down = true;
            pause_ms = WATCH_RETRY_FIRST_MS;
            clear_bar(&v);
            fprintf(stderr, "ztrain: %s: %s; reconnecting\n", v.id, zt_last_error());
        } else if (since_ms(&down) >= WATCH_RECONNECT_S * 1000.0) {
            break;
        }
        sleep_ms(pause_ms);
        pause_ms = pause_ms * 2 > WATCH_RETRY_LONGEST_MS ? WATCH_RETRY_LONGEST_MS : pause_ms * 2;
    }
    clear_bar(&v);
    if (s != ZT_OK)
        return zt_cli_fail(NULL);
    if (!terminal(v.state)) {
        fprintf(stderr, "ztrain: %s: the server ended the watch before the job did (state %s)\n",
                id, zt_job_proto_state_name(v.state));
        return 1;
    }
    return report_outcome(&v);
}

/* ---- commands ---------------------------------------------------------------------------- */

/* The job file's directory, against which a "deepspeed" path is read. */
static char *dir_of(const char *path) {
    char *dir = strdup(path);
    if (!dir)
        return NULL;
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    return dir;
}

static zt_status read_spec(const options *o, Ztrain__V1__JobSpec **spec) {
    const char *path = o->arg;
    char *text = NULL, *applied = NULL, *dir = dir_of(path);
    zt_status s = dir ? zt_json_read_config(path, &text, NULL)
                      : zt_error(ZT_ERR_NOMEM, "out of memory");
    if (s == ZT_OK)
        s = zt_job_overrides_apply(text, path, dir, o->sets, o->n_sets, &applied);
    if (s == ZT_OK)
        s = zt_job_proto_spec_from_json(applied, path, dir, spec);
    free(applied);
    free(text);
    free(dir);
    return s;
}

/* --fork-from ID@STEP into the spec's fork_from (replacing one the job file has); the spec and
 * what it holds are freed as unpacked messages, so everything here comes from malloc. */
static int set_fork_from(const options *o, Ztrain__V1__JobSpec *spec) {
    const char *from = job_id(o->fork_from), *at = strrchr(from, '@');
    long step;
    if (!at || at == from)
        return usage_error(o, "--fork-from '%s': expected JOB@STEP (job-000042@800)",
                           o->fork_from);
    if (zt_cli_parse_long("--fork-from's step", at + 1, 0, LONG_MAX, &step))
        return 2;
    Ztrain__V1__ForkFrom *f = malloc(sizeof *f);
    char *id = strndup(from, (size_t)(at - from));
    ZT_ASSERT(f && id);
    ztrain__v1__fork_from__init(f);
    f->job = id;
    f->step = step;
    if (spec->fork_from)
        protobuf_c_message_free_unpacked(&spec->fork_from->base, NULL);
    spec->fork_from = f;
    return 0;
}

static int cmd_submit(const options *o, zt_rpc_client *c) {
    if (o->wait && o->watch)
        return usage_error(o, "%s", "--wait and --watch exclude each other");
    Ztrain__V1__SubmitJobRequest req = ZTRAIN__V1__SUBMIT_JOB_REQUEST__INIT;
    if (read_spec(o, &req.spec) != ZT_OK)
        return zt_cli_fail(NULL);
    int bad = o->fork_from ? set_fork_from(o, req.spec) : 0;
    if (bad) {
        protobuf_c_message_free_unpacked(&req.spec->base, NULL);
        return bad;
    }
    req.idempotency_key = (char *)(o->idempotency_key ? o->idempotency_key : "");
    Ztrain__V1__Job *job = NULL;
    zt_status s = zt_rpc_call(c, "/ztrain.v1.Trainer/SubmitJob", &req.base,
                              &ztrain__v1__job__descriptor, (ProtobufCMessage **)&job);
    protobuf_c_message_free_unpacked(&req.spec->base, NULL);
    if (s != ZT_OK)
        return zt_cli_fail(NULL);
    char id[64];
    printf("%s\n", shown_in(job->id, id, sizeof id));
    fflush(stdout);
    int rc = 0;
    /* stdout carries only the id, so what --watch shows goes to stderr. */
    if (o->wait || o->watch)
        rc = watch_job(c, job->id, 0, stderr, o->wait);
    protobuf_c_message_free_unpacked(&job->base, NULL);
    return rc;
}

static void print_list_row(const Ztrain__V1__Job *j, bool wide) {
    char step[48], loss[32], created[32], id[64];
    format_step(j->step, j->max_steps, step, sizeof step);
    format_loss(j, loss, sizeof loss);
    format_time(zt_job_proto_time_ms(j->create_time), created, sizeof created);
    char *name = shown(j->name);
    if (wide) {
        char rate[32], elapsed[32] = "-", device[16];
        format_rate(j->tokens_per_second, rate, sizeof rate);
        /* The server measures the run time, so a client's clock cannot skew it. */
        if (j->run_duration)
            format_duration((double)j->run_duration->seconds +
                                (double)j->run_duration->nanos / 1e9,
                            elapsed, sizeof elapsed);
        printf("%-12s %-10s %-13s %-9s %-9s %-8s %-5d %-6s %-19s %s\n",
               shown_in(j->id, id, sizeof id), zt_job_proto_state_name(j->state), step, loss,
               rate, elapsed, j->spec ? j->spec->world_size : (int)j->n_ranks,
               shown_in(j->spec ? j->spec->device : "", device, sizeof device), created, name);
    } else {
        printf("%-12s %-10s %-13s %-9s %-19s %s\n", shown_in(j->id, id, sizeof id),
               zt_job_proto_state_name(j->state), step, loss, created, name);
    }
    free(name);
}

/* A job as GET /api/v1/jobs/{id} answers it: the proto3 JSON mapping of Job (api/proto_json.h),
 * the API object as kubectl's -o json prints it. The characters a terminal would act on (DEL,
 * C1, bidirectional controls), which JSON allows raw in strings, are written as JSON escapes:
 * the value read back is the same. */
static int print_job_json(FILE *out, const Ztrain__V1__Job *job, const char *prefix) {
    zt_jbuf b;
    zt_jbuf_init(&b);
    zt_proto_json(&b, &job->base);
    char *text = zt_jbuf_take(&b, NULL);
    char *safe = text ? zt_text_escape_dup(text, ZT_ESCAPE_JSON) : NULL;
    free(text);
    if (!safe) {
        fprintf(stderr, "ztrain: out of memory\n");
        return 1;
    }
    fprintf(out, "%s%s", prefix, safe);
    free(safe);
    return 0;
}

static int cmd_list(const options *o, zt_rpc_client *c) {
    Ztrain__V1__ListJobsRequest req = ZTRAIN__V1__LIST_JOBS_REQUEST__INIT;
    if (o->state && !(req.state = zt_job_proto_state_parse(o->state)))
        return usage_error(o, "unknown state '%s' (QUEUED, STARTING, RUNNING, STOPPING, "
                              "SUCCEEDED, FAILED, CANCELLED)", o->state);
    const char *fmt = o->output ? o->output : "";
    bool json = strcmp(fmt, "json") == 0, names = strcmp(fmt, "name") == 0;
    bool wide = strcmp(fmt, "wide") == 0;
    long shown = 0;
    char *token = NULL;
    int rc = 0;
    /* The JSON document is built whole and printed only once every page came, so that a
     * failure leaves stdout empty rather than holding half a document. */
    char *doc = NULL;
    size_t doc_len = 0;
    FILE *out = json ? open_memstream(&doc, &doc_len) : stdout;
    if (!out) {
        fprintf(stderr, "ztrain: list: out of memory\n");
        return 1;
    }
    if (json)
        fprintf(out, "{\"jobs\": [");
    do {
        long want = o->limit ? o->limit - shown : 1000;
        req.page_size = (int32_t)(want > 1000 ? 1000 : want);
        req.page_token = token ? token : "";
        Ztrain__V1__ListJobsResponse *resp = NULL;
        if (zt_rpc_call(c, "/ztrain.v1.Trainer/ListJobs", &req.base,
                        &ztrain__v1__list_jobs_response__descriptor,
                        (ProtobufCMessage **)&resp) != ZT_OK) {
            rc = zt_cli_fail(NULL);
            break;
        }
        if (!token && wide)
            printf("%-12s %-10s %-13s %-9s %-9s %-8s %-5s %-6s %-19s %s\n", "ID", "STATE",
                   "STEP", "LOSS", "TOKENS/S", "ELAPSED", "RANKS", "DEVICE", "CREATED", "NAME");
        else if (!token && !json && !names)
            printf("%-12s %-10s %-13s %-9s %-19s %s\n", "ID", "STATE", "STEP", "LOSS", "CREATED",
                   "NAME");
        for (size_t i = 0; i < resp->n_jobs && rc == 0; i++) {
            char id[64];
            if (json)
                rc = print_job_json(out, resp->jobs[i], shown + (long)i ? ",\n  " : "\n  ");
            else if (names)
                printf("%s\n", shown_in(resp->jobs[i]->id, id, sizeof id));
            else
                print_list_row(resp->jobs[i], wide);
        }
        shown += (long)resp->n_jobs;
        free(token);
        token = resp->next_page_token[0] ? strdup(resp->next_page_token) : NULL;
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    } while (rc == 0 && token && (!o->limit || shown < o->limit));
    free(token);
    if (json) {
        fprintf(out, "%s]}\n", shown ? "\n" : "");
        fclose(out);
        if (rc == 0)
            fwrite(doc, 1, doc_len, stdout);
        free(doc);
    }
    return rc;
}

/* A fork's lineage, and the attempts of a job that restarted or may (max_restarts). */
static void print_recovery(const Ztrain__V1__Job *j) {
    const Ztrain__V1__JobSpec *spec = j->spec;
    if (spec && spec->fork_from) {
        char *parent = shown(spec->fork_from->job);
        printf("  forked from  %s at step %lld\n", parent, (long long)spec->fork_from->step);
        free(parent);
    }
    if (j->n_attempts <= 1 && (!spec || spec->max_restarts == 0))
        return;
    printf("  restarts     %zu of max_restarts %d\n", j->n_attempts ? j->n_attempts - 1 : 0,
           spec ? spec->max_restarts : 0);
    for (size_t i = 0; i < j->n_attempts; i++) {
        const Ztrain__V1__JobAttempt *a = j->attempts[i];
        char *reason = shown(a->reason);
        printf("  %-12s %d: steps %lld-%lld, %s%s%s\n", i == 0 ? "attempts" : "", a->attempt,
               (long long)a->resumed_from_step, (long long)a->step,
               !a->end_time ? "running" : a->failed ? "failed" : "ended",
               reason[0] ? ": " : "", reason);
        free(reason);
    }
}

static void print_status(const Ztrain__V1__Job *j) {
    char step[48], loss[32], rate[32], t0[32], t1[32], t2[32];
    format_step(j->step, j->max_steps, step, sizeof step);
    format_loss(j, loss, sizeof loss);
    format_rate(j->tokens_per_second, rate, sizeof rate);
    format_time(zt_job_proto_time_ms(j->create_time), t0, sizeof t0);
    format_time(zt_job_proto_time_ms(j->start_time), t1, sizeof t1);
    format_time(zt_job_proto_time_ms(j->end_time), t2, sizeof t2);
    char id[64];
    char *name = shown(j->name), *reason = shown(j->reason);
    char *run_dir = shown(j->run_dir), *ckpt = shown(j->checkpoint_dir);
    printf("%s  %s\n", shown_in(j->id, id, sizeof id), name);
    printf("  state        %s\n", zt_job_proto_state_name(j->state));
    if (reason[0])
        printf("  reason       %s\n", reason);
    printf("  step         %s\n", step);
    printf("  loss         %s\n", loss);
    printf("  tokens/s     %s\n", rate);
    printf("  created      %s\n  started      %s\n  finished     %s\n", t0, t1, t2);
    for (size_t i = 0; i < j->n_ranks; i++) {
        char r[256];
        format_rank(j->ranks[i], r, sizeof r);
        printf("  %-12s %s\n", i == 0 ? "ranks" : "", r);
    }
    print_recovery(j);
    printf("  run dir      %s\n", run_dir[0] ? run_dir : "-");
    printf("  checkpoints  %s\n", ckpt[0] ? ckpt : "-");
    free(name);
    free(reason);
    free(run_dir);
    free(ckpt);
}

static int cmd_status(const options *o, zt_rpc_client *c) {
    /* The text form already shows every field of one job: there are no columns to widen. */
    if (o->output && strcmp(o->output, "wide") == 0)
        return usage_error(o, "-o wide is list's (more columns); status shows every field already, "
                           "%s", "-o json gives them as JSON");
    Ztrain__V1__Job *job;
    if (get_job(c, o->arg, &job) != ZT_OK)
        return zt_cli_fail(NULL);
    int rc = 0;
    const char *fmt = o->output ? o->output : "";
    if (strcmp(fmt, "json") == 0) {
        rc = print_job_json(stdout, job, "");
        if (rc == 0)
            printf("\n");
    } else if (strcmp(fmt, "name") == 0) {
        char id[64];
        printf("%s\n", shown_in(job->id, id, sizeof id));
    } else {
        print_status(job);
    }
    protobuf_c_message_free_unpacked(&job->base, NULL);
    return rc;
}

static bool on_log(void *ctx, const ProtobufCMessage *m) {
    (void)ctx;
    const Ztrain__V1__LogLine *l = (const Ztrain__V1__LogLine *)m;
    char *text = shown(l->text);
    if (l->rank < 0)
        printf("[ztraind] %s\n", text);
    else if (l->rank > 0)
        printf("[rank %d] %s\n", l->rank, text);
    else
        printf("%s\n", text);
    free(text);
    fflush(stdout);
    return true;
}

static int cmd_logs(const options *o, zt_rpc_client *c) {
    Ztrain__V1__StreamLogsRequest req = ZTRAIN__V1__STREAM_LOGS_REQUEST__INIT;
    req.id = (char *)o->arg;
    if (o->tail_given) {
        req.tail_present_case = ZTRAIN__V1__STREAM_LOGS_REQUEST__TAIL_PRESENT_TAIL;
        req.tail = (int32_t)o->tail;
    }
    req.follow = o->follow;
    zt_status s = zt_rpc_stream(c, "/ztrain.v1.Trainer/StreamLogs", &req.base,
                                &ztrain__v1__log_line__descriptor, on_log, NULL);
    return s == ZT_OK ? 0 : zt_cli_fail(NULL);
}

static int cancel_one(const options *o, zt_rpc_client *c, const char *id_arg) {
    Ztrain__V1__CancelJobRequest req = ZTRAIN__V1__CANCEL_JOB_REQUEST__INIT;
    req.id = (char *)id_arg;
    req.force = o->force;
    req.grace_seconds = o->grace_s;
    Ztrain__V1__Job *job;
    if (zt_rpc_call(c, "/ztrain.v1.Trainer/CancelJob", &req.base, &ztrain__v1__job__descriptor,
                    (ProtobufCMessage **)&job) != ZT_OK)
        return zt_cli_fail(NULL);
    char id[64];
    char *reason = shown(job->reason);
    printf("%s: %s%s%s\n", shown_in(job->id, id, sizeof id), zt_job_proto_state_name(job->state),
           reason[0] ? " - " : "", reason);
    free(reason);
    protobuf_c_message_free_unpacked(&job->base, NULL);
    return 0;
}

/* Every id is tried, as `kubectl delete` and `docker stop` do; the exit status says whether
 * any failed (each failure is on stderr, naming its id). */
static int cmd_cancel(const options *o, zt_rpc_client *c) {
    int rc = cancel_one(o, c, o->arg);
    for (size_t i = 0; i < o->n_more; i++)
        if (cancel_one(o, c, o->more[i]) != 0)
            rc = 1;
    return rc;
}

static int cmd_watch(const options *o, zt_rpc_client *c) {
    return watch_job(c, o->arg, o->from_step, stdout, false);
}

static const struct {
    const char *name;
    int (*run)(const options *o, zt_rpc_client *c);
    bool needs_arg;
    const char *arg_name;
} commands[] = {
    {"submit", cmd_submit, true, "the job file"}, {"list", cmd_list, false, NULL},
    {"status", cmd_status, true, "the job id"},   {"watch", cmd_watch, true, "the job id"},
    {"logs", cmd_logs, true, "the job id"},       {"cancel", cmd_cancel, true, "the job id"},
};

/* The stand-in for the checkpoint directory ztraind gives a job without one
 * (<runs root>/<job id>/ckpt), which a dry run cannot know: the local checks then judge the
 * job as the server will (checkpoint_interval and resume need a directory). Nothing is made. */
#define DRY_RUN_CKPT "train.checkpoint_dir=\"RUNS_ROOT/JOB_ID/ckpt\""

/* submit --dry-run: the JobSpec exactly as it would be sent (through the same JSON -> proto
 * mapping, so a key the proto cannot carry fails here too), then the job judged on this host
 * as `ztrain run` would judge it, with the checkpoint directory ztraind would give it when it
 * has none. Nothing is sent. */
static int dry_run(const options *o) {
    Ztrain__V1__JobSpec *spec = NULL;
    if (read_spec(o, &spec) != ZT_OK)
        return zt_cli_fail(NULL);
    int bad = o->fork_from ? set_fork_from(o, spec) : 0;
    char *text = NULL;
    zt_status s = bad ? ZT_OK : zt_job_proto_spec_to_json(spec, &text);
    bool server_ckpt = !spec->train || !spec->train->checkpoint_dir ||
                       !spec->train->checkpoint_dir[0];
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    if (bad)
        return bad;
    if (s != ZT_OK)
        return zt_cli_fail(NULL);
    printf("the JobSpec submit would send:\n%s\n\n", text);
    free(text);
    fprintf(stderr, "ztrain: submit --dry-run: nothing was sent; the checks below are this "
                    "host's (ztraind resolves data paths inside its --data-root and admits by "
                    "its own limits)\n");
    const char *sets[sizeof o->sets / sizeof o->sets[0] + 1];
    memcpy(sets, o->sets, o->n_sets * sizeof *sets);
    size_t n_sets = o->n_sets;
    if (server_ckpt) {
        fprintf(stderr, "ztrain: submit --dry-run: train.checkpoint_dir is not set: ztraind "
                        "will use <runs root>/<job id>/ckpt, checked below as %s\n",
                DRY_RUN_CKPT);
        sets[n_sets++] = DRY_RUN_CKPT;
    }
    return zt_cli_validate(o->arg, sets, n_sets);
}

/* The options every remote command takes, which may also come before the command. */
static bool is_global(const char *a, size_t n) {
    static const char *const globals[] = {"--server", "--token-file", "--tls-ca", "--tls-cert",
                                          "--tls-key"};
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strlen(globals[i]) == n && strncmp(a, globals[i], n) == 0)
            return true;
    return false;
}

int zt_cli_remote_hoist_globals(int argc, char **argv) {
    int i = 1;
    while (i < argc && strncmp(argv[i], "--", 2) == 0 &&
           is_global(argv[i], strcspn(argv[i], "="))) {
        if (!strchr(argv[i], '=') && i + 1 >= argc) {
            fprintf(stderr, "ztrain: %s needs a value\n", argv[i]);
            return 2;
        }
        i += strchr(argv[i], '=') ? 1 : 2;
    }
    if (i == 1)
        return 0;
    /* `ztrain --server X --help` asks for the help, as kubectl's does: the globals change
     * nothing there. */
    bool help = i < argc && (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0 ||
                             strcmp(argv[i], "--version") == 0);
    if (!help && (i >= argc || !zt_cli_remote_is_command(argv[i]))) {
        char opt[32];
        snprintf(opt, sizeof opt, "%.*s", (int)strcspn(argv[1], "="), argv[1]);
        fprintf(stderr, "ztrain: %s is an option of the commands that talk to ztraind (submit, "
                        "list, status, watch, logs, cancel)%s%s%s: ztrain %s %s list\n",
                opt, i < argc ? ", not of '" : "", i < argc ? argv[i] : "",
                i < argc ? "'" : "", opt, strcmp(opt, "--server") == 0 ? "HOST:PORT" : "FILE");
        return 2;
    }
    char *command = argv[i];
    memmove(&argv[2], &argv[1], (size_t)(i - 1) * sizeof *argv);
    argv[1] = command;
    return 0;
}

bool zt_cli_remote_is_command(const char *command) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, command) == 0)
            return true;
    return false;
}

int zt_cli_remote_main(const char *command, int argc, char **argv) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(commands[i].name, command) != 0)
            continue;
        options o = {.command = command};
        int rc = parse_options(&o, argc, argv);
        if (rc)
            return rc;
        if (commands[i].needs_arg && !o.arg)
            return usage_error(&o, "%s is missing", commands[i].arg_name);
        if (!commands[i].needs_arg && o.arg)
            return usage_error(&o, "unexpected argument '%s'", o.arg);
        if (o.dry_run)
            return dry_run(&o);
        zt_rpc_client *c;
        rc = connect_client(&o, &c);
        if (rc)
            return rc;
        rc = commands[i].run(&o, c);
        zt_rpc_client_destroy(c);
        return rc;
    }
    fprintf(stderr, "ztrain: unknown command '%s'\n", command);
    return 2;
}
