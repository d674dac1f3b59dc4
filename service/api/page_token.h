/* Page tokens (AIP-158's next_page_token) that gRPC and HTTP hand out alike for the lists that
 * page by a cursor: opaque to clients, authenticated, and bound to the list, the job and the
 * filter they came from.
 *
 * A token is the base64url text (RFC 4648 section 5, no padding) of
 *     version (1 byte, 2) | list (1 byte, zt_page_list) | cursor (its bytes) | tag (32 bytes)
 * where tag is HMAC-SHA256, under the state directory's page key, of
 *     version | list | u16 len | job | u16 len | filter | u16 len | cursor
 * (lengths big-endian). The job and the filter are not in the token: the request that brings
 * it back supplies them, so a token of another list, another job or another filter, one the
 * server never made, one altered or cut short, or one of another state directory's daemon
 * does not read back. The key lives in the state directory, so tokens outlive a restart. */
#ifndef ZTRAIN_PAGE_TOKEN_H
#define ZTRAIN_PAGE_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "ztrain/status.h"

/* The secret that signs page tokens: ZT_PAGE_KEY_FILE in the state directory. */
#define ZT_PAGE_KEY_BYTES 32
#define ZT_PAGE_KEY_FILE "page_token.key"
typedef struct {
    unsigned char bytes[ZT_PAGE_KEY_BYTES];
} zt_page_key;

/* Reads <state_dir>/page_token.key into key, creating it the first time with 32 random bytes
 * (the kernel's CSPRNG through OpenSSL's RAND_bytes), mode 0600. A file that is not exactly 32
 * bytes, or that its group or others may read, is ZT_ERR_INVALID naming it; one that cannot be
 * read or written is ZT_ERR_IO naming it. Call it with the state directory locked (one daemon
 * per directory), so that two daemons never make two keys. */
zt_status zt_page_key_load(zt_page_key *key, const char *state_dir);

/* The lists that page with these tokens, and what each binds its tokens to. */
typedef enum {
    ZT_PAGE_JOBS = 1,         /* ListJobs, GET /api/v1/jobs: cursor a job id, job "", filter
                               * the state's name ("" for every state) */
    ZT_PAGE_ANOMALIES = 2,    /* ListAnomalies, .../anomalies: cursor a seq, the job, filter "" */
    ZT_PAGE_RECORDS = 3,      /* .../records: cursor a seq, the job, filter the since_step */
} zt_page_list;

/* A token's text is at most this long, NUL included, for a cursor of up to 64 bytes. */
#define ZT_PAGE_TOKEN_MAX 136

/* Writes the token for `cursor` (a job id, or a number in decimal) of `list` for `job` under
 * `filter` (NULL reads as "") into out. False when the cursor is longer than 64 bytes, job or
 * filter longer than 65535, or out is too small; out is then "". */
bool zt_page_token_make(const zt_page_key *key, zt_page_list list, const char *job,
                        const char *filter, const char *cursor, char *out, size_t out_size);

/* The cursor a token holds, into cursor (cursor_size bytes, NUL-terminated), when the token is
 * one zt_page_token_make made under the same key for the same list, job and filter; false for
 * anything else (cursor is then ""). */
bool zt_page_token_read(const zt_page_key *key, const char *token, zt_page_list list,
                        const char *job, const char *filter, char *cursor, size_t cursor_size);

#endif
