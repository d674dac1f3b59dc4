/* Fuzz target: the tokenizer (engine/tokenizer/tok_*.c, engine/tokenizer/tokenizer.c). The first byte picks what the
 * rest is. Even: a tokenizer.json, loaded; when it loads, a fixed set of texts (invalid UTF-8
 * among them) is encoded and decoded with it. Odd: a text, encoded with each of two tokenizers
 * built here (byte-level BPE with GPT-2's regex and an added token; SentencePiece-style BPE with
 * byte fallback and a BOS template) on one and on two threads. What must hold: every id is below
 * the vocabulary size, the two thread counts agree, decoding never fails, and for the byte-level
 * tokenizer decoding gives back the text (with invalid UTF-8 replaced as the library says). */
#include <limits.h>

#include "fuzz_util.h"
#include "ztrain/tokenizer.h"

/* GPT-2's byte-to-unicode alphabet as JSON string escapes, built the way the format defines it. */
static void byte_char(int b, char out[8]) {
    static int map[256];
    static int ready;
    if (!ready) {
        int next = 256;
        for (int i = 0; i < 256; i++) {
            bool printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
            map[i] = printable ? i : next++;
        }
        ready = 1;
    }
    snprintf(out, 8, "\\u%04x", map[b]);
}

static char *byte_level_json(void) {
    size_t cap = 64 * 1024, n = 0;
    char *s = malloc(cap);
    FUZZ_CHECK(s != NULL, "out of memory");
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"added_tokens\": [{\"id\": 262, \"content\": \"<|endoftext|>\", "
                          "\"special\": true, \"normalized\": false}], \"normalizer\": null, "
                          "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                          "false, \"use_regex\": true}, \"post_processor\": null, \"decoder\": "
                          "{\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {");
    char c[8], d[8];
    for (int b = 0; b < 256; b++) {
        byte_char(b, c);
        n += (size_t)snprintf(s + n, cap - n, "\"%s\": %d, ", c, b);
    }
    /* A few merges over "Ġt", "he", "Ġthe", "in", "er", "Ġa". */
    byte_char(' ', d);
    n += (size_t)snprintf(s + n, cap - n,
                          "\"%st\": 256, \"he\": 257, \"%sthe\": 258, \"in\": 259, \"er\": 260, "
                          "\"%sa\": 261}, \"merges\": [\"%s t\", \"h e\", \"%st he\", \"i n\", "
                          "\"e r\", [\"%s\", \"a\"]]}}",
                          d, d, d, d, d, d);
    return s;
}

static const char sentencepiece_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, "
    "\"content\": \"<s>\", \"special\": true}], \"normalizer\": {\"type\": \"Sequence\", "
    "\"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", "
    "\"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}, \"pre_tokenizer\": null, "
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
    "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
    "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}}, "
    "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
    "{\"String\": \"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": "
    "\"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}, "
    "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
    "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"\\u2581\": 2, \"a\": 3, "
    "\"b\": 4, \"\\u2581a\": 5, \"ab\": 6, \"<0x41>\": 7, \"<0xC3>\": 8, \"<0xA9>\": 9}, "
    "\"merges\": [\"\\u2581 a\", \"a b\"]}}";

static zt_tokenizer_t *load_text(const char *json, size_t n, const char *name) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", fuzz_tmpdir(), name);
    fuzz_write_file(path, json, n);
    zt_tokenizer_t *t = NULL;
    if (zt_tokenizer_load(path, &t) != ZT_OK)
        return NULL;
    return t;
}

/* Encodes on one and two threads, checks the ids, decodes; returns the decoded text. */
static char *round_trip(zt_tokenizer_t *t, const char *text, size_t len, bool special) {
    const char *texts[3] = {text, text, text};
    size_t lens[3] = {len, len, len};
    zt_tok_ids one[3] = {{0}}, two[3] = {{0}};
    FUZZ_CHECK(zt_tokenizer_encode_batch(t, texts, lens, 3, special, 1, one, NULL) == ZT_OK,
               "encode failed: %s", zt_last_error());
    FUZZ_CHECK(zt_tokenizer_encode_batch(t, texts, lens, 3, special, 2, two, NULL) == ZT_OK,
               "encode on two threads failed: %s", zt_last_error());
    for (int k = 0; k < 3; k++) {
        FUZZ_CHECK(one[k].n == one[0].n && two[k].n == one[0].n &&
                       (one[0].n == 0 ||
                        (memcmp(two[k].ids, one[0].ids, one[0].n * sizeof(int32_t)) == 0 &&
                         memcmp(one[k].ids, one[0].ids, one[0].n * sizeof(int32_t)) == 0)),
                   "documents %d differ between threads or copies", k);
    }
    for (size_t i = 0; i < one[0].n; i++)
        FUZZ_CHECK(one[0].ids[i] >= 0 && one[0].ids[i] < zt_tokenizer_vocab_size(t),
                   "id %d outside the vocabulary of %d", one[0].ids[i],
                   zt_tokenizer_vocab_size(t));
    char *out = NULL;
    FUZZ_CHECK(zt_tokenizer_decode(t, one[0].ids, one[0].n, false, &out, NULL) == ZT_OK,
               "decode failed: %s", zt_last_error());
    for (int k = 0; k < 3; k++) {
        free(one[k].ids);
        free(two[k].ids);
    }
    return out;
}

/* The text with each maximal invalid UTF-8 subpart as U+FFFD, written independently of the
 * library: the Unicode rule for the second byte's range after E0, ED, F0, F4. */
static char *repaired(const unsigned char *s, size_t n) {
    char *out = malloc(3 * n + 1), *o = out;
    FUZZ_CHECK(out != NULL, "out of memory");
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t need = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
                      : c >= 0xF0 && c <= 0xF4 ? 3 : 99;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        size_t k = 1;
        if (need != 99)
            for (; k <= need && i + k < n; k++)
                if (s[i + k] < (k == 1 ? lo : 0x80) || s[i + k] > (k == 1 ? hi : 0xBF))
                    break;
        if (need != 99 && k == need + 1) {
            memcpy(o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i += need == 99 ? 1 : k;
        }
    }
    *o = '\0';
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] % 2 == 0) {
        zt_tokenizer_t *t = load_text(rest, n, "tok.json");
        static const char *const texts[] = {"Hello world", " spaced  out\n\n", "caf\xc3\xa9 \xe6\x9d\xb1",
                                            "bad \xff\xc3 bytes", "<|endoftext|><s>", ""};
        for (size_t i = 0; t && i < sizeof texts / sizeof texts[0]; i++)
            free(round_trip(t, texts[i], strlen(texts[i]), i % 2 == 0));
        zt_tokenizer_destroy(t);
        return 0;
    }
    char *bl = byte_level_json();
    zt_tokenizer_t *t = load_text(bl, strlen(bl), "bl.json");
    free(bl);
    FUZZ_CHECK(t != NULL, "the byte-level tokenizer does not load: %s", zt_last_error());
    char *back = round_trip(t, rest, n, true);
    char *want = repaired((const unsigned char *)rest, n);
    /* An embedded NUL is a byte like any other to the tokenizer but ends the C string. */
    FUZZ_CHECK(strcmp(back, want) == 0, "byte-level round trip gave back \"%s\" for \"%s\"",
               back, want);
    free(back);
    free(want);
    zt_tokenizer_destroy(t);
    t = load_text(sentencepiece_json, strlen(sentencepiece_json), "sp.json");
    FUZZ_CHECK(t != NULL, "the sentencepiece tokenizer does not load: %s", zt_last_error());
    free(round_trip(t, rest, n, true));
    zt_tokenizer_destroy(t);
    return 0;
}
