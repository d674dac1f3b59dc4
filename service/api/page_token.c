/* Page tokens signed with the state directory's key (page_token.h): OpenSSL's HMAC-SHA256 and
 * its base64 (EVP_EncodeBlock), with the URL alphabet and padding of RFC 4648 section 5 mapped
 * in and out here. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "page_token.h"

#define TOKEN_VERSION 2
#define MAX_CURSOR 64
#define TAG 32
/* version, list, the cursor, the tag. */
#define MAX_RAW (2 + MAX_CURSOR + TAG)

/* ---- the key ---------------------------------------------------------------------------- */

static zt_status read_key(zt_page_key *key, const char *path, int fd) {
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return zt_error(ZT_ERR_IO, "%s: %s", path, strerror(errno));
    /* A key others can read lets them make tokens: refused rather than used (as ssh does). */
    if (!S_ISREG(sb.st_mode) || (sb.st_mode & 077))
        return zt_error(ZT_ERR_INVALID, "%s: the page token key must be a regular file only "
                        "its owner can read (chmod 600), mode is %03o", path,
                        (unsigned)(sb.st_mode & 0777));
    unsigned char buf[ZT_PAGE_KEY_BYTES + 1];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0)
        return zt_error(ZT_ERR_IO, "%s: %s", path, strerror(errno));
    if (n != ZT_PAGE_KEY_BYTES)
        return zt_error(ZT_ERR_INVALID, "%s: the page token key must be %d bytes, it has %s%zd; "
                        "remove it to have a new one made (tokens handed out stop working)",
                        path, ZT_PAGE_KEY_BYTES, n > ZT_PAGE_KEY_BYTES ? "more than " : "",
                        n > ZT_PAGE_KEY_BYTES ? (ssize_t)ZT_PAGE_KEY_BYTES : n);
    memcpy(key->bytes, buf, ZT_PAGE_KEY_BYTES);
    OPENSSL_cleanse(buf, sizeof buf);
    return ZT_OK;
}

/* Writes a new key to a temporary file and renames it into place, so that a crash never leaves
 * a short key behind. */
static zt_status make_key(zt_page_key *key, const char *dir, const char *path) {
    if (RAND_bytes(key->bytes, ZT_PAGE_KEY_BYTES) != 1)
        return zt_error(ZT_ERR_IO, "%s: no random bytes for a page token key", path);
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, ZT_PAGE_KEY_FILE) >= (int)sizeof tmp)
        return zt_error(ZT_ERR_INVALID, "%s: path too long", path);
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: %s", tmp, strerror(errno));
    bool ok = write(fd, key->bytes, ZT_PAGE_KEY_BYTES) == ZT_PAGE_KEY_BYTES && fsync(fd) == 0;
    int err = errno;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        err = ok ? errno : err;
        unlink(tmp);
        return zt_error(ZT_ERR_IO, "%s: %s", path, strerror(err));
    }
    return ZT_OK;
}

zt_status zt_page_key_load(zt_page_key *key, const char *state_dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", state_dir, ZT_PAGE_KEY_FILE) >= (int)sizeof path)
        return zt_error(ZT_ERR_INVALID, "%s/%s: path too long", state_dir, ZT_PAGE_KEY_FILE);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return make_key(key, state_dir, path);
    if (fd < 0)
        return zt_error(ZT_ERR_IO, "%s: %s", path, strerror(errno));
    zt_status s = read_key(key, path, fd);
    close(fd);
    return s;
}

/* ---- base64url -------------------------------------------------------------------------- */

/* OpenSSL writes the standard alphabet with padding; tokens use the URL one without. */
static void to_url(const unsigned char *raw, size_t n, char *out) {
    int len = EVP_EncodeBlock((unsigned char *)out, raw, (int)n);
    for (int i = 0; i < len; i++)
        out[i] = out[i] == '+' ? '-' : out[i] == '/' ? '_' : out[i];
    while (len > 0 && out[len - 1] == '=')
        len--;
    out[len] = '\0';
}

/* The bytes of an unpadded base64url text, or -1. Only the canonical spelling of some bytes
 * reads back: EVP_DecodeBlock skips white space and ignores the unused low bits of the last
 * character, so the text is checked against the encoding of what it decoded to. */
static long from_url(const char *text, unsigned char *raw, size_t raw_size) {
    size_t len = strlen(text);
    char std[(MAX_RAW + 2) / 3 * 4 + 4];
    if (len % 4 == 1 || len + 3 >= sizeof std)
        return -1;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return -1;
        std[i] = c == '-' ? '+' : c == '_' ? '/' : c;
    }
    size_t pad = (4 - len % 4) % 4;
    memset(std + len, '=', pad);
    std[len + pad] = '\0';
    unsigned char buf[sizeof std];
    int n = EVP_DecodeBlock(buf, (const unsigned char *)std, (int)(len + pad));
    if (n < 0 || (size_t)n < pad || (size_t)n - pad > raw_size)
        return -1;
    n -= (int)pad;
    char again[sizeof std];
    to_url(buf, (size_t)n, again);
    if (strcmp(again, text) != 0)
        return -1;
    memcpy(raw, buf, (size_t)n);
    return n;
}

/* ---- tokens ----------------------------------------------------------------------------- */

static unsigned char *add_field(unsigned char *p, const char *s, size_t n) {
    *p++ = (unsigned char)(n >> 8);
    *p++ = (unsigned char)n;
    memcpy(p, s, n);
    return p + n;
}

/* The tag of a cursor of `list` for job and filter under key, into tag (TAG bytes). */
static bool make_tag(const zt_page_key *key, zt_page_list list, const char *job,
                     const char *filter, const char *cursor, size_t cursor_len,
                     unsigned char *tag) {
    job = job ? job : "";
    filter = filter ? filter : "";
    size_t job_len = strlen(job), filter_len = strlen(filter);
    if (job_len > 0xffff || filter_len > 0xffff || cursor_len > MAX_CURSOR)
        return false;
    unsigned char *msg = malloc(2 + 6 + job_len + filter_len + cursor_len);
    if (!msg)
        return false;
    unsigned char *p = msg;
    *p++ = TOKEN_VERSION;
    *p++ = (unsigned char)list;
    p = add_field(p, job, job_len);
    p = add_field(p, filter, filter_len);
    p = add_field(p, cursor, cursor_len);
    unsigned int tag_len = 0;
    bool ok = HMAC(EVP_sha256(), key->bytes, ZT_PAGE_KEY_BYTES, msg, (size_t)(p - msg), tag,
                   &tag_len) && tag_len == TAG;
    free(msg);
    return ok;
}

bool zt_page_token_make(const zt_page_key *key, zt_page_list list, const char *job,
                        const char *filter, const char *cursor, char *out, size_t out_size) {
    unsigned char raw[MAX_RAW];
    size_t n = strlen(cursor);
    if (out_size)
        out[0] = '\0';
    if (n > MAX_CURSOR || out_size < ZT_PAGE_TOKEN_MAX)
        return false;
    raw[0] = TOKEN_VERSION;
    raw[1] = (unsigned char)list;
    memcpy(raw + 2, cursor, n);
    if (!make_tag(key, list, job, filter, cursor, n, raw + 2 + n))
        return false;
    to_url(raw, 2 + n + TAG, out);
    return true;
}

bool zt_page_token_read(const zt_page_key *key, const char *token, zt_page_list list,
                        const char *job, const char *filter, char *cursor, size_t cursor_size) {
    unsigned char raw[MAX_RAW], want[TAG];
    if (cursor_size)
        cursor[0] = '\0';
    long n = from_url(token, raw, sizeof raw);
    if (n < 2 + TAG + 1 || raw[0] != TOKEN_VERSION || raw[1] != (unsigned char)list)
        return false;
    size_t m = (size_t)n - 2 - TAG;
    const char *text = (const char *)raw + 2;
    /* A cursor is text: a NUL inside would cut it short. */
    if (m >= cursor_size || memchr(text, '\0', m) ||
        !make_tag(key, list, job, filter, text, m, want) ||
        CRYPTO_memcmp(want, raw + 2 + m, TAG) != 0)
        return false;
    memcpy(cursor, text, m);
    cursor[m] = '\0';
    return true;
}
