/* Fuzz target: ztraind's HTTP server, from the raw bytes of a request to the answer. The input
 * is sent as it is over a TCP connection to a real server (zt_http_start) on 127.0.0.1, so it
 * goes through libmicrohttpd's request parsing (request line, headers, query arguments with
 * their percent-decoding, chunked bodies) and then all of ztraind's own: the Host and Origin
 * checks, the bearer token, the routing of the path, every route's query arguments and the
 * cancel body. The server runs over a real job manager that holds three finished jobs (one
 * succeeded with metric records and a checkpoint, one failed, one cancelled), so the job routes
 * have something to answer with; none of them can change any more, so every input meets the
 * same server.
 *
 * What comes back is checked for what may never happen: an answer that is not HTTP, a wildcard
 * CORS header, job data for a request that did not carry the token, a connection that is not
 * closed once the request is over. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "fuzz_util.h"
#include "api/auth.h"
#include "http/http_api.h"
#include "daemon/job_manager.h"

#define TOKEN "fuzz-token"
/* How long the answer to one input may take before the connection counts as hung. */
#define ANSWER_TIMEOUT_S 15

static zt_jobs *jobs;
static zt_http_server *server;
static int port;

static const char ok_job[] =
    "{\"name\": \"fuzz-ok\", \"model\": {\"type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, "
    "\"n_embd\": 8, \"vocab_size\": 256, \"block_size\": 8}, \"data\": {\"train\": \"train.txt\"},"
    " \"train\": {\"max_steps\": 3, \"log_interval\": 1}, \"deepspeed\": {\"train_batch_size\": 2,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}}}";
/* init_from names a file that exists but holds no safetensors: the submit (which checks that the
 * file can be opened) accepts it, the worker refuses it and the job fails. */
static const char failing_job[] =
    "{\"name\": \"fuzz-fail\", \"model\": {\"type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, "
    "\"n_embd\": 8, \"vocab_size\": 256, \"block_size\": 8, \"init_from\": \"train.txt\"}, "
    "\"data\": {\"train\": \"train.txt\"},"
    " \"deepspeed\": {\"train_batch_size\": 2, \"optimizer\": {\"type\": \"AdamW\"}}}";
static const char long_job[] =
    "{\"name\": \"fuzz-cancelled\", \"model\": {\"type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2,"
    " \"n_embd\": 8, \"vocab_size\": 256, \"block_size\": 8}, \"data\": {\"train\": \"train.txt\"},"
    " \"train\": {\"max_steps\": 1000000}, \"deepspeed\": {\"train_batch_size\": 2,"
    " \"optimizer\": {\"type\": \"AdamW\"}}}";

static void wait_terminal(const char *id) {
    for (int i = 0; i < 2400; i++) {
        zt_job_info info;
        FUZZ_CHECK(zt_jobs_get(jobs, id, &info) == ZT_OK, "%s: %s", id, zt_last_error());
        bool done = zt_job_state_terminal(info.state);
        zt_job_info_free(&info);
        if (done)
            return;
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    FUZZ_CHECK(false, "%s did not finish within 120 s", id);
}

static void submit(const char *spec, char id[32]) {
    zt_job_info info = {0};
    FUZZ_CHECK(zt_jobs_submit(jobs, spec, NULL, &info) == ZT_OK, "submit: %s", zt_last_error());
    snprintf(id, 32, "%s", info.id);
    zt_job_info_free(&info);
}

/* At exit, before the temporary directory goes: the server's threads and the supervisor stop
 * first, so that nothing runs while the process ends. */
static void stop_server(void) {
    zt_http_stop(server);
    zt_jobs_destroy(jobs);
}

static void start_server(void) {
    const char *tmp = fuzz_tmpdir();
    char data[PATH_MAX], runs[PATH_MAX], db[PATH_MAX], path[PATH_MAX + 32];
    snprintf(data, sizeof data, "%s/data", tmp);
    snprintf(runs, sizeof runs, "%s/runs", tmp);
    snprintf(db, sizeof db, "%s/ztraind.db", tmp);
    FUZZ_CHECK(mkdir(data, 0700) == 0 && mkdir(runs, 0700) == 0, "cannot make the roots");
    unsigned char bytes[2048];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)("the quick brown fox jumps over the lazy dog "[i % 44]);
    snprintf(path, sizeof path, "%s/train.txt", data);
    fuzz_write_file(path, bytes, sizeof bytes);

    zt_jobs_config jc = {.data_root = data, .runs_root = runs, .db_path = db,
                         .worker_path = ZT_FUZZ_WORKER, .max_ranks = 1, .max_world_size = 1,
                         .max_jobs = 8, .threads_per_rank = 1, .default_grace_s = 5};
    FUZZ_CHECK(zt_jobs_create(&jobs, &jc) == ZT_OK, "job manager: %s", zt_last_error());
    char ok[32], failing[32], cancelled[32];
    submit(ok_job, ok);
    submit(failing_job, failing);
    submit(long_job, cancelled);
    zt_job_info info = {0};
    FUZZ_CHECK(zt_jobs_cancel(jobs, cancelled, true, 0, &info) == ZT_OK, "cancel: %s",
               zt_last_error());
    zt_job_info_free(&info);
    wait_terminal(ok);
    wait_terminal(failing);
    wait_terminal(cancelled);
    FUZZ_CHECK(zt_jobs_get(jobs, ok, &info) == ZT_OK && info.state == ZT_JOB_SUCCEEDED,
               "the job that should succeed ended %s (%s)", zt_job_state_name(info.state),
               info.reason ? info.reason : "");
    zt_job_info_free(&info);

    static const char *const hosts[] = {"ztrain.example"};
    static const char *const origins[] = {"https://dash.example"};
    /* One admin token, as ZTRAIN_TOKEN gives it. */
    static zt_auth_tokens *tokens;
    setenv("ZTRAIN_TOKEN", TOKEN, 1);
    FUZZ_CHECK(zt_auth_load_tokens(NULL, &tokens) == ZT_OK && tokens, "tokens: %s",
               zt_last_error());
    zt_http_config hc = {.host = "127.0.0.1", .port = 0, .tokens = tokens,
                         .web_dir = ZT_FUZZ_WEB_DIR, .chartjs_dir = ZT_FUZZ_WEB_DIR,
                         .hosts = hosts, .n_hosts = 1, .origins = origins, .n_origins = 1,
                         .page_key = &(zt_page_key){{1, 2, 3}}};
    FUZZ_CHECK(zt_http_start(&server, &hc, jobs) == ZT_OK, "HTTP: %s", zt_last_error());
    port = zt_http_port(server);
    atexit(stop_server);
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends the request, half-closes, and reads the whole answer into a growing buffer. libFuzzer's
 * timer signal interrupts the calls now and then, so they are retried on EINTR against one
 * deadline. */
static char *exchange(const uint8_t *req, size_t size, size_t *len) {
    int64_t deadline = mono_ms() + ANSWER_TIMEOUT_S * 1000;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&a, sizeof a)) != 0 && errno == EINTR)
        ;
    FUZZ_CHECK(rc == 0 || errno == EISCONN, "connect: %s", strerror(errno));
    /* The server may answer and close before it has read everything (a refused Host, a body
     * too large): a failed send is not an error, the answer is what counts. */
    for (size_t sent = 0; sent < size;) {
        ssize_t n = send(fd, req + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EINTR && errno != EAGAIN)
            break;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline - mono_ms();
        FUZZ_CHECK(left > 0, "the server read no more of the request for %d s", ANSWER_TIMEOUT_S);
        poll(&p, 1, (int)left);
    }
    shutdown(fd, SHUT_WR);
    size_t cap = 8192;
    char *buf = malloc(cap + 1);
    FUZZ_CHECK(buf != NULL, "out of memory");
    *len = 0;
    for (;;) {
        if (*len == cap) {
            buf = realloc(buf, 2 * cap + 1);
            FUZZ_CHECK(buf != NULL, "out of memory");
            cap *= 2;
        }
        ssize_t n = recv(fd, buf + *len, cap - *len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            break;
        if (n > 0) {
            *len += (size_t)n;
            continue;
        }
        FUZZ_CHECK(errno == EINTR || errno == EAGAIN, "recv: %s", strerror(errno));
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - mono_ms();
        FUZZ_CHECK(left > 0, "the server neither answered nor closed in %d s", ANSWER_TIMEOUT_S);
        poll(&p, 1, (int)left);
    }
    buf[*len] = '\0';
    close(fd);
    return buf;
}

static bool contains_caseless(const uint8_t *data, size_t size, const char *word) {
    size_t n = strlen(word);
    for (size_t i = 0; i + n <= size; i++)
        if (strncasecmp((const char *)data + i, word, n) == 0)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!server)
        start_server();
    size_t len;
    char *answer = exchange(data, size, &len);
    if (len > 0)
        FUZZ_CHECK(strncmp(answer, "HTTP/1.", len < 7 ? len : 7) == 0, "not an HTTP answer: %.64s",
                   answer);
    /* As a header line: a body may quote a request's header back (JSON-escaped, so without a
     * raw line break). */
    FUZZ_CHECK(!memmem(answer, len, "\r\nAccess-Control-Allow-Origin: *\r\n", 34),
               "a wildcard CORS answer");
    /* The token reaches the server in the Authorization header, or as ?access_token= on an
     * event stream, where it may be percent-encoded (and libmicrohttpd matches argument names
     * whatever their case). A request with neither may not see a job's run directory or
     * Prometheus' job labels (JSON escapes the quotes of anything the request itself made the
     * server echo). */
    bool may_have_token = memmem(data, size, "Bearer " TOKEN, 17) || memchr(data, '%', size) ||
                          contains_caseless(data, size, "access_token");
    if (!may_have_token) {
        FUZZ_CHECK(!memmem(answer, len, "\"run_dir\":", 10), "job data without the token");
        FUZZ_CHECK(!memmem(answer, len, "job=\"job-", 9), "job metrics without the token");
    }
    free(answer);
    return 0;
}
