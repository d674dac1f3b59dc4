"""gRPC server reflection: a client that has no .proto learns ztrain's API from ztraind itself and
calls it (grpcio-reflection's client from PyPI, run in .venv/).

  a. ListServices names ztrain.v1.Trainer, grpc.health.v1.Health and both reflection services.
  b. Described through reflection alone (a DescriptorPool fed by the server), Trainer has every
     rpc that proto/ztrain.proto declares, read here from the .proto text by a regular
     expression, with the same request and response types and the same streaming flags.
  c. With message classes made from those descriptors only, SubmitJob and ListJobs work: the job
     runs and is listed.
  d. v1 and v1alpha answer the same, and one stream carries several questions: the list, a
     method's file with its imports, an unknown symbol (ErrorResponse NOT_FOUND, the stream goes
     on), a file by name; the stream ends OK when the client closes its side.
  e. With a token, reflection without it is UNAUTHENTICATED, and with it works."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, SOURCE, Checker, Daemon, temp_dir, tiny_job,  # noqa: E402
                 write_data)

import grpc  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, json_format  # noqa: E402
from google.protobuf import message_factory  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2 as rpb  # noqa: E402
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: E402
    ProtoReflectionDescriptorDatabase)

ck = Checker()


def proto_rpcs():
    """{name: (request, response, server streaming, client streaming)} from the .proto text."""
    with open(os.path.join(SOURCE, "proto", "ztrain.proto")) as f:
        text = f.read()
    pat = re.compile(r"rpc\s+(\w+)\s*\(\s*(stream\s+)?(\w+)\s*\)\s*returns\s*\(\s*(stream\s+)?(\w+)")
    return {m[0]: ("ztrain.v1." + m[2], "ztrain.v1." + m[4], bool(m[3]), bool(m[1]))
            for m in pat.findall(text)}


def reflect(channel, path, requests, metadata=()):
    call = channel.stream_stream(path, request_serializer=rpb.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=rpb.ServerReflectionResponse.FromString)
    return list(call(iter(requests), metadata=list(metadata), timeout=30))


def case_abc(d):
    channel = d.channel()
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    want = {"ztrain.v1.Trainer", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"}
    ck.check(want <= services, f"a: ListServices: {sorted(services)}")

    pool = descriptor_pool.DescriptorPool(db)
    trainer = pool.FindServiceByName("ztrain.v1.Trainer")
    got = {m.name: (m.input_type.full_name, m.output_type.full_name, m.server_streaming,
                    m.client_streaming) for m in trainer.methods}
    want_rpcs = proto_rpcs()
    ck.check(len(want_rpcs) >= 7 and got == want_rpcs,
             f"b: Trainer described by reflection has the .proto's {len(want_rpcs)} rpcs "
             f"with their types and streaming ({sorted(got)})")
    spec = pool.FindMessageTypeByName("ztrain.v1.JobSpec")
    ck.check({"name", "world_size", "model", "data", "train", "deepspeed_json"} <=
             {f.name for f in spec.fields}, "b: JobSpec's fields are described")

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    def unary(method, req_name, resp_name, body):
        call = channel.unary_unary(f"/ztrain.v1.Trainer/{method}",
                                   request_serializer=cls(req_name).SerializeToString,
                                   response_deserializer=cls(resp_name).FromString)
        return call(json_format.ParseDict(body, cls(req_name)()), metadata=d.metadata, timeout=30)

    job = tiny_job(d.data_root, name="reflected", max_steps=3)
    ds = job.pop("deepspeed")
    job["deepspeed_json"] = __import__("json").dumps(ds)
    submitted = unary("SubmitJob", "ztrain.v1.SubmitJobRequest", "ztrain.v1.Job", {"spec": job})
    listed = unary("ListJobs", "ztrain.v1.ListJobsRequest", "ztrain.v1.ListJobsResponse", {})
    ck.check(submitted.id and submitted.id in [j.id for j in listed.jobs],
             f"c: a job submitted with reflected types is listed ({submitted.id})")
    state = submitted.state
    import time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        j = unary("GetJob", "ztrain.v1.GetJobRequest", "ztrain.v1.Job", {"id": submitted.id})
        state = pool.FindEnumTypeByName("ztrain.v1.JobState").values_by_number[j.state].name
        if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            break
        time.sleep(0.1)
    ck.check(state == "JOB_STATE_SUCCEEDED", f"c: the job ran: {state}")


def case_d(d):
    channel = d.channel()
    questions = [rpb.ServerReflectionRequest(list_services=""),
                 rpb.ServerReflectionRequest(file_containing_symbol="ztrain.v1.Trainer.WatchJob"),
                 rpb.ServerReflectionRequest(file_containing_symbol="ztrain.v1.NoSuchThing"),
                 rpb.ServerReflectionRequest(file_by_filename="grpc/health/v1/health.proto"),
                 rpb.ServerReflectionRequest(
                     file_containing_symbol="ztrain.v1.ModelSpec")]
    answers = {}
    for version in ("v1", "v1alpha"):
        try:
            rs = reflect(channel, f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                         questions)
        except grpc.RpcError as e:
            ck.check(False, f"d: {version}: the stream failed: {e.code()}: {e.details()}")
            continue
        ok = len(rs) == len(questions)
        names = []
        if ok:
            names = sorted(s.name for s in rs[0].list_services_response.service)
            files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                     for b in rs[1].file_descriptor_response.file_descriptor_proto]
            ok = (files and files[0].name == "ztrain.proto" and
                  "Trainer" in [s.name for s in files[0].service])
            ck.check(ok, f"d: {version}: WatchJob's file is ztrain.proto "
                     f"({[f.name for f in files]})")
            err = rs[2].error_response
            ck.check(rs[2].WhichOneof("message_response") == "error_response" and
                     err.error_code == grpc.StatusCode.NOT_FOUND.value[0] and
                     "ztrain.v1.NoSuchThing" in err.error_message,
                     f"d: {version}: an unknown symbol is NOT_FOUND in-band "
                     f"({err.error_code}: {err.error_message})")
            hfiles = [descriptor_pb2.FileDescriptorProto.FromString(b)
                      for b in rs[3].file_descriptor_response.file_descriptor_proto]
            ck.check(hfiles and hfiles[0].package == "grpc.health.v1",
                     f"d: {version}: a file by name")
            ck.check(rs[4].original_request.file_containing_symbol == "ztrain.v1.ModelSpec",
                     f"d: {version}: the response carries the original request")
        ck.check(ok, f"d: {version}: {len(rs)} answers to {len(questions)} questions on one stream")
        answers[version] = (names, [r.SerializeToString() for r in rs[1:]])
    ck.check(len(answers) == 2 and answers["v1"] == answers["v1alpha"],
             "d: v1 and v1alpha give the same answers")


def case_e(tmp):
    with Daemon(BUILD, os.path.join(tmp, "auth"), token="reflect-token") as d:
        req = [rpb.ServerReflectionRequest(list_services="")]
        path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        try:
            reflect(d.channel(), path, req)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        ck.check(code == grpc.StatusCode.UNAUTHENTICATED, f"e: without the token: {code}")
        rs = reflect(d.channel(), path, req, metadata=d.metadata)
        ck.check(len(rs) == 1 and rs[0].list_services_response.service,
                 "e: with the token it answers")


def main():
    tmp = temp_dir("ztrain-reflection-")
    with Daemon(BUILD, os.path.join(tmp, "d")) as d:
        write_data(d.data_root)
        case_abc(d)
        case_d(d)
    case_e(tmp)
    ck.done()


if __name__ == "__main__":
    main()
