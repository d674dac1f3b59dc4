/* Text checks and escaping (engine/util/text.c). The UTF-8 verdict is compared, for every sequence of
 * one to three bytes and for four-byte sequences around every boundary, with a reference written
 * the other way round: decode the bits without any range table, re-encode the code point in its
 * one canonical form, and call the bytes a character when that gives them back (and the code
 * point is neither a surrogate nor past U+10FFFF); the fault is where no such character starts. The printable rule and the escapes are checked against
 * hand-written cases from the Unicode code charts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ztrain/text.h"

/* The canonical (shortest) UTF-8 encoding of cp into out; its length. */
static size_t encode(uint32_t cp, unsigned char *out) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Whether the n bytes are exactly one UTF-8 character, the reference way. */
static bool one_char(const unsigned char *s, size_t n) {
    size_t len = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3
                                 : (s[0] >> 3) == 30 ? 4 : 0;
    if (len != n)
        return false;
    uint32_t cp = len == 1 ? s[0] : s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return false;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    unsigned char again[4];
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || encode(cp, again) != n)
        return false;
    return memcmp(again, s, n) == 0;
}

/* Where the n bytes stop being UTF-8 text without NUL, the reference way: the offset of the first
 * byte that starts no character of one to four bytes; n when there is none. */
static size_t first_fault(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k = 1;
        while (k <= 4 && (i + k > n || !one_char(s + i, k)))
            k++;
        if (k > 4 || (k == 1 && s[i] == 0))
            return i;
        i += k;
    }
    return n;
}

static void check_sequence(const unsigned char *s, size_t n) {
    size_t at = 99;
    char why[ZT_TEXT_WHY_SIZE];
    size_t want = first_fault(s, n);
    bool got = zt_text_check((const char *)s, n, ZT_TEXT_NO_NUL, &at, why);
    if (got != (want == n) || (!got && at != want))
        CHECK(false, "bytes %02x %02x %02x %02x (%zu): got %d at %zu (%s), want fault at %zu",
              s[0], n > 1 ? s[1] : 0, n > 2 ? s[2] : 0, n > 3 ? s[3] : 0, n, got, at,
              got ? "" : why, want);
    else
        check_count++;
}

static void check_utf8(void) {
    unsigned char s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (unsigned char)a;
        check_sequence(s, 1);
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (unsigned char)b;
            check_sequence(s, 2);
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (unsigned char)c;
                check_sequence(s, 3);
            }
        }
    }
    /* Four bytes: every lead, second bytes on each side of every boundary, a few tails. */
    static const unsigned char seconds[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0xBF, 0xC0, 0xFF};
    static const unsigned char tails[] = {0x41, 0x80, 0xBF, 0xC0};
    for (unsigned a = 0xE0; a < 256; a++)
        for (size_t b = 0; b < sizeof seconds; b++)
            for (size_t c = 0; c < sizeof tails; c++)
                for (size_t d = 0; d < sizeof tails; d++) {
                    unsigned char q[4] = {(unsigned char)a, seconds[b], tails[c], tails[d]};
                    check_sequence(q, 4);
                }
}

/* The printable rule, and where and what the fault is said to be. */
static void check_printable(void) {
    static const struct {
        const char *text;
        bool ok;
        size_t at;
        const char *why;
    } cases[] = {
        {"gpt2-small run #3", true, 0, ""},
        {"r\xc3\xa9sum\xc3\xa9 \xe8\xae\xad\xe7\xbb\x83 \xf0\x9f\x9a\x80", true, 0, ""},
        {"zero\xe2\x80\x8dwidth joiner", true, 0, ""},  /* U+200D: emoji sequences need it */
        {"a\x1b[31m", false, 1, "the control character U+001B"},
        {"bell\x07", false, 4, "the control character U+0007"},
        {"tab\there", false, 3, "the control character U+0009"},
        {"line\nbreak", false, 4, "the control character U+000A"},
        {"cr\r", false, 2, "the control character U+000D"},
        {"del\x7f", false, 3, "the control character U+007F"},
        {"csi\xc2\x9b", false, 3, "the control or format character U+009B"},
        {"\xc2\x80", false, 0, "the control or format character U+0080"},
        {"ok\xc2\xa0nbsp", true, 0, ""},                /* U+00A0 is a printable space */
        {"rlo\xe2\x80\xae", false, 3, "the control or format character U+202E"},
        {"lrm\xe2\x80\x8e", false, 3, "the control or format character U+200E"},
        {"alm\xd8\x9c", false, 3, "the control or format character U+061C"},
        {"ls\xe2\x80\xa8", false, 2, "the control or format character U+2028"},
        {"fsi\xe2\x81\xa8", false, 3, "the control or format character U+2068"},
        {"pdi\xe2\x81\xa9", false, 3, "the control or format character U+2069"},
        {"ok\xe2\x81\xaa", true, 0, ""},                 /* U+206A is past the isolates */
        {"bad\xff", false, 3, "invalid UTF-8 (byte 0xff)"},
        {"over\xc0\xaf", false, 4, "invalid UTF-8 (byte 0xc0)"},
        {"cut\xe2\x80", false, 3, "invalid UTF-8 (byte 0xe2)"},
        {"sur\xed\xa0\x80", false, 3, "invalid UTF-8 (byte 0xed)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t at = 99;
        char why[ZT_TEXT_WHY_SIZE] = "";
        const char *t = cases[i].text;
        bool ok = zt_text_check(t, strlen(t), ZT_TEXT_PRINTABLE, &at, why);
        CHECK(ok == cases[i].ok, "case %zu: got %d (%s at %zu)", i, ok, why, at);
        if (!cases[i].ok && !ok) {
            CHECK(at == cases[i].at, "case %zu: at %zu, want %zu", i, at, cases[i].at);
            CHECK_STR(why, cases[i].why);
        }
    }
    /* A NUL inside the length counts, with either rule; under NO_NUL controls pass. */
    size_t at = 99;
    char why[ZT_TEXT_WHY_SIZE];
    CHECK(!zt_text_check("ab\0cd", 5, ZT_TEXT_NO_NUL, &at, why) && at == 2);
    CHECK_STR(why, "a NUL byte");
    CHECK(!zt_text_check("ab\0cd", 5, ZT_TEXT_PRINTABLE, &at, why) && at == 2);
    CHECK(zt_text_check("a\tb\n\x1b", 5, ZT_TEXT_NO_NUL, &at, why));
    CHECK(zt_text_check("", 0, ZT_TEXT_PRINTABLE, &at, why));
}

static void check_escape(void) {
    static const struct {
        const char *in;
        int flags;
        const char *out;
    } cases[] = {
        {"plain text, \\ kept", 0, "plain text, \\ kept"},
        {"a\x1b[31mred\x07", 0, "a\\x1b[31mred\\x07"},
        {"tab\tstays", 0, "tab\tstays"},
        {"two\nlines", 0, "two\\x0alines"},
        {"two\nlines", ZT_ESCAPE_KEEP_NEWLINE, "two\nlines"},
        {"cr\rdel\x7f", 0, "cr\\x0ddel\\x7f"},
        {"csi\xc2\x9b" "2J", 0, "csi\\u009b2J"},
        {"rlo\xe2\x80\xae" "txt", 0, "rlo\\u202etxt"},
        {"r\xc3\xa9sum\xc3\xa9 \xf0\x9f\x9a\x80", 0, "r\xc3\xa9sum\xc3\xa9 \xf0\x9f\x9a\x80"},
        {"bad\xff\xfe", 0, "bad\\xff\\xfe"},
        {"cut\xe2\x80", 0, "cut\\xe2\\x80"},
        {"{\n\t\"n\":\t\"a\xc2\x9b\xe2\x80\xae\xff\x7f\"\n}", ZT_ESCAPE_JSON,
         "{\n\t\"n\":\t\"a\\u009b\\u202e\\ufffd\\u007f\"\n}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[128];
        size_t need = zt_text_escape(cases[i].in, cases[i].flags, buf, sizeof buf);
        const char *want = cases[i].out;
        CHECK(strcmp(buf, want) == 0, "case %zu:\n  want: %s\n  got:  %s", i, want, buf);
        CHECK(need == strlen(want), "case %zu: need %zu", i, need);
        char *dup = zt_text_escape_dup(cases[i].in, cases[i].flags);
        CHECK(dup && strcmp(dup, want) == 0, "case %zu: the heap copy differs", i);
        free(dup);
    }
    /* Cut short: never inside an escape or a character, always terminated, full length told. */
    const char *in = "ab\x1b\xc3\xa9z";
    static const char *const cut[] = {"", "a", "ab", "ab", "ab", "ab", "ab\\x1b", "ab\\x1b",
                                      "ab\\x1b\xc3\xa9", "ab\\x1b\xc3\xa9z"};
    for (size_t size = 1; size <= 10; size++) {
        char buf[16];
        memset(buf, '#', sizeof buf);
        size_t need = zt_text_escape(in, 0, buf, size);
        CHECK(need == 9, "size %zu: need %zu", size, need);
        CHECK_STR(buf, cut[size - 1]);
        CHECK(buf[size] == '#', "size %zu: wrote past the buffer", size);
    }
    CHECK(zt_text_escape(in, 0, NULL, 0) == 9);
}

int main(void) {
    check_utf8();
    check_printable();
    check_escape();
    return check_summary("test_text");
}
