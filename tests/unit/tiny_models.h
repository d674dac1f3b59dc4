/* The tiny model specs that several unit tests share, as the JSON of a job spec's "model"
 * object: one definition per shape, so that tests meaning the same model name it, and a change
 * of shape is made once. A test whose shape is its own (a size a check depends on) keeps it. */
#ifndef ZT_TEST_TINY_MODELS_H
#define ZT_TEST_TINY_MODELS_H

/* GPT-2 of 2 layers, 2 heads, 32 channels, a 256-token vocabulary and 16 positions: a training
 * step in milliseconds on the CPU and on the emulated CUDA device. */
#define TINY_GPT2                                                                                  \
    "{\"type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 256, "  \
    "\"block_size\": 16}"

/* Llama of the same size: 4 query heads over 2 key/value heads (grouped-query attention), an
 * MLP of 48 and untied embeddings, so every Llama-only path runs. */
#define TINY_LLAMA                                                                                 \
    "{\"type\": \"llama\", \"n_layer\": 2, \"n_head\": 4, \"n_kv_head\": 2, \"n_embd\": 32, "    \
    "\"intermediate_size\": 48, \"vocab_size\": 256, \"block_size\": 16, "                      \
    "\"tie_word_embeddings\": false}"

/* GPT-2 of 1 layer and 16 channels, for jobs the daemon takes where the model only has to be
 * valid. */
#define TINY_GPT2_1L                                                                               \
    "{\"type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"vocab_size\": 256, "  \
    "\"block_size\": 16}"

#endif
