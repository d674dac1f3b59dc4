/* Tests for the safetensors reader and writer (engine/ckpt/safetensors.c).
 *
 * A round trip through the writer and reader, the F16/BF16 conversions against the IEEE formulas
 * for every bit pattern, and one hand-built file per defect, each of which must be refused with a
 * message naming the file and the tensor. Truncations and byte flips of a valid file must never
 * crash. Interop with an independent Python implementation is in
 * tests/reference/test_safetensors_io.py. */
#define _XOPEN_SOURCE 700 /* mkdtemp and realpath, for check.h; before any header */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ztrain/safetensors.h"

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    *n = fread(buf, 1, (size_t)len, f);
    fclose(f);
    return buf;
}

/* A file from a header text and a data section of `data_len` bytes (filled with 0x3f). */
static void build_file(const char *path, const char *header, size_t data_len) {
    size_t hl = strlen(header), n = 8 + hl + data_len;
    unsigned char *buf = malloc(n);
    uint64_t h = hl;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, 0x3f, data_len);
    check_write_file(path, buf, n);
    free(buf);
}

/* Opening must fail with `want` and a message that names the file and holds each fact. */
static void expect_open_fails(const char *path, zt_status want, ...) {
    zt_st_file f;
    zt_status s = zt_st_open(&f, path);
    va_list facts;
    va_start(facts, want);
    check_error_has(__FILE__, __LINE__, s, want, path, facts);
    va_end(facts);
    CHECK(f.map == NULL && f.tensors == NULL && f.path == NULL);
    if (s == ZT_OK)
        zt_st_close(&f);
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_round_trip(void) {
    float wte[15], qkv[24], scalar = -0.0f;
    for (int i = 0; i < 15; i++)
        wte[i] = (float)i * 0.37f - 2.0f;
    for (int i = 0; i < 24; i++)
        qkv[i] = ldexpf(1.0f + (float)i / 32.0f, i - 140); /* reaches fp32 subnormals */
    qkv[3] = INFINITY;
    qkv[4] = -INFINITY;
    qkv[5] = NAN;
    const char *odd = "we\"ird\\name\twith\x01 ctl and ünïcode";
    zt_st_entry e[] = {
        {"wte", wte, 2, {5, 3}},
        {"h.0.attn.c_attn.weight", qkv, 3, {2, 3, 4}},
        {"scalar", &scalar, 0, {0}},
        {"empty", NULL, 2, {0, 4}},
        {odd, wte, 1, {1}},
    };
    const char *mk[] = {"format", "note"};
    const char *mv[] = {"pt", "line\nbreak \"quoted\" \\ end"};
    const char *p = check_tmp_path("rt.safetensors");
    CHECK(zt_st_write(p, e, 5, mk, mv, 2) == ZT_OK);
    CHECK(access(check_tmp_path("rt.safetensors.tmp"), F_OK) != 0);

    /* The layout the reference writer produces: 8-byte length, space-padded header. */
    size_t n;
    unsigned char *raw = read_file(p, &n);
    uint64_t hl;
    memcpy(&hl, raw, 8);
    CHECK(hl % 8 == 0 && 8 + hl + (15 + 24 + 1 + 0 + 1) * 4 == n);
    CHECK(raw[8] == '{' && (raw[8 + hl - 1] == '}' || raw[8 + hl - 1] == ' '));
    free(raw);

    zt_st_file f;
    CHECK(zt_st_open(&f, p) == ZT_OK);
    CHECK(f.n_tensors == 5 && f.data_start % 8 == 0);
    size_t at = 0;
    for (int i = 0; i < 5; i++) {
        const zt_st_tensor *t = &f.tensors[i];
        CHECK(strcmp(t->name, e[i].name) == 0);
        CHECK(zt_st_find(&f, e[i].name) == t);
        CHECK(t->dtype == ZT_ST_F32 && strcmp(t->dtype_name, "F32") == 0);
        CHECK(t->ndim == e[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            CHECK(t->shape[d] == e[i].shape[d]);
        CHECK(t->offset == at);
        int64_t numel = zt_st_numel(t);
        CHECK(t->nbytes == (size_t)numel * 4);
        at += t->nbytes;
        float out[32];
        CHECK(zt_st_read_f32(&f, t, out, (size_t)numel) == ZT_OK);
        for (int64_t k = 0; k < numel; k++)
            CHECK(same_bits(out[k], e[i].data[k]));
    }
    CHECK(zt_st_find(&f, "nope") == NULL);
    CHECK(zt_st_numel(zt_st_find(&f, "scalar")) == 1);
    cJSON *meta = cJSON_Parse(f.metadata_json);
    CHECK(meta && cJSON_GetArraySize(meta) == 2);
    CHECK(strcmp(cJSON_GetObjectItem(meta, "format")->valuestring, "pt") == 0);
    CHECK(strcmp(cJSON_GetObjectItem(meta, "note")->valuestring, mv[1]) == 0);
    cJSON_Delete(meta);
    zt_st_close(&f);
    zt_st_close(&f);

    /* No metadata and no tensors is a valid, empty file. */
    CHECK(zt_st_write(p, NULL, 0, NULL, NULL, 0) == ZT_OK);
    CHECK(zt_st_open(&f, p) == ZT_OK);
    CHECK(f.n_tensors == 0 && f.metadata_json == NULL);
    zt_st_close(&f);
}

/* binary16 and bfloat16 from their definitions, for comparison with the bit manipulation. */
static float half_formula(uint16_t h, int mant_bits, int exp_bits) {
    int bias = (1 << (exp_bits - 1)) - 1, emax = (1 << exp_bits) - 1;
    int sign = h >> 15, exp = (h >> mant_bits) & emax, mant = h & ((1 << mant_bits) - 1);
    double v;
    if (exp == emax)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(mant, 1 - bias - mant_bits);
    else
        v = ldexp(1.0 + ldexp(mant, -mant_bits), exp - bias);
    return (float)(sign ? -v : v);
}

static void test_half_conversions(void) {
    /* One F16 and one BF16 tensor holding every 16-bit pattern, after a header padded so that
     * the data is unaligned, as other writers may leave it. */
    static unsigned char buf[8 + 256 + 4 * 65536];
    char header[256];
    snprintf(header, sizeof header,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[65536],\"data_offsets\":[0,131072]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[256,256],\"data_offsets\":[131072,262144]}}");
    size_t hl = strlen(header);
    while ((8 + hl) % 4 != 1)
        header[hl++] = ' ';
    header[hl] = 0;
    uint64_t h64 = hl;
    memcpy(buf, &h64, 8);
    memcpy(buf + 8, header, hl);
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t v = (uint16_t)i;
        memcpy(buf + 8 + hl + 2 * i, &v, 2);
        memcpy(buf + 8 + hl + 131072 + 2 * i, &v, 2);
    }
    const char *p = check_tmp_path("half.safetensors");
    check_write_file(p, buf, 8 + hl + 262144);
    zt_st_file f;
    CHECK(zt_st_open(&f, p) == ZT_OK);
    CHECK(f.data_start % 4 == 1);
    float *out = malloc(65536 * sizeof *out);
    const zt_st_tensor *th = zt_st_find(&f, "h"), *tb = zt_st_find(&f, "b");
    CHECK(th && th->dtype == ZT_ST_F16 && tb && tb->dtype == ZT_ST_BF16);
    for (int k = 0; k < 2; k++) {
        const zt_st_tensor *t = k ? tb : th;
        CHECK(zt_st_read_f32(&f, t, out, 65536) == ZT_OK);
        int bad = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            float want = k ? half_formula((uint16_t)i, 7, 8) : half_formula((uint16_t)i, 10, 5);
            /* A NaN keeps its sign and its payload in the top mantissa bits. */
            uint32_t bits;
            memcpy(&bits, &out[i], 4);
            uint32_t payload = k ? (bits >> 16) & 0x7f : (bits >> 13) & 0x3ff;
            uint32_t want_payload = k ? i & 0x7f : i & 0x3ff;
            bool ok = isnan(want) ? isnan(out[i]) && (signbit(out[i]) != 0) == (i >> 15 != 0) &&
                                        payload == want_payload
                                  : same_bits(out[i], want);
            if (!ok && bad++ < 5)
                fprintf(stderr, "FAIL %s 0x%04x: got %a want %a\n", k ? "BF16" : "F16", i,
                        out[i], want);
        }
        CHECK(bad == 0);
    }
    /* Spot values that name the cases: smallest subnormal, largest normal, -0, inf. */
    CHECK(zt_st_read_f32(&f, th, out, 65536) == ZT_OK);
    CHECK(out[0x0001] == ldexpf(1.0f, -24) && out[0x7bff] == 65504.0f);
    CHECK(same_bits(out[0x8000], -0.0f) && out[0x7c00] == INFINITY && isnan(out[0x7e00]));
    zt_status s = zt_st_read_f32(&f, th, out, 65535);
    CHECK(s == ZT_ERR_FORMAT && strstr(zt_last_error(), "'h'") &&
          strstr(zt_last_error(), "65536 elements, expected 65535"));
    free(out);
    zt_st_close(&f);
}

static void test_other_dtypes(void) {
    const char *p = check_tmp_path("types.safetensors");
    build_file(p,
               "{\"__metadata__\":{\"a\":\"b\"},"
               "\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
               "\"u\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]},"
               "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[19,27]},"
               "\"q\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[27,30]}}    ",
               30);
    zt_st_file f;
    CHECK(zt_st_open(&f, p) == ZT_OK);
    CHECK(f.n_tensors == 4);
    const zt_st_tensor *i = zt_st_find(&f, "i"), *u = zt_st_find(&f, "u"), *d = zt_st_find(&f, "d");
    CHECK(i && i->dtype == ZT_ST_I64 && i->nbytes == 16);
    CHECK(u && u->dtype == ZT_ST_U8 && u->nbytes == 3);
    CHECK(zt_st_find(&f, "q")->dtype == ZT_ST_OTHER);
    float out[3];
    CHECK(zt_st_read_f32(&f, i, out, 2) == ZT_ERR_FORMAT);
    CHECK(strstr(zt_last_error(), p) && strstr(zt_last_error(), "'i'") &&
          strstr(zt_last_error(), "I64, not a float type"));
    CHECK(zt_st_read_f32(&f, d, out, 1) == ZT_OK);
    double dv;
    memset(&dv, 0x3f, sizeof dv);
    CHECK(out[0] == (float)dv);
    zt_st_close(&f);
}

static void test_bad_files(void) {
    const char *p = check_tmp_path("bad.safetensors");
    zt_st_entry e[] = {{"a", (float[]){1, 2, 3, 4}, 1, {4}}, {"b", (float[]){5, 6}, 2, {1, 2}}};

    /* Truncated: the last tensor runs off the end; cut into the length field. */
    CHECK(zt_st_write(p, e, 2, NULL, NULL, 0) == ZT_OK);
    size_t n;
    unsigned char *raw = read_file(p, &n);
    uint64_t hl;
    memcpy(&hl, raw, 8);
    check_write_file(p, raw, 8 + hl + 20);
    expect_open_fails(p, ZT_ERR_FORMAT, "'b'", "runs past the end", NULL);
    check_write_file(p, raw, 8 + hl + 23);
    expect_open_fails(p, ZT_ERR_FORMAT, "'b'", "runs past the end", NULL);
    check_write_file(p, raw, 8 + hl - 1);
    expect_open_fails(p, ZT_ERR_FORMAT, "header length", NULL);
    check_write_file(p, raw, 5);
    expect_open_fails(p, ZT_ERR_FORMAT, "5 bytes", "too short", NULL);
    check_write_file(p, raw, 0);
    expect_open_fails(p, ZT_ERR_FORMAT, "0 bytes", NULL);
    free(raw);

    /* A header length beyond the file, and one absurdly large. */
    unsigned char big[64] = {0};
    uint64_t len = 1000;
    memcpy(big, &len, 8);
    memcpy(big + 8, "{}", 2);
    check_write_file(p, big, sizeof big);
    expect_open_fails(p, ZT_ERR_FORMAT, "header length 1000 is larger than the 56 bytes", NULL);
    len = UINT64_MAX;
    memcpy(big, &len, 8);
    check_write_file(p, big, sizeof big);
    expect_open_fails(p, ZT_ERR_FORMAT, "header length 18446744073709551615", NULL);

    const char *F = "\"dtype\":\"F32\"";
    char h[512];
#define BAD(data_len, ...)                                                        \
    do {                                                                          \
        build_file(p, h, data_len);                                               \
        expect_open_fails(p, ZT_ERR_FORMAT, __VA_ARGS__, NULL);                   \
    } while (0)

    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2],", F);
    BAD(8, "not valid JSON");
    snprintf(h, sizeof h, "[1,2]");
    BAD(0, "not a JSON object");
    snprintf(h, sizeof h, "{}xyz");
    BAD(0, "unexpected byte 0x78");
    snprintf(h, sizeof h, "{}");
    BAD(4, "no tensors but 4 bytes");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[0,8]}}", F);
    BAD(4, "'a'", "runs past the end of the 4-byte data section");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[100,108]}}", F);
    BAD(8, "'a'", "gap");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[3],\"data_offsets\":[0,8]}}", F);
    BAD(8, "'a'", "dtype F32 and shape [3] need 12 bytes but data_offsets [0, 8] span 8");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    BAD(8, "'w'", "unknown dtype \"F33\"");
    snprintf(h, sizeof h, "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}");
    BAD(8, "'w'", "dtype");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{%s,\"shape\":[2],\"data_offsets\":[4,12]}}", F, F);
    BAD(12, "'b'", "overlaps tensor 'a'");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{%s,\"shape\":[1],\"data_offsets\":[8,12]}}", F, F);
    BAD(12, "'b'", "gap after byte 4");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]}}", F);
    BAD(8, "tensors end at data offset 4 but the data section has 8 bytes");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"a\":{%s,\"shape\":[1],\"data_offsets\":[4,8]}}", F, F);
    BAD(8, "'a' appears twice");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[-1],\"data_offsets\":[0,4]}}", F);
    BAD(4, "'a'", "shape entry 0");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1.5],\"data_offsets\":[0,4]}}", F);
    BAD(4, "'a'", "shape entry 0");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":2,\"data_offsets\":[0,4]}}", F);
    BAD(4, "'a'", "shape");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4,8]}}", F);
    BAD(4, "'a'", "data_offsets");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[8,4]}}", F);
    BAD(4, "'a'", "end before they begin");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", F);
    BAD(4, "'a'", "9 dimensions");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", F);
    BAD(4, "'a'", "too large");
    snprintf(h, sizeof h, "{\"a\":[1]}");
    BAD(4, "'a'", "not an object");
    snprintf(h, sizeof h, "{\"q\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}");
    BAD(2, "'q'", "whole bytes");
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":1}}");
    BAD(0, "metadata value of 'k' is not a string");
    snprintf(h, sizeof h, "{\"__metadata__\":[]}");
    BAD(0, "\"__metadata__\" is not an object");
#undef BAD

    expect_open_fails(check_tmp_path("missing.safetensors"), ZT_ERR_IO, "No such file or directory",
                      NULL);
    expect_open_fails(check_tmpdir, ZT_ERR_IO, "not a regular file", NULL);

    /* The writer refuses bad input and leaves no file behind. */
    const char *w = check_tmp_path("w.safetensors");
    zt_st_entry dup[] = {{"x", (float[]){1}, 1, {1}}, {"x", (float[]){2}, 1, {1}}};
    CHECK(zt_st_write(w, dup, 2, NULL, NULL, 0) == ZT_ERR_INVALID &&
          strstr(zt_last_error(), "'x' is listed twice"));
    zt_st_entry nodata[] = {{"x", NULL, 1, {3}}};
    CHECK(zt_st_write(w, nodata, 1, NULL, NULL, 0) == ZT_ERR_INVALID);
    zt_st_entry reserved[] = {{"__metadata__", (float[]){1}, 1, {1}}};
    CHECK(zt_st_write(w, reserved, 1, NULL, NULL, 0) == ZT_ERR_INVALID);
    const char *k2[] = {"k", "k"}, *v2[] = {"1", "2"};
    CHECK(zt_st_write(w, NULL, 0, k2, v2, 2) == ZT_ERR_INVALID);
    CHECK(access(w, F_OK) != 0);
    const char *nodir = check_tmp_path("no/such/dir.safetensors");
    CHECK(zt_st_write(nodir, e, 2, NULL, NULL, 0) == ZT_ERR_IO &&
          strstr(zt_last_error(), "No such file or directory"));
}

/* Every truncation and many single-byte changes of a valid file: each must open or fail
 * cleanly (run under ZT_SANITIZE to catch out-of-bounds reads). */
static void test_no_crash(void) {
    const char *p = check_tmp_path("fuzz.safetensors");
    zt_st_entry e[] = {{"a", (float[]){1, 2, 3, 4}, 2, {2, 2}}, {"bb", (float[]){5}, 0, {0}}};
    const char *mk[] = {"m"}, *mv[] = {"v"};
    CHECK(zt_st_write(p, e, 2, mk, mv, 1) == ZT_OK);
    size_t n;
    unsigned char *raw = read_file(p, &n);
    int opened = 0;
    for (size_t cut = 0; cut < n; cut++) {
        check_write_file(p, raw, cut);
        zt_st_file f;
        if (zt_st_open(&f, p) == ZT_OK) {
            opened++;
            zt_st_close(&f);
        }
    }
    CHECK(opened == 0);
    const unsigned char subst[] = {0, '"', '{', '}', '[', ']', ',', ':', '9', '-', 'e', 0xff};
    uint32_t rng = 12345;
    for (size_t pos = 0; pos < n; pos++)
        for (int k = 0; k < 3; k++) {
            unsigned char *m = malloc(n);
            memcpy(m, raw, n);
            rng = rng * 1103515245u + 12345u;
            m[pos] = subst[(rng >> 16) % sizeof subst];
            check_write_file(p, m, n);
            zt_st_file f;
            if (zt_st_open(&f, p) == ZT_OK) {
                for (int i = 0; i < f.n_tensors; i++) {
                    float out[16];
                    int64_t ne = zt_st_numel(&f.tensors[i]);
                    if (ne <= 16)
                        (void)zt_st_read_f32(&f, &f.tensors[i], out, (size_t)ne);
                }
                zt_st_close(&f);
            }
            free(m);
        }
    free(raw);
}

int main(void) {
    check_tmpdir_create("zt_test_st");
    test_round_trip();
    test_half_conversions();
    test_other_dtypes();
    test_bad_files();
    test_no_crash();
    check_tmpdir_remove();
    return check_summary("test_safetensors");
}
