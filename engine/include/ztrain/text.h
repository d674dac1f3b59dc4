/* Text that came from outside (a job's name, a request's strings, what a server sends back to the
 * CLI) checked and made safe to show (internal to libztrain, shared with ztraind and the CLI).
 *
 * A terminal acts on some characters instead of showing them: ESC starts sequences that recolour,
 * move the cursor, retitle the window or rewrite the clipboard, BEL rings, a carriage return
 * overwrites the line, and the bidirectional controls reorder what follows. Names are refused when
 * they hold one (zt_text_check); text that cannot be refused, such as a rank's log line or the
 * answer of an older server, is escaped before it is printed (zt_text_escape). */
#ifndef ZTRAIN_TEXT_H
#define ZTRAIN_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* What zt_text_check allows. Both rules require UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
typedef enum {
    ZT_TEXT_NO_NUL,     /* any character but NUL, which C strings would end at */
    /* No control or format character either: C0 (U+0000..U+001F, tab and newline included), DEL,
     * C1 (U+0080..U+009F), the line and paragraph separators U+2028/U+2029, and the
     * bidirectional marks, embeddings, overrides and isolates (U+061C, U+200E, U+200F,
     * U+202A..U+202E, U+2066..U+2069). */
    ZT_TEXT_PRINTABLE,
} zt_text_rule;

/* Room for the description zt_text_check writes. */
#define ZT_TEXT_WHY_SIZE 48

/* Whether the n bytes at s are UTF-8 text that obeys `rule`. When they are not, *offset is the
 * first offending byte (counting from 0) and why (ZT_TEXT_WHY_SIZE bytes) says what is there:
 * "invalid UTF-8 (byte 0xff)", "a NUL byte", "the control character U+001B". */
bool zt_text_check(const char *s, size_t n, zt_text_rule rule, size_t *offset, char *why);

/* Flags of zt_text_escape. */
enum {
    ZT_ESCAPE_KEEP_NEWLINE = 1, /* '\n' passes unchanged (a message of several lines) */
    /* The text is JSON (cJSON's output, or the API's proto3 JSON): what is escaped becomes a
     * JSON escape (\u001b, \u202e, and \ufffd for a byte that is not UTF-8), which is valid
     * because both only ever leave such characters inside strings; '\n' and '\t' pass, as
     * cJSON's indentation. */
    ZT_ESCAPE_JSON = 2,
};

/* Writes the NUL-terminated text s into buf (size bytes; always terminated when size > 0) with
 * every character that ZT_TEXT_PRINTABLE refuses made visible, except tab (and newline with
 * ZT_ESCAPE_KEEP_NEWLINE): an ASCII control or DEL as \xHH ("\x1b"), another refused character
 * as \uHHHH ("\u202e"), a byte that is not UTF-8 as \xHH. Everything else is copied unchanged,
 * backslashes included. Returns the length the whole escaped text needs, as snprintf does; text
 * cut short for want of room ends between two characters, never inside an escape or a UTF-8
 * sequence. */
size_t zt_text_escape(const char *s, int flags, char *buf, size_t size);

/* The same in a heap string the caller frees; NULL only when out of memory. */
char *zt_text_escape_dup(const char *s, int flags);

/* For a word that is no command or option (the CLI's and ztraind's "did you mean"): the word
 * of `text` nearest to it when it is near enough to be a typo ("lsit": list, "--limt":
 * --limit), written into buf (size bytes), or NULL. The candidates are text's words of letters,
 * digits, '-' and '_' (a command table's option list, or a program's --help), options ('-'
 * first) for an option and the others for a name; the word's "=value" is not compared. */
const char *zt_text_suggest(const char *word, const char *text, char *buf, size_t size);

#endif
