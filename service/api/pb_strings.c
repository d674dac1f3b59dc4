/* A walk over the protobuf wire format (pb_strings.h): tags, varints and length-delimited fields,
 * descending into the sub-messages the descriptor knows. Nothing is allocated. */
#include "pb_strings.h"

#include <stdio.h>
#include <string.h>

#include "ztrain/text.h"

/* Deeper nesting than any ztrain message has; protobuf-c's decoder judges the rest. */
#define MAX_DEPTH 32

typedef enum { WALK_OK, WALK_BAD_STRING, WALK_MALFORMED } walk_result;

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

static walk_result walk(const ProtobufCMessageDescriptor *desc, const uint8_t *p,
                        const uint8_t *end, const char *path, int depth, char *why,
                        size_t why_size) {
    while (p < end) {
        uint64_t tag, len;
        if (!read_varint(&p, end, &tag))
            return WALK_MALFORMED;
        switch (tag & 7) {
        case 0:
            if (!read_varint(&p, end, &len))
                return WALK_MALFORMED;
            continue;
        case 1:
        case 5: {
            size_t skip = (tag & 7) == 1 ? 8 : 4;
            if ((size_t)(end - p) < skip)
                return WALK_MALFORMED;
            p += skip;
            continue;
        }
        case 2:
            break;
        default:
            /* Groups (3, 4) are not proto3, and 6 and 7 are not wire types at all. */
            return WALK_MALFORMED;
        }
        if (!read_varint(&p, end, &len) || len > (uint64_t)(end - p))
            return WALK_MALFORMED;
        const ProtobufCFieldDescriptor *f =
            desc ? protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3)) : NULL;
        char sub[256];
        if (f)
            snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", f->name);
        if (f && f->type == PROTOBUF_C_TYPE_STRING) {
            size_t at;
            char what[ZT_TEXT_WHY_SIZE];
            if (!zt_text_check((const char *)p, (size_t)len, ZT_TEXT_NO_NUL, &at, what)) {
                snprintf(why, why_size, "%s: %s at byte %zu", sub, what, at);
                return WALK_BAD_STRING;
            }
        } else if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < MAX_DEPTH) {
            walk_result r = walk(f->descriptor, p, p + len, sub, depth + 1, why, why_size);
            if (r != WALK_OK)
                return r;
        }
        p += len;
    }
    return WALK_OK;
}

bool zt_pb_strings_valid(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                         char *why, size_t why_size) {
    if (!data || len == 0)
        return true;
    return walk(desc, data, data + len, "", 0, why, why_size) != WALK_BAD_STRING;
}
