/* The option forms every ztrain program takes, shared by `ztrain` (ztrain_cli.c) and
 * ztrain-worker, so that an option both have is written the same ways for both: "--opt value"
 * and "--opt=value" (as getopt_long), "-o=json" and "-ojson" for a command with -o, and a
 * flag's "--flag=value" kept whole as its optional argument (`--profile=ops`). */
#ifndef ZTRAIN_CLI_ARGS_H
#define ZTRAIN_CLI_ARGS_H

#include <stdbool.h>

/* argv (argc entries, the program and command names left out) with each "--opt=value" split
 * into "--opt" "value", for a parser that then takes only "--opt value". `options` lists the
 * program's options, space-separated, a trailing '=' marking one that takes a value (the
 * command table's form, cli_commands.h): an option listed without '=' is a flag, whose
 * "=value" stays attached; "-ojson" becomes "-o" "json" when "-o=" is listed. Arguments after
 * "--" are left as they are. The strings of argv are reused (the '=' of a split one is
 * overwritten with '\0'); the array is heap-owned by the caller (free()), NULL when out of
 * memory. *out_argc gets its length. */
char **zt_cli_split_equals(const char *options, int argc, char **argv, int *out_argc);

/* Whether `opt` is listed in `options` (the command table's form) as taking a value. */
bool zt_cli_takes_value(const char *options, const char *opt);

/* What word `a` of a command's arguments is, for a parser's loop: 0 an option, 1 an operand (a
 * positional argument: a word not starting with '-', "-" alone, or any word after "--"), and -1
 * for the first "--" itself, which ends the options (it sets *operands, which starts false) and
 * is skipped, as every POSIX tool and getopt take it. */
int zt_cli_word_kind(const char *a, bool *operands);

/* Whether a command's arguments (after zt_cli_split_equals) ask for its help: 1 for --help or
 * -h as an option of their own (not the value of an option that takes one, `--prompt=--help`
 * or `--prompt -h`, and not after "--"), 0 for none, -1 after printing "<who>: --help takes
 * no value" for "--help=X" or "-h=X". */
int zt_cli_wants_help(const char *who, const char *options, int argc, char **argv);

/* --profile at argv[i], after zt_cli_split_equals: "--profile", "--profile=ops", or "--profile"
 * "ops" (the value is optional; written apart it is taken when it names a profile, as no job
 * file is named that). ops, the per-op timings of every step, is the one profile so far.
 * Returns how many arguments it took (1 or 2), 0 when argv[i] is not --profile, and -1 for an
 * unknown profile after printing "<who>: --profile=X: unknown profile ..." on stderr. */
int zt_cli_profile_arg(const char *who, int argc, char **argv, int i);

/* Whether v has a --set override's form, KEY.PATH=VALUE (a key before the '='); the key and
 * the value are judged against the job file when it is read (ztrain/job_overrides.h). */
bool zt_cli_set_form_ok(const char *v);

#endif
