/* Page tokens (AIP-158's next_page_token) that gRPC and HTTP hand out alike for the lists that
 * page by a cursor: opaque to clients, and bound to the list and the filter they came from. A
 * token is the base64url text (RFC 4648 section 5, no padding) of a version byte, the list's
 * kind, a 64-bit FNV-1a hash of the filter and the cursor, so a token of another list, of the
 * same list under another filter, or one the server never made does not read back. */
#ifndef ZTRAIN_PAGE_TOKEN_H
#define ZTRAIN_PAGE_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

/* The lists that page with these tokens. */
typedef enum {
    ZT_PAGE_JOBS = 1,         /* ListJobs, GET /api/v1/jobs: cursor a job id, filter the state */
    ZT_PAGE_ANOMALIES = 2,    /* ListAnomalies, .../anomalies: cursor a seq, filter the job id */
} zt_page_list;

/* A token's text is at most this long, NUL included, for a cursor of up to 64 bytes. */
#define ZT_PAGE_TOKEN_MAX 112

/* Writes the token for `cursor` (a job id, or a number in decimal) in `list` under `filter`
 * (a text naming the filter: "" for none) into out. False when the cursor is longer than 64
 * bytes or out is too small; out is then "". */
bool zt_page_token_make(zt_page_list list, const char *filter, const char *cursor, char *out,
                        size_t out_size);

/* The cursor a token holds, into cursor (cursor_size bytes, NUL-terminated), when the token is
 * one zt_page_token_make made for the same list and filter; false for anything else. */
bool zt_page_token_read(const char *token, zt_page_list list, const char *filter, char *cursor,
                        size_t cursor_size);

#endif
