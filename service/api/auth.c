/* Bearer-token loading and checking (auth.h). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "ztrain/fsutil.h"

static char *trim_first_line(char *s) {
    char *nl = strchr(s, '\n');
    if (nl)
        *nl = '\0';
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

zt_status zt_auth_load_token(const char *file, char **token) {
    *token = NULL;
    /* One rule for the CLI, ztraind and the container: ZTRAIN_TOKEN_FILE names a file,
     * ZTRAIN_TOKEN is the token itself; both set is ambiguous and refused rather than one of
     * them silently ignored. */
    const char *env_file = getenv("ZTRAIN_TOKEN_FILE"), *env_token = getenv("ZTRAIN_TOKEN");
    if (!file && env_file && *env_file && env_token && *env_token)
        return zt_error(ZT_ERR_INVALID, "both ZTRAIN_TOKEN_FILE and ZTRAIN_TOKEN are set: "
                        "unset one (ZTRAIN_TOKEN_FILE names a file holding the token, "
                        "ZTRAIN_TOKEN is the token)");
    if (!file && env_file && *env_file)
        file = env_file;
    if (!file) {
        const char *env = env_token;
        if (!env || !*env)
            return ZT_OK;
        char *copy = strdup(env);
        char *t = copy ? trim_first_line(copy) : NULL;
        if (!t || !*t) {
            free(copy);
            return zt_error(ZT_ERR_INVALID, "ZTRAIN_TOKEN is blank");
        }
        *token = strdup(t);
        free(copy);
        return *token ? ZT_OK : ZT_ERR_NOMEM;
    }
    char *data = NULL;
    ZT_TRY(zt_read_file(file, &data, NULL));
    char *t = trim_first_line(data);
    if (!*t) {
        free(data);
        return zt_error(ZT_ERR_INVALID, "%s: the token file is empty", file);
    }
    *token = strdup(t);
    free(data);
    return *token ? ZT_OK : ZT_ERR_NOMEM;
}

bool zt_auth_bearer_ok(const char *expected, const char *header) {
    static const char prefix[] = "Bearer ";
    if (!header || strncmp(header, prefix, sizeof prefix - 1) != 0)
        return false;
    const char *got = header + sizeof prefix - 1;
    size_t ne = strlen(expected), ng = strlen(got);
    unsigned char diff = ne != ng;
    for (size_t i = 0; i < ng; i++)
        diff |= (unsigned char)(got[i] ^ expected[i % (ne ? ne : 1)]);
    return diff == 0 && ne > 0;
}
