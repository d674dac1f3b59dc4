/* Fuzz target: a Hugging Face model directory as model.init_from reads it, through its two JSON
 * files. The input's first byte picks the file the rest of it becomes: 'c' config.json
 * (zt_hf_config_read), anything else model.safetensors.index.json (zt_st_set_open); the other
 * file keeps a valid GPT-2 default, and the two shards the index may name are fixed, valid
 * safetensors. Checked on success: the set's tensors are exactly the shards' tensors, each found
 * by name, and every shard opened lies in the directory (an index cannot reach other files); a
 * config gives a registered family whose name is spec.type. */
#include <limits.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "ztrain/hf_config.h"
#include "ztrain/safetensors.h"

static const char default_config[] =
    "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 2, "
    "\"vocab_size\": 3, \"n_positions\": 4}";
static const char default_index[] =
    "{\"metadata\": {\"total_size\": 32}, \"weight_map\": {"
    "\"transformer.wte.weight\": \"model-00001-of-00002.safetensors\", "
    "\"transformer.wpe.weight\": \"model-00002-of-00002.safetensors\"}}";

/* One shard holding a single F32 tensor `name` of shape [rows, 2], zeros. */
static void write_shard(const char *dir, const char *file, const char *name, int rows) {
    char header[256], path[1024];
    int n = snprintf(header, sizeof header, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,2],"
                     "\"data_offsets\":[0,%d]}}", name, rows, rows * 8);
    while (n % 8)
        header[n++] = ' ';
    unsigned char buf[512] = {0};
    uint64_t len = (uint64_t)n;
    memcpy(buf, &len, 8);
    memcpy(buf + 8, header, (size_t)n);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    fuzz_write_file(path, buf, 8 + (size_t)n + (size_t)rows * 8);
}

static const char *model_dir(void) {
    static char dir[512];
    if (dir[0])
        return dir;
    snprintf(dir, sizeof dir, "%s/hf", fuzz_tmpdir());
    FUZZ_CHECK(mkdir(dir, 0700) == 0, "cannot make %s", dir);
    write_shard(dir, "model-00001-of-00002.safetensors", "transformer.wte.weight", 3);
    write_shard(dir, "model-00002-of-00002.safetensors", "transformer.wpe.weight", 4);
    return dir;
}

static void check_set(const char *dir) {
    zt_st_set set;
    if (zt_st_set_open(&set, dir) != ZT_OK)
        return;
    int total = 0;
    for (int k = 0; k < set.n_files; k++) {
        const char *path = set.files[k].path;
        const char *slash = strrchr(path, '/');
        FUZZ_CHECK(slash && (size_t)(slash - path) == strlen(dir) &&
                       strncmp(path, dir, strlen(dir)) == 0,
                   "shard %s is outside %s", path, dir);
        total += set.files[k].n_tensors;
    }
    FUZZ_CHECK(total == set.n_tensors, "%d tensors in the shards, %d in the set", total,
               set.n_tensors);
    for (int i = 0; i < set.n_tensors; i++)
        FUZZ_CHECK(zt_st_set_find(&set, set.tensors[i].tensor->name) == &set.tensors[i],
                   "tensor '%s' is found elsewhere", set.tensors[i].tensor->name);
    zt_st_set_close(&set);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = model_dir();
    bool config = size > 0 && data[0] == 'c';
    const uint8_t *body = size > 0 ? data + 1 : data;
    size_t n = size > 0 ? size - 1 : 0;
    char config_path[1024], index_path[1024];
    snprintf(config_path, sizeof config_path, "%s/config.json", dir);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    fuzz_write_file(config_path, config ? body : (const uint8_t *)default_config,
                    config ? n : strlen(default_config));
    fuzz_write_file(index_path, config ? (const uint8_t *)default_index : body,
                    config ? strlen(default_index) : n);
    check_set(dir);
    zt_hf_config c;
    if (zt_hf_config_read(dir, &c) == ZT_OK) {
        FUZZ_CHECK(c.family && strcmp(c.family->name, c.spec.type) == 0,
                   "config read as family %s with type %s", c.family ? c.family->name : "(none)",
                   c.spec.type);
        FUZZ_CHECK(c.max_positions >= 0, "max_positions %d", c.max_positions);
    }
    return 0;
}
