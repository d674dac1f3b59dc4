/* Fuzz target: the bearer-token file reader and the header check (service/api/auth.c), which
 * ztraind and the CLI run on --token-file and ZTRAIN_TOKEN, and ztraind on every request's
 * Authorization header. The input is the token file; the token it gives must be what auth.h
 * says (the first line without surrounding whitespace, never empty), the header check must
 * accept exactly "Bearer <token>", and the same text through ZTRAIN_TOKEN must give the same
 * token. */
#include <ctype.h>
#include <limits.h>

#include "api/auth.h"
#include "fuzz_util.h"

/* The token auth.h promises for this text (up to its first NUL), or NULL for none. */
static char *expected_token(const char *text) {
    const char *end = strchr(text, '\n');
    if (!end)
        end = text + strlen(text);
    while (text < end && isspace((unsigned char)*text))
        text++;
    while (end > text && isspace((unsigned char)end[-1]))
        end--;
    return end > text ? strndup(text, (size_t)(end - text)) : NULL;
}

static void check_header(const char *token) {
    size_t n = strlen(token);
    char *header = malloc(n + 9);
    FUZZ_CHECK(header != NULL, "out of memory");
    sprintf(header, "Bearer %s", token);
    FUZZ_CHECK(zt_auth_bearer_ok(token, header), "'%s' refused", header);
    /* One byte changed, one too many, one too few, another scheme: all refused. */
    header[7 + n / 2] ^= 1;
    FUZZ_CHECK(!zt_auth_bearer_ok(token, header), "'%s' accepted for '%s'", header, token);
    header[7 + n / 2] ^= 1;
    header[7 + n] = 'x';
    header[8 + n] = '\0';
    FUZZ_CHECK(!zt_auth_bearer_ok(token, header), "'%s' accepted for '%s'", header, token);
    header[6 + n] = '\0';
    FUZZ_CHECK(!zt_auth_bearer_ok(token, header), "'%s' accepted for '%s'", header, token);
    FUZZ_CHECK(!zt_auth_bearer_ok(token, token), "the bare token accepted as a header");
    FUZZ_CHECK(!zt_auth_bearer_ok(token, NULL), "no header accepted");
    free(header);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/token", fuzz_tmpdir());
    fuzz_write_file(path, data, size);
    char *text = fuzz_cstr(data, size);
    char *want = expected_token(text);

    char *token = NULL;
    zt_status s = zt_auth_load_token(path, &token);
    FUZZ_CHECK((s == ZT_OK) == (want != NULL), "load gave %d for a file whose token is %s%s%s",
               (int)s, want ? "'" : "", want ? want : "none", want ? "'" : "");
    if (s == ZT_OK) {
        FUZZ_CHECK(token && strcmp(token, want) == 0, "token '%s', expected '%s'",
                   token ? token : "(null)", want);
        check_header(token);
        free(token);
    }

    /* The same text as ZTRAIN_TOKEN: an empty or blank value is refused, never "no token". */
    setenv("ZTRAIN_TOKEN", text, 1);
    token = NULL;
    s = zt_auth_load_token(NULL, &token);
    if (want)
        FUZZ_CHECK(s == ZT_OK && token && strcmp(token, want) == 0,
                   "ZTRAIN_TOKEN gave '%s', expected '%s'", token ? token : "(null)", want);
    else
        FUZZ_CHECK(s != ZT_OK, "a blank ZTRAIN_TOKEN was accepted");
    free(token);
    unsetenv("ZTRAIN_TOKEN");
    free(want);
    free(text);
    return 0;
}
