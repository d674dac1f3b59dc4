/* Structured errors, the same over both transports (Google's AIP-193): a gRPC status code, the
 * message, and one machine-readable detail that names what was at fault:
 *
 *   INVALID_ARGUMENT     BadRequest { field_violations: [{field, description}] }, the field as a
 *                        path in the request ("spec.model.n_embd", "page_size")
 *   NOT_FOUND            ResourceInfo { resource_type "ztrain.v1.Job", resource_name "jobs/ID" }
 *   ALREADY_EXISTS       ResourceInfo of the job the idempotency key already names
 *   FAILED_PRECONDITION  PreconditionFailure { violations: [{type, subject, description}] }: the
 *                        spec is valid but this server cannot run it (too many ranks for its
 *                        --max-ranks, no GPUs, not enough memory, no Slurm)
 *   RESOURCE_EXHAUSTED   QuotaFailure { violations: [{subject, description}] }: a limit of the
 *                        server (its job count, the spec's size, its --max-world-size)
 *   UNAUTHENTICATED,     ErrorInfo { reason, domain "ztrain", metadata }, Google's standard for
 *   PERMISSION_DENIED    refusals of a caller: reason CREDENTIALS_MISSING or TOKEN_INVALID (401),
 *                        ACCESS_TOKEN_SCOPE_INSUFFICIENT (metadata scope, requiredScope),
 *                        NOT_JOB_SUBMITTER (metadata job), and over HTTP only ORIGIN_NOT_ALLOWED,
 *                        HOST_NOT_ALLOWED (421), CLIENT_CERTIFICATE_MISSING or _REFUSED (403)
 *   UNAVAILABLE          ErrorInfo, reason STATE_FILE_UNWRITABLE: ztraind cannot write its state
 *                        file (a full disk), so a new job is not queued; retry later
 *
 * gRPC carries it as a google.rpc.Status in the grpc-status-details-bin trailer (what grpcio's
 * rpc_status.from_call and grpcurl read); HTTP as an RFC 9457 problem (application/problem+json)
 * whose "code" is the gRPC code's name and whose "field", "violations" or "resource" say the
 * same as the detail (ErrorInfo: "reason", "domain" and "metadata"). */
#ifndef ZTRAIN_API_ERROR_H
#define ZTRAIN_API_ERROR_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

/* A spec the server judged valid but cannot run as things are here. Joins the service codes of
 * daemon/job_manager.h (ZT_ERR_NOT_FOUND, ZT_ERR_LIMIT, ZT_ERR_CONFLICT). */
#define ZT_ERR_PRECONDITION (-103)

typedef enum {
    ZT_DETAIL_NONE,
    ZT_DETAIL_BAD_REQUEST,
    ZT_DETAIL_RESOURCE,
    ZT_DETAIL_PRECONDITION,
    ZT_DETAIL_QUOTA,
    ZT_DETAIL_ERROR_INFO,
} zt_detail_kind;

/* ErrorInfo's domain: the service whose reasons these are. */
#define ZT_API_ERROR_DOMAIN "ztrain"
#define ZT_API_ERROR_META 2

typedef struct {
    grpc_status_code code;
    char message[4000];
    zt_detail_kind kind;
    char field[160];      /* BadRequest's field, PreconditionFailure's and QuotaFailure's subject */
    char type[32];        /* PreconditionFailure's type: "RANKS", "GPU", "NODES", "MEMORY" */
    /* ResourceInfo's resource_name, "jobs/job-000042": room for a name that is no job's id (a
     * URL's or a request's, echoed whole up to this size). */
    char resource[512];
    char reason[48];      /* ErrorInfo's reason, "ACCESS_TOKEN_SCOPE_INSUFFICIENT" */
    /* ErrorInfo's metadata: n_meta lowerCamelCase keys and their values. */
    int n_meta;
    char meta_key[ZT_API_ERROR_META][24];
    char meta_value[ZT_API_ERROR_META][160];
} zt_api_error;

/* The error for a failed zt_status s with its message (zt_last_error() at the failure) from a
 * request whose `scope` prefixes field paths ("spec" for a submit, NULL elsewhere) and that named
 * job `job_id` (NULL when none): the code by the status, the detail by the status and the field
 * path the parser recorded with the failure (zt_last_error_field(), when message is
 * zt_last_error() on the failing thread), else the one the message names (its first
 * "field.path:", a quoted 'key', or a DeepSpeed key) for failures whose code records none. */
void zt_api_error_from_status(zt_api_error *e, int s, const char *message, const char *scope,
                              const char *job_id);

/* An error with an explicit code and, when field is not NULL, a BadRequest naming it (or, for
 * RESOURCE_EXHAUSTED, a QuotaFailure with that subject). */
void zt_api_error_set(zt_api_error *e, grpc_status_code code, const char *field,
                      const char *message);

/* A refusal of the caller (UNAUTHENTICATED or PERMISSION_DENIED) with an ErrorInfo detail of
 * `reason` (see above) in ZT_API_ERROR_DOMAIN; zt_api_error_meta adds a metadata entry (at most
 * ZT_API_ERROR_META, later ones are dropped). */
void zt_api_error_refusal(zt_api_error *e, grpc_status_code code, const char *reason,
                          const char *message);
void zt_api_error_meta(zt_api_error *e, const char *key, const char *value);

/* The field path of a message as zt_api_error_from_status finds it ("" when it names none),
 * prefixed with scope when one is given. Exposed for the tests. */
void zt_api_error_field(const char *message, const char *scope, char *out, size_t out_size);

/* Cuts e's message to at most max bytes on a character boundary. gRPC sends the message twice
 * (grpc-message and google.rpc.Status.message, which grpcio requires to be equal) in trailers
 * that clients cap at 8 KiB in all, so the gRPC server cuts it before sending
 * (ZT_API_GRPC_MESSAGE_MAX); HTTP sends it whole. */
#define ZT_API_GRPC_MESSAGE_MAX 2048
void zt_api_error_cut(zt_api_error *e, size_t max);

/* e as a packed google.rpc.Status (code, message, one Any detail when e has one): malloc'd,
 * *len bytes; NULL when memory ran out. */
uint8_t *zt_api_error_status_bin(const zt_api_error *e, size_t *len);

/* e as an RFC 9457 problem object (JSON text, malloc'd; NULL when memory ran out): type, title,
 * status, detail, instance (the request path, when not NULL), plus "code", "error" (the detail
 * again: what clients of the older {"error": ...} bodies read) and the detail's members. */
char *zt_api_error_problem_json(const zt_api_error *e, unsigned http_status, const char *instance);

/* The HTTP status for a gRPC code, as Google's HTTP mapping has it (INVALID_ARGUMENT and
 * FAILED_PRECONDITION 400, NOT_FOUND 404, ALREADY_EXISTS 409, RESOURCE_EXHAUSTED 429, ...), and
 * the gRPC code for an HTTP status the server answers with itself (405 UNIMPLEMENTED, 413
 * RESOURCE_EXHAUSTED, 415 INVALID_ARGUMENT, 421 PERMISSION_DENIED, ...). */
unsigned zt_api_http_status(grpc_status_code code);
grpc_status_code zt_api_code_from_http(unsigned http_status);

#endif
