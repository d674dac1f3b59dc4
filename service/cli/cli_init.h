/* `ztrain init --hf DIR [--deepspeed DS.json] [--out JOB.json] [--name NAME]`: a job file that
 * fine-tunes a Hugging Face model directory, for a user who has a model and a DeepSpeed config
 * and no job file yet. The file is checked as `ztrain run` reads it (the directory's
 * config.json and weights, the DeepSpeed config) before it is written, and an existing file is
 * never replaced. Returns the exit status (0, 1 failure, 2 usage). */
#ifndef ZTRAIN_CLI_INIT_H
#define ZTRAIN_CLI_INIT_H

int zt_cli_init(int argc, char **argv);

#endif
