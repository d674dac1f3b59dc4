/* The strings of a protobuf message checked on the wire, before protobuf-c decodes it: protobuf-c
 * neither checks that a string field is UTF-8 (which proto3 requires, and which other clients'
 * decoders enforce: a job named with a stray byte would make every ListJobs answer unreadable to
 * them) nor keeps a string's length, so a NUL would cut a name short without a word. */
#ifndef ZTRAIN_PB_STRINGS_H
#define ZTRAIN_PB_STRINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Whether every string field of the encoded message of type `desc` (in sub-messages too, at any
 * depth) is UTF-8 without a NUL (text.h's ZT_TEXT_NO_NUL). When one is not, why (why_size bytes)
 * names the field by its path from the message and the byte at fault:
 * "spec.name: a NUL byte at byte 2". Bytes that are not a well-formed encoding are let through:
 * protobuf-c's decoder refuses them next. */
bool zt_pb_strings_valid(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                         char *why, size_t why_size);

#endif
