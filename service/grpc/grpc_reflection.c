/* gRPC server reflection (grpc.reflection.v1 and v1alpha ServerReflectionInfo) for ztraind: the
 * answers come from the FileDescriptorSet that protoc compiled from proto/ztrain.proto and the
 * protos it serves beside it at build time (service/CMakeLists.txt embeds it), so grpcurl or a
 * grpcio reflection client can list, describe and call ztrain.v1.Trainer with no .proto at hand.
 *
 * The set is read once, on the first request: the bytes of every FileDescriptorProto stay where
 * they are in the embedded array (a reply sends them unchanged) and a table maps each symbol the
 * files declare (services, methods, messages, enums, nested ones included) to its file. The
 * stream is bidirectional; each request gets one response, errors included (ErrorResponse
 * carries the gRPC code), and the stream stays open until the client closes its side. v1alpha's
 * messages are v1's on the wire, so both method paths share this handler. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/protobuf/descriptor.pb-c.h"
#include "daemon/oplog.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "grpc_server_internal.h"

extern const unsigned char zt_descriptor_set[];
extern const size_t zt_descriptor_set_size;

typedef struct {
    char *name;                       /* "ztrain.proto" */
    const uint8_t *bytes;             /* the FileDescriptorProto as protoc wrote it */
    size_t len;
    Google__Protobuf__FileDescriptorProto *fd;
} desc_file;

typedef struct {
    char *name;                       /* "ztrain.v1.Trainer.SubmitJob" */
    int file;
} desc_symbol;

static struct {
    desc_file *files;
    int n_files;
    desc_symbol *symbols;
    int n_symbols, cap_symbols;
    char **services;                  /* full names, every service of every file */
    int n_services;
    bool ok;
} idx;

static pthread_once_t idx_once = PTHREAD_ONCE_INIT;

static void add_symbol(const char *scope, const char *name, int file) {
    if (idx.n_symbols == idx.cap_symbols) {
        int cap = idx.cap_symbols ? 2 * idx.cap_symbols : 64;
        desc_symbol *grown = realloc(idx.symbols, sizeof *grown * (size_t)cap);
        if (!grown)
            return;
        idx.symbols = grown;
        idx.cap_symbols = cap;
    }
    size_t n = strlen(scope) + strlen(name) + 2;
    char *full = malloc(n);
    if (!full)
        return;
    snprintf(full, n, "%s%s%s", scope, scope[0] ? "." : "", name);
    idx.symbols[idx.n_symbols++] = (desc_symbol){full, file};
}

static void add_message(const char *scope, const Google__Protobuf__DescriptorProto *m, int file) {
    add_symbol(scope, m->name, file);
    size_t n = strlen(scope) + strlen(m->name) + 2;
    char *inner = malloc(n);
    if (!inner)
        return;
    snprintf(inner, n, "%s%s%s", scope, scope[0] ? "." : "", m->name);
    for (size_t i = 0; i < m->n_nested_type; i++)
        add_message(inner, m->nested_type[i], file);
    for (size_t i = 0; i < m->n_enum_type; i++)
        add_symbol(inner, m->enum_type[i]->name, file);
    free(inner);
}

static void index_file(int f) {
    const Google__Protobuf__FileDescriptorProto *fd = idx.files[f].fd;
    const char *pkg = fd->package ? fd->package : "";
    for (size_t i = 0; i < fd->n_message_type; i++)
        add_message(pkg, fd->message_type[i], f);
    for (size_t i = 0; i < fd->n_enum_type; i++)
        add_symbol(pkg, fd->enum_type[i]->name, f);
    for (size_t i = 0; i < fd->n_service; i++) {
        const Google__Protobuf__ServiceDescriptorProto *s = fd->service[i];
        add_symbol(pkg, s->name, f);
        char *full = strdup(idx.symbols[idx.n_symbols - 1].name);
        char **grown = full ? realloc(idx.services, sizeof *grown * (size_t)(idx.n_services + 1))
                            : NULL;
        if (!grown) {
            free(full);
            continue;
        }
        idx.services = grown;
        idx.services[idx.n_services++] = full;
        for (size_t j = 0; j < s->n_method; j++)
            add_symbol(full, s->method[j]->name, f);
    }
}

/* Reads a varint at *p (below end); false when it runs past end or over 64 bits. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* FileDescriptorSet is `repeated FileDescriptorProto file = 1`: a run of field-1,
 * length-delimited records, which is all this walks. */
static void build_index(void) {
    const uint8_t *p = zt_descriptor_set, *end = zt_descriptor_set + zt_descriptor_set_size;
    while (p < end) {
        uint64_t key, len;
        if (!read_varint(&p, end, &key) || key != ((1 << 3) | 2) || !read_varint(&p, end, &len) ||
            len > (uint64_t)(end - p)) {
            zt_oplog(ZT_LOG_ERR, "grpc reflection: the embedded descriptor set is damaged\n");
            return;
        }
        Google__Protobuf__FileDescriptorProto *fd =
            google__protobuf__file_descriptor_proto__unpack(NULL, (size_t)len, p);
        desc_file *grown = realloc(idx.files, sizeof *grown * (size_t)(idx.n_files + 1));
        if (!fd || !grown) {
            if (fd)
                google__protobuf__file_descriptor_proto__free_unpacked(fd, NULL);
            zt_oplog(ZT_LOG_ERR, "grpc reflection: cannot read the descriptor set\n");
            return;
        }
        idx.files = grown;
        idx.files[idx.n_files] = (desc_file){fd->name, p, (size_t)len, fd};
        index_file(idx.n_files++);
        p += len;
    }
    idx.ok = true;
}

static int find_file(const char *name) {
    for (int i = 0; i < idx.n_files; i++)
        if (strcmp(idx.files[i].name, name) == 0)
            return i;
    return -1;
}

static int find_symbol(const char *name) {
    for (int i = 0; i < idx.n_symbols; i++)
        if (strcmp(idx.symbols[i].name, name) == 0)
            return idx.symbols[i].file;
    return -1;
}

/* Marks file f and everything it imports, transitively. */
static void mark_deps(int f, bool *mark) {
    if (f < 0 || mark[f])
        return;
    mark[f] = true;
    const Google__Protobuf__FileDescriptorProto *fd = idx.files[f].fd;
    for (size_t i = 0; i < fd->n_dependency; i++)
        mark_deps(find_file(fd->dependency[i]), mark);
}

/* The response for file f: that file first, then what it imports (a client that already has
 * some of them just keeps its copy). Storage: the caller's arrays, the bytes the embedded set's. */
static void file_response(int f, Grpc__Reflection__V1__FileDescriptorResponse *fr,
                          ProtobufCBinaryData *protos, bool *mark) {
    memset(mark, 0, sizeof *mark * (size_t)idx.n_files);
    mark_deps(f, mark);
    size_t n = 0;
    protos[n++] = (ProtobufCBinaryData){idx.files[f].len, (uint8_t *)idx.files[f].bytes};
    for (int i = 0; i < idx.n_files; i++)
        if (mark[i] && i != f)
            protos[n++] = (ProtobufCBinaryData){idx.files[i].len, (uint8_t *)idx.files[i].bytes};
    fr->n_file_descriptor_proto = n;
    fr->file_descriptor_proto = protos;
}

void zt_grpc_reflection_handle(call *c, ProtobufCMessage *m) {
    Grpc__Reflection__V1__ServerReflectionRequest *req =
        (Grpc__Reflection__V1__ServerReflectionRequest *)m;
    pthread_once(&idx_once, build_index);
    if (!idx.ok) {
        zt_call_finish(c, GRPC_STATUS_INTERNAL, "the embedded descriptor set cannot be read");
        return;
    }
    Grpc__Reflection__V1__ServerReflectionResponse resp =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    resp.valid_host = req->host;
    resp.original_request = req;
    Grpc__Reflection__V1__FileDescriptorResponse fr =
        GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse lr = GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ExtensionNumberResponse er =
        GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse err = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    ProtobufCBinaryData *protos = calloc((size_t)idx.n_files + 1, sizeof *protos);
    bool *mark = calloc((size_t)idx.n_files + 1, sizeof *mark);
    Grpc__Reflection__V1__ServiceResponse *services =
        calloc((size_t)idx.n_services + 1, sizeof *services);
    Grpc__Reflection__V1__ServiceResponse **service_ptrs =
        calloc((size_t)idx.n_services + 1, sizeof *service_ptrs);
    char text[512];
    int f = -1;
    if (!protos || !mark || !services || !service_ptrs) {
        err.error_code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        err.error_message = "ztraind is out of memory";
    } else {
        switch (req->message_request_case) {
        case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
            if ((f = find_file(req->file_by_filename)) < 0)
                snprintf(text, sizeof text, "no file named %.400s", req->file_by_filename);
            break;
        case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
            if ((f = find_symbol(req->file_containing_symbol)) < 0)
                snprintf(text, sizeof text, "no symbol named %.400s",
                         req->file_containing_symbol);
            break;
        case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
            snprintf(text, sizeof text, "no extension of %.400s: these files declare none",
                     req->file_containing_extension->containing_type);
            break;
        case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
            /* A message we know has no extensions: the empty list is the true answer. */
            if (find_symbol(req->all_extension_numbers_of_type) >= 0) {
                er.base_type_name = req->all_extension_numbers_of_type;
                resp.message_response_case =
                    GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
                resp.all_extension_numbers_response = &er;
            } else {
                snprintf(text, sizeof text, "no type named %.400s",
                         req->all_extension_numbers_of_type);
            }
            break;
        case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
            for (int i = 0; i < idx.n_services; i++) {
                grpc__reflection__v1__service_response__init(&services[i]);
                services[i].name = idx.services[i];
                service_ptrs[i] = &services[i];
            }
            lr.n_service = (size_t)idx.n_services;
            lr.service = service_ptrs;
            resp.message_response_case =
                GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
            resp.list_services_response = &lr;
            break;
        default:
            snprintf(text, sizeof text, "the request names no question (message_request unset)");
            err.error_code = GRPC_STATUS_INVALID_ARGUMENT;
            break;
        }
        if (f >= 0) {
            file_response(f, &fr, protos, mark);
            resp.message_response_case =
                GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
            resp.file_descriptor_response = &fr;
        } else if (!resp.message_response_case) {
            err.error_code = err.error_code ? err.error_code : GRPC_STATUS_NOT_FOUND;
            err.error_message = text;
        }
    }
    if (!resp.message_response_case) {
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &err;
    }
    zt_call_send(c, &resp.base);
    free(protos);
    free(mark);
    free(services);
    free(service_ptrs);
}
