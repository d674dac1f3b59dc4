/* The ztrain CLI's command table and what is printed from it (cli_commands.h). */
#include <stdbool.h>
#include <string.h>

#include "cli_commands.h"

#define REMOTE_OPTIONS "--server= --token-file= --tls-ca= --tls-cert= --tls-key="

static const zt_cli_command commands[] = {
    {"run", "JOB.json [--out DIR] [--threads N] [--profile [ops]] [--set KEY.PATH=VALUE]...\n"
     "        [--max-device-memory SIZE]",
     "Train the job on this host without a daemon. Metrics go to DIR/metrics.jsonl (default\n"
     "DIR: runs/<job name>). --set overrides a key of the job file (repeatable). --profile\n"
     "(or --profile ops, --profile=ops) times every op of every step into DIR/profile.json\n"
     "(docs/profiling.md).\n"
     "--max-device-memory refuses a \"cuda\" job whose device estimate per rank is above SIZE.\n",
     "--out= --threads= --profile --set= --max-device-memory=", "file"},
    {"validate", "JOB.json [--set KEY.PATH=VALUE]... [-o json | --json]",
     "Check the job as `run` and ztraind would, and print the resolved job, the effective\n"
     "DeepSpeed config, the memory estimate and the admission verdict on this host. Makes\n"
     "nothing; exit 1 when the job would be refused. -o json (or --json): one JSON object,\n"
     "{\"valid\", \"errors\", \"warnings\", \"resolved\", \"effective_config\"} (docs/getting-started.md).\n",
     "--set= -o= --output= --json", "file"},
    {"init", "--hf DIR [--deepspeed DS.json] [--out JOB.json] [--name NAME]",
     "Write a job file that fine-tunes the Hugging Face model directory DIR (its config.json\n"
     "gives the architecture) with the DeepSpeed config DS.json (default: a ZeRO-2 AdamW\n"
     "config with \"auto\" values). Default JOB.json: job.json; an existing file is kept.\n",
     "--hf= --deepspeed= --out= --name=", ""},
    {"prepare",
     "--tokenizer TOKENIZER.json --out DIR INPUT... [--name NAME] [--field F] [--lines]\n"
     "        [--val-fraction F] [--shard-size TOKENS] [--threads N] [--seed S]\n"
     "        [--separator TOKEN] [--dtype uint16|uint32] [--skip-bad-lines] [--overwrite]\n"
     "        [--format text|chat|prompt-completion] [--chat-template TOKENIZER_CONFIG.json]\n"
     "        [--max-length N] [--overlong truncate|drop]",
     "Encode text files, JSONL files (*.jsonl: field F, default text), directories and globs\n"
     "into llm.c token shards DIR/NAME_{train,val}_NNNNNN.bin. With --format chat (JSONL\n"
     "{\"messages\": [...]}, or the list under --field F, rendered with the chat template\n"
     "of the tokenizer's tokenizer_config.json) or prompt-completion (JSONL {\"prompt\",\n"
     "\"completion\"}), each shard gets a loss mask NAME_..._NNNNNN.bin.mask (train with\n"
     "data.format \"masked\"); examples over --max-length tokens are truncated or dropped.\n",
     "--tokenizer= --out= --name= --field= --lines --val-fraction= --shard-size= --threads= "
     "--seed= --separator= --dtype= --skip-bad-lines --overwrite --format= --chat-template= "
     "--max-length= --overlong=",
     "file"},
    {"sample",
     "CKPT_DIR [--tag TAG] [--prompt TEXT | --prompt-tokens 1,2,3] [--tokens N]\n"
     "        [--temperature F] [--top-k K] [--seed S] [--threads N] [--tokenizer TOKENIZER.json]\n"
     "        [--chat CONVERSATION.json [--chat-template TOKENIZER_CONFIG.json]]",
     "Generate N tokens (default 200) from a checkpoint (default tag: latest); with a tokenizer\n"
     "(default: the job's data.tokenizer) the prompt and output are text; the model sees the\n"
     "last block_size tokens of a longer prompt. With --chat, the conversation (a JSON list\n"
     "of {role, content}) is rendered with the chat template (default: tokenizer_config.json\n"
     "beside the tokenizer) and the assistant's reply is printed, up to the template's\n"
     "eos_token.\n",
     "--tag= --prompt= --prompt-tokens= --tokens= --temperature= --top-k= --seed= --threads= "
     "--tokenizer= --chat= --chat-template=",
     "dir"},
    {"export", "CKPT_DIR (--out FILE | --hf DIR [--max-shard-size SIZE]) [--tag TAG]",
     "--out: the checkpoint's weights as one safetensors file with Hugging Face names.\n"
     "--hf: a Hugging Face model directory (config.json, safetensors shards of at most SIZE,\n"
     "default 5GB, and their index) that transformers' from_pretrained loads.\n"
     "Both write fp32: after bf16/fp16 training the fp32 master weights of the optimizer\n"
     "files (cast to the 16-bit type they give the weights training ran with), else the\n"
     "weights (fp32 training, whose weights are the masters; bf16 masters).\n",
     "--out= --hf= --max-shard-size= --tag=", "dir"},
    {"zero-to-fp32", "CKPT_DIR OUT.safetensors [--tag TAG]",
     "Consolidated fp32 weights of a checkpoint of any ZeRO stage and rank count, as\n"
     "DeepSpeed's zero_to_fp32: after bf16/fp16 training the fp32 master weights of the\n"
     "optimizer files, not the 16-bit weights widened; after fp32 training, or with bf16\n"
     "masters (bf16_master_weights_and_grads), the weights, which are the masters.\n"
     "The same as `export --out`.\n", "--tag=",
     "file"},
    {"estimate", "JOB.json [-o json | --json] [--max-device-memory SIZE]",
     "The job's memory per rank and on this host, as `ztrain run` and ztraind judge it; for a\n"
     "\"cuda\" job also its device memory per rank, judged against the visible GPUs and\n"
     "--max-device-memory (docs/gpu.md, \"Device memory\"). -o json (or --json): one JSON\n"
     "object.\n",
     "-o= --output= --json --max-device-memory=", "file"},
    {"config-keys", "[-o json | --json]",
     "Every DeepSpeed config key ztrain knows, with its fate, as a markdown table; -o json\n"
     "(or --json): a JSON array, one object per key (key, fate, stages, default, section,\n"
     "contents_listed, note; docs/deepspeed.md).\n",
     "-o= --output= --json", ""},
    {"submit",
     "JOB.json [--wait | --watch] [--idempotency-key K] [--fork-from ID@STEP]\n"
     "        [--set KEY.PATH=VALUE]... [--dry-run]",
     "Send the job to ztraind and print its id. --wait waits for the end, --watch shows\n"
     "progress (on stderr); both exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED. --fork-from starts\n"
     "it from job ID's checkpoint of step STEP (the spec's fork_from). --dry-run sends\n"
     "nothing: it prints what `ztrain validate` prints for the job as it would be sent.\n",
     "--wait --watch --idempotency-key= --fork-from= --set= --dry-run " REMOTE_OPTIONS, "file"},
    {"list", "[--state STATE] [--limit N] [-o json|wide|name] [--json]",
     "The server's jobs, newest first. -o json (or --json): one JSON object with a \"jobs\"\n"
     "array of jobs as status -o json prints them; wide: more columns; name: the ids alone,\n"
     "one per line.\n",
     "--state= --limit= -o= --output= --json " REMOTE_OPTIONS, ""},
    {"status", "ID [-o json|name] [--json]",
     "A job's state, progress, ranks and directories; -o json (or --json) the job as the\n"
     "HTTP API's GET /api/v1/jobs/ID answers it (the proto3 JSON mapping of Job).\n",
     "-o= --output= --json " REMOTE_OPTIONS, "id"},
    {"watch", "ID [--from-step N]",
     "Follow a job until it ends (exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED).\n",
     "--from-step= " REMOTE_OPTIONS, "id"},
    {"logs", "ID [-f] [--tail N]",
     "The job's last N log lines (default 100); -f follows until it ends.\n",
     "-f --follow --tail= " REMOTE_OPTIONS, "id"},
    {"cancel", "ID... [--force] [--grace SECONDS]",
     "Stop jobs: each writes a checkpoint first, or stops at once with --force. Exit 1 when\n"
     "any of them could not be cancelled (each is tried).\n",
     "--force --grace= " REMOTE_OPTIONS, "id"},
    {"help", "[COMMAND]", "This text, or one command's.\n", "", "command"},
    {"completion", "bash|zsh",
     "A completion script for the shell, generated from this table:\n"
     "  source <(ztrain completion bash)\n",
     "", "shell"},
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
    fputs("\nOptions take their value as --opt VALUE or --opt=VALUE (-o json, -o=json or -ojson).\n"
          "Commands that print JSON take -o json (--output json). Exit status: 0 success,\n"
          "1 the command or the job failed, 2 bad usage, 3 a watched job was cancelled, 130\n"
          "stopped by a signal after writing a checkpoint.\n",
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

int zt_cli_help_main(int argc, char **argv) {
    if (argc == 0) {
        zt_cli_print_usage(stdout);
        return 0;
    }
    const zt_cli_command *c = argc == 1 ? zt_cli_command_find(argv[0]) : NULL;
    if (!c) {
        fprintf(stderr, "ztrain: help: %s '%s' (ztrain help lists them)\n",
                argc == 1 ? "no command" : "one command at most, not",
                argc == 1 ? argv[0] : argv[1]);
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

static void bash_script(FILE *f) {
    fputs("# bash completion for ztrain, generated by `ztrain completion bash` from its command\n"
          "# table.\n"
          "_ztrain() {\n"
          "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
          "  local commands='", f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "%s%s", i ? " " : "", commands[i].name);
    fputs("'\n"
          "  if [ \"$COMP_CWORD\" -eq 1 ]; then\n"
          "    COMPREPLY=($(compgen -W \"$commands --help --version\" -- \"$cur\"))\n"
          "    return\n"
          "  fi\n"
          "  local opts='' values='' args=''\n"
          "  case ${COMP_WORDS[1]} in\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const zt_cli_command *c = &commands[i];
        fprintf(f, "    %s) opts='", c->name);
        print_options(f, c, false);
        fputs("'; values='", f);
        print_options(f, c, true);
        fprintf(f, "'; args='%s' ;;\n", c->args);
    }
    fputs("  esac\n"
          "  case \" $values \" in\n"
          "    *\" $prev \"*)\n"
          "      case $prev in\n"
          "        -o|--output) COMPREPLY=($(compgen -W 'json wide name' -- \"$cur\")) ;;\n"
          "        *) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n"
          "      esac\n"
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

/* The first line of a command's help, for zsh's descriptions, with ':' and '\'' escaped. */
static void zsh_description(FILE *f, const char *help) {
    for (const char *p = help; *p && *p != '\n'; p++) {
        if (*p == ':')
            fputs("\\:", f);
        else if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p, f);
    }
}

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
          "  if (( CURRENT == 2 )); then\n"
          "    _describe 'command' commands\n"
          "    return\n"
          "  fi\n"
          "  local -a opts\n"
          "  case $words[2] in\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const zt_cli_command *c = &commands[i];
        fprintf(f, "    %s) opts=(", c->name);
        const char *p = c->options;
        while (*p) {
            size_t n = strcspn(p, " ");
            if (n > 0) {
                bool value = p[n - 1] == '=';
                fprintf(f, " '*%.*s%s'", (int)(n - value), p,
                        value ? ((p[0] == '-' && p[1] == 'o' && n == 3) ||
                                         (n == 9 && strncmp(p, "--output=", 9) == 0)
                                     ? ":format:(json wide name)"
                                     : ":value:_files")
                              : "");
            }
            p += n + (p[n] == ' ');
        }
        const char *arg = strcmp(c->args, "file") == 0      ? " '*:file:_files'"
                          : strcmp(c->args, "dir") == 0     ? " '*:directory:_files -/'"
                          : strcmp(c->args, "command") == 0 ? " '1:command:($commands_names)'"
                          : strcmp(c->args, "shell") == 0   ? " '1:shell:(bash zsh)'"
                                                            : "";
        fprintf(f, "%s '--help' ) ;;\n", arg);
    }
    fputs("  esac\n"
          "  local -a commands_names\n"
          "  commands_names=(${commands%%:*})\n"
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
