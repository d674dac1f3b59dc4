/* Preparing a dataset: text in, llm.c token shards out (what `ztrain prepare` runs).
 *
 * Inputs are files, directories (searched recursively, files in name order) and glob patterns;
 * the run's own shards in out_dir (an earlier run's, when the input contains out_dir) are left out
 * of directories and globs and refused when named.
 * A file named *.jsonl or *.ndjson holds one JSON object per line whose `field` (default "text")
 * is a document; blank lines are skipped. Any other file is
 * text: the whole file is one document, or each line one when text_lines is set (empty lines are
 * skipped). An empty document (an empty text file, a JSONL field "") is skipped and counted in
 * zt_prepare_stats.empty_documents: it has no tokens to train on.
 *
 * Documents are encoded with the tokenizer on n_threads threads. Each document is separated from
 * the previous one the way its family does it: when the tokenizer's template puts tokens
 * around a sequence (Llama's BOS, and EOS with tokenizer_config.json's add_eos_token; see
 * ztrain/tokenizer.h), documents are encoded with them, as tokenizer(text) gives them; otherwise the separator token
 * (default: the tokenizer's <|endoftext|>, </s>, <|end_of_text|> or <eos>, whichever it has) goes
 * before each document, as llm.c's GPT-2 shards have it.
 *
 * Each document goes to the validation split with probability val_fraction, decided by a hash of
 * its index and the seed (the same inputs always give the same split). Each split is cut into
 * shards of shard_tokens tokens (the last one shorter), named OUT_DIR/NAME_{train,val}_NNNNNN.bin,
 * uint16 tokens when the vocabulary fits (magic 20240520) and uint32 otherwise (20240801).
 * Shards are written under temporary names and renamed into place only when every input was read
 * and encoded: a failure leaves no shard behind. Existing shards of the same name are an error
 * unless overwrite is set, in which case they are removed just before the new ones are renamed. */
#ifndef ZTRAIN_PREPARE_H
#define ZTRAIN_PREPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

typedef enum { ZT_PREPARE_DTYPE_AUTO = 0, ZT_PREPARE_DTYPE_U16, ZT_PREPARE_DTYPE_U32 } zt_prepare_dtype;

/* What the inputs hold. Text is pre-training data (above). The fine-tuning formats read JSONL
 * examples and write shards with a loss mask each (ztrain/loss_mask.h; docs/fine-tuning.md):
 *   CHAT: {"messages": [{"role", "content", ...}, ...], "tools": [...], "documents": [...],
 *         "chat_template_kwargs": {...}} (TRL's format: tools and documents lists of objects,
 *         optional; a message's content a string or a list of text parts, or null or absent
 *         beside an assistant's "tool_calls" list; its other keys passed on as they are: the
 *         rules of zt_chat_conversation_check; chat_template_kwargs an
 *         object or null, apply_chat_template's extra keyword arguments: see zt_chat_args)
 *         rendered with the model's chat template (ztrain/chat_template.h, given the tools,
 *         documents and kwargs) and encoded without the post-processor's tokens (the template
 *         writes them). When the template holds {% generation %} blocks, the tokens of their
 *         spans are trained as apply_chat_template(return_assistant_tokens_mask=True) marks them
 *         (by the tokens' offsets, zt_tokenizer_offsets, with a byte-level or SentencePiece-
 *         style tokenizer; without them, e.g. with an <unk> token, a span edge inside a token
 *         is refused, naming the line and the message; so is a tokenizer.json whose ByteLevel
 *         post-processor trims offsets);
 *         else the
 *         tokens of the assistant turns, tool calls included: from the end of the conversation
 *         before the turn rendered with the generation prompt to the end of the conversation
 *         through the turn (a template that does not render a prefix of itself is refused).
 *   PROMPT_COMPLETION: {"prompt", "completion"}: prompt + completion encoded with the
 *         post-processor's tokens, then the end-of-text token; the completion and that token are
 *         trained. With add_eos_token the template's EOS comes first, so such an example ends
 *         in two EOS tokens, as tokenizer(prompt + completion + eos_token) does.
 * Each example starts a document (mask bit 1) and lies whole in one shard. */
typedef enum {
    ZT_PREPARE_TEXT = 0,
    ZT_PREPARE_CHAT,
    ZT_PREPARE_PROMPT_COMPLETION,
} zt_prepare_format;

typedef struct {
    const char *tokenizer;        /* tokenizer.json */
    const char *const *inputs;    /* files, directories, globs */
    int n_inputs;
    const char *out_dir;          /* created when missing */
    const char *name;             /* shard name prefix, default "data" */
    const char *field;            /* JSONL field, default "text"; CHAT: the messages list's,
                                     default "messages" */
    const char *separator;        /* a token's text, or NULL for the family's default */
    bool text_lines;              /* a text file's lines are its documents */
    bool skip_bad_lines;          /* count bad JSONL lines instead of failing on the first */
    bool overwrite;
    double val_fraction;          /* in [0, 1) */
    uint64_t seed;
    int64_t shard_tokens;         /* default 100,000,000; at most INT32_MAX */
    zt_prepare_dtype dtype;
    int n_threads;
    zt_prepare_format format;
    const char *chat_template;    /* CHAT: a tokenizer_config.json; NULL: the one beside the
                                     tokenizer */
    int64_t max_length;           /* fine-tuning: > 0 bounds an example's tokens */
    bool drop_long;               /* longer examples are dropped, else truncated */
    /* Called after each batch of documents (may be NULL). */
    void (*progress)(void *ctx, uint64_t bytes_done, uint64_t bytes_total, uint64_t tokens_done);
    void *progress_ctx;
} zt_prepare_options;

typedef struct {
    uint64_t documents, tokens, bytes;     /* tokens count the separators */
    uint64_t val_documents, val_tokens;
    uint64_t bad_lines;                    /* skipped under skip_bad_lines */
    uint64_t empty_documents;              /* skipped: empty text files, JSONL fields "" */
    uint64_t invalid_utf8;                 /* sequences replaced by U+FFFD */
    int train_shards, val_shards;
    int32_t vocab_size;
    bool uint32_tokens;
    /* Fine-tuning formats: tokens of the loss, and examples over max_length. */
    uint64_t trained_tokens, truncated, dropped;
} zt_prepare_stats;

/* Runs the preparation. Errors name the file (and line, for JSONL) at fault: "a.jsonl:12: not
 * JSON", "a.jsonl:13: no string field \"text\"", a vocabulary too large for uint16, no inputs. */
zt_status zt_prepare_run(const zt_prepare_options *o, zt_prepare_stats *stats);

/* The fine-tuning formats (engine/data/prepare_sft.c); zt_prepare_run calls it for them. */
zt_status zt_prepare_sft_run(const zt_prepare_options *o, zt_prepare_stats *stats);

#endif
