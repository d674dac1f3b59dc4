/* ztrain: the command-line front end.
 *
 *   ztrain prepare --tokenizer T --out DIR INPUT...   text/JSONL to token shards (cli_prepare.h)
 *   ztrain run JOB.json [--out DIR] [--threads N] [--profile] [--set K=V]...
 *             [--max-device-memory SIZE]                train a job here
 *   ztrain validate JOB.json [--set K=V]...            the resolved job, config, memory, verdict
 *   ztrain init --hf DIR [--deepspeed DS.json]         write a job file (cli_init.h)
 *   ztrain help [CMD], ztrain completion bash|zsh      from the command table (cli_commands.h)
 *   ztrain estimate JOB.json [--json] [--max-device-memory SIZE]   the job's memory, as
 *                                                     admission judges it
 *   ztrain config-keys [-o json]                      the DeepSpeed key table, as markdown or JSON
 *   ztrain sample CKPT_DIR [options]                  generate text from a checkpoint
 *   ztrain export CKPT_DIR --out FILE [--tag TAG]     write the weights as HF safetensors
 *   ztrain export CKPT_DIR --hf DIR [--max-shard-size SIZE]   a Hugging Face model directory
 *   ztrain submit|list|status|watch|logs|cancel ...   talk to a running ztraind (cli_remote.h)
 *
 * Exit status: 0 success, 1 the job or command failed (the message says why), 2 bad usage,
 * 130 stopped by a signal at a step's end (its checkpoint written when the job has a
 * checkpoint_dir), 137 (128 + SIGKILL, as docker and the shells report a SIGKILLed process) the
 * ranks were SIGKILLed on a second signal, their last step not checkpointed. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli_args.h"
#include "cli_chat.h"
#include "cli_commands.h"
#include "cli_config_keys.h"
#include "cli_init.h"
#include "cli_prepare.h"
#include "cli_text.h"
#include "cli_remote.h"
#include "launcher.h"
#include "ztrain/admission.h"
#include "ztrain/text.h"
#include "ztrain/checkpoint.h"
#include "ztrain/engine.h"
#include "ztrain/gpu.h"
#include "ztrain/hf_config.h"
#include "ztrain/job_overrides.h"
#include "ztrain/json_util.h"
#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/sampler.h"
#include "ztrain/stop_signals.h"
#include "ztrain/tmp_paths.h"
#include "ztrain/trainer.h"

#ifndef ZTRAIN_VERSION
#define ZTRAIN_VERSION "unknown"
#endif

static void print_usage(FILE *f) {
    zt_cli_print_usage(f);
}

/* Set by the thread that takes SIGINT and SIGTERM during an in-process `ztrain run`
 * (ztrain/stop_signals.h). */
static volatile sig_atomic_t stop_requested;

/* `ztrain run`'s status when the ranks were SIGKILLed on a second signal: 128 + SIGKILL. */
#define ZT_CLI_EXIT_KILLED 137

int zt_cli_fail(const char *what) {
    /* The message may quote a server's answer or a file's name: control characters are shown,
     * not acted on. */
    char *msg = zt_text_escape_dup(zt_last_error(), ZT_ESCAPE_KEEP_NEWLINE);
    fprintf(stderr, "ztrain: %s%s\n", what ? what : "", msg ? msg : "(out of memory)");
    free(msg);
    return 1;
}

static int bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "ztrain: ");
    fprintf(stderr, fmt, arg);
    /* The command is the message's first word ("run: unknown option ..."). */
    size_t n = strcspn(fmt, ":");
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), fmt);
    fputc('\n', stderr);
    zt_cli_print_short_usage(stderr, fmt[n] == ':' ? name : NULL);
    return 2;
}

int zt_cli_parse_long(const char *opt, const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "ztrain: %s expects an integer in [%ld, %ld], got '%s'\n", opt, min, max, s);
        return -1;
    }
    *out = v;
    return 0;
}

int zt_cli_parse_double(const char *opt, const char *s, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= min && v <= max)) {
        fprintf(stderr, "ztrain: %s expects a number in [%g, %g], got '%s'\n", opt, min, max, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* The limits of a job that starts now on this host: what the host (or this process's memory
 * cgroup) has available. False, with a warning, when that cannot be read: the job then runs
 * unchecked, as it would have. */
static bool host_limits(zt_admission_limits *lim, zt_host_memory *hm) {
    if (zt_host_memory_read(hm) != ZT_OK) {
        fprintf(stderr, "ztrain: warning: %s; the job's memory is not checked\n", zt_last_error());
        return false;
    }
    *lim = (zt_admission_limits){
        .host_bytes = hm->available,
        .host_name = hm->cgroup_limited ? "what this process's memory cgroup has left"
                                        : "the memory available on this host (MemAvailable)"};
    return true;
}

/* A "cuda" job's device limits when it starts here: --max-device-memory when given, and the
 * smallest of the visible GPUs its ranks would take (LOCAL_RANK 0 .. world_size - 1, as
 * zt_gpu_for_rank gives them out). Without a visible GPU there is no GPU to judge against, as
 * before this check: only the option applies. */
static void device_limits(const zt_job_spec *job, uint64_t max_device, zt_admission_limits *lim) {
    static char gpu_name[320];
    if (job->device != ZT_DEVICE_CUDA)
        return;
    lim->device_bytes = max_device;
    lim->device_name = "--max-device-memory";
    const int n = zt_gpu_count();
    lim->gpus = n;
    for (int r = 0; r < job->world_size && r < n; r++) {
        zt_gpu_props p;
        int g = zt_gpu_for_rank(r, n);
        if (zt_gpu_props_get(g, &p) != ZT_OK ||
            (lim->gpu_bytes && p.total_bytes >= lim->gpu_bytes))
            continue;
        lim->gpu_bytes = p.total_bytes;
        snprintf(gpu_name, sizeof gpu_name, "GPU %d (%s)", g, p.name);
        lim->gpu_name = gpu_name;
    }
}

/* The verdict as the exit status, after the whole report: a script can gate a submission on
 * `ztrain estimate JOB.json` alone, as on `ztrain validate`. */
static int estimate_status(bool fits) {
    return fits ? 0 : 1;
}

static int cmd_estimate(int argc, char **argv) {
    const char *job_path = NULL;
    bool json = false;
    uint64_t max_device = 0;
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        int kind = zt_cli_word_kind(argv[i], &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            if (job_path)
                return bad_usage("estimate: unexpected argument '%s'", argv[i]);
            job_path = argv[i];
            continue;
        }
        bool value = strcmp(argv[i], "--max-device-memory") == 0 ||
                     strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0;
        if (value && i + 1 >= argc)
            return bad_usage("estimate: %s needs a value", argv[i]);
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) {
            /* The one structured form; the text is the default. */
            if (strcmp(argv[++i], "json") != 0)
                return bad_usage("estimate: -o expects json, got '%s'", argv[i]);
            json = true;
        } else if (strcmp(argv[i], "--max-device-memory") == 0) {
            if (zt_parse_bytes(argv[++i], "--max-device-memory", &max_device) != ZT_OK)
                return bad_usage("estimate: %s", zt_last_error());
        } else
            return zt_cli_unknown_option("estimate", argv[i]);
    }
    if (!job_path)
        return bad_usage("estimate: %sthe job file is missing", "");
    zt_job_spec job;
    if (zt_job_spec_load(&job, job_path) != ZT_OK)
        return zt_cli_fail(NULL);
    zt_memory_estimate e;
    zt_admission_limits lim = {0};
    zt_host_memory hm = {0};
    bool checked = host_limits(&lim, &hm);
    device_limits(&job, max_device, &lim);
    zt_status s = zt_memory_estimate_job(&job, job_path, &e);
    /* The host's verdict and the device's apart, so each line says what it judged. */
    char why[2048] = "";
    zt_admission_limits host_only = lim, device_only = lim;
    host_only.device_bytes = host_only.gpu_bytes = 0;
    device_only.rank_bytes = device_only.job_bytes = device_only.host_bytes = 0;
    bool host_fits = s == ZT_OK && zt_admission_check(&job, &host_only, job_path, NULL) == ZT_OK;
    bool device_fits = s == ZT_OK &&
                       zt_admission_check(&job, &device_only, job_path, NULL) == ZT_OK;
    if (s == ZT_OK && !device_fits)
        snprintf(why, sizeof why, "%s", zt_last_error());
    bool fits = host_fits && device_fits;
    zt_job_spec_free(&job);
    if (s != ZT_OK)
        return zt_cli_fail(NULL);
    /* A "cuda" job's device figure, its terms and the GPU it was judged against. */
    char device[1024] = "";
    if (e.has_device) {
        const zt_device_estimate *d = &e.device;
        int at = snprintf(device, sizeof device,
                          ", \"device_bytes\": %llu, \"device_terms\": {\"param_bytes\": %llu, "
                          "\"grad_bytes\": %llu, \"optimizer_bytes\": %llu, "
                          "\"fp32_copy_bytes\": %llu, \"setup_bytes\": %llu, "
                          "\"activation_bytes\": %llu, \"cublas_bytes\": %llu, "
                          "\"workspace_bytes\": %llu}, \"device_reserve_bytes\": %llu",
                          (unsigned long long)d->total_bytes, (unsigned long long)d->param_bytes,
                          (unsigned long long)d->grad_bytes,
                          (unsigned long long)d->optimizer_bytes,
                          (unsigned long long)d->fp32_copy_bytes,
                          (unsigned long long)d->setup_bytes,
                          (unsigned long long)d->activation_bytes,
                          (unsigned long long)d->cublas_bytes,
                          (unsigned long long)d->workspace_bytes,
                          (unsigned long long)ZT_DEVICE_RESERVE_BYTES);
        if (lim.gpu_bytes && at > 0 && (size_t)at < sizeof device)
            at += snprintf(device + at, sizeof device - (size_t)at,
                           ", \"gpu_total_bytes\": %llu", (unsigned long long)lim.gpu_bytes);
        if (max_device && at > 0 && (size_t)at < sizeof device)
            snprintf(device + at, sizeof device - (size_t)at, ", \"max_device_bytes\": %llu",
                     (unsigned long long)max_device);
    }
    if (json) {
        printf("{\"params\": %llu, \"padded\": %llu, \"stage\": %d, \"world_size\": %d, "
               "\"tp_size\": %d, \"zero_size\": %d, \"param_size\": %d, \"state_size\": %d, \"param_bytes\": %llu, "
               "\"grad_bytes\": %llu, \"optimizer_bytes\": %llu, \"offload_bytes\": %llu, "
               "\"workspace_bytes\": %llu, \"activation_bytes\": %llu, \"micro_batch\": %d, "
               "\"overhead_bytes\": %llu, \"rank_bytes\": %llu, \"ranks_per_host\": %d, "
               "\"host_bytes\": %llu, \"job_bytes\": %llu, \"available_bytes\": %llu%s, "
               "\"fits\": %s}\n",
               (unsigned long long)e.params, (unsigned long long)e.padded, e.stage, e.world_size,
               e.tp_size, e.zero_size, e.param_size, e.state_size, (unsigned long long)e.param_bytes,
               (unsigned long long)e.grad_bytes, (unsigned long long)e.optimizer_bytes,
               (unsigned long long)e.offload_bytes, (unsigned long long)e.workspace_bytes,
               (unsigned long long)e.activation_bytes, e.micro_batch,
               (unsigned long long)e.overhead_bytes, (unsigned long long)e.rank_bytes,
               e.ranks_per_host, (unsigned long long)e.host_bytes,
               (unsigned long long)e.job_bytes, (unsigned long long)hm.available, device,
               fits ? "true" : "false");
        return estimate_status(fits);
    }
    char desc[768], host[32], avail[32];
    zt_memory_estimate_describe(&e, desc, sizeof desc);
    zt_format_bytes(e.host_bytes, host, sizeof host);
    zt_format_bytes(hm.available, avail, sizeof avail);
    printf("%s: %s\n", job_path, desc);
    if (e.has_device) {
        char dev[512];
        zt_device_estimate_describe(&e.device, dev, sizeof dev);
        printf("device memory: %s\n", dev);
        if (lim.gpu_bytes || max_device) {
            char limit[32];
            zt_format_bytes(lim.gpu_bytes ? lim.gpu_bytes : max_device, limit, sizeof limit);
            printf("against %s, %s%s: %s\n",
                   lim.gpu_bytes ? lim.gpu_name : "--max-device-memory", limit,
                   lim.gpu_bytes ? " (less 1 GiB for the CUDA context, NCCL and cuDNN)" : "",
                   device_fits ? "fits" : "does not fit");
        } else {
            printf("no GPU is visible here: the device figure is not checked\n");
        }
    }
    if (checked)
        printf("%d rank%s on this host: %s of %s available: %s\n", e.ranks_per_host,
               e.ranks_per_host == 1 ? "" : "s", host, avail,
               host_fits ? "fits" : "does not fit");
    if (why[0])
        printf("%s\n", why);
    return estimate_status(fits);
}

/* The --set overrides of a command line, at most ZT_CLI_MAX_SETS. */
#define ZT_CLI_MAX_SETS 64

static int add_set(const char *cmd, const char *v, const char **sets, size_t *n) {
    if (*n == ZT_CLI_MAX_SETS) {
        fprintf(stderr, "ztrain: %s: at most %d --set overrides\n", cmd, ZT_CLI_MAX_SETS);
        return 2;
    }
    /* The override's form is the command line's business (a usage error); its key and value
     * are judged against the job file when it is read. */
    if (!zt_cli_set_form_ok(v)) {
        fprintf(stderr, "ztrain: %s: --set '%s': expected KEY.PATH=VALUE (train.max_steps=30)\n",
                cmd, v);
        zt_cli_print_short_usage(stderr, cmd);
        return 2;
    }
    sets[(*n)++] = v;
    return 0;
}

/* What `ztrain run` refuses of a valid job because it starts every rank on this host, without a
 * daemon; `ztrain validate` checks it too (ztrain submit --dry-run does not: ztraind may launch
 * elsewhere). True with why set to the reason ("run: ..."). */
static bool refused_here(const zt_job_spec *job, const char *job_path, char *why, size_t n) {
    if (job->nodes > 1) {
        snprintf(why, n, "run: %s asks for %d nodes, but `ztrain run` starts every rank on this "
                 "host: use srun/sbatch (examples/slurm/) or ztraind --launcher slurm", job_path,
                 job->nodes);
        return true;
    }
    /* The spec says nothing of this host's GPUs (its ranks may run under Slurm elsewhere);
     * `ztrain run` starts them here, so here is where a GPU must be. */
    if (job->device == ZT_DEVICE_CUDA && zt_backend_device_count(ZT_DEVICE_CUDA) == 0) {
        snprintf(why, n, "run: %s: device \"cuda\": no CUDA device is visible on this host (no "
                 "GPU or driver, or CUDA_VISIBLE_DEVICES hides them), and `ztrain run` starts "
                 "every rank here: run it on a GPU host, submit it to ztraind --launcher slurm, "
                 "or use \"device\": \"cpu\"", job_path);
        return true;
    }
    /* A fork's checkpoint is put in place by ztraind at submit; here there is no job to fork
     * from, and training from scratch instead would hide that. */
    if (job->fork_job) {
        snprintf(why, n, "run: %s: fork_from is for ztraind (ztrain submit --fork-from); under "
                 "`ztrain run`, copy the checkpoint into train.checkpoint_dir and set "
                 "train.resume", job_path);
        return true;
    }
    return false;
}

static int cmd_run(int argc, char **argv) {
    const char *job_path = NULL, *out = NULL;
    const char *sets[ZT_CLI_MAX_SETS];
    size_t n_sets = 0;
    long threads = 0;
    bool profile = false;
    uint64_t max_device = 0;
    int took;
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        int kind = zt_cli_word_kind(argv[i], &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            if (job_path)
                return bad_usage("run: unexpected argument '%s'", argv[i]);
            job_path = argv[i];
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--max-device-memory") == 0 && i + 1 < argc) {
            if (zt_parse_bytes(argv[++i], "--max-device-memory", &max_device) != ZT_OK)
                return bad_usage("run: %s", zt_last_error());
        }
        else if ((took = zt_cli_profile_arg("ztrain: run", argc, argv, i)) != 0) {
            if (took < 0)
                return 2;
            i += took - 1;
            profile = true;
        } else if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
            if (add_set("run", argv[++i], sets, &n_sets))
                return 2;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            if (zt_cli_parse_long("--threads", argv[++i], 1, 1024, &threads))
                return 2;
        } else
            return zt_cli_unknown_option("run", argv[i]);
    }
    if (!job_path)
        return bad_usage("run: %sthe job file is missing", "");
    if (out && !out[0])
        return bad_usage("run: %s--out needs a directory, got ''", "");
    zt_job_spec job;
    if (zt_job_overrides_load(&job, job_path, sets, n_sets) != ZT_OK)
        return zt_cli_fail(NULL);
    /* A single-rank job trains in this process: its stop signals go to a thread of their own
     * before anything else starts a thread (the CUDA driver's below, OpenMP's), which would
     * otherwise take them unhandled (ztrain/stop_signals.h). A launcher of ranks keeps them: it
     * forwards them, and its ranks must not inherit a blocked mask. */
    if (job.world_size <= 1 && zt_stop_signals_start(&stop_requested) != ZT_OK) {
        zt_job_spec_free(&job);
        return zt_cli_fail(NULL);
    }
    /* Once per job, here, before any rank starts: the ranks are told they need not. */
    if (zt_job_spec_check_files(&job, job_path) != ZT_OK ||
        zt_job_spec_check_rank_dirs(&job, job_path) != ZT_OK) {
        zt_job_spec_free(&job);
        return zt_cli_fail(NULL);
    }
    zt_job_spec_print_notes(&job, stderr);
    char why[1024];
    if (refused_here(&job, job_path, why, sizeof why)) {
        fprintf(stderr, "ztrain: %s\n", why);
        zt_job_spec_free(&job);
        return 1;
    }
    if (job.max_restarts > 0)
        fprintf(stderr, "ztrain: run: max_restarts is ztraind's: `ztrain run` does not restart "
                "failed ranks\n");
    /* Judged before a rank starts: a job that cannot fit would only grow until the kernel's
     * OOM killer ends it, perhaps with other processes. */
    zt_admission_limits lim = {0};
    zt_host_memory hm;
    if (!host_limits(&lim, &hm))
        lim = (zt_admission_limits){0};
    device_limits(&job, max_device, &lim);
    if (zt_admission_check(&job, &lim, job_path, NULL) != ZT_OK) {
        zt_job_spec_free(&job);
        return zt_cli_fail(NULL);
    }
    char default_out[1024];
    if (!out) {
        snprintf(default_out, sizeof default_out, "runs/%s", job.name ? job.name : "job");
        out = default_out;
    }
    char model[512];
    zt_model_spec_describe(&job.model, model, sizeof model);
    /* DeepSpeed's batch arithmetic: its world size is the data-parallel one (the ranks over
     * pipeline stages and tensor-parallel shards), so it is named as that. */
    printf("ztrain %s: job '%s', %s, batch %d = %d × %d × %d data-parallel rank%s, "
           "metrics in %s/metrics.jsonl\n",
           ZTRAIN_VERSION, job.name, model,
           job.ds.train_batch_size, job.ds.train_micro_batch_size_per_gpu,
           job.ds.gradient_accumulation_steps, job.ds.world_size,
           job.ds.world_size == 1 ? "" : "s", out);
    if (job.world_size > 1) {
        /* Several ranks run as that many ztrain-worker processes (the binary next to this one),
         * which this process only supervises; rank 0 prints the progress and the final line.
         * The launcher takes SIGINT/SIGTERM itself and forwards them to the ranks. */
        int world_size = job.world_size;
        zt_job_spec_free(&job);
        char worker[4096];
        ssize_t n = readlink("/proc/self/exe", worker, sizeof worker);
        if (n <= 0 || (size_t)n > sizeof worker - sizeof "/ztrain-worker") {
            fprintf(stderr, "ztrain: cannot read this program's path from /proc/self/exe: %s\n",
                    n < 0 ? strerror(errno) : "too long");
            return 1;
        }
        worker[n] = '\0';
        strcpy(strrchr(worker, '/'), "/ztrain-worker");
        /* --threads reaches the ranks as their OMP_NUM_THREADS, which the launcher weighs
         * against the cores. */
        /* The ranks read the job file themselves, with the same overrides. */
        char *wargv[7 + 2 * ZT_CLI_MAX_SETS] = {"ztrain-worker", (char *)job_path, "--out",
                                                (char *)out, "--validated"};
        int w = 5;
        if (profile)
            wargv[w++] = "--profile";
        for (size_t k = 0; k < n_sets; k++) {
            wargv[w++] = "--set";
            wargv[w++] = (char *)sets[k];
        }
        zt_launch_options lo = {.program = worker, .argv = wargv, .world_size = world_size,
                                .threads_per_rank = (int)threads};
        zt_launch_result lr;
        if (zt_launch_ranks(&lo, &lr) != ZT_OK) {
            fprintf(stderr, "ztrain: %s: %s\n", job_path, zt_last_error());
            return 1;
        }
        if (lr.killed) {
            fprintf(stderr, "ztrain: %s: the ranks were killed on a second signal; their last "
                            "step was not checkpointed\n", job_path);
            return ZT_CLI_EXIT_KILLED;
        }
        return lr.stopped ? 130 : 0;
    }
    zt_train_options opts = {.out_dir = out, .progress = stdout, .threads = (int)threads,
                             .stop_requested = &stop_requested, .profile = profile};
    zt_train_result res;
    zt_status s = zt_train_run(&job, &opts, &res);
    bool checkpointed = job.train.checkpoint_dir != NULL;
    zt_job_spec_free(&job);
    if (s != ZT_OK) {
        fprintf(stderr, "ztrain: %s: %s\n", job_path, zt_last_error());
        return 1;
    }
    if (res.stopped) {
        printf("stopped at step %lld%s\n", res.steps,
               checkpointed ? " (checkpoint written)" : "");
        return 130;
    }
    zt_train_result_print(&res, stdout);
    return 0;
}

/* What `ztrain validate -o json` prints (docs/getting-started.md): {"valid", "errors", "warnings",
 * "resolved", "effective_config"}. NULL members in text mode, where each message goes to stderr
 * as it comes. */
typedef struct {
    cJSON *root, *errors, *warnings, *resolved;
} validate_report;

/* A failure of the job: a line of the report, or "ztrain: MESSAGE" on stderr. Returns 1. */
static int validate_error(validate_report *r, const char *msg) {
    if (!r->root) {
        char *m = zt_text_escape_dup(msg, ZT_ESCAPE_KEEP_NEWLINE);
        fprintf(stderr, "ztrain: %s\n", m ? m : "(out of memory)");
        free(m);
    } else {
        cJSON_AddItemToArray(r->errors, cJSON_CreateString(msg));
    }
    return 1;
}

/* The lines of text (each "ztrain: ...\n") as strings of `into`, without the newline. */
static void add_lines(cJSON *into, const char *text) {
    for (const char *p = text; p && *p;) {
        size_t n = strcspn(p, "\n");
        char *line = strndup(p, n);
        if (line)
            cJSON_AddItemToArray(into, cJSON_CreateString(line));
        free(line);
        p += n + (p[n] == '\n');
    }
}

/* `ztrain validate` (here: also what `run` refuses because it starts the ranks on this host) and
 * `ztrain submit --dry-run`: everything `run` checks before a rank starts, printed, and nothing
 * made. With `json`, one JSON object on stdout instead (the warnings in it, not on stderr). */
static int validate_job(const char *job_path, const char *const *sets, size_t n_sets, bool here,
                        validate_report *r) {
    bool text_out = !r->root;
    char *text = NULL, *applied = NULL;
    if (zt_json_read_config(job_path, &text, NULL) != ZT_OK)
        return validate_error(r, zt_last_error());
    /* The job as read after the overrides: what run or submit would use. A "deepspeed" file
     * is read relative to the job file, as the job's parser reads it. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", job_path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    zt_status s = zt_job_overrides_apply(text, job_path, dir, sets, n_sets, &applied);
    free(text);
    if (s != ZT_OK)
        return validate_error(r, zt_last_error());
    zt_job_spec job;
    if (zt_job_overrides_load(&job, job_path, sets, n_sets) != ZT_OK) {
        free(applied);
        return validate_error(r, zt_last_error());
    }
    if (text_out)
        printf("job %s%s:\n%s\n", job_path, n_sets ? " with its --set overrides" : "", applied);
    free(applied);
    int rc = 0;
    if (zt_job_spec_check_files(&job, job_path) != ZT_OK ||
        (here && zt_job_spec_check_rank_dirs(&job, job_path) != ZT_OK))
        rc = validate_error(r, zt_last_error());
    /* Warnings go to stderr, as `run` prints them. */
    if (text_out) {
        zt_job_spec_print_notes(&job, stderr);
    } else {
        add_lines(r->resolved, job.ds.resolved);
        char *w = NULL;
        size_t wn = 0;
        FILE *m = open_memstream(&w, &wn);
        if (m) {
            zt_ds_config_print_warnings(&job.ds, m);
            fclose(m);
            add_lines(r->warnings, w);
        }
        free(w);
    }
    char why[1024];
    if (here && refused_here(&job, job_path, why, sizeof why))
        rc = validate_error(r, why);
    if (text_out) {
        printf("\neffective DeepSpeed config (ds_config.effective.json):\n%s\n",
               job.ds_effective_json ? job.ds_effective_json : "(none)");
    } else {
        cJSON *eff = job.ds_effective_json ? cJSON_Parse(job.ds_effective_json) : NULL;
        cJSON_ReplaceItemInObjectCaseSensitive(r->root, "effective_config",
                                               eff ? eff : cJSON_CreateNull());
    }
    zt_memory_estimate e;
    if (zt_memory_estimate_job(&job, job_path, &e) != ZT_OK) {
        rc = validate_error(r, zt_last_error());
    } else {
        char desc[768];
        zt_memory_estimate_describe(&e, desc, sizeof desc);
        if (text_out)
            printf("\nmemory: %s\n", desc);
        if (e.has_device && text_out) {
            char dev[512];
            zt_device_estimate_describe(&e.device, dev, sizeof dev);
            printf("device memory: %s\n", dev);
        }
        zt_admission_limits lim;
        zt_host_memory hm;
        if (host_limits(&lim, &hm)) {
            device_limits(&job, 0, &lim);
            if (zt_admission_check(&job, &lim, job_path, NULL) == ZT_OK) {
                char avail[32];
                zt_format_bytes(hm.available, avail, sizeof avail);
                if (text_out)
                    printf("admission: fits this host (%s available)\n", avail);
            } else {
                if (text_out)
                    printf("admission: refused: %s\n", zt_last_error());
                else
                    validate_error(r, zt_last_error());
                rc = 1;
            }
        }
    }
    zt_job_spec_free(&job);
    if (rc == 0 && text_out)
        printf("%s: valid; nothing was made\n", job_path);
    return rc;
}

static int validate(const char *job_path, const char *const *sets, size_t n_sets, bool here,
                    bool json) {
    validate_report r = {0};
    if (!json)
        return validate_job(job_path, sets, n_sets, here, &r);
    r.root = cJSON_CreateObject();
    cJSON_AddBoolToObject(r.root, "valid", false);
    r.errors = cJSON_AddArrayToObject(r.root, "errors");
    r.warnings = cJSON_AddArrayToObject(r.root, "warnings");
    r.resolved = cJSON_AddArrayToObject(r.root, "resolved");
    cJSON_AddNullToObject(r.root, "effective_config");
    if (!r.resolved) {
        cJSON_Delete(r.root);
        fprintf(stderr, "ztrain: validate: out of memory\n");
        return 1;
    }
    int rc = validate_job(job_path, sets, n_sets, here, &r);
    cJSON_ReplaceItemInObjectCaseSensitive(r.root, "valid", cJSON_CreateBool(rc == 0));
    char *out = cJSON_Print(r.root);
    cJSON_Delete(r.root);
    if (!out) {
        fprintf(stderr, "ztrain: validate: out of memory\n");
        return 1;
    }
    printf("%s\n", out);
    free(out);
    return rc;
}

int zt_cli_validate(const char *job_path, const char *const *sets, size_t n_sets) {
    return validate(job_path, sets, n_sets, false, false);
}

static int cmd_validate(int argc, char **argv) {
    const char *job_path = NULL;
    const char *sets[ZT_CLI_MAX_SETS];
    size_t n_sets = 0;
    bool json = false, operands = false;
    for (int i = 0; i < argc; i++) {
        int kind = zt_cli_word_kind(argv[i], &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            if (job_path)
                return bad_usage("validate: unexpected argument '%s'", argv[i]);
            job_path = argv[i];
        } else if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
            if (add_set("validate", argv[++i], sets, &n_sets))
                return 2;
        } else if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) &&
                   i + 1 < argc) {
            /* The one structured form; the text is the default. */
            if (strcmp(argv[++i], "json") != 0)
                return bad_usage("validate: -o expects json, got '%s'", argv[i]);
            json = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else
            return zt_cli_unknown_option("validate", argv[i]);
    }
    if (!job_path)
        return bad_usage("validate: %sthe job file is missing", "");
    return validate(job_path, sets, n_sets, true, json);
}

static void print_token(int32_t token, void *ctx) {
    int vocab = *(int *)ctx;
    if (vocab <= 256)
        putchar(token);
    else
        printf("%d ", token);
    fflush(stdout);
}

static int parse_token_list(const char *s, int32_t *tokens, int cap, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || *n >= cap)
            return -1;
        tokens[(*n)++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return 0;
}

/* Fills the model's parameters from a checkpoint's weights, tensor by tensor, matched by name. */
static zt_status load_checkpoint_weights(zt_model *m, zt_ckpt_weights *w) {
    if (zt_ckpt_weights_count(w) != m->n_tensors)
        return zt_error(ZT_ERR_FORMAT, "checkpoint: %d weight tensors for a model of %d",
                        zt_ckpt_weights_count(w), m->n_tensors);
    zt_status s = ZT_OK;
    for (int i = 0; i < m->n_tensors && s == ZT_OK; i++) {
        const zt_tensor_info *t = &m->tensors[i];
        int k = 0;
        while (k < m->n_tensors && strcmp(zt_ckpt_weights_tensor(w, k)->name, t->name) != 0)
            k++;
        if (k == m->n_tensors || zt_ckpt_weights_tensor(w, k)->numel != t->numel)
            return zt_error(ZT_ERR_FORMAT, "checkpoint: no tensor '%s' of %zu values", t->name,
                            t->numel);
        float *v = malloc((t->numel ? t->numel : 1) * sizeof *v);
        if (!v)
            return zt_error(ZT_ERR_NOMEM, "checkpoint: out of memory reading '%s'", t->name);
        s = zt_ckpt_weights_read(w, k, 0, v, t->numel);
        if (s == ZT_OK)
            s = zt_model_set_params(m, t->offset, v, t->numel);
        free(v);
    }
    return s;
}

/* The tag cmd reads from the checkpoint dir into out[size]: --tag TAG, which must name an entry
 * inside dir, else the one a resume would take (zt_ckpt_find_default), whose note goes on
 * stderr. 0, or the exit status after saying why not. */
static int pick_tag(const char *cmd, const char *dir, const char *tag, char *out, size_t size) {
    if (tag && !zt_ckpt_tag_is_name(tag)) {
        fprintf(stderr, "ztrain: %s: --tag '%s' is not a tag: the name of a checkpoint in %s "
                "(not empty, no '/', not '.' or '..')\n", cmd, tag, dir);
        return 2;
    }
    if (tag && strlen(tag) >= size) {
        fprintf(stderr, "ztrain: %s: --tag '%s' is too long for a tag\n", cmd, tag);
        return 2;
    }
    if (tag) {
        snprintf(out, size, "%s", tag);
        return 0;
    }
    char note[4096];
    if (zt_ckpt_find_default(dir, cmd, out, size, note, sizeof note) != ZT_OK)
        return zt_cli_fail(NULL);
    if (note[0])
        fprintf(stderr, "ztrain: %s\n", note);
    return 0;
}

static int cmd_sample(int argc, char **argv) {
    const char *dir = NULL, *tag = NULL, *prompt = NULL, *prompt_tokens = NULL, *tok_path = NULL;
    const char *chat = NULL, *chat_template = NULL;
    long n_tokens = 200, top_k = 40, seed = 1337, threads = 0;
    double temperature = 0.8;
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        int kind = zt_cli_word_kind(a, &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            if (dir)
                return bad_usage("sample: unexpected argument '%s'", a);
            dir = a;
        } else if (strcmp(a, "--tag") == 0 && has)
            tag = argv[++i];
        else if (strcmp(a, "--prompt") == 0 && has)
            prompt = argv[++i];
        else if (strcmp(a, "--prompt-tokens") == 0 && has)
            prompt_tokens = argv[++i];
        else if (strcmp(a, "--tokenizer") == 0 && has)
            tok_path = argv[++i];
        else if (strcmp(a, "--chat") == 0 && has)
            chat = argv[++i];
        else if (strcmp(a, "--chat-template") == 0 && has)
            chat_template = argv[++i];
        else if (strcmp(a, "--tokens") == 0 && has) {
            if (zt_cli_parse_long(a, argv[++i], 1, 1000000, &n_tokens))
                return 2;
        } else if (strcmp(a, "--top-k") == 0 && has) {
            if (zt_cli_parse_long(a, argv[++i], 0, 1 << 30, &top_k))
                return 2;
        } else if (strcmp(a, "--seed") == 0 && has) {
            if (zt_cli_parse_long(a, argv[++i], 0, 0x7fffffffL, &seed))
                return 2;
        } else if (strcmp(a, "--threads") == 0 && has) {
            if (zt_cli_parse_long(a, argv[++i], 1, 1024, &threads))
                return 2;
        } else if (strcmp(a, "--temperature") == 0 && has) {
            if (zt_cli_parse_double(a, argv[++i], -HUGE_VAL, HUGE_VAL, &temperature))
                return 2;
        } else
            return zt_cli_unknown_option("sample", a);
    }
    if (!dir)
        return bad_usage("sample: %sthe checkpoint directory is missing", "");
    if (chat && (prompt || prompt_tokens))
        return bad_usage("sample: %s--chat takes the place of --prompt and --prompt-tokens", "");
    if (prompt && prompt_tokens)
        return bad_usage("sample: %s--prompt TEXT and --prompt-tokens LIST are two prompts: give "
                         "one", "");
    if (chat_template && !chat)
        return bad_usage("sample: %s--chat-template needs --chat", "");
    /* Options are judged before anything is loaded or printed (a prompt is echoed). */
    if (!(temperature > 0)) {
        char got[64];
        snprintf(got, sizeof got, "%g", temperature);
        return bad_usage("sample: --temperature must be positive, got %s", got);
    }
    char picked[256];
    int picked_rc = pick_tag("sample", dir, tag, picked, sizeof picked);
    if (picked_rc)
        return picked_rc;
    tag = picked;
    zt_model_spec spec;
    zt_ckpt_weights *w = NULL;
    if (zt_ckpt_weights_open(&w, dir, tag, ZT_CKPT_WORKING, &spec) != ZT_OK)
        return zt_cli_fail(NULL);
    zt_backend *be = NULL;
    zt_model *m = NULL;
    int rc = 0;
    int32_t *tokens = NULL;
    char *ckpt_tok = NULL;
    zt_tokenizer_t *tok = NULL;
    zt_cli_text text = {0};
    /* The job's tokenizer, recorded in the checkpoint; one that cannot be read is an error here,
     * not a sample without text. */
    if (!tok_path && !prompt_tokens) {
        if (zt_ckpt_read_tokenizer(dir, tag, &ckpt_tok) != ZT_OK) {
            rc = zt_cli_fail("sample: ");
            goto done;
        }
        tok_path = ckpt_tok;
    }
    if (tok_path && zt_tokenizer_load(tok_path, &tok) != ZT_OK) {
        rc = zt_cli_fail("sample: ");
        goto done;
    }
    zt_backend_options bo = {.threads = (int)threads};
    if (zt_backend_create(&be, ZT_DEVICE_CPU, &bo) != ZT_OK ||
        zt_model_create(&m, &spec, be, ZT_F32, 1, 1) != ZT_OK ||
        load_checkpoint_weights(m, w) != ZT_OK) {
        rc = zt_cli_fail(NULL);
        goto done;
    }
    if (chat) {
        zt_sample_options so = {.temperature = (float)temperature, .top_k = (int)top_k,
                                .seed = (uint64_t)seed};
        if (!tok)
            rc = bad_usage("sample: %s--chat needs a tokenizer (--tokenizer, or the job's "
                           "data.tokenizer)", "");
        else
            rc = zt_cli_sample_chat(m, tok, tok_path, chat, chat_template, (int)n_tokens, &so);
        goto done;
    }
    /* Room for the whole prompt, however long (a command line holds at most a few MB): the
     * model sees its last block_size tokens, as the sampler crops every step's context. A
     * tokenizer's encoding may add a few special tokens to one per byte. */
    size_t prompt_room = 1;
    if (prompt_tokens)
        for (const char *p = prompt_tokens; *p; p++)
            prompt_room += *p == ',';
    else
        prompt_room = (prompt ? strlen(prompt) : 0) + (tok ? 64 : 1);
    int prompt_cap = (int)prompt_room, cap = (int)n_tokens + prompt_cap + 1, n_prompt = 0;
    tokens = malloc(sizeof(int32_t) * (size_t)cap);
    if (!tokens) {
        fprintf(stderr, "ztrain: sample: out of memory for a prompt of %d tokens\n", prompt_cap);
        rc = 1;
        goto done;
    }
    if (tok && !prompt_tokens) {
        if (zt_cli_text_prompt(&text, tok, prompt ? prompt : "", spec.vocab_size, tokens,
                               prompt_cap, &n_prompt) != ZT_OK) {
            rc = zt_cli_fail(NULL);
            goto done;
        }
    } else if (prompt_tokens) {
        if (parse_token_list(prompt_tokens, tokens, prompt_cap, &n_prompt) != 0) {
            rc = bad_usage("sample: --prompt-tokens expects comma-separated integers, got '%s'",
                           prompt_tokens);
            goto done;
        }
    } else if (prompt && *prompt) {
        if (spec.vocab_size < 256) {
            fprintf(stderr, "ztrain: --prompt is text (bytes) but the model's vocab_size is %d; "
                            "use --prompt-tokens\n", spec.vocab_size);
            rc = 2;
            goto done;
        }
        for (const unsigned char *p = (const unsigned char *)prompt; *p && n_prompt < prompt_cap;
             p++)
            tokens[n_prompt++] = *p;
    } else {
        tokens[n_prompt++] = spec.vocab_size <= 256 ? '\n' : 50256; /* newline / <|endoftext|> */
    }
    for (int i = 0; i < n_prompt; i++) {
        if (tokens[i] < 0 || tokens[i] >= spec.vocab_size) {
            fprintf(stderr, "ztrain: sample: prompt token %d is outside the model's vocab_size %d\n",
                    tokens[i], spec.vocab_size);
            rc = 2;
            goto done;
        }
    }
    if (n_prompt > spec.block_size)
        fprintf(stderr, "ztrain: sample: the prompt is %d tokens, more than the model's "
                "block_size %d: the model sees its last %d as context\n", n_prompt,
                spec.block_size, spec.block_size);
    if (spec.vocab_size <= 256 && !text.tok)
        for (int i = 0; i < n_prompt; i++)
            putchar(tokens[i]);
    zt_sample_options so = {.temperature = (float)temperature, .top_k = (int)top_k,
                            .seed = (uint64_t)seed};
    if (zt_sample_generate(m, tokens, n_prompt, n_prompt + (int)n_tokens, &so,
                           text.tok ? zt_cli_text_on_token : print_token,
                           text.tok ? (void *)&text : (void *)&spec.vocab_size) != ZT_OK)
        rc = zt_cli_fail(NULL);
    if (text.tok)
        zt_cli_text_finish(&text);
    putchar('\n');
done:
    if (text.tok)
        zt_cli_text_finish(&text);
    zt_tokenizer_destroy(tok);
    free(ckpt_tok);
    free(tokens);
    zt_model_destroy(m);
    zt_backend_destroy(be);
    zt_ckpt_weights_close(w);
    return rc;
}

/* `export --hf DIR`: a Hugging Face directory, streamed from the checkpoint. */
static int export_hf(const char *dir, const char *tag, const char *out, const char *max_size) {
    uint64_t max_bytes = 5000000000ULL; /* save_pretrained's default, "5GB" */
    if (max_size && !zt_hf_parse_size(max_size, &max_bytes))
        return bad_usage("export: --max-shard-size expects a size such as 5GB, 200MiB or a "
                         "byte count, got '%s'", max_size);
    zt_hf_export_result res;
    if (zt_hf_export(dir, tag, out, max_bytes, &res) != ZT_OK)
        return zt_cli_fail(NULL);
    printf("wrote %s (%zu parameters, %d shard%s, %llu bytes)\n", out, res.n_params,
           res.n_shards, res.n_shards == 1 ? "" : "s", (unsigned long long)res.total_bytes);
    if (res.n_positions > 0)
        printf("n_positions is %d, the job's block_size: training crops GPT-2's position table "
               "to block_size, so the checkpoint holds only those rows\n", res.n_positions);
    if (res.tokenizer_files > 0)
        printf("with the job's tokenizer (%d file%s)\n", res.tokenizer_files,
               res.tokenizer_files == 1 ? "" : "s");
    if (res.tokenizer_missing[0])
        fprintf(stderr, "ztrain: warning: the job's tokenizer %s no longer exists: %s has no "
                "tokenizer\n", res.tokenizer_missing, out);
    if (res.source_missing[0])
        fprintf(stderr, "ztrain: warning: %s, the model directory the job started from, has no "
                "config.json any more: %s takes its special token ids and generation_config.json "
                "from beside the job's tokenizer, where there are any\n", res.source_missing, out);
    return 0;
}

/* `export --out FILE`: FILE goes in a directory that exists, named as such rather than through
 * the temporary file written beside it. An existing file is replaced (the new one is renamed over
 * it once written, as DeepSpeed's zero_to_fp32 and torch.save replace theirs), and says so; a
 * directory or another kind of file there is refused. A directory of --hf is refused unless
 * empty instead: files of an older export left beside a new one would mix two models. */
static int check_export_out(const char *out) {
    struct stat st;
    if (lstat(out, &st) == 0) {
        if (!S_ISREG(st.st_mode)) {
            fprintf(stderr, "ztrain: export: --out %s exists and is not a regular file\n", out);
            return 1;
        }
        fprintf(stderr, "ztrain: export: --out %s exists: it is replaced\n", out);
    }
    char dir[4096];
    const char *slash = strrchr(out, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) : 1, slash ? out : ".");
    if (slash == out)
        snprintf(dir, sizeof dir, "/");
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ztrain: export: --out %s: no such directory %s\n", out, dir);
        return 1;
    }
    return 0;
}

static int cmd_export(int argc, char **argv) {
    const char *dir = NULL, *tag = NULL, *out = NULL, *hf = NULL, *max_size = NULL;
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        int kind = zt_cli_word_kind(argv[i], &operands);
        if (kind < 0)
            continue;
        if (kind > 0) {
            if (!dir)
                dir = argv[i];
            else if (!out && !hf)
                out = argv[i];
            else
                return bad_usage("export: unexpected argument '%s'", argv[i]);
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--hf") == 0 && i + 1 < argc)
            hf = argv[++i];
        else if (strcmp(argv[i], "--max-shard-size") == 0 && i + 1 < argc)
            max_size = argv[++i];
        else if (strcmp(argv[i], "--tag") == 0 && i + 1 < argc)
            tag = argv[++i];
        else
            return zt_cli_unknown_option("export", argv[i]);
    }
    if (!dir || (!out && !hf))
        return bad_usage("export: %sexpects CKPT_DIR and --out FILE or --hf DIR", "");
    if (out && hf)
        return bad_usage("export: %s--out FILE and --hf DIR are two formats: give one", "");
    if (max_size && !hf)
        return bad_usage("export: %s--max-shard-size goes with --hf DIR", "");
    char picked[256];
    int rc = pick_tag("export", dir, tag, picked, sizeof picked);
    if (rc)
        return rc;
    tag = picked;
    /* Before anything starts a thread: an interrupted export leaves neither FILE.tmp nor
     * DIR.tmp-PID/ behind. */
    if (zt_tmp_remove_on_signals() != ZT_OK)
        return zt_cli_fail(NULL);
    if (hf)
        return export_hf(dir, tag, hf, max_size);
    rc = check_export_out(out);
    if (rc)
        return rc;
    /* Streamed tensor by tensor from the checkpoint's files (a ZeRO-3 checkpoint's shards), never
     * the whole model in memory. */
    if (zt_ckpt_export_fp32(dir, tag, out) != ZT_OK)
        return zt_cli_fail(NULL);
    printf("wrote %s\n", out);
    return 0;
}

/* `zero-to-fp32 CKPT_DIR OUT.safetensors`: DeepSpeed's zero_to_fp32 is `export --out`, since
 * both consolidate the fp32 master weights whatever the ZeRO stage and rank count that wrote
 * them (zt_ckpt_export_fp32); its own usage, without export's --hf options. */
static int cmd_zero_to_fp32(int argc, char **argv) {
    const char *dir = NULL, *tag = NULL, *out = NULL;
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        int kind = zt_cli_word_kind(argv[i], &operands);
        if (kind < 0)
            continue;
        if (kind == 0 && strcmp(argv[i], "--tag") == 0 && i + 1 < argc)
            tag = argv[++i];
        else if (kind == 0)
            return zt_cli_unknown_option("zero-to-fp32", argv[i]);
        else if (!dir)
            dir = argv[i];
        else if (!out)
            out = argv[i];
        else
            return bad_usage("zero-to-fp32: unexpected argument '%s'", argv[i]);
    }
    if (!dir || !out)
        return bad_usage("zero-to-fp32: %sexpects CKPT_DIR and OUT.safetensors", "");
    char picked[256];
    int rc = pick_tag("zero-to-fp32", dir, tag, picked, sizeof picked);
    if (rc)
        return rc;
    tag = picked;
    if (zt_tmp_remove_on_signals() != ZT_OK)
        return zt_cli_fail(NULL);
    if (zt_ckpt_export_fp32(dir, tag, out) != ZT_OK)
        return zt_cli_fail(NULL);
    printf("wrote %s\n", out);
    return 0;
}

int main(int argc, char **argv) {
    /* Global options may come first (ztrain --server X list, ztrain --server X --help). */
    int hoisted = zt_cli_remote_hoist_globals(argc, argv);
    if (hoisted)
        return hoisted;
    /* Bare `ztrain` is a request for help, as bare `docker` and `kubectl` are: exit 0. */
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("ztrain %s\n", ZTRAIN_VERSION);
        return 0;
    }
    if (zt_cli_wants_help("ztrain", "", 1, argv + 1) < 0)
        return 2;
    const char *cmd = argv[1];
    const zt_cli_command *c = zt_cli_command_find(cmd);
    if (!c)
        return zt_cli_unknown_command(cmd);
    int n;
    char **args = zt_cli_split_equals(c->options, argc - 2, argv + 2, &n);
    if (!args) {
        fprintf(stderr, "ztrain: out of memory\n");
        return 1;
    }
    char who[48];
    snprintf(who, sizeof who, "ztrain: %s", c->name);
    int rc, help = zt_cli_wants_help(who, c->options, n, args);
    if (help < 0)
        rc = 2;
    else if (help) {
        zt_cli_print_command_help(stdout, c);
        rc = 0;
    } else if (strcmp(cmd, "help") == 0 || strcmp(cmd, "completion") == 0) {
        /* They take operands only: a "--" before them ends no options. */
        int skip = n > 0 && strcmp(args[0], "--") == 0;
        rc = (cmd[0] == 'h' ? zt_cli_help_main : zt_cli_completion_main)(n - skip, args + skip);
    }
    else if (strcmp(cmd, "prepare") == 0)
        rc = zt_cli_prepare(n, args);
    else if (strcmp(cmd, "run") == 0)
        rc = cmd_run(n, args);
    else if (strcmp(cmd, "validate") == 0)
        rc = cmd_validate(n, args);
    else if (strcmp(cmd, "init") == 0)
        rc = zt_cli_init(n, args);
    else if (strcmp(cmd, "estimate") == 0)
        rc = cmd_estimate(n, args);
    else if (strcmp(cmd, "config-keys") == 0)
        rc = zt_cli_config_keys(n, args);
    else if (strcmp(cmd, "sample") == 0)
        rc = cmd_sample(n, args);
    else if (strcmp(cmd, "export") == 0)
        rc = cmd_export(n, args);
    else if (strcmp(cmd, "zero-to-fp32") == 0)
        rc = cmd_zero_to_fp32(n, args);
    else
        rc = zt_cli_remote_main(cmd, n, args);
    free(args);
    return rc;
}
