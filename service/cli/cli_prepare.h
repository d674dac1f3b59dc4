/* `ztrain prepare`: text and JSONL in, llm.c token shards out (ztrain/prepare.h does the work;
 * this is its command line, progress bar and summary). */
#ifndef ZTRAIN_CLI_PREPARE_H
#define ZTRAIN_CLI_PREPARE_H

/* Runs the command (argv[0] is the first argument after "prepare"); returns the exit status:
 * 0 success, 1 failure (the message on stderr), 2 bad usage. */
int zt_cli_prepare(int argc, char **argv);

#endif
