/* The proto3 JSON mapping of a protobuf-c message (https://protobuf.dev/programming-guides/
 * proto3/#json), which is what every HTTP body of the API is, and what `ztrain status -o json`
 * and `ztrain list -o json` print: the same message gRPC sends, printed as protobuf's own JSON
 * printer prints it, so that json_format.Parse (Python) or protojson (Go) reads an HTTP body
 * into the generated type, and the dashboard, curl, the CLI and the gRPC clients see one shape.
 *
 * The printer walks the message's descriptor: field names in lowerCamelCase (the proto's
 * json_name), enums by value name, 64-bit integers as strings, NaN and infinities as "NaN",
 * "Infinity" and "-Infinity", bytes as base64, google.protobuf.Timestamp as RFC 3339 text in
 * UTC ("2026-12-05T01:35:01.250Z") and Duration as seconds ("1.500s"). Fields at their default
 * (0, "", false, an empty list, an unset message, enum value 0) are left out, as the printer
 * does by default; a member of a oneof that is set is printed even when it is zero, since the
 * oneof carries its presence. Pure: no I/O, no locks. */
#ifndef ZTRAIN_PROTO_JSON_H
#define ZTRAIN_PROTO_JSON_H

#include <protobuf-c/protobuf-c.h>

#include "json_writer.h"

/* Writes m as one JSON object value into b (the writer's comma rules apply, so it can be a
 * member's value or an array element). */
void zt_proto_json(zt_jbuf *b, const ProtobufCMessage *m);

/* The JSON name of a field ("max_steps" -> "maxSteps"), written into out (at most n bytes with
 * the NUL; longer names are cut). */
void zt_proto_json_name(const char *field, char *out, size_t n);

#endif
