/* What ztraind's gRPC server and the ztrain CLI's client share on top of gRPC's C core:
 * protobuf-c messages to and from byte buffers, request metadata, and status codes and names. */
#ifndef ZTRAIN_GRPC_UTIL_H
#define ZTRAIN_GRPC_UTIL_H

#include <stdbool.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "ztrain/status.h"

/* A new byte buffer holding m packed; the caller destroys it with grpc_byte_buffer_destroy (or
 * hands it to a SEND_MESSAGE op and destroys it when the op's tag returns). */
grpc_byte_buffer *zt_pb_pack(const ProtobufCMessage *m);

/* The message of type `desc` in bb, or NULL when bb is NULL (no message was sent), cannot be
 * read (failed decompression) or is not a valid encoding. The buffer stays the caller's; the
 * message is heap-owned: protobuf_c_message_free_unpacked(msg, NULL). */
ProtobufCMessage *zt_pb_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb);

/* zt_pb_unpack for a request: its strings are checked first (pb_strings.h), so that a NUL or a
 * byte that is not UTF-8 is refused naming the field instead of being cut short or passed on.
 * NULL when the message is refused or cannot be decoded; in the first case why (why_size bytes)
 * says which field and byte ("SubmitJobRequest.spec.name: a NUL byte at byte 2"), in the second
 * it is left empty. */
ProtobufCMessage *zt_pb_unpack_request(const ProtobufCMessageDescriptor *desc,
                                       grpc_byte_buffer *bb, char *why, size_t why_size);

/* A malloc'd copy of the value of the first metadata entry named `key` (lowercase), or NULL
 * when there is none. */
char *zt_grpc_metadata_find(const grpc_metadata_array *md, const char *key);

/* The gRPC status for a failed zt_status: INVALID_ARGUMENT for bad input (INVALID, FORMAT,
 * UNSUPPORTED), NOT_FOUND, RESOURCE_EXHAUSTED for ZT_ERR_LIMIT, ALREADY_EXISTS for
 * ZT_ERR_CONFLICT, DEADLINE_EXCEEDED for a timeout, INTERNAL for the rest. */
grpc_status_code zt_grpc_status_from_zt(int s);

/* "NOT_FOUND", "UNAVAILABLE", ... (the names clients print); "UNKNOWN" for anything else. */
const char *zt_grpc_status_name(grpc_status_code code);

/* From now on gRPC's own log lines go to write_line as "grpc: <message>" (no newline), at most
 * per_minute of them a minute, followed by how many were left out: gRPC logs every failed TLS
 * handshake, and a client reconnecting in a loop must not fill a daemon's log. Process-wide;
 * write_line is the program's own log function (ztraind's gives the lines a severity). */
void zt_grpc_log_limit(void (*write_line)(const char *text), int per_minute);

/* While muted, the messages zt_grpc_log_limit would print are dropped: for a call whose failure
 * the caller words itself (a port in use), where gRPC core would log its raw error text too.
 * Without zt_grpc_log_limit (GRPC_VERBOSITY or GRPC_TRACE set) gRPC's own log is untouched. */
void zt_grpc_log_mute(bool mute);

#endif
