/* config.json of Hugging Face directories <-> model specs (ztrain/hf_config.h): the values and
 * defaults transformers' config classes give (GPT2Config, LlamaConfig, MistralConfig,
 * Qwen2Config in transformers 4.46, written out here by hand), the keys refused by name, a job
 * spec whose init_from is a directory (fields filled, agreement, block_size against
 * n_positions), config.json written for a spec and read back to the same spec, and
 * --max-shard-size sizes. The Llama-family rows are checked through the field table by name, for
 * the families this build registers. */
#define _XOPEN_SOURCE 700 /* mkdtemp and realpath, for check.h; before any header */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "ztrain/hf_config.h"
#include "ztrain/job_spec.h"
#include "ztrain/model.h"

/* A directory NAME holding config.json with this text and a model.safetensors without tensors
 * (the header "{}" padded to 8 bytes). */
static const char *hf_dir(const char *name, const char *config) {
    const char *dir = check_tmp_path(name);
    mkdir(dir, 0755);
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    check_write_file(path, config, strlen(config));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    static const char empty[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    check_write_file(path, empty, sizeof empty);
    return dir;
}

static const zt_model_field *field(const zt_model_spec *s, const char *key) {
    const zt_model_field *f = zt_model_family_field(zt_model_family_find(s->type), key);
    ZT_ASSERT(f);
    return f;
}

static int get_int(const zt_model_spec *s, const char *key) {
    return *(const int *)((const char *)s + field(s, key)->offset);
}

static double get_double(const zt_model_spec *s, const char *key) {
    return *(const double *)((const char *)s + field(s, key)->offset);
}

static bool get_bool(const zt_model_spec *s, const char *key) {
    return *(const bool *)((const char *)s + field(s, key)->offset);
}

static const char *get_str(const zt_model_spec *s, const char *key) {
    return (const char *)s + field(s, key)->offset;
}

/* The error of reading a directory whose config.json is `config` names config.json and holds
 * every fact. */
static void read_fails(int line, const char *name, const char *config, zt_status want, ...) {
    const char *dir = hf_dir(name, config);
    zt_hf_config c;
    zt_status s = zt_hf_config_read(dir, &c);
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    va_list ap;
    va_start(ap, want);
    check_error_has(__FILE__, line, s, want, path, ap);
    va_end(ap);
}

static void test_gpt2_read(void) {
    const char *dir = hf_dir("gpt2", "{\"model_type\": \"gpt2\", \"n_layer\": 3, \"n_head\": 2, "
                                     "\"n_embd\": 8, \"vocab_size\": 50, \"n_positions\": 16, "
                                     "\"activation_function\": \"gelu_new\", "
                                     "\"architectures\": [\"GPT2LMHeadModel\"]}");
    zt_hf_config c;
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK_STR(c.spec.type, "gpt2");
    CHECK(c.spec.n_layer == 3 && c.spec.n_head == 2 && c.spec.n_embd == 8 &&
          c.spec.vocab_size == 50, "%d %d %d %d", c.spec.n_layer, c.spec.n_head, c.spec.n_embd,
          c.spec.vocab_size);
    CHECK(c.max_positions == 16 && strcmp(c.max_positions_key, "n_positions") == 0);
    const zt_model_family *fam = zt_model_family_find("gpt2");
    for (const zt_model_field *f = fam->fields; f->key; f++) {
        bool want = strcmp(f->key, "block_size") != 0 && strcmp(f->key, "init_from") != 0;
        CHECK(c.given[f - fam->fields] == want, "given[%s] = %d", f->key,
              c.given[f - fam->fields]);
    }
    /* A key given twice keeps its last value, as Python's json.load (and so transformers)
     * reads {"n_layer": 2, "n_layer": 5}: json.loads gives {'n_layer': 5}. */
    dir = hf_dir("gpt2-dup", "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, "
                             "\"n_layer\": 5, \"n_embd\": 8}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK && c.spec.n_layer == 5, "n_layer %d %s",
          c.spec.n_layer, zt_last_error());
    /* save_pretrained leaves out keys equal to the defaults: GPT2Config's apply. */
    dir = hf_dir("gpt2-defaults", "{\"model_type\": \"gpt2\"}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(c.spec.n_layer == 12 && c.spec.n_head == 12 && c.spec.n_embd == 768 &&
          c.spec.vocab_size == 50257 && c.max_positions == 1024);
}

static void test_refusals(void) {
    read_fails(__LINE__, "no-type", "{\"n_layer\": 2}", ZT_ERR_FORMAT, "model_type", NULL);
    read_fails(__LINE__, "bert", "{\"model_type\": \"bert\"}", ZT_ERR_UNSUPPORTED, "\"bert\"",
               "gpt2, llama, mistral, qwen2", NULL);
    read_fails(__LINE__, "frac", "{\"model_type\": \"gpt2\", \"n_layer\": 2.5}", ZT_ERR_FORMAT,
               "'n_layer'", "integer", "2.5", NULL);
    read_fails(__LINE__, "inner", "{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_inner\": 64}",
               ZT_ERR_UNSUPPORTED, "'n_inner'", "64", NULL);
    read_fails(__LINE__, "untied", "{\"model_type\": \"gpt2\", \"tie_word_embeddings\": false}",
               ZT_ERR_UNSUPPORTED, "'tie_word_embeddings'", "false", NULL);
    read_fails(__LINE__, "eps", "{\"model_type\": \"gpt2\", \"layer_norm_epsilon\": 1e-6}",
               ZT_ERR_UNSUPPORTED, "'layer_norm_epsilon'", NULL);
    read_fails(__LINE__, "positions", "{\"model_type\": \"gpt2\", \"n_positions\": 0}",
               ZT_ERR_FORMAT, "'n_positions'", "positive", NULL);
    read_fails(__LINE__, "not-object", "[1, 2]", ZT_ERR_FORMAT, "not a JSON object", NULL);
    /* An integer too large for the field is named as out of range, not as a non-integer. */
    read_fails(__LINE__, "huge", "{\"model_type\": \"gpt2\", \"n_layer\": 1000000000000}",
               ZT_ERR_FORMAT, "'n_layer'", "1000000000000", "out of range", NULL);
    read_fails(__LINE__, "huge-positions", "{\"model_type\": \"gpt2\", \"n_positions\": "
               "1000000000000}", ZT_ERR_FORMAT, "'n_positions'", "out of range", NULL);

    /* A directory without weights is refused before anything else looks at it. */
    const char *dir = check_tmp_path("no-weights");
    mkdir(dir, 0755);
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *cfg = "{\"model_type\": \"gpt2\"}";
    check_write_file(path, cfg, strlen(cfg));
    zt_hf_config c;
    CHECK(zt_hf_config_read(dir, &c) == ZT_ERR_IO && strstr(zt_last_error(), "model.safetensors"),
          "%s", zt_last_error());

    /* The Llama family's refusals, where this build has the family. */
    if (!zt_model_family_find("llama")) {
        read_fails(__LINE__, "llama-absent", "{\"model_type\": \"llama\"}", ZT_ERR_UNSUPPORTED,
                   "\"llama\"", "not available in this build", NULL);
        return;
    }
    read_fails(__LINE__, "gelu", "{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}",
               ZT_ERR_UNSUPPORTED, "'hidden_act'", "gelu", NULL);
    read_fails(__LINE__, "mlp-bias", "{\"model_type\": \"llama\", \"mlp_bias\": true}",
               ZT_ERR_UNSUPPORTED, "'mlp_bias'", NULL);
    read_fails(__LINE__, "yarn", "{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": "
               "\"yarn\", \"factor\": 4.0}}", ZT_ERR_UNSUPPORTED, "'rope_scaling.rope_type'",
               "yarn", NULL);
    read_fails(__LINE__, "dynamic", "{\"model_type\": \"qwen2\", \"rope_scaling\": {\"type\": "
               "\"dynamic\", \"factor\": 2.0}}", ZT_ERR_UNSUPPORTED, "dynamic", NULL);
    read_fails(__LINE__, "windows", "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 4, "
               "\"use_sliding_window\": true, \"sliding_window\": 64, \"max_window_layers\": 2}",
               ZT_ERR_UNSUPPORTED, "'max_window_layers'", NULL);
    /* transformers has no default for a scaling type's members (4.46's rope_config_validation
     * raises KeyError "Missing required keys in `rope_scaling`"); transformers 5 fills only
     * llama3's original_max_position_embeddings, from max_position_embeddings, so a
     * rope_scaling without it is read differently by the two and refused. */
    read_fails(__LINE__, "llama3-no-orig", "{\"model_type\": \"llama\", \"max_position_embeddings\": "
               "1024, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
               "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}", ZT_ERR_FORMAT,
               "'rope_scaling.original_max_position_embeddings'", "missing", NULL);
    read_fails(__LINE__, "llama3-no-low", "{\"model_type\": \"qwen2\", \"rope_scaling\": "
               "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 4.0, "
               "\"original_max_position_embeddings\": 512}}", ZT_ERR_FORMAT,
               "'rope_scaling.low_freq_factor'", NULL);
    read_fails(__LINE__, "linear-no-factor", "{\"model_type\": \"llama\", \"rope_scaling\": "
               "{\"type\": \"linear\"}}", ZT_ERR_FORMAT, "'rope_scaling.factor'", NULL);
    read_fails(__LINE__, "v5-llama3-no-high", "{\"model_type\": \"llama\", \"rope_parameters\": "
               "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, "
               "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 512}}",
               ZT_ERR_FORMAT, "'rope_parameters.high_freq_factor'", NULL);
    read_fails(__LINE__, "v5-llama3-no-lengths", "{\"model_type\": \"llama\", \"rope_parameters\": "
               "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, "
               "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}", ZT_ERR_FORMAT,
               "'rope_parameters.original_max_position_embeddings'", "max_position_embeddings",
               NULL);
}

/* Each family's defaults for an absent key, and what the keys fill. */
static void test_llama_read(void) {
    if (!zt_model_family_find("llama"))
        return;
    zt_hf_config c;
    const char *dir = hf_dir("llama3", "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"hidden_size\": 32, "
        "\"intermediate_size\": 64, \"vocab_size\": 100, \"rms_norm_eps\": 1e-05, "
        "\"rope_theta\": 500000.0, \"max_position_embeddings\": 4096, \"attention_bias\": true, "
        "\"tie_word_embeddings\": true, \"rope_scaling\": {\"rope_type\": \"llama3\", "
        "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 512}}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    zt_model_spec *s = &c.spec;
    CHECK(get_int(s, "n_layer") == 2 && get_int(s, "n_head") == 4 && get_int(s, "n_kv_head") == 1
          && get_int(s, "n_embd") == 32 && get_int(s, "intermediate_size") == 64 &&
          get_int(s, "vocab_size") == 100 && get_int(s, "head_dim") == 0);
    CHECK(get_double(s, "rms_norm_eps") == 1e-5 && get_double(s, "rope_theta") == 500000.0);
    CHECK(get_int(s, "max_position_embeddings") == 4096 && c.max_positions == 4096);
    CHECK(get_bool(s, "qkv_bias") && get_bool(s, "o_bias") && get_bool(s, "tie_word_embeddings"));
    CHECK_STR(get_str(s, "rope_scaling"), "llama3");
    CHECK(get_double(s, "rope_factor") == 8.0 && get_int(s, "rope_original_max_position") == 512);

    dir = hf_dir("llama-defaults", "{\"model_type\": \"llama\"}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(get_int(s, "n_layer") == 32 && get_int(s, "n_embd") == 4096 &&
          get_int(s, "intermediate_size") == 11008 && get_int(s, "vocab_size") == 32000 &&
          get_int(s, "max_position_embeddings") == 2048 && get_int(s, "n_kv_head") == 0 &&
          !get_bool(s, "tie_word_embeddings") && get_str(s, "rope_scaling")[0] == '\0' &&
          get_double(s, "rms_norm_eps") == 1e-6);

    dir = hf_dir("mistral", "{\"model_type\": \"mistral\"}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(get_int(s, "n_kv_head") == 8 && get_int(s, "sliding_window") == 4096 &&
          get_int(s, "intermediate_size") == 14336 && !get_bool(s, "qkv_bias") &&
          get_int(s, "max_position_embeddings") == 131072);
    dir = hf_dir("mistral-nowin", "{\"model_type\": \"mistral\", \"sliding_window\": null}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK && get_int(s, "sliding_window") == 0);

    dir = hf_dir("qwen2", "{\"model_type\": \"qwen2\", \"sliding_window\": 128, "
                          "\"use_sliding_window\": false}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(get_bool(s, "qkv_bias") && !get_bool(s, "o_bias") && get_int(s, "sliding_window") == 0
          && get_int(s, "vocab_size") == 151936 && get_int(s, "n_kv_head") == 32);
    /* Qwen2 windows layer i when use_sliding_window and i >= max_window_layers (4.x's flash
     * attention, 5.x's layer_types): every layer from 0 (or below), none from num_hidden_layers
     * on, which the default 28 is for a model of 28 layers or fewer. */
    dir = hf_dir("qwen2-win", "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, "
                 "\"sliding_window\": 128, \"use_sliding_window\": true, "
                 "\"max_window_layers\": 0}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK && get_int(s, "sliding_window") == 128, "%s",
          zt_last_error());
    dir = hf_dir("qwen2-win-none", "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, "
                 "\"sliding_window\": 128, \"use_sliding_window\": true, "
                 "\"max_window_layers\": 2}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK && get_int(s, "sliding_window") == 0,
          "max_window_layers 2 of 2 layers: window %d %s", get_int(s, "sliding_window"),
          zt_last_error());
    dir = hf_dir("qwen2-win-default", "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 4, "
                 "\"sliding_window\": 128, \"use_sliding_window\": true}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK && get_int(s, "sliding_window") == 0,
          "max_window_layers 28 (default) of 4 layers: window %d %s",
          get_int(s, "sliding_window"), zt_last_error());
    dir = hf_dir("linear", "{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"linear\", "
                 "\"factor\": 2.0}}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(strcmp(get_str(s, "rope_scaling"), "linear") == 0 && get_double(s, "rope_factor") == 2.0);
}

/* config.json as transformers 5 writes it (rope_parameters, dtype, Qwen2's layer_types), read
 * as transformers 5.x's convert_rope_params_to_dict and standardize_rope_params would: the
 * rotary dict carries theta and scaling, llama3's pre-training length defaults to
 * max_position_embeddings. Keys the two versions would read differently are refused. */
static void test_v5_layout(void) {
    if (!zt_model_family_find("llama"))
        return;
    zt_hf_config c;
    zt_model_spec *s = &c.spec;
    const char *dir = hf_dir("v5-qwen2", "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, "
        "\"dtype\": \"bfloat16\", \"rope_parameters\": {\"rope_type\": \"default\", "
        "\"rope_theta\": 1000000.0}, \"use_sliding_window\": false, \"sliding_window\": null, "
        "\"max_window_layers\": 28, \"layer_types\": [\"full_attention\", \"full_attention\"]}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(get_double(s, "rope_theta") == 1e6 && get_str(s, "rope_scaling")[0] == '\0',
          "theta %g", get_double(s, "rope_theta"));
    dir = hf_dir("v5-llama3", "{\"model_type\": \"llama\", \"max_position_embeddings\": 1024, "
        "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, "
        "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(get_double(s, "rope_theta") == 5e5 && strcmp(get_str(s, "rope_scaling"), "llama3") == 0
          && get_double(s, "rope_factor") == 8.0 && get_int(s, "rope_original_max_position") == 1024,
          "theta %g orig %d", get_double(s, "rope_theta"), get_int(s, "rope_original_max_position"));
    /* Both layouts at once, agreeing, as ztrain's export writes them. */
    dir = hf_dir("v45-both", "{\"model_type\": \"llama\", \"rope_theta\": 250000.0, "
        "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, \"rope_parameters\": "
        "{\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 250000.0}}");
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(get_double(s, "rope_theta") == 2.5e5 && get_double(s, "rope_factor") == 2.0);

    read_fails(__LINE__, "v5-theta-clash", "{\"model_type\": \"qwen2\", \"rope_theta\": 10000.0, "
               "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}}",
               ZT_ERR_UNSUPPORTED, "'rope_theta'", "'rope_parameters.rope_theta'", NULL);
    read_fails(__LINE__, "v5-yarn", "{\"model_type\": \"llama\", \"rope_parameters\": "
               "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0}}",
               ZT_ERR_UNSUPPORTED, "'rope_parameters.rope_type'", "yarn", NULL);
    read_fails(__LINE__, "v5-partial", "{\"model_type\": \"llama\", \"rope_parameters\": "
               "{\"rope_type\": \"default\", \"rope_theta\": 10000.0, "
               "\"partial_rotary_factor\": 0.5}}", ZT_ERR_UNSUPPORTED,
               "'rope_parameters.partial_rotary_factor'", NULL);
    read_fails(__LINE__, "v5-per-layer", "{\"model_type\": \"qwen2\", \"rope_parameters\": "
               "{\"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}}",
               ZT_ERR_UNSUPPORTED, "'rope_parameters.full_attention'", "per layer type", NULL);
    read_fails(__LINE__, "v5-unknown-member", "{\"model_type\": \"llama\", \"rope_parameters\": "
               "{\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"mscale\": 1.0}}",
               ZT_ERR_UNSUPPORTED, "'rope_parameters.mscale'", NULL);
    read_fails(__LINE__, "v5-layer-types", "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, "
               "\"use_sliding_window\": true, \"sliding_window\": 8, \"max_window_layers\": 0, "
               "\"layer_types\": [\"full_attention\", \"sliding_attention\"]}",
               ZT_ERR_UNSUPPORTED, "'layer_types[0]'", NULL);
    read_fails(__LINE__, "qwen2-head-dim", "{\"model_type\": \"qwen2\", \"hidden_size\": 64, "
               "\"num_attention_heads\": 4, \"head_dim\": 32}", ZT_ERR_UNSUPPORTED, "'head_dim'",
               NULL);
    read_fails(__LINE__, "mistral-scaling", "{\"model_type\": \"mistral\", \"rope_scaling\": "
               "{\"rope_type\": \"linear\", \"factor\": 2.0}}", ZT_ERR_UNSUPPORTED,
               "'rope_scaling'", NULL);
    /* What no row reads and is not known to leave the model alone is refused by name. */
    read_fails(__LINE__, "unknown-key", "{\"model_type\": \"llama\", \"quantization_config\": "
               "{\"bits\": 4}}", ZT_ERR_UNSUPPORTED, "'quantization_config'", NULL);
    read_fails(__LINE__, "dropout", "{\"model_type\": \"qwen2\", \"attention_dropout\": 0.1}",
               ZT_ERR_UNSUPPORTED, "'attention_dropout'", NULL);
    read_fails(__LINE__, "tp", "{\"model_type\": \"llama\", \"pretraining_tp\": 2}",
               ZT_ERR_UNSUPPORTED, "'pretraining_tp'", NULL);
}

#define DS "\"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1}"

static zt_status parse(zt_job_spec *job, const char *model) {
    char json[4096];
    snprintf(json, sizeof json, "{\"model\": %s, \"data\": {\"train\": \"t.bin\"}, " DS "}",
             model);
    return zt_job_spec_parse(job, json, "job.json", check_tmpdir);
}

static void test_job_spec(void) {
    hf_dir("job-hf", "{\"model_type\": \"gpt2\", \"n_layer\": 3, \"n_head\": 2, \"n_embd\": 8, "
                     "\"vocab_size\": 50, \"n_positions\": 16}");
    zt_job_spec job;
    zt_status s = parse(&job, "{\"init_from\": \"job-hf\", \"block_size\": 8}");
    CHECK(s == ZT_OK, "%s", zt_last_error());
    if (s == ZT_OK) {
        CHECK_STR(job.model.type, "gpt2");
        CHECK(job.model.n_layer == 3 && job.model.n_head == 2 && job.model.n_embd == 8 &&
              job.model.vocab_size == 50 && job.model.block_size == 8);
        CHECK_STR(job.model.init_from, check_tmp_path("job-hf"));
        zt_job_spec_free(&job);
    }
    /* Fields the job repeats must agree; type too. */
    s = parse(&job, "{\"type\": \"gpt2\", \"init_from\": \"job-hf\", \"n_head\": 2, "
                    "\"n_embd\": 8, \"block_size\": 16}");
    CHECK(s == ZT_OK, "%s", zt_last_error());
    if (s == ZT_OK)
        zt_job_spec_free(&job);
    char want[PATH_MAX + 300];
    s = parse(&job, "{\"init_from\": \"job-hf\", \"n_head\": 4, \"block_size\": 8}");
    snprintf(want, sizeof want, "job.json: model.n_head is 4 but %s/config.json gives 2 (n_head)",
             check_tmp_path("job-hf"));
    check_error_is(__FILE__, __LINE__, "job", "n_head 4", s, ZT_ERR_INVALID, want, false);
    s = parse(&job, "{\"init_from\": \"job-hf\", \"block_size\": 17}");
    snprintf(want, sizeof want, "job.json: model.block_size 17 is above %s/config.json's "
             "n_positions 16", check_tmp_path("job-hf"));
    check_error_is(__FILE__, __LINE__, "job", "block_size 17", s, ZT_ERR_INVALID, want, true);
    s = parse(&job, "{\"init_from\": \"job-hf\"}");
    check_error_is(__FILE__, __LINE__, "job", "no block_size", s, ZT_ERR_INVALID,
                   "job.json: key 'model.block_size' is required", false);
    /* A file path is still a plain safetensors path: the job gives every dimension. */
    s = parse(&job, "{\"init_from\": \"job-hf/model.safetensors\", \"block_size\": 8}");
    check_error_is(__FILE__, __LINE__, "job", "file init_from", s, ZT_ERR_INVALID,
                   "job.json: key 'model.n_layer' is required", false);
    /* A field the model_type's config has no key for is fixed at its default. */
    if (zt_model_family_find("mistral")) {
        hf_dir("job-mistral", "{\"model_type\": \"mistral\", \"num_hidden_layers\": 1, "
               "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"hidden_size\": 8, "
               "\"intermediate_size\": 8, \"vocab_size\": 10}");
        s = parse(&job, "{\"init_from\": \"job-mistral\", \"block_size\": 8, "
                        "\"rope_scaling\": \"linear\"}");
        snprintf(want, sizeof want, "job.json: model.rope_scaling is linear but "
                 "%s/config.json gives (none) (fixed for model_type mistral)",
                 check_tmp_path("job-mistral"));
        check_error_is(__FILE__, __LINE__, "job", "mistral rope_scaling", s, ZT_ERR_INVALID, want,
                       false);
    }
    /* A broken config is an error of the job, naming both files. */
    hf_dir("job-bad", "{\"model_type\": \"gpt2\", \"n_head\": \"two\"}");
    s = parse(&job, "{\"init_from\": \"job-bad\", \"block_size\": 8}");
    CHECK(s != ZT_OK && strstr(zt_last_error(), "job.json: model.init_from: ") &&
          strstr(zt_last_error(), "job-bad/config.json: key 'n_head'"), "%s", zt_last_error());
}

/* config.json written for a spec reads back to the same spec. */
static void roundtrip(int line, const char *name, const zt_model_spec *spec) {
    const char *dir = hf_dir(name, "");
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    zt_status s = zt_hf_config_write(spec, path);
    check_at(__FILE__, line, s == ZT_OK, "write %s: %s", name, zt_last_error());
    zt_hf_config c;
    s = zt_hf_config_read(dir, &c);
    check_at(__FILE__, line, s == ZT_OK, "read %s: %s", name, zt_last_error());
    c.spec.block_size = spec->block_size;
    const zt_model_field *d = zt_model_spec_difference(&c.spec, spec);
    check_at(__FILE__, line, s == ZT_OK && !d, "%s: read back differs in %s", name,
             d ? d->key : "");
    check_at(__FILE__, line, c.max_positions >= spec->block_size, "%s: positions %d", name,
             c.max_positions);
}

static void set_field(zt_model_spec *s, const char *key, double v) {
    const zt_model_field *f = field(s, key);
    void *p = (char *)s + f->offset;
    if (f->kind == ZT_FIELD_INT)
        *(int *)p = (int)v;
    else if (f->kind == ZT_FIELD_FLOAT)
        *(double *)p = v;
    else
        *(bool *)p = v != 0;
}

static void defaults(zt_model_spec *s, const char *type) {
    memset(s, 0, sizeof *s);
    snprintf(s->type, sizeof s->type, "%s", type);
    for (const zt_model_field *f = zt_model_family_find(type)->fields; f->key; f++)
        if (f->kind != ZT_FIELD_PATH && f->kind != ZT_FIELD_STRING)
            set_field(s, f->key, f->def);
}

static void test_write(void) {
    zt_model_spec g = {.type = "gpt2", .n_layer = 3, .n_head = 4, .n_embd = 16,
                       .vocab_size = 77, .block_size = 24};
    roundtrip(__LINE__, "rt-gpt2", &g);
    if (!zt_model_family_find("llama"))
        return;
    zt_model_spec s;
    defaults(&s, "llama");
    static const struct {
        const char *key;
        double v;
    } llama[] = {{"n_layer", 2}, {"n_head", 4}, {"n_embd", 32}, {"vocab_size", 100},
                 {"block_size", 16}, {"n_kv_head", 2}, {"head_dim", 16},
                 {"intermediate_size", 48}, {"rms_norm_eps", 1e-5}, {"rope_theta", 500000},
                 {"rope_factor", 8}, {"rope_low_freq_factor", 2}, {"rope_high_freq_factor", 8},
                 {"rope_original_max_position", 64}, {"max_position_embeddings", 1024},
                 {"tie_word_embeddings", 1}, {"qkv_bias", 1}, {"o_bias", 1}};
    for (size_t i = 0; i < sizeof llama / sizeof llama[0]; i++)
        set_field(&s, llama[i].key, llama[i].v);
    snprintf((char *)get_str(&s, "rope_scaling"), 16, "llama3");
    roundtrip(__LINE__, "rt-llama3", &s);
    {
        /* Export states the rotary settings in both layouts, the same. */
        char path[PATH_MAX + 300], text[8192] = "";
        snprintf(path, sizeof path, "%s/config.json", check_tmp_path("rt-llama3"));
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        text[n] = '\0';
        if (f)
            fclose(f);
        CHECK(strstr(text, "\"rope_parameters\"") && strstr(text, "\"rope_theta\"") &&
              strstr(text, "\"rope_scaling\""), "%s", text);
        /* Floats stay floats when whole, as Python's json writes 8.0: transformers warns
         * "factor field must be a float >= 1, got 8" on an integer. */
        CHECK(strstr(text, "\"factor\":\t8.0") && strstr(text, "\"low_freq_factor\":\t2.0") &&
              strstr(text, "\"rope_theta\":\t500000.0") && !strstr(text, "\"factor\":\t8,"),
              "%s", text);
    }
    snprintf((char *)get_str(&s, "rope_scaling"), 16, "linear");
    set_field(&s, "rope_low_freq_factor", 1);
    set_field(&s, "rope_high_freq_factor", 4);
    set_field(&s, "rope_original_max_position", 8192);
    roundtrip(__LINE__, "rt-linear", &s);

    /* A 0 that stands for another value is written as that value. */
    defaults(&s, "mistral");
    set_field(&s, "n_layer", 1);
    set_field(&s, "n_head", 4);
    set_field(&s, "n_embd", 32);
    set_field(&s, "vocab_size", 10);
    set_field(&s, "block_size", 8);
    set_field(&s, "intermediate_size", 8);
    set_field(&s, "sliding_window", 4);
    const char *dir = hf_dir("rt-mistral", "");
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(zt_hf_config_write(&s, path) == ZT_OK, "%s", zt_last_error());
    zt_hf_config c;
    CHECK(zt_hf_config_read(dir, &c) == ZT_OK, "%s", zt_last_error());
    CHECK(get_int(&c.spec, "head_dim") == 8 && get_int(&c.spec, "n_kv_head") == 4 &&
          get_int(&c.spec, "max_position_embeddings") == 8 &&
          get_int(&c.spec, "sliding_window") == 4);

    defaults(&s, "qwen2");
    set_field(&s, "n_layer", 2);
    set_field(&s, "n_head", 2);
    set_field(&s, "n_kv_head", 1);
    set_field(&s, "n_embd", 16);
    set_field(&s, "vocab_size", 10);
    set_field(&s, "block_size", 8);
    set_field(&s, "intermediate_size", 8);
    set_field(&s, "max_position_embeddings", 64);
    set_field(&s, "sliding_window", 4);
    roundtrip(__LINE__, "rt-qwen2-window", &s);
    set_field(&s, "sliding_window", 0);
    roundtrip(__LINE__, "rt-qwen2", &s);

    /* Llama's one attention_bias cannot say "q/k/v yes, o no". */
    defaults(&s, "llama");
    set_field(&s, "qkv_bias", 1);
    CHECK(zt_hf_config_write(&s, check_tmp_path("qkv-only.json")) == ZT_ERR_UNSUPPORTED);
    /* Fields a model_type's config has no key for must be what transformers assumes. */
    defaults(&s, "qwen2");
    set_field(&s, "n_head", 2);
    set_field(&s, "n_embd", 16);
    set_field(&s, "head_dim", 16);
    CHECK(zt_hf_config_write(&s, check_tmp_path("qwen2-head-dim.json")) == ZT_ERR_UNSUPPORTED &&
          strstr(zt_last_error(), "model.head_dim is 16"), "%s", zt_last_error());
    defaults(&s, "mistral");
    set_field(&s, "o_bias", 1);
    CHECK(zt_hf_config_write(&s, check_tmp_path("mistral-o-bias.json")) == ZT_ERR_UNSUPPORTED &&
          strstr(zt_last_error(), "model.o_bias is true"), "%s", zt_last_error());
    struct stat st;
    CHECK(stat(check_tmp_path("mistral-o-bias.json"), &st) != 0, "a refused config was written");
}

static void test_sizes(void) {
    static const struct {
        const char *text;
        uint64_t bytes;
    } ok[] = {{"5GB", 5000000000ULL}, {"200MiB", 200ULL << 20}, {"1000", 1000},
              {"20kB", 20000},        {"1.5KiB", 1536},         {"10B", 10},
              /* transformers' convert_file_size_to_int: a final lowercase b is bits, rounded
               * down (int(size[:-2]) * 10**k // 8). */
              {"20kb", 2500},         {"5Gb", 625000000ULL},    {"3mb", 375000},
              {"1kib", 1024},         {"7Kb", 875}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t b = 0;
        CHECK(zt_hf_parse_size(ok[i].text, &b) && b == ok[i].bytes, "%s -> %llu", ok[i].text,
              (unsigned long long)b);
    }
    static const char *const bad[] = {"0", "lots", "-5", "5XB", "", "GB", "0.1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b = 0;
        CHECK(!zt_hf_parse_size(bad[i], &b), "'%s' accepted as %llu", bad[i],
              (unsigned long long)b);
    }
}

int main(void) {
    check_tmpdir_create("zt-hf-config");
    test_gpt2_read();
    test_refusals();
    test_llama_read();
    test_v5_layout();
    test_job_spec();
    test_write();
    test_sizes();
    check_tmpdir_remove();
    return check_summary("test_hf_config");
}
