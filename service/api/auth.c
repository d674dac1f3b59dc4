/* Bearer-token loading and checking, and the scopes of a daemon's tokens (auth.h). */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <gnutls/crypto.h>

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
    /* A variable set to nothing is a mistake (an unfilled template, a secret that did not
     * arrive), not a wish to run without authentication: refused like a blank one. */
    if (!file && env_file && !*env_file)
        return zt_error(ZT_ERR_INVALID, "ZTRAIN_TOKEN_FILE is set but empty: name the token's "
                        "file, or unset the variable");
    if (!file && env_token && !*env_token)
        return zt_error(ZT_ERR_INVALID, "ZTRAIN_TOKEN is set but empty: give the token, or "
                        "unset the variable");
    if (!file && env_file && env_token)
        return zt_error(ZT_ERR_INVALID, "both ZTRAIN_TOKEN_FILE and ZTRAIN_TOKEN are set: "
                        "unset one (ZTRAIN_TOKEN_FILE names a file holding the token, "
                        "ZTRAIN_TOKEN is the token)");
    if (!file && env_file)
        file = env_file;
    if (!file) {
        const char *env = env_token;
        if (!env)
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
    /* RFC 9110 11.1: an authentication scheme is matched case-insensitively ("bearer" and
     * "BEARER" are Bearer), and one or more spaces part it from the credentials. */
    static const char scheme[] = "Bearer";
    if (!header || strncasecmp(header, scheme, sizeof scheme - 1) != 0 ||
        header[sizeof scheme - 1] != ' ')
        return false;
    const char *got = header + sizeof scheme - 1;
    while (*got == ' ')
        got++;
    size_t ne = strlen(expected), ng = strlen(got);
    unsigned char diff = ne != ng;
    for (size_t i = 0; i < ng; i++)
        diff |= (unsigned char)(got[i] ^ expected[i % (ne ? ne : 1)]);
    return diff == 0 && ne > 0;
}

struct zt_auth_tokens {
    int n;
    char **token;
    zt_scope *scope;
    char (*identity)[ZT_AUTH_IDENTITY_MAX];
};

const char *zt_scope_name(zt_scope s) {
    switch (s) {
    case ZT_SCOPE_READ: return "read";
    case ZT_SCOPE_SUBMIT: return "submit";
    case ZT_SCOPE_ADMIN: return "admin";
    default: return "none";
    }
}

void zt_auth_tokens_free(zt_auth_tokens *t) {
    if (!t)
        return;
    for (int i = 0; i < t->n; i++)
        free(t->token[i]);
    free(t->token);
    free(t->scope);
    free(t->identity);
    free(t);
}

static zt_status add_token(zt_auth_tokens *t, const char *token, zt_scope scope,
                           const char *where) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->token[i], token) == 0)
            return zt_error(ZT_ERR_INVALID, "%s: the same token is already on an earlier line",
                            where);
    char **tk = realloc(t->token, (size_t)(t->n + 1) * sizeof *tk);
    if (tk)
        t->token = tk;
    zt_scope *sc = tk ? realloc(t->scope, (size_t)(t->n + 1) * sizeof *sc) : NULL;
    if (sc)
        t->scope = sc;
    char(*id)[ZT_AUTH_IDENTITY_MAX] =
        sc ? realloc(t->identity, (size_t)(t->n + 1) * sizeof *id) : NULL;
    if (id)
        t->identity = id;
    char *copy = id ? strdup(token) : NULL;
    unsigned char digest[32];
    if (!copy || gnutls_hash_fast(GNUTLS_DIG_SHA256, token, strlen(token), digest) != 0) {
        free(copy);
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    }
    int k = snprintf(t->identity[t->n], ZT_AUTH_IDENTITY_MAX, "sha256:");
    for (int i = 0; i < 8; i++)
        k += snprintf(t->identity[t->n] + k, (size_t)(ZT_AUTH_IDENTITY_MAX - k), "%02x", digest[i]);
    t->token[t->n] = copy;
    t->scope[t->n++] = scope;
    return ZT_OK;
}

/* One line of a token file: "<token>" or "<token> <scope>". */
static zt_status parse_line(zt_auth_tokens *t, char *line, const char *where) {
    char *tok = strtok(line, " \t"), *scope = strtok(NULL, " \t"), *extra = strtok(NULL, " \t");
    if (extra)
        return zt_error(ZT_ERR_INVALID, "%s: '%.32s' after the scope: a line is a token and "
                        "at most one scope (read, submit or admin)", where, extra);
    for (const char *p = tok; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p == 0x7f)
            return zt_error(ZT_ERR_INVALID, "%s: the token holds a control character", where);
    zt_scope sc = ZT_SCOPE_ADMIN;
    if (scope) {
        sc = !strcmp(scope, "read") ? ZT_SCOPE_READ : !strcmp(scope, "submit") ? ZT_SCOPE_SUBMIT
             : !strcmp(scope, "admin") ? ZT_SCOPE_ADMIN : ZT_SCOPE_NONE;
        if (sc == ZT_SCOPE_NONE)
            return zt_error(ZT_ERR_INVALID, "%s: unknown scope '%.32s' (read, submit or admin)",
                            where, scope);
    }
    return add_token(t, tok, sc, where);
}

zt_status zt_auth_load_tokens(const char *file, zt_auth_tokens **out) {
    *out = NULL;
    zt_auth_tokens *t = calloc(1, sizeof *t);
    if (!t)
        return zt_error(ZT_ERR_NOMEM, "out of memory");
    zt_status s = ZT_OK;
    /* $ZTRAIN_TOKEN_FILE is a token file like --token-file's (scopes included), unless
     * $ZTRAIN_TOKEN is set too, which zt_auth_load_token refuses as ambiguous. */
    const char *env_file = getenv("ZTRAIN_TOKEN_FILE"), *env_token = getenv("ZTRAIN_TOKEN");
    if (!file && env_file && *env_file && !env_token)
        file = env_file;
    if (!file) {
        char *env = NULL;
        s = zt_auth_load_token(NULL, &env);
        if (s == ZT_OK && env)
            s = add_token(t, env, ZT_SCOPE_ADMIN, "ZTRAIN_TOKEN");
        free(env);
    } else {
        char *data = NULL;
        s = zt_read_file(file, &data, NULL);
        int line_no = 0;
        for (char *line = data, *next; s == ZT_OK && line; line = next) {
            next = strchr(line, '\n');
            if (next)
                *next++ = '\0';
            line_no++;
            char *p = line;
            while (*p && isspace((unsigned char)*p))
                p++;
            size_t n = strlen(p);
            while (n > 0 && isspace((unsigned char)p[n - 1]))
                p[--n] = '\0';
            if (!*p || *p == '#')
                continue;
            char where[300];
            snprintf(where, sizeof where, "%s:%d", file, line_no);
            s = parse_line(t, p, where);
        }
        free(data);
        if (s == ZT_OK && t->n == 0)
            s = zt_error(ZT_ERR_INVALID, "%s: the token file holds no token", file);
    }
    if (s != ZT_OK || t->n == 0) {
        zt_auth_tokens_free(t);
        return s;
    }
    *out = t;
    return ZT_OK;
}

zt_auth_caller zt_auth_who(const zt_auth_tokens *t, const char *header) {
    zt_auth_caller who = {.scope = ZT_SCOPE_NONE};
    for (int i = 0; t && i < t->n; i++)
        if (zt_auth_bearer_ok(t->token[i], header) && t->scope[i] > who.scope) {
            who.scope = t->scope[i];
            memcpy(who.identity, t->identity[i], sizeof who.identity);
        }
    return who;
}

zt_scope zt_auth_scope(const zt_auth_tokens *t, const char *header) {
    return zt_auth_who(t, header).scope;
}
