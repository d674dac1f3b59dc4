/* The ztrain CLI's command table: every command's synopsis, help and options, in one place from
 * which `ztrain --help`, `ztrain help CMD`, `ztrain CMD --help` and the bash and zsh completion
 * scripts (`ztrain completion bash|zsh`) are all printed, so none of them can list a command or
 * an option the others do not. */
#ifndef ZTRAIN_CLI_COMMANDS_H
#define ZTRAIN_CLI_COMMANDS_H

#include <stdio.h>

typedef struct {
    const char *name;
    const char *synopsis;   /* the arguments after the name, as the usage line shows them */
    const char *help;       /* what it does, lines of at most 90 columns, each ending in \n */
    const char *options;    /* its options, space-separated; a trailing '=' marks one with a
                             * value (completion then offers files after it) */
    const char *args;       /* what the positional arguments complete to: "file", "dir", "id",
                             * "command", "shell" or "" */
    const char *choices;    /* the values an option takes, when they are a fixed few, for
                             * completion: "OPT:V1,V2 OPT2:..." (space-separated); NULL for none */
} zt_cli_command;

/* The table, in the order `ztrain --help` lists it; *n is its length. */
const zt_cli_command *zt_cli_commands(size_t *n);

/* The command named `name`, or NULL. */
const zt_cli_command *zt_cli_command_find(const char *name);

/* `ztrain --help`: every command's synopsis and help. */
void zt_cli_print_usage(FILE *f);

/* `ztrain help CMD`, `ztrain CMD --help`: one command's synopsis, help and, for the commands
 * that talk to ztraind, the connection options they share. */
void zt_cli_print_command_help(FILE *f, const zt_cli_command *c);

/* After a usage error: the command's usage line and where its help is, or for an unknown command
 * (NULL or not in the table) the general usage line and the command names. */
void zt_cli_print_short_usage(FILE *f, const char *command);

/* An unknown command (or, for a word starting with '-', an unknown option before the command):
 * names it on stderr with the nearest command or global option ("did you mean list?"), then
 * the short usage. Returns 2, the exit status of bad usage. */
int zt_cli_unknown_command(const char *word);

/* An option `word` that `command` does not take, or one of its value options given without a
 * value: names it on stderr ("ztrain: list: unknown option '--limt' (did you mean --limit?)",
 * "ztrain: run: --out needs a value"), then the command's usage line. Returns 2. */
int zt_cli_unknown_option(const char *command, const char *word);

/* `ztrain help [CMD]` (argv after "help"): exit status 0, or 2 for an unknown command. */
int zt_cli_help_main(int argc, char **argv);

/* `ztrain completion bash|zsh`: a completion script generated from the table. */
int zt_cli_completion_main(int argc, char **argv);

#endif
