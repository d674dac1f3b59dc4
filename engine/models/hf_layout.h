/* The two layouts of a Hugging Face config.json (internal to libztrain; used by hf_config.c).
 *
 * transformers 4.x keeps the rotary base in a top-level "rope_theta" and its scaling in
 * "rope_scaling"; transformers 5 keeps both inside "rope_parameters" ({"rope_type", "rope_theta",
 * "factor", ...}), writes "dtype" for "torch_dtype" and gives Qwen2 a per-layer "layer_types".
 * hf_layout.c brings a config of either layout to the 4.x one that hf_config.c's rows read,
 * refusing a file the two versions would build into different models, and adds the 5.x keys to
 * an exported config so that both versions load it as the same model. */
#ifndef ZTRAIN_HF_LAYOUT_H
#define ZTRAIN_HF_LAYOUT_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "ztrain/status.h"

/* Rewrites root (config.json of model_type `type`, read from path) into the 4.x layout:
 * rope_parameters' rope_theta becomes rope_theta and its scaling becomes rope_scaling, as
 * transformers 5 reads them; an old rope_scaling "type" becomes "rope_type", and a rope_scaling
 * of rope_type "default" (plain RoPE to transformers) becomes null, and so does a GPT-2 n_inner
 * of exactly 4 * n_embd (its MLP's default width). Fails, naming the
 * key and path, on a rope_scaling that is not null yet not an object naming its type (4.x
 * raises on {}), one whose "type" and "rope_type" differ (4.x reads the first, 5.x the second),
 * per-layer-type rotary parameters, a rope_type other than default, linear and
 * llama3, a scaling without a member transformers requires of its type (linear's factor;
 * llama3's factor, low/high_freq_factor and original_max_position_embeddings, which only
 * rope_parameters may leave to max_position_embeddings), a partial_rotary_factor other than 1, a
 * key inside rope_parameters it does not know,
 * a rope_theta or scaling that transformers 4 and 5 would read differently, and a Qwen2
 * layer_types whose windowed layers differ from what use_sliding_window and max_window_layers
 * say. */
zt_status zt_hf_layout_read(cJSON *root, const char *type, const char *path);

/* Whether a top-level key that no row of hf_config.c reads is known not to change the model's
 * training computation (token ids, dtype notes, generation settings, initialisation ranges,
 * dropout, which ztrain does not apply; see docs/fine-tuning.md), or is read by
 * zt_hf_layout_read. Any other key is refused by the reader. */
bool zt_hf_layout_key_known(const char *type, const char *key);


/* Adds to an exported 4.x-layout config (rope_theta, rope_scaling written) the same values in
 * the 5.x layout: rope_parameters, and for Qwen2 layer_types. */
void zt_hf_layout_write(cJSON *root, const char *type);

#endif
