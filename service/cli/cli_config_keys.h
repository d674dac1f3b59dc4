/* `ztrain config-keys [-o json]`: every DeepSpeed config key ztrain knows (zt_ds_keys), with its
 * fate. The text is docs/deepspeed.md's markdown table (a test keeps the two equal); -o json is
 * one JSON array, one object per key:
 *   {"key": "zero_optimization.stage", "fate": "honoured" | "warned" | "refused",
 *    "stages": [0, 1] (the ZeRO stages an honoured key acts at; [] for all),
 *    "default": DeepSpeed's default as a JSON value (null: none, any value counts as set),
 *    "section": true for an object whose keys are rows of their own,
 *    "contents_listed": false for a section whose contents are not listed, "note": "..."}
 * Returns the exit status (0, or 2 for a usage error). */
#ifndef ZTRAIN_CLI_CONFIG_KEYS_H
#define ZTRAIN_CLI_CONFIG_KEYS_H

int zt_cli_config_keys(int argc, char **argv);

#endif
