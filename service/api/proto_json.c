/* The proto3 JSON mapping of protobuf-c messages (proto_json.h), driven by their descriptors so
 * that every message of proto/ztrain.proto prints the same way and a field added to the proto
 * reaches the HTTP API without code here. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "proto_json.h"

void zt_proto_json_name(const char *field, char *out, size_t n) {
    size_t k = 0;
    bool upper = false;
    for (const char *p = field; *p && k + 1 < n; p++) {
        if (*p == '_') {
            upper = true;
            continue;
        }
        out[k++] = upper && *p >= 'a' && *p <= 'z' ? (char)(*p - 'a' + 'A') : *p;
        upper = false;
    }
    if (n)
        out[k] = '\0';
}

/* "1.250" for 1 s 250 ms: the fraction with 0, 3, 6 or 9 digits, as protobuf prints it. */
static void put_fraction(char *out, size_t n, int32_t nanos) {
    if (nanos == 0)
        out[0] = '\0';
    else if (nanos % 1000000 == 0)
        snprintf(out, n, ".%03d", nanos / 1000000);
    else if (nanos % 1000 == 0)
        snprintf(out, n, ".%06d", nanos / 1000);
    else
        snprintf(out, n, ".%09d", nanos);
}

static void print_timestamp(zt_jbuf *b, int64_t seconds, int32_t nanos) {
    time_t t = (time_t)seconds;
    struct tm tm;
    char date[40] = "", frac[16], text[64];
    if (!gmtime_r(&t, &tm) || strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        snprintf(date, sizeof date, "1970-01-01T00:00:00");
    put_fraction(frac, sizeof frac, nanos < 0 ? 0 : nanos);
    snprintf(text, sizeof text, "%s%sZ", date, frac);
    zt_json_str(b, text);
}

static void print_duration(zt_jbuf *b, int64_t seconds, int32_t nanos) {
    /* seconds and nanos share their sign; the text carries it once. */
    bool negative = seconds < 0 || nanos < 0;
    char frac[16], text[48];
    put_fraction(frac, sizeof frac, nanos < 0 ? -nanos : nanos);
    snprintf(text, sizeof text, "%s%" PRId64 "%ss", negative ? "-" : "",
             seconds < 0 ? -seconds : seconds, frac);
    zt_json_str(b, text);
}

static void print_base64(zt_jbuf *b, const ProtobufCBinaryData *d) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    zt_jbuf text;
    zt_jbuf_init(&text);
    for (size_t i = 0; i < d->len; i += 3) {
        uint32_t v = (uint32_t)d->data[i] << 16;
        size_t left = d->len - i;
        if (left > 1)
            v |= (uint32_t)d->data[i + 1] << 8;
        if (left > 2)
            v |= d->data[i + 2];
        char q[4] = {abc[(v >> 18) & 63], abc[(v >> 12) & 63],
                     left > 1 ? abc[(v >> 6) & 63] : '=', left > 2 ? abc[v & 63] : '='};
        zt_jbuf_text(&text, q, 4);
    }
    zt_json_strn(b, text.buf.data ? text.buf.data : "", text.buf.len);
    zt_jbuf_free(&text);
}

static void print_double(zt_jbuf *b, double v) {
    /* JSON has no NaN or infinity; the mapping spells them as strings. */
    if (isnan(v))
        zt_json_str(b, "NaN");
    else if (isinf(v))
        zt_json_str(b, v > 0 ? "Infinity" : "-Infinity");
    else
        zt_json_num(b, v);
}

static void print_int64_string(zt_jbuf *b, int64_t v) {
    char text[24];
    snprintf(text, sizeof text, "%" PRId64, v);
    zt_json_str(b, text);
}

static void print_uint64_string(zt_jbuf *b, uint64_t v) {
    char text[24];
    snprintf(text, sizeof text, "%" PRIu64, v);
    zt_json_str(b, text);
}

/* One value of field f stored at p (an element, for a repeated field). */
static void print_value(zt_jbuf *b, const ProtobufCFieldDescriptor *f, const void *p) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: zt_json_int(b, *(const int32_t *)p); break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: zt_json_int(b, *(const uint32_t *)p); break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: print_int64_string(b, *(const int64_t *)p); break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: print_uint64_string(b, *(const uint64_t *)p); break;
    case PROTOBUF_C_TYPE_FLOAT: print_double(b, *(const float *)p); break;
    case PROTOBUF_C_TYPE_DOUBLE: print_double(b, *(const double *)p); break;
    case PROTOBUF_C_TYPE_BOOL: zt_json_bool(b, *(const protobuf_c_boolean *)p); break;
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        /* A value this build does not know has no name: the mapping allows its number. */
        if (ev)
            zt_json_str(b, ev->name);
        else
            zt_json_int(b, v);
        break;
    }
    case PROTOBUF_C_TYPE_STRING: zt_json_str(b, *(char *const *)p ? *(char *const *)p : ""); break;
    case PROTOBUF_C_TYPE_BYTES: print_base64(b, p); break;
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
        if (m)
            zt_proto_json(b, m);
        else
            zt_json_null(b);
        break;
    }
    }
}

/* Whether a singular field without presence holds its type's default (and is left out). */
static bool is_default(const ProtobufCFieldDescriptor *f, const void *p) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: return *(const uint32_t *)p == 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: return *(const uint64_t *)p == 0;
    /* Only +0 is the default: -0 has a different bit pattern and protobuf prints it. */
    case PROTOBUF_C_TYPE_FLOAT: return *(const float *)p == 0 && !signbit(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE: return *(const double *)p == 0 && !signbit(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL: return !*(const protobuf_c_boolean *)p;
    case PROTOBUF_C_TYPE_ENUM: return *(const int *)p == 0;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return !s || !*s;
    }
    case PROTOBUF_C_TYPE_BYTES: return ((const ProtobufCBinaryData *)p)->len == 0;
    case PROTOBUF_C_TYPE_MESSAGE: return *(ProtobufCMessage *const *)p == NULL;
    }
    return true;
}

/* The size of one element of a repeated field of f's type, as protobuf-c lays arrays out. */
static size_t element_size(const ProtobufCFieldDescriptor *f) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: return 8;
    case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
    case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    default: return 4;
    }
}

void zt_proto_json(zt_jbuf *b, const ProtobufCMessage *m) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    /* The well-known time types print as text, not as their seconds and nanos. */
    if (!strcmp(d->name, "google.protobuf.Timestamp") ||
        !strcmp(d->name, "google.protobuf.Duration")) {
        int64_t seconds = *(const int64_t *)(base + d->fields[0].offset);
        int32_t nanos = *(const int32_t *)(base + d->fields[1].offset);
        if (d->name[16] == 'T')
            print_timestamp(b, seconds, nanos);
        else
            print_duration(b, seconds, nanos);
        return;
    }
    zt_json_open(b, '{');
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *p = base + f->offset;
        char name[128];
        zt_proto_json_name(f->name, name, sizeof name);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            if (n == 0)
                continue;
            const char *arr = *(const char *const *)p;
            zt_json_key(b, name);
            zt_json_open(b, '[');
            for (size_t k = 0; k < n; k++)
                print_value(b, f, arr + k * element_size(f));
            zt_json_close(b, ']');
            continue;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
                   f->type != PROTOBUF_C_TYPE_STRING) {
            /* proto2-style presence (has_x), which the well-known types do not use but
             * another message could. */
            if (!*(const protobuf_c_boolean *)(base + f->quantifier_offset))
                continue;
        } else if (is_default(f, p)) {
            continue;
        }
        zt_json_key(b, name);
        print_value(b, f, p);
    }
    zt_json_close(b, '}');
}
