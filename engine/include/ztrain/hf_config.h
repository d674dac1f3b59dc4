/* Hugging Face model directories: config.json <-> the model spec, and export of a checkpoint
 * as a directory `from_pretrained` loads.
 *
 * A Hugging Face directory holds config.json and the weights, either model.safetensors or shards
 * model-0000k-of-0000n.safetensors listed by model.safetensors.index.json (safetensors.h reads
 * both). config.json's "model_type" names the family ("gpt2", "llama", "mistral", "qwen2", which
 * is also spec.type) and its keys fill the spec's architecture fields through one table in
 * engine/ckpt/hf_config.c, keyed by the families' spec field names (zt_model_family_field): a family
 * gains Hugging Face support by adding rows there. */
#ifndef ZTRAIN_HF_CONFIG_H
#define ZTRAIN_HF_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "ztrain/job_spec.h"
#include "ztrain/model.h"
#include "ztrain/status.h"

/* What a directory's config.json says about the model. */
typedef struct {
    char path[4096];          /* DIR/config.json, for messages */
    const zt_model_family *family;
    /* spec.type and every field of the family: from config.json where it gives one (or where
     * Hugging Face's own default applies to an absent key), else the field's default. Paths are
     * NULL. */
    zt_model_spec spec;
    /* given[i]: the config determines the family's i-th field (fam->fields[i]); a job spec that
     * also sets it must agree. That is every field but block_size and the paths: a field that no
     * key of the model_type sets is fixed at its default. */
    bool given[ZT_MODEL_MAX_FIELDS];
    /* The config key behind given[i], or NULL where the model_type alone fixes the field
     * (Qwen2's qkv_bias). Static strings. */
    const char *given_key[ZT_MODEL_MAX_FIELDS];
    /* The longest sequence the weights support (GPT-2's n_positions, the Llama family's
     * max_position_embeddings): model.block_size may not exceed it. 0 when the config has none. */
    int max_positions;
    const char *max_positions_key; /* the config key it came from */
} zt_hf_config;

/* Whether path is a directory (a Hugging Face model directory, as init_from may name). */
bool zt_hf_is_dir(const char *path);

/* Reads DIR/config.json, in the layout of transformers 4.x (rope_theta, rope_scaling) or 5.x
 * (rope_parameters, dtype, Qwen2's layer_types; engine/models/hf_layout.h). Fails, naming
 * config.json and the key, on a model_type ztrain lacks (or a family this build does not
 * register), a value of the wrong type, a file transformers 4 and 5 would read as different
 * models, a top-level key that is neither read nor known to leave the model alone
 * (quantization_config, ...), and on what ztrain cannot represent: hidden_act other than silu,
 * mlp_bias, rope types other than linear and llama3, partial rotary factors, dropout in the
 * Llama family, Qwen2 sliding windows on only some layers, GPT-2 variants with another
 * activation, epsilon or attention scaling. Also checks the weights as far as headers tell (zt_st_set_open
 * on the directory: the index and every shard it names, and a float dtype for every tensor),
 * so that these errors come when a job is read, before any rank starts. */
zt_status zt_hf_config_read(const char *dir, zt_hf_config *out);

/* Writes the config.json `from_pretrained` needs for spec (model_type, architectures,
 * torch_dtype "float32", every mapped key, tie_word_embeddings, and the fixed keys such as
 * hidden_act) into path, atomically, with the rotary settings in both layouts (rope_theta and
 * rope_scaling for transformers 4.x, rope_parameters and Qwen2's layer_types for 5.x). A spec that config.json cannot describe is
 * ZT_ERR_UNSUPPORTED naming the field, and nothing is written: a field no key of its model_type
 * carries that is not at the value transformers assumes (a Qwen2 head_dim, a Mistral
 * rope_scaling, Qwen2 or Mistral biases other than theirs), or a Llama with q/k/v biases but no
 * output bias. */
zt_status zt_hf_config_write(const zt_model_spec *spec, const char *path);

/* Parses a size as `ztrain export --max-shard-size` takes it, in Hugging Face's notation:
 * a byte count, or a number with KB/MB/GB (powers of 1000) or KiB/MiB/GiB (powers of 1024);
 * "5GB", "200MiB", "1000000". As transformers' convert_file_size_to_int reads them, the case of
 * the unit does not matter except for a final lowercase b of KB/MB/GB, which means bits ("5Gb"
 * and "5gb" are 625000000 bytes). Returns false for anything else or a size of 0. */
bool zt_hf_parse_size(const char *text, uint64_t *bytes);

/* What zt_hf_export wrote. */
typedef struct {
    int n_shards;             /* 1: model.safetensors alone, no index */
    uint64_t total_bytes;     /* the tensors' data (the index's metadata.total_size) */
    size_t n_params;
    /* GPT-2: the rows of its learned position table, written as n_positions. They are the
     * job's block_size: the loader crops the table to it, so rows past it were never trained
     * and are not in the checkpoint. 0 for a model with rotary positions. */
    int n_positions;
    /* The files of the job's tokenizer copied beside the model (tokenizer.json, and the
     * tokenizer_config.json, special_tokens_map.json and added_tokens.json beside it), 0
     * without a data.tokenizer; the path of a recorded tokenizer that no longer exists, else
     * "". */
    int tokenizer_files;
    char tokenizer_missing[4096];
    /* The Hugging Face model directory the job started from (model.init_from, recorded in the
     * checkpoint) when it no longer holds a config.json, so its special token ids and its
     * generation_config.json are not in the export (those beside the tokenizer are, if any);
     * else "". */
    char source_missing[4096];
} zt_hf_export_result;

/* Writes the checkpoint dir/tag (tag NULL: latest) as a Hugging Face directory out_dir:
 * config.json, and fp32 safetensors with the Hugging Face names (GPT-2's with the
 * "transformer." prefix, as save_pretrained writes them; a tied head is left out), split into
 * model-0000k-of-0000n.safetensors of at most max_shard_bytes each (a larger tensor gets a shard
 * of its own) with model.safetensors.index.json when there is more than one. Tensors are read
 * from the checkpoint one at a time through zt_ckpt_weights (checkpoint.h), so no process holds
 * the whole model. The job's tokenizer (data.tokenizer) is copied along, as save_pretrained
 * writes one beside its model (res says which files). Everything is written into a temporary
 * directory beside out_dir that is renamed into place at the end: out_dir must not exist or be
 * an empty directory of its own (not a symbolic link or a mount point, which rename() cannot
 * replace: refused before anything is written), and on failure nothing is left behind. */
zt_status zt_hf_export(const char *dir, const char *tag, const char *out_dir,
                       uint64_t max_shard_bytes, zt_hf_export_result *res);

#endif
