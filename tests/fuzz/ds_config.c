/* Fuzz target: the DeepSpeed config parser (zt_ds_config_parse), which reads the "deepspeed"
 * object of every job a client submits. The input is the config's JSON text; it is parsed for a
 * world size of 1 and of 3, and what a successful parse returns is checked against DeepSpeed's
 * own invariants: a batch triple of positive numbers with train = micro * accumulation * world,
 * and a ZeRO stage from 0 to 3. */
#include "fuzz_util.h"
#include "ztrain/ds_config.h"

static void parse_and_check(const char *text, int world_size) {
    zt_ds_config cfg;
    if (zt_ds_config_parse(&cfg, text, "fuzz.json", world_size) != ZT_OK)
        return;
    FUZZ_CHECK(cfg.world_size == world_size, "world_size %d, asked for %d", cfg.world_size,
               world_size);
    FUZZ_CHECK(cfg.train_batch_size >= 1 && cfg.train_micro_batch_size_per_gpu >= 1 &&
                   cfg.gradient_accumulation_steps >= 1,
               "batch triple %d, %d, %d", cfg.train_batch_size,
               cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps);
    int64_t product = (int64_t)cfg.train_micro_batch_size_per_gpu *
                      cfg.gradient_accumulation_steps * world_size;
    FUZZ_CHECK(product == cfg.train_batch_size,
               "train_batch_size %d != micro %d * accumulation %d * world %d",
               cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
               cfg.gradient_accumulation_steps, world_size);
    FUZZ_CHECK(cfg.zero.stage >= 0 && cfg.zero.stage <= 3, "zero stage %d", cfg.zero.stage);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    parse_and_check(text, 1);
    parse_and_check(text, 3);
    free(text);
    return 0;
}
