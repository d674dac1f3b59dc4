/* The ztrain CLI's commands that talk to a running ztraind over gRPC:
 *
 *   ztrain submit JOB.json [--wait | --watch] [--idempotency-key K] [--set K=V]... [--dry-run]
 *   ztrain list [--state S] [--limit N] [-o json|wide|name]
 *   ztrain status ID [--json | -o json|wide|name]
 *   ztrain watch ID [--from-step N]
 *   ztrain logs ID [-f] [--tail N]
 *   ztrain cancel ID... [--force] [--grace SECONDS]
 *
 * Their help texts are in the command table (cli_commands.c). Every command takes --server
 * HOST:PORT (default $ZTRAIN_SERVER, else 127.0.0.1:50051), --token-file FILE (default: the
 * file $ZTRAIN_TOKEN_FILE names, else the token $ZTRAIN_TOKEN), and for a TLS server
 * --tls-ca FILE (the CA that signed its certificate) and, for mutual TLS, --tls-cert FILE and
 * --tls-key FILE (defaults $ZTRAIN_TLS_CA, $ZTRAIN_TLS_CERT, $ZTRAIN_TLS_KEY; any of them turns
 * TLS on). */
#ifndef ZTRAIN_CLI_REMOTE_H
#define ZTRAIN_CLI_REMOTE_H

#include <stdbool.h>
#include <stddef.h>

/* Whether `command` is one of the commands above. */
bool zt_cli_remote_is_command(const char *command);

/* Their common options (--server, --token-file, --tls-ca, --tls-cert, --tls-key, each as
 * "--opt VALUE" or "--opt=VALUE") given before the command, as docker and kubectl take global
 * flags (`ztrain --server HOST:PORT list`), are moved after it in argv, in place, so that
 * argv[1] is the command. Returns 0, or 2 after a usage message on stderr when such options are
 * not followed by one of these commands. */
int zt_cli_remote_hoist_globals(int argc, char **argv);

/* ztrain_cli.c's helpers, shared with these commands. zt_cli_fail prints "ztrain: " what and
 * zt_last_error() and returns 1; the parsers print a usage message and return -1 for a value
 * that is not a number (an integer for _long) in [min, max]. */
int zt_cli_fail(const char *what);
int zt_cli_parse_long(const char *opt, const char *s, long min, long max, long *out);
int zt_cli_parse_double(const char *opt, const char *s, double min, double max, double *out);

/* `ztrain validate JOB.json` with its --set overrides, which `submit --dry-run` runs too: prints
 * the job, its effective DeepSpeed config, its memory estimate and this host's verdict. */
int zt_cli_validate(const char *job_path, const char *const *sets, size_t n_sets);

/* Runs `command` with its arguments (argv[0] is the first argument after the command name).
 * Returns the process exit status: 0 success, 1 failure (an error on stderr), 2 bad usage.
 * `watch` and `submit --wait/--watch` return the job's outcome: 0 SUCCEEDED, 1 FAILED,
 * 3 CANCELLED. */
int zt_cli_remote_main(const char *command, int argc, char **argv);

#endif
