/* `ztrain prepare`: parses the options into zt_prepare_options, draws a progress bar with MB/s and
 * tokens/s when stderr is a terminal, and prints the summary (documents, tokens, bytes per token,
 * shards, skipped lines). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "cli_args.h"
#include "cli_commands.h"
#include "cli_prepare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_remote.h"
#include "ztrain/prepare.h"
#include "ztrain/tmp_paths.h"


typedef struct {
    struct timespec start;
    double last;
    bool tty;
} progress_state;

static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void on_progress(void *ctx, uint64_t done, uint64_t total, uint64_t tokens) {
    progress_state *p = ctx;
    double el = seconds_since(&p->start);
    if (!p->tty || (el - p->last < 0.2 && done < total))
        return;
    p->last = el;
    double frac = total ? (double)done / (double)total : 1.0;
    if (frac > 1)
        frac = 1;
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : ' ';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %5.1f%%  %7.2f MB/s  %9.0f tokens/s", bar, 100 * frac,
            el > 0 ? (double)done / el / 1e6 : 0.0, el > 0 ? (double)tokens / el : 0.0);
    fflush(stderr);
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "ztrain: prepare: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    zt_cli_print_short_usage(stderr, "prepare");
    return 2;
}

int zt_cli_prepare(int argc, char **argv) {
    zt_prepare_options o = {.n_threads = 1, .seed = 1234};
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs)
        return 1;
    int rc = 0;
    bool overlong = false;
    bool operands = false;
    for (int i = 0; i < argc && rc == 0; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        double d;
        int kind = zt_cli_word_kind(a, &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            inputs[o.n_inputs++] = a;
        } else if (strcmp(a, "--lines") == 0) {
            o.text_lines = true;
        } else if (strcmp(a, "--skip-bad-lines") == 0) {
            o.skip_bad_lines = true;
        } else if (strcmp(a, "--overwrite") == 0) {
            o.overwrite = true;
        } else if (strncmp(a, "--", 2) == 0 && !v) {
            rc = zt_cli_unknown_option("prepare", a);
        } else if (strcmp(a, "--tokenizer") == 0) {
            o.tokenizer = argv[++i];
        } else if (strcmp(a, "--out") == 0) {
            o.out_dir = argv[++i];
        } else if (strcmp(a, "--name") == 0) {
            o.name = argv[++i];
        } else if (strcmp(a, "--field") == 0) {
            o.field = argv[++i];
        } else if (strcmp(a, "--separator") == 0) {
            o.separator = argv[++i];
        } else if (strcmp(a, "--format") == 0) {
            i++;
            if (strcmp(v, "text") == 0)
                o.format = ZT_PREPARE_TEXT;
            else if (strcmp(v, "chat") == 0)
                o.format = ZT_PREPARE_CHAT;
            else if (strcmp(v, "prompt-completion") == 0)
                o.format = ZT_PREPARE_PROMPT_COMPLETION;
            else
                rc = usage_error("--format is text, chat or prompt-completion, got '%s'", v);
        } else if (strcmp(a, "--chat-template") == 0) {
            o.chat_template = argv[++i];
        } else if (strcmp(a, "--max-length") == 0) {
            if (zt_cli_parse_long(a, argv[++i], 1, 2147483647L, &n) != 0)
                rc = 2;
            o.max_length = n;
        } else if (strcmp(a, "--overlong") == 0) {
            i++;
            overlong = true;
            if (strcmp(v, "truncate") == 0 || strcmp(v, "drop") == 0)
                o.drop_long = strcmp(v, "drop") == 0;
            else
                rc = usage_error("--overlong is truncate or drop, got '%s'", v);
        } else if (strcmp(a, "--dtype") == 0) {
            i++;
            if (strcmp(v, "uint16") == 0)
                o.dtype = ZT_PREPARE_DTYPE_U16;
            else if (strcmp(v, "uint32") == 0)
                o.dtype = ZT_PREPARE_DTYPE_U32;
            else
                rc = usage_error("--dtype is uint16 or uint32, got '%s'", v);
        } else if (strcmp(a, "--val-fraction") == 0) {
            if (zt_cli_parse_double(a, argv[++i], 0, 0.999999, &d) != 0)
                rc = 2;
            o.val_fraction = d;
        } else if (strcmp(a, "--shard-size") == 0) {
            if (zt_cli_parse_long(a, argv[++i], 2, 2147483647L, &n) != 0)
                rc = 2;
            o.shard_tokens = n;
        } else if (strcmp(a, "--threads") == 0) {
            if (zt_cli_parse_long(a, argv[++i], 1, 64, &n) != 0)
                rc = 2;
            o.n_threads = (int)n;
        } else if (strcmp(a, "--seed") == 0) {
            if (zt_cli_parse_long(a, argv[++i], 0, 2147483647L, &n) != 0)
                rc = 2;
            o.seed = (uint64_t)n;
        } else {
            rc = zt_cli_unknown_option("prepare", a);
        }
    }
    if (rc == 0 && (!o.tokenizer || !o.out_dir))
        rc = usage_error("%s--tokenizer and --out are required", "");
    if (rc == 0 && o.format == ZT_PREPARE_TEXT && (o.max_length || o.chat_template))
        rc = usage_error("%s--max-length and --chat-template need --format chat or "
                         "prompt-completion", "");
    /* Options that the format would not read are refused rather than ignored. */
    if (rc == 0 && o.format != ZT_PREPARE_TEXT && o.text_lines)
        rc = usage_error("%s--lines applies to --format text only (a fine-tuning format reads "
                         "JSONL examples)", "");
    if (rc == 0 && o.format == ZT_PREPARE_CHAT && o.separator)
        rc = usage_error("%s--separator does not apply to --format chat (the chat template "
                         "writes the tokens between examples)", "");
    if (rc == 0 && o.format == ZT_PREPARE_PROMPT_COMPLETION && o.field)
        rc = usage_error("%s--field does not apply to --format prompt-completion (it reads "
                         "\"prompt\" and \"completion\")", "");
    if (rc == 0 && overlong && !o.max_length)
        rc = usage_error("%s--overlong needs --max-length", "");
    if (rc == 0 && o.n_inputs == 0)
        rc = usage_error("%sno input files", "");
    if (rc != 0) {
        free(inputs);
        return rc;
    }
    o.inputs = inputs;
    /* Before the tokenizer's threads start: an interrupted prepare leaves no .tmp shard. */
    if (zt_tmp_remove_on_signals() != ZT_OK) {
        free(inputs);
        return zt_cli_fail("prepare: ");
    }
    progress_state ps = {.tty = isatty(STDERR_FILENO) == 1};
    clock_gettime(CLOCK_MONOTONIC, &ps.start);
    o.progress = on_progress;
    o.progress_ctx = &ps;
    zt_prepare_stats st;
    zt_status s = zt_prepare_run(&o, &st);
    double el = seconds_since(&ps.start);
    if (ps.tty)
        fputc('\n', stderr);
    free(inputs);
    if (s != ZT_OK)
        return zt_cli_fail("prepare: ");
    printf("prepared %llu documents: %llu tokens from %llu bytes (%.2f bytes/token), vocab %d, "
           "%s tokens\n",
           (unsigned long long)st.documents, (unsigned long long)st.tokens,
           (unsigned long long)st.bytes, st.tokens ? (double)st.bytes / (double)st.tokens : 0.0,
           st.vocab_size, st.uint32_tokens ? "uint32" : "uint16");
    printf("train: %d shards, %llu tokens; val: %d shards, %llu tokens (%llu documents)\n",
           st.train_shards, (unsigned long long)(st.tokens - st.val_tokens), st.val_shards,
           (unsigned long long)st.val_tokens, (unsigned long long)st.val_documents);
    if (o.format != ZT_PREPARE_TEXT)
        printf("loss on %llu tokens (%.1f%%); over --max-length: %llu truncated, %llu dropped\n",
               (unsigned long long)st.trained_tokens,
               st.tokens ? 100.0 * (double)st.trained_tokens / (double)st.tokens : 0.0,
               (unsigned long long)st.truncated, (unsigned long long)st.dropped);
    if (o.format != ZT_PREPARE_TEXT)
        printf("train on it with \"data\": {\"format\": \"masked\"} in the job: without it "
               "the .mask files are ignored and every token is trained\n");
    if (st.bad_lines)
        printf("skipped %llu bad JSONL lines\n", (unsigned long long)st.bad_lines);
    if (st.empty_documents)
        printf("skipped %llu empty documents (empty text files, JSONL fields \"\")\n",
               (unsigned long long)st.empty_documents);
    if (st.invalid_utf8)
        printf("replaced %llu invalid UTF-8 sequences with U+FFFD\n",
               (unsigned long long)st.invalid_utf8);
    printf("%.2f s, %.2f MB/s, %.0f tokens/s on %d threads\n", el,
           el > 0 ? (double)st.bytes / el / 1e6 : 0.0, el > 0 ? (double)st.tokens / el : 0.0,
           o.n_threads);
    return 0;
}
