/* Bearer tokens: how ztraind and the CLI find the token, how a request's header is checked, and
 * the scopes (roles) a daemon's tokens carry.
 *
 * ztraind's --token-file holds one token per line, each optionally followed by its scope:
 *
 *     # dashboards and the Prometheus scrape
 *     9f2c...e1 read
 *     # CI submits jobs
 *     4ab0...77 submit
 *     c3d9...02 admin
 *
 * read: every query (jobs, metrics, records, logs, events, checkpoints, the effective config,
 * anomalies, webhook deliveries, exports, /metrics, health, reflection); submit: read, SubmitJob
 * (HTTP POST /api/v1/jobs) and cancelling the jobs this token submitted; admin: everything,
 * cancelling any job included; api_ops.h holds the table of which operation needs which. A
 * line with a token alone is admin (the one-token file of earlier versions). Blank lines and
 * lines starting with '#' are skipped; anything else is an error naming the file and
 * line. ZTRAIN_TOKEN, when there is no file, is one admin token. */
#ifndef ZTRAIN_AUTH_H
#define ZTRAIN_AUTH_H

#include <stdbool.h>

#include "ztrain/status.h"

/* The token from `file` (its first line, surrounding whitespace removed) when file is not NULL,
 * else from the file the ZTRAIN_TOKEN_FILE environment variable names, else the ZTRAIN_TOKEN
 * environment variable itself, else none (*token = NULL). Both variables set (and no file) is
 * ZT_ERR_INVALID naming them, and so is either one set but empty or blank: an empty variable
 * never means "no authentication". An unreadable or empty file is ZT_ERR_IO / ZT_ERR_INVALID
 * naming it. *token is heap-owned by the caller. */
zt_status zt_auth_load_token(const char *file, char **token);

/* Whether `header` (the value of an Authorization header, may be NULL) is "Bearer <expected>",
 * the scheme in any case and followed by one or more spaces (RFC 9110 11.1, RFC 6750 2.1).
 * The comparison takes the same time wherever the first difference is. */
bool zt_auth_bearer_ok(const char *expected, const char *header);

/* Scopes, each including the ones below it. */
typedef enum { ZT_SCOPE_NONE = 0, ZT_SCOPE_READ, ZT_SCOPE_SUBMIT, ZT_SCOPE_ADMIN } zt_scope;

const char *zt_scope_name(zt_scope s);

typedef struct zt_auth_tokens zt_auth_tokens;

/* ztraind's tokens: from `file` (the format above) when not NULL, else ZTRAIN_TOKEN as one
 * admin token, else none (*out = NULL: no authentication). Errors name the file and line: an
 * unknown scope, a token of white space or control characters, the same token twice. */
zt_status zt_auth_load_tokens(const char *file, zt_auth_tokens **out);
void zt_auth_tokens_free(zt_auth_tokens *t);

/* The scope of the token in `header` ("Bearer <token>", may be NULL): ZT_SCOPE_NONE when it
 * is none of them. Every token is compared, each in constant time, whichever matches. */
zt_scope zt_auth_scope(const zt_auth_tokens *t, const char *header);

/* A token's identity: "sha256:" and the first 16 hex digits of the token's SHA-256. It names
 * the token in a job's record (who submitted it) without revealing it, and stays the same
 * across restarts and edits of the file's other lines. */
#define ZT_AUTH_IDENTITY_MAX 24

/* Who a request is: its token's scope (as zt_auth_scope) and identity ("" when the scope is
 * ZT_SCOPE_NONE). */
typedef struct {
    zt_scope scope;
    char identity[ZT_AUTH_IDENTITY_MAX];
} zt_auth_caller;

zt_auth_caller zt_auth_who(const zt_auth_tokens *t, const char *header);

#endif
