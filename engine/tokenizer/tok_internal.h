/* The tokenizer's internals (ztrain/tokenizer.h is the contract): the loaded components, the hash
 * tables, and the small string lists the encoding pipeline passes from stage to stage. */
#ifndef ZTRAIN_TOK_INTERNAL_H
#define ZTRAIN_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ztrain/strbuf.h"
#include "ztrain/tokenizer.h"

/* ---- hash tables (tok_hash.c) ------------------------------------------------------------- */

/* Bytes -> int32 with open addressing. Keys are borrowed (the table never copies them). */
typedef struct {
    const char *key;
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tok_slot;

typedef struct {
    tok_slot *slots;
    size_t mask, n;
} tok_strmap;

uint32_t tok_hash_bytes(const char *s, size_t n);
/* A table that holds up to `capacity` keys at a load factor of at most one half. */
bool tok_strmap_init(tok_strmap *m, size_t capacity);
void tok_strmap_free(tok_strmap *m);
/* Inserts or overwrites; false when the table is full (capacity reached). */
bool tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t val);
/* The value, or -1 when absent. */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, uint32_t len);

/* (left id, right id) -> (rank, merged id): the BPE merges. */
typedef struct {
    uint64_t key; /* (left << 32 | right) + 1; 0 marks an empty slot */
    int32_t rank, id;
} tok_pair;

typedef struct {
    tok_pair *slots;
    size_t mask;
} tok_pairmap;

bool tok_pairmap_init(tok_pairmap *m, size_t capacity);
void tok_pairmap_free(tok_pairmap *m);
/* A pair listed twice takes its last entry, as HF's merge map (collected in order) does. */
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);

/* ---- byte-level alphabet and UTF-8 (tok_bytes.c) ------------------------------------------ */

/* The UTF-8 text (2 bytes at most) of byte b in GPT-2's byte-to-unicode alphabet. */
typedef struct {
    char s[2];
    uint8_t len;
} tok_bytechar;
extern tok_bytechar tok_byte_to_char[256];
/* The byte of a code point of that alphabet, or -1. Indexed by code point below 324. */
int tok_char_to_byte(uint32_t cp);
/* Whether every character of the UTF-8 text s[0..len) is one of that alphabet's. */
bool tok_all_bytes(const char *s, size_t len);
void tok_bytes_init(void);

/* Length of the valid UTF-8 sequence at p[0..n) (1..4), or 0 with *bad set to the length of the
 * maximal invalid subpart (>= 1) that one U+FFFD replaces (Python's and Rust's rule). */
size_t tok_utf8_valid(const unsigned char *p, size_t n, size_t *bad);
/* Decodes one code point of valid UTF-8 at p; *len gets its byte length. */
uint32_t tok_utf8_decode(const unsigned char *p, size_t *len);
/* Writes cp as UTF-8 into out (4 bytes of room) and returns its length. */
int tok_utf8_encode(uint32_t cp, char *out);

/* ---- byte buffers and string lists --------------------------------------------------------- */

/* Empties a worker's buffer for the next text. One that ran out of memory on the last text (the
 * zt_strbuf latch) is freed instead, so one failed text does not fail every later one. */
void tok_buf_restart(zt_strbuf *b);

/* Pieces of text: each is buf.data[off .. off+len). `first` marks a piece that starts at offset 0
 * of the original text (Metaspace's prepend_scheme "first" looks at it). */
typedef struct {
    size_t off, len;
    bool first;
} tok_piece;

typedef struct {
    zt_strbuf buf;
    tok_piece *v;
    size_t n, cap;
} tok_pieces;

bool tok_pieces_add(tok_pieces *p, const char *s, size_t len, bool first);
/* Piece i's text ("" while the buffer holds nothing, so no offset is applied to NULL). */
static inline const char *tok_piece_text(const tok_pieces *p, size_t i) {
    return p->buf.data ? p->buf.data + p->v[i].off : "";
}
void tok_pieces_clear(tok_pieces *p);
void tok_pieces_free(tok_pieces *p);

/* The largest id a tokenizer.json may use: real vocabularies hold a few hundred thousand, and
 * the id tables are allocated up to the largest id. */
#define TOK_MAX_ID (1 << 24)

/* ---- components ----------------------------------------------------------------------------- */

typedef enum { TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_UNICODE } tok_norm_kind;

typedef struct {
    tok_norm_kind kind;
    char *a, *b; /* Prepend: a; Replace: pattern a by content b */
    size_t alen, blen;
    const void *form; /* Unicode: libunistring's uninorm_t (NFC, NFD, NFKC, NFKD) */
} tok_norm;

typedef enum { TOK_PRE_BYTELEVEL, TOK_PRE_SPLIT, TOK_PRE_METASPACE } tok_pre_kind;

typedef enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend;

typedef struct {
    tok_pre_kind kind;
    pcre2_code *re;          /* ByteLevel with use_regex, Split */
    bool add_prefix_space;   /* ByteLevel */
    tok_split_behavior behavior;
    bool invert;             /* Split */
    char repl[8];            /* Metaspace's replacement character, UTF-8 */
    size_t repl_len;
    tok_prepend prepend;
    bool split;              /* Metaspace: split on the replacement */
} tok_pre;

typedef enum {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_METASPACE,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP
} tok_dec_kind;

typedef struct {
    tok_dec_kind kind;
    char *a, *b;             /* Replace: pattern, content; Metaspace/Strip: the character in a */
    size_t alen, blen;
    tok_prepend prepend;     /* Metaspace */
    int start, stop;         /* Strip */
} tok_dec;

/* An added token: its content s, and the text it is matched on, m: s itself, or for a
 * normalized token s run through the normalizers (HF matches those in the normalized text).
 * id -1 marks a token tokenizer_config.json names that the tokenizer lacks: transformers gives
 * it a new id past the vocabulary, so ztrain refuses a text holding it, naming `origin`. */
typedef struct {
    char *s, *m;
    size_t len, mlen;
    int32_t id;
    bool special, normalized;
    char *origin;
} tok_added;

struct zt_tokenizer {
    char *path;
    /* id -> text (model vocabulary, overlaid by added tokens), and flags */
    int32_t n_ids;
    char **id_text;
    uint32_t *id_len;
    bool *id_special;
    tok_strmap vocab;          /* the model's vocabulary; its keys are id_text strings */
    /* Texts an added token replaced in id_text: the vocabulary map still points at them. */
    char **retired;
    size_t n_retired;
    tok_pairmap merges;
    int32_t unk_id;            /* -1: none */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256];     /* <0xNN> tokens, -1 when absent */

    tok_added *added;
    size_t n_added;
    bool any_raw_added, any_norm_added;
    uint8_t added_first[256];  /* bit 0: a raw token starts with this byte; bit 1: a normalized one */

    tok_norm *norms;
    size_t n_norms;
    tok_pre *pres;
    size_t n_pres;
    tok_dec *decs;
    size_t n_decs;
    bool has_decoder;

    int32_t *tmpl_before, *tmpl_after;
    size_t n_before, n_after;
};

/* Loading (tok_json.c) hands each component to its file's parser. Messages start with `src`. */
zt_status tok_parse_normalizer(zt_tokenizer_t *t, const cJSON *j, const char *src);
zt_status tok_parse_pre_tokenizer(zt_tokenizer_t *t, const cJSON *j, const char *src);
zt_status tok_parse_decoder(zt_tokenizer_t *t, const cJSON *j, const char *src);
zt_status tok_parse_post_processor(zt_tokenizer_t *t, const cJSON *j, const char *src);
zt_status tok_parse_bpe(zt_tokenizer_t *t, const cJSON *model, const char *src);
zt_status tok_parse_added(zt_tokenizer_t *t, const cJSON *j, const char *src);
/* After the normalizers are loaded: the texts the added tokens are matched on. */
zt_status tok_prepare_added(zt_tokenizer_t *t, const char *src);
/* After the whole tokenizer.json (root) is loaded (tok_config.c): the template of the tokenizer
 * class AutoTokenizer picks from the files beside it, which may replace the post-processor's. */
zt_status tok_apply_class(zt_tokenizer_t *t, const cJSON *root);
/* Then (tok_specials.c): the special tokens tokenizer_config.json (`config`, NULL when there is
 * none; messages start with src) and the class `cls` (its name without "Fast", "" for none)
 * name, added as transformers' PreTrainedTokenizerFast.__init__ adds those tokenizer.json's
 * added_tokens lacks; without an added_tokens_decoder in the config, special_tokens_map.json's
 * and added_tokens.json's too, as from_pretrained's legacy branch reads them. */
zt_status tok_add_config_tokens(zt_tokenizer_t *t, const cJSON *config, const char *src,
                                const char *cls);
/* transformers' special_tokens_map for tokenizer_config.json (`config`, at src) and the class
 * `cls`: zt_tokenizer_special_tokens_map's object, special_tokens_map.json read beside src. */
zt_status tok_special_tokens_map(const cJSON *config, const char *src, const char *cls,
                                 cJSON **out);
/* The class's default for a special token key ("bos_token", ...), or NULL when it has none. */
const char *tok_class_default(const char *cls, const char *key);
void tok_free_components(zt_tokenizer_t *t);
zt_status tok_grow_ids(zt_tokenizer_t *t, int32_t id);
zt_status tok_set_added_text(zt_tokenizer_t *t, int32_t id, const char *s, size_t len);
/* Appends an added token matched on s (normalized or raw), as id (-1: one that would need a new
 * id; origin says who names it and starts the messages). Its special flag is the id's. */
zt_status tok_add_token(zt_tokenizer_t *t, const char *s, int32_t id, bool normalized,
                        const char *origin);
/* One entry of added_tokens.json (a slow tokenizer's {"text": id} file): its text, borrowed
 * from the parsed file, and its id. */
typedef struct {
    const char *s;
    int32_t id;
} tok_json_added;
/* added_tokens.json beside the file `beside` (its path into path): *root its parse, which the
 * entries borrow (NULL when there is no such file; the caller deletes it), *out its *n entries
 * by id (the caller frees it) and *last the text of the file's last entry. A file that is not
 * an object of distinct non-empty texts to distinct integer ids >= 0 is refused naming the file
 * and the entry. */
zt_status tok_load_added_json(const char *beside, char *path, size_t cap, cJSON **root,
                              tok_json_added **out, size_t *n, const char **last);
/* The longest added token of the given kind (normalized or raw) that starts at s, or NULL. */
const tok_added *tok_added_match(const zt_tokenizer_t *t, const char *s, size_t len,
                                 bool normalized);

/* Compiles a tokenizer.json regex, written for Oniguruma, to PCRE2 with the same meaning, or a
 * literal string (`literal`); what cannot be translated exactly is refused naming src, what
 * (the component) and the construct. */
zt_status tok_regex_compile(const char *pattern, bool literal, pcre2_code **out, const char *src,
                            const char *what);

/* A string field of a component, or NULL when absent or not a string. */
const char *tok_json_str(const cJSON *j, const char *key);

/* ---- the worker: per-thread scratch of the encoding pipeline ----------------------------------- */

typedef struct {
    tok_strmap map;            /* word -> index into entries */
    char *keys;                /* the words' bytes, allocated once (the map borrows them) */
    size_t n_keys, cap_keys;
    int32_t *ids;              /* the entries' ids, back to back */
    size_t n_ids, cap_ids;
    uint32_t *starts, *counts; /* per entry */
    size_t n, cap;
} tok_cache;

struct zt_tok_worker {
    const zt_tokenizer_t *t;
    pcre2_match_data *md;
    tok_pieces a, b;           /* pre-tokenizer stages ping-pong between these */
    zt_strbuf text, norm;      /* the sanitised text; one normalized segment */
    zt_strbuf scratch;         /* a pre-tokenizer's rewritten piece */
    tok_cache cache;
    /* BPE scratch */
    struct tok_sym *syms;
    size_t cap_syms;
    struct tok_merge *heap;
    size_t cap_heap;
    /* regex split scratch: (start, end, is_match) spans covering a piece */
    struct tok_span *spans;
    size_t cap_spans;
};

/* Normalizes s into out (restarted first). */
zt_status tok_normalize(const zt_tokenizer_t *t, const char *s, size_t len, zt_strbuf *out);
/* Runs the pre-tokenizers over one normalized segment; the result is in *result (w->a or w->b),
 * already mapped to the byte-level alphabet where a ByteLevel pre-tokenizer asks for it. */
zt_status tok_pre_tokenize(zt_tok_worker_t *w, const char *s, size_t len, bool first,
                           tok_pieces **result);
/* Appends the BPE ids of one pre-token. */
zt_status tok_bpe_word(zt_tok_worker_t *w, const char *s, size_t len, zt_tok_ids *out);
void tok_cache_free(tok_cache *c);

bool tok_ids_push(zt_tok_ids *o, int32_t id);

#endif
