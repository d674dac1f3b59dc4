/* Hugging Face tokenizers in C: reads a tokenizer.json and encodes and decodes exactly as the
 * `tokenizers` library does, for the BPE families ztrain trains.
 *
 * What a tokenizer.json may hold (anything else is ZT_ERR_UNSUPPORTED naming the component, e.g.
 * "tok.json: normalizer type Lowercase is not supported", never a silently different encoding):
 *   model           BPE: vocab, merges (either "a b" strings or ["a", "b"] pairs), unk_token,
 *                   fuse_unk, byte_fallback (<0xNN> tokens), ignore_merges; no dropout, no
 *                   continuing_subword_prefix / end_of_word_suffix.
 *   normalizer      null, Prepend, Replace (string pattern), NFC, NFD, NFKC, NFKD (libunistring),
 *                   Sequence of those.
 *   pre_tokenizer   null, ByteLevel (GPT-2's regex or none), Split (regex or string; any of the
 *                   five behaviours; invert), Metaspace (prepend_scheme always/first/never, split),
 *                   Digits, Sequence of those.
 *   post_processor  null, ByteLevel (offsets only: no effect on ids), TemplateProcessing (its
 *                   single-sequence template), Sequence of those.
 *   decoder         null, ByteLevel, Metaspace, Replace (string pattern), ByteFallback, Fuse,
 *                   Strip, Sequence of those.
 *   added_tokens    matched before the model, leftmost-longest, on the raw text (normalized:
 *                   false) or, by their normalized content, on the normalized text between
 *                   those (normalized: true), as HF does; no lstrip, rstrip or single_word.
 *   truncation and padding must be null; ids must be below 2^24.
 *
 * The template tokens (add_special) are those AutoTokenizer.from_pretrained(dir) puts around a
 * text, read from the files beside tokenizer.json (tok_config.c): the tokenizer class is
 * tokenizer_config.json's tokenizer_class (with or without "Fast"), else config.json's, else the
 * class of config.json's model_type (llama, mistral, mixtral: Llama; gemma, gemma2: Gemma;
 * gpt_neox, cohere, gpt2, qwen2: their own). LlamaTokenizer, CodeLlamaTokenizer, GemmaTokenizer,
 * GPTNeoXTokenizer and CohereTokenizer replace the post-processor's template with
 * "[bos_token] $A [eos_token]" from tokenizer_config.json's add_bos_token / add_eos_token (each
 * class's defaults where a key is missing: BOS on, EOS off, GPTNeoX both off; null is off), as
 * their update_post_processor does in transformers 4.46; PreTrainedTokenizerFast,
 * GPT2TokenizerFast, Qwen2TokenizerFast and transformers 5's TokenizersBackend keep
 * tokenizer.json's (5.x drops the two flags whenever tokenizer.json is there, so for the
 * rebuilding classes this is 4.x's reading, not 5.x's). Refused by name: another class
 * or model_type, a flag that is true with its token null (transformers raises), a token the
 * tokenizer does not have (transformers would add it as a new id past the vocabulary), and an
 * add_prefix_space with which the class would rewrite the pre-tokenizer (GPT2, GPTNeoX: one
 * differing from tokenizer.json's; Cohere: true) or convert tokenizer.model (Llama: any). With
 * neither file beside it (or a tokenizer_config.json naming no class and no config.json),
 * tokenizer.json's template is used.
 *
 * The special tokens the directory names outside tokenizer.json's added_tokens are added as
 * transformers 4.46's PreTrainedTokenizerFast.__init__ adds them (tok_specials.c): the class's
 * default tokens, tokenizer_config.json's bos/eos/unk/sep/pad/cls/mask_token and
 * additional_special_tokens (overridden by special_tokens_map.json's when the config has no
 * added_tokens_decoder) and its added_tokens_decoder entries, each with its AddedToken flags
 * (a string is special and raw): a text held in the vocabulary is then matched as one token and,
 * when special, skipped by decode's skip_special. One the vocabulary lacks (transformers gives it
 * a new id past the vocabulary) refuses any text that holds it, naming the token and the key;
 * lstrip, rstrip and single_word are refused by name.
 *
 * Text is UTF-8. Invalid UTF-8 is encoded as Python's bytes.decode("utf-8", "replace") would hand
 * it to Hugging Face: each maximal invalid subsequence becomes U+FFFD. Regexes are Oniguruma's, as
 * HF's; they run on PCRE2, translated to match the same characters (\w \s \h \b \v \p{Script},
 * (?m), ^ $), and what has no exact translation (POSIX brackets, class intersection,
 * multi-character case folds under (?i), ...) is refused by name.
 *
 * Threads: a zt_tokenizer_t is immutable after loading and may be shared by any number of
 * threads; each thread encodes through its own zt_tok_worker_t (regex match space and a cache of
 * pre-token results). zt_tokenizer_encode_batch makes its own workers. */
#ifndef ZTRAIN_TOKENIZER_H
#define ZTRAIN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ztrain/status.h"

typedef struct zt_tokenizer zt_tokenizer_t;
typedef struct zt_tok_worker zt_tok_worker_t;

/* A growable array of token ids; encode calls append to it. Free ids with free(). */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} zt_tok_ids;

/* Loads a tokenizer.json, and the tokenizer class's template from the tokenizer_config.json and
 * config.json beside it (above). *out is the caller's to zt_tokenizer_destroy. Messages name the
 * file and the component or key at fault. */
zt_status zt_tokenizer_load(const char *path, zt_tokenizer_t **out);
void zt_tokenizer_destroy(zt_tokenizer_t *t);

/* transformers 4.46's special_tokens_map for the directory of a tokenizer_config.json (its path
 * and config, its parsed object), the variables apply_chat_template gives a chat template:
 * {"bos_token": "<s>", ..., "additional_special_tokens": [...]}. Each of bos, eos, unk, sep,
 * pad, cls and mask_token is its text as from_pretrained resolves it, the same resolution
 * zt_tokenizer_load adds the tokens by (above): special_tokens_map.json's value (read beside
 * it only when the config has no added_tokens_decoder), else the config's, else the default of
 * the class AutoTokenizer picks (LlamaTokenizerFast's "<s>", GemmaTokenizerFast's "<pad>", ...);
 * a key left null or "" is absent. additional_special_tokens is the config's list, then the
 * map's items it does not already hold, then CodeLlama's infilling tokens, absent when empty.
 * A class ztrain does not know, and a token that is neither text nor an AddedToken object, are
 * refused by name. *out is the caller's to cJSON_Delete. */
zt_status zt_tokenizer_special_tokens_map(const char *tokenizer_config, const cJSON *config,
                                          cJSON **out);

/* One past the largest id of the vocabulary and the added tokens: the smallest vocab_size that
 * holds every id the tokenizer produces. */
int32_t zt_tokenizer_vocab_size(const zt_tokenizer_t *t);

/* The id of a token given by its text (vocabulary or added token), or -1. */
int32_t zt_tokenizer_token_id(const zt_tokenizer_t *t, const char *token);

/* The text of an id (a vocabulary entry in the model's alphabet, e.g. "Ġthe" or "▁the"), or NULL
 * for an id the tokenizer does not have. Valid while t is. */
const char *zt_tokenizer_id_token(const zt_tokenizer_t *t, int32_t id);

/* True when the id is an added token marked special. */
bool zt_tokenizer_is_special(const zt_tokenizer_t *t, int32_t id);

/* The ids the single-sequence template puts before and after the text (Llama's BOS: one id
 * before, none after; with add_eos_token, </s> after), the tokenizer class's where it rebuilds
 * the template. The pointers are valid while t is; counts may be 0. */
void zt_tokenizer_template(const zt_tokenizer_t *t, const int32_t **before, size_t *n_before,
                           const int32_t **after, size_t *n_after);

zt_status zt_tok_worker_create(const zt_tokenizer_t *t, zt_tok_worker_t **out);
void zt_tok_worker_destroy(zt_tok_worker_t *w);

/* Appends the ids of text[0..len) to out, as HF's encode(text, add_special_tokens) gives them;
 * add_special applies the template (zt_tokenizer_template): AutoTokenizer's tokenizer(text). *invalid_utf8 (may be NULL) is incremented
 * by the number of invalid UTF-8 sequences replaced by U+FFFD. On failure out keeps what it had. */
zt_status zt_tok_encode(zt_tok_worker_t *w, const char *text, size_t len, bool add_special,
                        zt_tok_ids *out, size_t *invalid_utf8);

/* Encodes n documents on n_threads threads (<= 0: one); outs[i] receives document i's ids
 * (appended). *invalid_utf8 (may be NULL) gets the total count of replaced sequences. */
zt_status zt_tokenizer_encode_batch(const zt_tokenizer_t *t, const char *const *texts,
                                    const size_t *lens, size_t n, bool add_special, int n_threads,
                                    zt_tok_ids *outs, size_t *invalid_utf8);

/* The byte offsets of ids[0..n), text[0..len)'s encoding without the template, as the offsets of
 * HF's encoding (the tokenizers library's encoding.offsets, a fast tokenizer's offset_mapping and
 * char_to_token) give them: ends[i] is where token i's coverage ends, and the token that holds
 * byte b (char_to_token of its character) is the first whose end lies past b. ends has room for
 * n. Known exactly, and checked on every call, for two families; false otherwise, ends then
 * unspecified:
 *  - a byte-level vocabulary (a ByteLevel pre-tokenizer: GPT-2, Llama 3, Qwen2/3), with a ByteLevel
 *    post-processor's trim_offsets false (a token " Paris" covers its space), when the tokens'
 *    bytes (the alphabet reversed; a token with a character outside it, an added token's content,
 *    as it is) concatenate to exactly the text: not where a normalizer changed the text, a prefix
 *    space was added, a pre-tokenizer removed some, or U+FFFD replaced invalid UTF-8;
 *  - a SentencePiece-style one (Llama 2, Mistral, Gemma, TinyLlama): normalizers Prepend and
 *    Replace of one character by one (Prepend("▁") + Replace(" ", "▁")), a Metaspace as the first
 *    pre-tokenizer (prepend_scheme always, first or never; split or not), Splits that remove
 *    nothing, a Unicode form only where it leaves the text as it is, a BPE with or without
 *    byte_fallback, when the tokens' pieces (a "<0xNN>" byte-fallback token as its byte, any other
 *    token as its text) concatenate to exactly the normalized text: each stretch between added
 *    tokens with its prepended "▁" (Prepend's on every non-empty stretch; Metaspace's where the
 *    stretch does not start with one, and for "first" only at the text's start) and each space
 *    as "▁". As tokenizers aligns them, a "▁" that stands for a space covers that space (the
 *    reply "Paris" after "[/INST] " starts inside "▁Paris"), a prepended "▁" covers the
 *    stretch's first character, and an added token its own text. Not with an <unk> token, a
 *    Unicode form that changes the text (NFKC's "ﬁ"), or invalid UTF-8.
 * In both, a token that holds only some bytes of a character (byte tokens of "世") covers the
 * whole character, as HF gives it, so a character's token is the first that holds part of it. */
bool zt_tokenizer_offsets(const zt_tokenizer_t *t, const int32_t *ids, size_t n,
                          const char *text, size_t len, size_t *ends);

/* Decodes ids into a NUL-terminated heap string the caller frees (*len, if not NULL, excludes
 * the NUL), as HF's decode(ids, skip_special_tokens) does: ids the tokenizer does not have (a
 * model's vocabulary padded past the tokenizer's) are left out, and bytes that do not form UTF-8
 * become U+FFFD. */
zt_status zt_tokenizer_decode(const zt_tokenizer_t *t, const int32_t *ids, size_t n,
                              bool skip_special, char **text, size_t *len);

#endif
