/* ztraind's command line, as the option parser reads it: one word per flag and one per value.
 *
 * Two spellings become that form before parsing:
 *   --flag=value          the same as "--flag value" (a flag that takes no value refuses '=');
 *   --config FILE         the flags FILE lists, read in place of these two words.
 *
 * A config file holds one flag a line, written as on the command line without its "--":
 *
 *     # ztraind.conf
 *     state-dir = /var/lib/ztrain
 *     max-ranks = 8
 *     webhook-allow = hooks.example.com
 *     webhook-allow = *.ci.example.com
 *     webhook-allow-private
 *
 * "name = value" or "name value"; the value runs to the end of the line with the spaces around
 * it dropped and no quoting. Blank lines and lines starting with '#' are skipped. Since the
 * file's flags take its place in the command line, a flag given after --config overrides the
 * file's value, and a repeatable flag adds to the file's list. Config files do not nest. */
#ifndef ZTRAIN_DAEMON_ARGS_H
#define ZTRAIN_DAEMON_ARGS_H

/* The expanded argument list (argv[0] kept) into *out_argc / *out_argv, allocated for the
 * life of the process; (*out_origins)[i] is "FILE:LINE" for a word read from a config file
 * (for the parser's messages), NULL for one from the command line. switches lists the flags
 * that take no value, NULL-terminated. Returns 0, or -1 after printing to stderr what is
 * wrong, naming the word, or the file and line. */
int zt_daemon_args_expand(int argc, char **argv, const char *const *switches, int *out_argc,
                          char ***out_argv, char ***out_origins);

#endif
