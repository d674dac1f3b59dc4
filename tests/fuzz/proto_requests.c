/* Fuzz target: the request messages ztraind's gRPC server decodes. The first input byte picks
 * one of the methods of proto/ztrain.proto's Trainer service or of grpc.health.v1.Health (taken
 * from the generated service descriptors, so a new method is fuzzed without a change here);
 * the rest is that method's request in the protobuf wire format, unpacked as grpc_server.c
 * unpacks it. A message that unpacks is packed again, and must unpack to the same bytes. A
 * SubmitJobRequest's JobSpec then goes where SubmitJob sends it: to job-spec JSON
 * (zt_job_proto_spec_to_json) and into ztraind's spec check. That JSON (the job file's form,
 * as `ztrain submit --dry-run` prints it) maps back to a JobSpec (as `ztrain submit` reads it),
 * and from there on the mapping must be stable: once through JSON -> JobSpec -> JSON, a
 * second time changes nothing.
 * (The first pass may: "auto" and null read as "unset", which the JSON then leaves out.) */
#include <limits.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "health.pb-c.h"
#include "api/job_proto.h"
#include "daemon/spec_check.h"
#include "ztrain.pb-c.h"

static const ProtobufCServiceDescriptor *const services[] = {
    &ztrain__v1__trainer__descriptor,
    &grpc__health__v1__health__descriptor,
};

static char data_root[PATH_MAX], runs_root[PATH_MAX];

static void make_roots(void) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/data", fuzz_tmpdir());
    FUZZ_CHECK(mkdir(path, 0700) == 0 && realpath(path, data_root), "cannot make %s", path);
    snprintf(path, sizeof path, "%s/runs", fuzz_tmpdir());
    FUZZ_CHECK(mkdir(path, 0700) == 0 && realpath(path, runs_root), "cannot make %s", path);
    snprintf(path, sizeof path, "%s/train.txt", data_root);
    fuzz_write_file(path, "tokens", 6);
}

/* The request descriptor of method number `pick`, counting through every service. */
static const ProtobufCMessageDescriptor *request_type(unsigned pick) {
    unsigned total = 0;
    for (size_t i = 0; i < sizeof services / sizeof services[0]; i++)
        total += services[i]->n_methods;
    pick %= total;
    for (size_t i = 0;; i++) {
        if (pick < services[i]->n_methods)
            return services[i]->methods[pick].input;
        pick -= services[i]->n_methods;
    }
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
    *len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(*len ? *len : 1);
    FUZZ_CHECK(buf != NULL, "out of memory");
    FUZZ_CHECK(protobuf_c_message_pack(m, buf) == *len, "packed size differs");
    return buf;
}

/* Whether m or a message inside it kept fields its type does not have. */
static bool has_unknown_fields(const ProtobufCMessage *m) {
    if (m->n_unknown_fields > 0)
        return true;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const char *at = (const char *)m + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)at;
            for (size_t k = 0; k < n; k++)
                if (has_unknown_fields(v[k]))
                    return true;
        } else {
            const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)at;
            if (sub && has_unknown_fields(sub))
                return true;
        }
    }
    return false;
}

/* Packing what was unpacked and unpacking it again gives the same message. Not asked of a
 * message with unknown fields: protobuf-c 1.4 accepts the invalid field number 0 when its tag
 * is written in two bytes (0x80 0x00), keeps it as an unknown field and packs it as the one
 * byte 0x00, which it then refuses. ztraind ignores unknown fields and never repacks a
 * request, so that is no concern of its. */
static void check_repack(const ProtobufCMessageDescriptor *d, const ProtobufCMessage *m) {
    if (has_unknown_fields(m))
        return;
    size_t n1, n2;
    uint8_t *b1 = pack(m, &n1);
    ProtobufCMessage *again = protobuf_c_message_unpack(d, NULL, n1, b1);
    FUZZ_CHECK(again != NULL, "%s: a packed message does not unpack", d->name);
    uint8_t *b2 = pack(again, &n2);
    FUZZ_CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0, "%s: repacking changed the bytes", d->name);
    protobuf_c_message_free_unpacked(again, NULL);
    free(b1);
    free(b2);
}

/* The job-spec JSON of the JobSpec that `json` maps to, or NULL when it does not map. */
static char *round_trip(const char *json) {
    Ztrain__V1__JobSpec *spec;
    if (zt_job_proto_spec_from_json(json, "spec", NULL, &spec) != ZT_OK)
        return NULL;
    char *out;
    FUZZ_CHECK(zt_job_proto_spec_to_json(spec, &out) == ZT_OK,
               "a JobSpec read from %s does not map back: %s", json, zt_last_error());
    protobuf_c_message_free_unpacked(&spec->base, NULL);
    return out;
}

static void submit_path(const Ztrain__V1__SubmitJobRequest *req) {
    char *json;
    if (zt_job_proto_spec_to_json(req->spec, &json) != ZT_OK)
        return;
    zt_spec_limits lim = {.data_root = data_root, .runs_root = runs_root, .max_world_size = 8,
                          .max_ranks = 8, .max_nodes = 1};
    char *resolved;
    zt_job_spec spec;
    if (zt_spec_check(json, "job-000001", &lim, &resolved, &spec) == ZT_OK) {
        free(resolved);
        zt_job_spec_free(&spec);
    }
    char *json2 = round_trip(json), *json3 = json2 ? round_trip(json2) : NULL;
    if (json2)
        FUZZ_CHECK(json3 && strcmp(json2, json3) == 0,
                   "JSON -> JobSpec -> JSON does not settle:\n%s\nthen\n%s", json2,
                   json3 ? json3 : "(refused)");
    free(json3);
    free(json2);
    free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    if (!data_root[0])
        make_roots();
    const ProtobufCMessageDescriptor *d = request_type(data[0]);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
    if (!m)
        return 0;
    check_repack(d, m);
    if (d == &ztrain__v1__submit_job_request__descriptor)
        submit_path((const Ztrain__V1__SubmitJobRequest *)m);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
