/* protobuf-c <-> grpc byte buffers, metadata lookup, status names and gRPC's log
 * (grpc_util.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>

#include "grpc_util.h"
#include "daemon/job_manager.h"
#include "pb_strings.h"

grpc_byte_buffer *zt_pb_pack(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* The message of type desc in bb; with why, only when its strings pass zt_pb_strings_valid. */
static ProtobufCMessage *unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                                char *why, size_t why_size) {
    grpc_byte_buffer_reader r;
    if (why && why_size)
        why[0] = '\0';
    if (!bb || !grpc_byte_buffer_reader_init(&r, bb))
        return NULL;
    /* readall flattens a buffer that arrived in several slices. */
    grpc_slice all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    ProtobufCMessage *m = NULL;
    char field[200];
    if (why && !zt_pb_strings_valid(desc, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all),
                                    field, sizeof field))
        snprintf(why, why_size, "%s.%s (strings must be UTF-8 without NUL)", desc->short_name,
                 field);
    else
        m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(all),
                                      GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    return m;
}

ProtobufCMessage *zt_pb_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb) {
    return unpack(desc, bb, NULL, 0);
}

ProtobufCMessage *zt_pb_unpack_request(const ProtobufCMessageDescriptor *desc,
                                       grpc_byte_buffer *bb, char *why, size_t why_size) {
    return unpack(desc, bb, why, why_size);
}

char *zt_grpc_metadata_find(const grpc_metadata_array *md, const char *key) {
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, key) != 0)
            continue;
        const grpc_slice v = md->metadata[i].value;
        size_t n = GRPC_SLICE_LENGTH(v);
        char *out = malloc(n + 1);
        if (!out)
            return NULL;
        memcpy(out, GRPC_SLICE_START_PTR(v), n);
        out[n] = '\0';
        return out;
    }
    return NULL;
}

grpc_status_code zt_grpc_status_from_zt(int s) {
    switch (s) {
    case ZT_OK: return GRPC_STATUS_OK;
    case ZT_ERR_INVALID:
    case ZT_ERR_FORMAT:
    case ZT_ERR_UNSUPPORTED: return GRPC_STATUS_INVALID_ARGUMENT;
    case ZT_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case ZT_ERR_LIMIT: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case ZT_ERR_CONFLICT: return GRPC_STATUS_ALREADY_EXISTS;
    case ZT_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case ZT_ERR_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case ZT_ERR_PERMISSION: return GRPC_STATUS_PERMISSION_DENIED;
    default: return GRPC_STATUS_INTERNAL;
    }
}

const char *zt_grpc_status_name(grpc_status_code code) {
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED"};
    if ((int)code < 0 || (size_t)code >= sizeof names / sizeof names[0])
        return "UNKNOWN";
    return names[code];
}

static void (*log_write_line)(const char *text);
static int log_per_minute;
static atomic_bool log_muted;

static void log_limited(gpr_log_func_args *args) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static time_t window_start;
    static int in_window, dropped;
    if (atomic_load(&log_muted))
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&mu);
    if (now.tv_sec - window_start >= 60) {
        if (dropped) {
            char text[96];
            snprintf(text, sizeof text, "grpc: %d more messages were not logged", dropped);
            log_write_line(text);
        }
        window_start = now.tv_sec;
        in_window = dropped = 0;
    }
    if (in_window++ < log_per_minute) {
        char text[2048];
        snprintf(text, sizeof text, "grpc: %s", args->message);
        log_write_line(text);
    } else
        dropped++;
    pthread_mutex_unlock(&mu);
}

void zt_grpc_log_mute(bool mute) {
    atomic_store(&log_muted, mute);
}

void zt_grpc_log_limit(void (*write_line)(const char *text), int per_minute) {
    log_write_line = write_line;
    log_per_minute = per_minute;
    gpr_set_log_function(log_limited);
}
