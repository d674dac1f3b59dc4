/* The ztrain CLI's command table and what is printed from it (cli_commands.h). */
#include <stdbool.h>
#include <string.h>

#include "cli_args.h"
#include "cli_commands.h"
#include "ztrain/text.h"

#define REMOTE_OPTIONS "--server= --token-file= --tls-ca= --tls-cert= --tls-key="

static const zt_cli_command commands[] = {
    {"run", "JOB.json [--out DIR] [--threads N] [--profile [ops]] [--set KEY.PATH=VALUE]...\n"
     "        [--max-device-memory SIZE]",
     "Train the job on this host without a daemon. Metrics go to DIR/metrics.jsonl (default\n"
     "DIR: runs/<job name>). --set overrides a key of the job file (repeatable). --profile\n"
     "(or --profile ops, --profile=ops) times every op of every step into DIR/profile.json\n"
     "(docs/profiling.md).\n"
     "--max-device-memory refuses a \"cuda\" job whose device estimate per rank is above SIZE.\n",
     "--out= --threads= --profile --set= --max-device-memory=", "file", NULL},
    {"validate", "JOB.json [--set KEY.PATH=VALUE]... [-o json | --json]",
     "Check the job as `run` and ztraind would, and print the resolved job, the effective\n"
     "DeepSpeed config, the memory estimate and the admission verdict on this host. Makes\n"
     "nothing; exit 1 when the job would be refused. -o json (or --json): one JSON object,\n"
     "{\"valid\", \"errors\", \"warnings\", \"resolved\", \"effective_config\"} (docs/getting-started.md).\n",
     "--set= -o= --output= --json", "file", "-o:json --output:json"},
    {"init", "--hf DIR [--deepspeed DS.json] [--out JOB.json] [--name NAME]",
     "Write a job file that fine-tunes the Hugging Face model directory DIR (its config.json\n"
     "gives the architecture) with the DeepSpeed config DS.json (default: a ZeRO-2 AdamW\n"
     "config with \"auto\" values). Default JOB.json: job.json; an existing file is kept.\n",
     "--hf= --deepspeed= --out= --name=", "", NULL},
    {"prepare",
     "--tokenizer TOKENIZER.json --out DIR INPUT... [--name NAME] [--field F] [--lines]\n"
     "        [--val-fraction F] [--shard-size TOKENS] [--threads N] [--seed S]\n"
     "        [--separator TOKEN] [--dtype uint16|uint32] [--skip-bad-lines] [--overwrite]\n"
     "        [--format text|chat|prompt-completion] [--chat-template TOKENIZER_CONFIG.json]\n"
     "        [--max-length N] [--overlong truncate|drop]",
     "Encode text files, JSONL files (*.jsonl: field F, default text), directories and globs\n"
     "into llm.c token shards DIR/NAME_{train,val}_NNNNNN.bin. With --format chat (JSONL\n"
     "{\"messages\": [...], \"tools\": [...], \"chat_template_kwargs\": {...}} as TRL reads it,\n"
     "or the list under --field F, rendered with the chat template of the tokenizer's\n"
     "tokenizer_config.json, tools, tool_calls and the kwargs passed to it; every assistant\n"
     "turn is trained, or with {% generation %} blocks in the template what they wrote, as\n"
     "apply_chat_template's assistant mask) or prompt-completion\n"
     "(JSONL {\"prompt\", \"completion\"}), each shard gets a loss mask\n"
     "NAME_..._NNNNNN.bin.mask (train with data.format \"masked\"); examples over\n"
     "--max-length tokens are truncated or dropped.\n",
     "--tokenizer= --out= --name= --field= --lines --val-fraction= --shard-size= --threads= "
     "--seed= --separator= --dtype= --skip-bad-lines --overwrite --format= --chat-template= "
     "--max-length= --overlong=",
     "file", "--dtype:uint16,uint32 --format:text,chat,prompt-completion --overlong:truncate,drop"},
    {"sample",
     "CKPT_DIR [--tag TAG] [--prompt TEXT | --prompt-tokens 1,2,3] [--tokens N]\n"
     "        [--temperature F] [--top-k K] [--seed S] [--threads N] [--tokenizer TOKENIZER.json]\n"
     "        [--chat CONVERSATION.json [--chat-template TOKENIZER_CONFIG.json]]",
     "Generate N tokens (default 200) from a checkpoint (default tag: the one a resume would\n"
     "take, normally latest's); with a tokenizer (default: the job's data.tokenizer) the\n"
     "prompt and output are text; the model sees the last block_size tokens of a longer\n"
     "prompt. With --chat, the conversation (a JSON list\n"
     "of messages, or an object with \"messages\", \"tools\" and \"chat_template_kwargs\") is\n"
     "rendered with the chat template (default: tokenizer_config.json beside the tokenizer)\n"
     "and the assistant's reply is printed, up to the template's eos_token.\n",
     "--tag= --prompt= --prompt-tokens= --tokens= --temperature= --top-k= --seed= --threads= "
     "--tokenizer= --chat= --chat-template=",
     "dir", NULL},
    {"export", "CKPT_DIR (--out FILE | --hf DIR [--max-shard-size SIZE]) [--tag TAG]",
     "--out: the checkpoint's weights as one safetensors file with Hugging Face names.\n"
     "--hf: a Hugging Face model directory (config.json, safetensors shards of at most SIZE,\n"
     "default 5GB, and their index) that transformers' from_pretrained loads.\n"
     "Both write fp32: after bf16/fp16 training the fp32 master weights of the optimizer\n"
     "files (cast to the 16-bit type they give the weights training ran with), else the\n"
     "weights (fp32 training, whose weights are the masters; bf16 masters).\n"
     "--tag: a checkpoint in CKPT_DIR (default: the one a resume would take, normally\n"
     "latest's).\n",
     "--out= --hf= --max-shard-size= --tag=", "dir", NULL},
    {"zero-to-fp32", "CKPT_DIR OUT.safetensors [--tag TAG]",
     "Consolidated fp32 weights of a checkpoint of any ZeRO stage and rank count, as\n"
     "DeepSpeed's zero_to_fp32: after bf16/fp16 training the fp32 master weights of the\n"
     "optimizer files, not the 16-bit weights widened; after fp32 training, or with bf16\n"
     "masters (bf16_master_weights_and_grads), the weights, which are the masters.\n"
     "The same as `export --out`.\n", "--tag=",
     "file", NULL},
    {"estimate", "JOB.json [-o json | --json] [--max-device-memory SIZE]",
     "The job's memory per rank and on this host, as `ztrain run` and ztraind judge it; for a\n"
     "\"cuda\" job also its device memory per rank, judged against the visible GPUs and\n"
     "--max-device-memory (docs/gpu.md, \"Device memory\"). -o json (or --json): one JSON\n"
     "object. Exit status 0 when the job fits, 1 when it does not (after the whole report)\n"
     "or the job file is bad, 2 bad usage.\n",
     "-o= --output= --json --max-device-memory=", "file", "-o:json --output:json"},
    {"config-keys", "[-o json | --json]",
     "Every DeepSpeed config key ztrain knows, with its fate, as a markdown table; -o json\n"
     "(or --json): a JSON array, one object per key (key, fate, stages, default, section,\n"
     "contents_listed, note; docs/deepspeed.md).\n",
     "-o= --output= --json", "", "-o:json --output:json"},
    {"submit",
     "JOB.json [--wait | --watch] [--idempotency-key K] [--fork-from ID@STEP]\n"
     "        [--set KEY.PATH=VALUE]... [--dry-run]",
     "Send the job to ztraind and print its id. --wait waits for the end, --watch shows\n"
     "progress (on stderr); both exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED. --fork-from starts\n"
     "it from job ID's checkpoint of step STEP (the spec's fork_from). --dry-run sends\n"
     "nothing: it prints what `ztrain validate` prints for the job as it would be sent.\n",
     "--wait --watch --idempotency-key= --fork-from= --set= --dry-run " REMOTE_OPTIONS, "file", NULL},
    {"list", "[--state STATE] [--limit N] [-o json|wide|name] [--json]",
     "The server's jobs, newest first. -o json (or --json): one JSON object with a \"jobs\"\n"
     "array of jobs as status -o json prints them; wide: more columns; name: the ids alone,\n"
     "one per line.\n",
     "--state= --limit= -o= --output= --json " REMOTE_OPTIONS, "",
     "-o:json,wide,name --output:json,wide,name "
     "--state:QUEUED,STARTING,RUNNING,STOPPING,SUCCEEDED,FAILED,CANCELLED"},
    {"status", "ID [-o json|name] [--json]",
     "A job's state, progress, ranks and directories; -o json (or --json) the job as the\n"
     "HTTP API's GET /api/v1/jobs/ID answers it (the proto3 JSON mapping of Job).\n",
     "-o= --output= --json " REMOTE_OPTIONS, "id", "-o:json,name --output:json,name"},
    {"watch", "ID [--from-step N]",
     "Follow a job until it ends (exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED).\n",
     "--from-step= " REMOTE_OPTIONS, "id", NULL},
    {"logs", "ID [-f] [--tail N]",
     "The job's last N log lines (default 100; 0: none); -f then follows until the job ends\n"
     "(with --tail 0, only new lines).\n",
     "-f --follow --tail= " REMOTE_OPTIONS, "id", NULL},
    {"cancel", "ID... [--force] [--grace SECONDS]",
     "Stop jobs: each writes a checkpoint first, or stops at once with --force. --grace: the\n"
     "seconds before the ranks are killed (0 or none: ztraind's --grace, default 30). Exit 1\n"
     "when any of them could not be cancelled (each is tried).\n",
     "--force --grace= " REMOTE_OPTIONS, "id", NULL},
    {"help", "[COMMAND]", "This text, or one command's.\n", "", "command", NULL},
    {"completion", "bash|zsh",
     "A completion script for the shell, generated from this table:\n"
     "  source <(ztrain completion bash)\n",
     "", "shell", NULL},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const char remote_note[] =
    "Commands for a running ztraind take --server HOST:PORT (or unix:PATH; default\n"
    "$ZTRAIN_SERVER, else 127.0.0.1:50051) and a token: --token-file FILE, else the file $ZTRAIN_TOKEN_FILE names,\n"
    "else the token $ZTRAIN_TOKEN. For a ztraind with --tls-cert: --tls-ca FILE (default\n"
    "$ZTRAIN_TLS_CA), the PEM CA that signed the server's certificate, which must name the host\n"
    "of --server; with --tls-client-ca also --tls-cert FILE and --tls-key FILE (default\n"
    "$ZTRAIN_TLS_CERT, $ZTRAIN_TLS_KEY), the client's own. Any of them turns TLS on; without\n"
    "--tls-ca the system's roots are trusted. These options may also come before the\n"
    "command, as docker and kubectl take theirs: ztrain --server HOST:PORT list.\n";

const zt_cli_command *zt_cli_commands(size_t *n) {
    *n = N_COMMANDS;
    return commands;
}

const zt_cli_command *zt_cli_command_find(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static bool is_remote(const zt_cli_command *c) {
    return strstr(c->options, "--server=") != NULL;
}

/* Each line of text indented by `indent` spaces. */
static void indented(FILE *f, const char *text, int indent) {
    while (*text) {
        size_t n = strcspn(text, "\n");
        fprintf(f, "%*s%.*s\n", indent, "", (int)n, text);
        text += n + (text[n] == '\n');
    }
}

void zt_cli_print_usage(FILE *f) {
    fputs("usage: ztrain <command> [options]      (ztrain help COMMAND, ztrain COMMAND --help)\n"
          "       ztrain --version\n\ncommands:\n", f);
    bool remote_header = false;
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const zt_cli_command *c = &commands[i];
        if (is_remote(c) && !remote_header) {
            fputs("\ncommands for a running ztraind:\n", f);
            remote_header = true;
        } else if (!is_remote(c) && remote_header) {
            fputs("\n", f);
            remote_header = false;
        }
        fprintf(f, "  %s%s%s\n", c->name, c->synopsis[0] ? " " : "", c->synopsis);
        indented(f, c->help, 6);
    }
    fputs("\n", f);
    fputs(remote_note, f);
    fputs("\nOptions take their value as --opt VALUE or --opt=VALUE (-o json, -o=json or -ojson);\n"
          "-- ends the options (ztrain run -- -job.json).\n"
          "Commands that print JSON take -o json (--output json). Exit status: 0 success,\n"
          "1 the command or the job failed, 2 bad usage, 3 a watched job was cancelled, 130\n"
          "stopped by a signal after writing a checkpoint, 137 a run whose ranks were killed on\n"
          "a second signal (128 + SIGKILL; their last step not checkpointed).\n",
          f);
}

void zt_cli_print_command_help(FILE *f, const zt_cli_command *c) {
    fprintf(f, "usage: ztrain %s%s%s\n\n", c->name, c->synopsis[0] ? " " : "", c->synopsis);
    fputs(c->help, f);
    if (is_remote(c)) {
        fputs("\n", f);
        fputs(remote_note, f);
    }
    if (c->options[0] && strstr(c->options, "="))
        fputs("\nOptions take their value as --opt VALUE or --opt=VALUE.\n", f);
}

void zt_cli_print_short_usage(FILE *f, const char *command) {
    const zt_cli_command *c = command ? zt_cli_command_find(command) : NULL;
    if (c) {
        fprintf(f, "usage: ztrain %s%s%s\n(ztrain help %s: what it does and its options)\n",
                c->name, c->synopsis[0] ? " " : "", c->synopsis, c->name);
        return;
    }
    fputs("usage: ztrain <command> [options]\ncommands:", f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, " %s", commands[i].name);
    fputs("\n(ztrain help: what each does)\n", f);
}

/* " (did you mean X?)" for a near word of text, else "". */
static const char *did_you_mean(const char *word, const char *text, char *buf, size_t size) {
    char near[64];
    if (!zt_text_suggest(word, text, near, sizeof near))
        return "";
    snprintf(buf, size, " (did you mean %s?)", near);
    return buf;
}

/* The commands' names, space-separated, into buf. */
static const char *command_names(char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_COMMANDS && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s ", commands[i].name);
    return buf;
}

int zt_cli_unknown_command(const char *word) {
    char names[512], hint[96];
    command_names(names, sizeof names);
    if (word[0] == '-')
        fprintf(stderr, "ztrain: unknown option '%s'%s\n", word,
                did_you_mean(word, REMOTE_OPTIONS " --help --version", hint, sizeof hint));
    else
        fprintf(stderr, "ztrain: unknown command '%s'%s\n", word,
                did_you_mean(word, names, hint, sizeof hint));
    zt_cli_print_short_usage(stderr, NULL);
    return 2;
}

int zt_cli_unknown_option(const char *command, const char *word) {
    const zt_cli_command *c = zt_cli_command_find(command);
    const char *options = c ? c->options : "";
    char hint[96], with_help[1024];
    if (zt_cli_takes_value(options, word)) {
        fprintf(stderr, "ztrain: %s: %s needs a value\n", command, word);
    } else {
        snprintf(with_help, sizeof with_help, "%s --help", options);
        fprintf(stderr, "ztrain: %s: unknown option '%s'%s\n", command, word,
                did_you_mean(word, with_help, hint, sizeof hint));
    }
    zt_cli_print_short_usage(stderr, command);
    return 2;
}

int zt_cli_help_main(int argc, char **argv) {
    if (argc == 0) {
        zt_cli_print_usage(stdout);
        return 0;
    }
    const zt_cli_command *c = argc == 1 ? zt_cli_command_find(argv[0]) : NULL;
    if (!c) {
        char names[512], hint[96];
        command_names(names, sizeof names);
        fprintf(stderr, "ztrain: help: %s '%s'%s (ztrain help lists them)\n",
                argc == 1 ? "no command" : "one command at most, not",
                argc == 1 ? argv[0] : argv[1],
                argc == 1 ? did_you_mean(argv[0], names, hint, sizeof hint) : "");
        return 2;
    }
    zt_cli_print_command_help(stdout, c);
    return 0;
}

/* The options of c without their '=' marks, or only those with one (values). */
static void print_options(FILE *f, const zt_cli_command *c, bool values_only) {
    const char *p = c->options;
    bool first = true;
    while (*p) {
        size_t n = strcspn(p, " ");
        bool value = n > 0 && p[n - 1] == '=';
        if (n > 0 && (!values_only || value)) {
            fprintf(f, "%s%.*s", first ? "" : " ", (int)(n - value), p);
            first = false;
        }
        p += n + (p[n] == ' ');
    }
}

/* The global options' names, as the shell scripts' case patterns take them ("A|B|..."). */
static void print_globals(FILE *f, const char *sep, const char *suffix) {
    const char *p = REMOTE_OPTIONS;
    bool first = true;
    while (*p) {
        size_t n = strcspn(p, " ");
        if (n > 0) {
            fprintf(f, "%s%.*s%s", first ? "" : sep, (int)(n - (p[n - 1] == '=')), p, suffix);
            first = false;
        }
        p += n + (p[n] == ' ');
    }
}

/* The commands' names, space-separated. */
static void print_names(FILE *f) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "%s%s", i ? " " : "", commands[i].name);
}

/* The fixed values of option `opt` (n bytes) of c, comma-separated, or NULL. */
static const char *choices_of(const zt_cli_command *c, const char *opt, size_t n, size_t *len) {
    for (const char *p = c->choices; p && *p;) {
        size_t word = strcspn(p, " ");
        const char *colon = memchr(p, ':', word);
        if (colon && (size_t)(colon - p) == n && strncmp(p, opt, n) == 0) {
            *len = word - (size_t)(colon + 1 - p);
            return colon + 1;
        }
        p += word + (p[word] == ' ');
    }
    return NULL;
}

/* The command is the first word after the global options (ztrain --server X list), which may
 * come before it as docker's and kubectl's do; bash splits "--opt=value" into "--opt" "="
 * "value" (COMP_WORDBREAKS holds '='), so an option's value may follow a "=" word. */
static void bash_script(FILE *f) {
    fputs("# bash completion for ztrain, generated by `ztrain completion bash` from its command\n"
          "# table.\n"
          "_ztrain() {\n"
          "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
          "  if [ \"$cur\" = = ]; then cur=''; elif [ \"$prev\" = = ]; then\n"
          "    prev=${COMP_WORDS[COMP_CWORD-2]}\n"
          "  fi\n"
          "  local commands='", f);
    print_names(f);
    fputs("' globals='", f);
    print_globals(f, " ", "");
    fputs("'\n"
          "  local i=1 cmd=''\n"
          "  while [ $i -lt $COMP_CWORD ]; do\n"
          "    case ${COMP_WORDS[i]} in\n"
          "      ", f);
    print_globals(f, "|", "");
    fputs(")\n"
          "        if [ \"${COMP_WORDS[i+1]}\" = = ]; then i=$((i+3)); else i=$((i+2)); fi ;;\n"
          "      *) cmd=${COMP_WORDS[i]}; break ;;\n"
          "    esac\n"
          "  done\n"
          "  case $prev in\n"
          "    --server) COMPREPLY=(); return ;;\n"
          "    --token-file|--tls-ca|--tls-cert|--tls-key)\n"
          "      COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
          "  esac\n"
          "  if [ -z \"$cmd\" ]; then\n"
          "    COMPREPLY=($(compgen -W \"$commands $globals --help --version\" -- \"$cur\"))\n"
          "    return\n"
          "  fi\n"
          "  local opts='' values='' args='' choices=''\n"
          "  case $cmd in\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const zt_cli_command *c = &commands[i];
        fprintf(f, "    %s) opts='", c->name);
        print_options(f, c, false);
        fputs("'; values='", f);
        print_options(f, c, true);
        fprintf(f, "'; args='%s'", c->args);
        if (c->choices)
            fprintf(f, "; choices='%s'", c->choices);
        fputs(" ;;\n", f);
    }
    fputs("  esac\n"
          "  case \" $values \" in\n"
          "    *\" $prev \"*)\n"
          "      local c\n"
          "      for c in $choices; do\n"
          "        if [ \"${c%%:*}\" = \"$prev\" ]; then\n"
          "          c=${c#*:}\n"
          "          COMPREPLY=($(compgen -W \"${c//,/ }\" -- \"$cur\"))\n"
          "          return\n"
          "        fi\n"
          "      done\n"
          "      COMPREPLY=($(compgen -f -- \"$cur\"))\n"
          "      return ;;\n"
          "  esac\n"
          "  if [[ $cur == -* ]]; then\n"
          "    COMPREPLY=($(compgen -W \"$opts --help\" -- \"$cur\"))\n"
          "    return\n"
          "  fi\n"
          "  case $args in\n"
          "    file) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n"
          "    dir) COMPREPLY=($(compgen -d -- \"$cur\")) ;;\n"
          "    command) COMPREPLY=($(compgen -W \"$commands\" -- \"$cur\")) ;;\n"
          "    shell) COMPREPLY=($(compgen -W 'bash zsh' -- \"$cur\")) ;;\n"
          "    *) COMPREPLY=() ;;\n"
          "  esac\n"
          "}\n"
          "complete -o filenames -F _ztrain ztrain\n", f);
}

/* The first sentence (up to ". ", "; " or ":" at a line's end) of a command's help, on one
 * line, for zsh's descriptions, with ':' and '\'' escaped. */
static void zsh_description(FILE *f, const char *help) {
    for (const char *p = help; *p; p++) {
        if ((p[0] == '.' || p[0] == ';') && (p[1] == ' ' || p[1] == '\n' || !p[1]))
            return;
        if (p[0] == ':' && (p[1] == '\n' || !p[1]))
            return;
        if (*p == ':')
            fputs("\\:", f);
        else if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p == '\n' ? ' ' : *p, f);
    }
}

/* c's _arguments specs: its options (one with fixed values completes them, another value a
 * file), then what its positional arguments complete to. */
static void zsh_specs(FILE *f, const zt_cli_command *c) {
    const char *p = c->options;
    while (*p) {
        size_t n = strcspn(p, " ");
        if (n > 0) {
            bool value = p[n - 1] == '=';
            size_t len, name = n - value;
            const char *choices = value ? choices_of(c, p, name, &len) : NULL;
            fprintf(f, " '*%.*s", (int)name, p);
            if (choices) {
                fputs(":value:(", f);
                for (size_t k = 0; k < len; k++)
                    fputc(choices[k] == ',' ? ' ' : choices[k], f);
                fputs(")", f);
            } else if (value) {
                fputs(strncmp(p, "--server", name) == 0 && name == 8 ? ":address:" : ":value:_files",
                      f);
            }
            fputs("'", f);
        }
        p += n + (p[n] == ' ');
    }
    if (strcmp(c->args, "file") == 0)
        fputs(" '*:file:_files'", f);
    else if (strcmp(c->args, "dir") == 0)
        fputs(" '*:directory:_files -/'", f);
    else if (strcmp(c->args, "shell") == 0)
        fputs(" '1:shell:(bash zsh)'", f);
    else if (strcmp(c->args, "id") == 0)
        fputs(" '*:job id: '", f);
    else if (strcmp(c->args, "command") == 0) {
        fputs(" '1:command:(", f);
        print_names(f);
        fputs(")'", f);
    }
    fputs(" '--help'", f);
}

/* As bash's, the command is the first word after the global options; _arguments is then given
 * the words from the command on, so that its positional specs count from the command's first
 * argument. */
static void zsh_script(FILE *f) {
    fputs("#compdef ztrain\n"
          "# zsh completion for ztrain, generated by `ztrain completion zsh` from its command\n"
          "# table.\n"
          "_ztrain() {\n"
          "  local -a commands\n"
          "  commands=(\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        fprintf(f, "    '%s:", commands[i].name);
        zsh_description(f, commands[i].help);
        fputs("'\n", f);
    }
    fputs("  )\n"
          "  local i=2\n"
          "  while (( i < CURRENT )); do\n"
          "    case $words[i] in\n"
          "      ", f);
    print_globals(f, "|", "");
    fputs(") (( i += 2 )) ;;\n"
          "      ", f);
    print_globals(f, "|", "=*");
    fputs(") (( i += 1 )) ;;\n"
          "      *) break ;;\n"
          "    esac\n"
          "  done\n"
          "  if (( i > CURRENT )); then\n"
          "    if [[ $words[CURRENT-1] == --server ]]; then _message 'HOST:PORT or unix:PATH'\n"
          "    else _files; fi\n"
          "    return\n"
          "  fi\n"
          "  if (( i == CURRENT )); then\n"
          "    if [[ $PREFIX == -* ]]; then\n"
          "      compadd -- ", f);
    print_globals(f, " ", "");
    fputs(" --help --version\n"
          "    else\n"
          "      _describe 'command' commands\n"
          "    fi\n"
          "    return\n"
          "  fi\n"
          "  local cmd=$words[i]\n"
          "  shift $(( i - 1 )) words\n"
          "  (( CURRENT -= i - 1 ))\n"
          "  local -a opts\n"
          "  case $cmd in\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        fprintf(f, "    %s) opts=(", commands[i].name);
        zsh_specs(f, &commands[i]);
        fputs(" ) ;;\n", f);
    }
    fputs("    *) return 1 ;;\n"
          "  esac\n"
          "  _arguments -s $opts\n"
          "}\n"
          "_ztrain \"$@\"\n", f);
}

int zt_cli_completion_main(int argc, char **argv) {
    if (argc == 1 && strcmp(argv[0], "bash") == 0) {
        bash_script(stdout);
        return 0;
    }
    if (argc == 1 && strcmp(argv[0], "zsh") == 0) {
        zsh_script(stdout);
        return 0;
    }
    fprintf(stderr, "ztrain: completion: expected one shell, bash or zsh%s%s\n",
            argc ? ", got " : "", argc ? argv[0] : "");
    return 2;
}
