/* Bearer tokens: how ztraind and the CLI find the token, and how a request's header is checked. */
#ifndef ZTRAIN_AUTH_H
#define ZTRAIN_AUTH_H

#include <stdbool.h>

#include "ztrain/status.h"

/* The token from `file` (its first line, surrounding whitespace removed) when file is not NULL,
 * else from the file the ZTRAIN_TOKEN_FILE environment variable names, else the ZTRAIN_TOKEN
 * environment variable itself, else none (*token = NULL). Both variables set (and no file) is
 * ZT_ERR_INVALID naming them. An unreadable or empty file is ZT_ERR_IO / ZT_ERR_INVALID naming
 * it. *token is heap-owned by the caller. */
zt_status zt_auth_load_token(const char *file, char **token);

/* Whether `header` (the value of an Authorization header, may be NULL) is "Bearer <expected>".
 * The comparison takes the same time wherever the first difference is. */
bool zt_auth_bearer_ok(const char *expected, const char *header);

#endif
