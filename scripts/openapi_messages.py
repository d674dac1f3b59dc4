#!/usr/bin/env python3
"""Writes the JSON Schemas of proto/ztrain.proto's messages, in their proto3 JSON mapping, into
service/http/openapi.json's components.schemas, and points each JSON route's 200 response at the
message it answers with. The mapping (https://protobuf.dev/programming-guides/proto3/#json):
lowerCamelCase names, 64-bit integers as strings, doubles as numbers or "NaN"/"Infinity"/
"-Infinity", enums by name, Timestamp as RFC 3339 text, Duration as "<seconds>s", and any field
may be absent (its default). The schemas are read from the Python client's generated module,
whose descriptors protoc built from the same .proto, so the document cannot drift from it; the
event stream's events likewise (each one's data is the JSON of its message);
tests/service/test_openapi.py checks that the committed document equals this script's output.

  .venv/bin/python scripts/openapi_messages.py [--check]   (rewrite, or only compare: exit 1
  when stale; it needs the protobuf runtime of the test venv)"""
import copy
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from google.protobuf import descriptor as D  # noqa: E402
from ztrain._gen import ztrain_pb2 as pb  # noqa: E402

DOC = os.path.join(ROOT, "service", "http", "openapi.json")

# The message each JSON route answers with: (path, method) -> message name.
ROUTES = {
    ("/api/v1/jobs", "get"): "ListJobsResponse",
    ("/api/v1/jobs", "post"): "Job",
    ("/api/v1/jobs/{id}", "get"): "Job",
    ("/api/v1/jobs/{id}/cancel", "post"): "Job",
    ("/api/v1/jobs/{id}/metrics", "get"): "GetMetricsResponse",
    ("/api/v1/jobs/{id}/records", "get"): "ListMetricRecordsResponse",
    ("/api/v1/jobs/{id}/logs", "get"): "ListLogLinesResponse",
    ("/api/v1/jobs/{id}/anomalies", "get"): "ListAnomaliesResponse",
    ("/api/v1/jobs/{id}/webhooks", "get"): "ListWebhookDeliveriesResponse",
    ("/api/v1/jobs/{id}/checkpoints", "get"): "ListCheckpointsResponse",
    ("/api/v1/jobs/{id}/config", "get"): "EffectiveConfig",
}

INT64 = {"type": "string", "pattern": "^-?[0-9]{1,19}$"}
INT32 = {"type": "integer", "minimum": -2147483648, "maximum": 2147483647}
UINT32 = {"type": "integer", "minimum": 0, "maximum": 4294967295}
DOUBLE = {"oneOf": [{"type": "number"}, {"enum": ["NaN", "Infinity", "-Infinity"]}]}
TIMESTAMP = {"type": "string", "format": "date-time",
             "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?Z$"}
DURATION = {"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]{1,9})?s$"}


def scalar(f):
    t = f.type
    if t in (D.FieldDescriptor.TYPE_INT64, D.FieldDescriptor.TYPE_SINT64,
             D.FieldDescriptor.TYPE_SFIXED64, D.FieldDescriptor.TYPE_UINT64,
             D.FieldDescriptor.TYPE_FIXED64):
        return dict(INT64)
    if t in (D.FieldDescriptor.TYPE_INT32, D.FieldDescriptor.TYPE_SINT32,
             D.FieldDescriptor.TYPE_SFIXED32):
        return dict(INT32)
    if t in (D.FieldDescriptor.TYPE_UINT32, D.FieldDescriptor.TYPE_FIXED32):
        return dict(UINT32)
    if t in (D.FieldDescriptor.TYPE_DOUBLE, D.FieldDescriptor.TYPE_FLOAT):
        return copy.deepcopy(DOUBLE)
    if t == D.FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    if t == D.FieldDescriptor.TYPE_STRING:
        return {"type": "string"}
    if t == D.FieldDescriptor.TYPE_BYTES:
        return {"type": "string", "contentEncoding": "base64"}
    if t == D.FieldDescriptor.TYPE_ENUM:
        return {"$ref": f"#/components/schemas/{f.enum_type.name}"}
    m = f.message_type
    if m.full_name == "google.protobuf.Timestamp":
        return dict(TIMESTAMP)
    if m.full_name == "google.protobuf.Duration":
        return dict(DURATION)
    return {"$ref": f"#/components/schemas/{m.name}"}


def message_schema(m):
    props = {}
    for f in m.fields:
        s = scalar(f)
        # protobuf 6 has is_repeated; older ones only the label.
        if (f.is_repeated if hasattr(f, "is_repeated")
                else f.label == D.FieldDescriptor.LABEL_REPEATED):
            s = {"type": "array", "items": s}
        props[f.json_name] = s
    return {"type": "object", "description": f"ztrain.v1.{m.name} in the proto3 JSON mapping "
            "(proto/ztrain.proto); a field at its default is absent.",
            "properties": props, "additionalProperties": False}


def schemas():
    out = {}
    for e in pb.DESCRIPTOR.enum_types_by_name.values():
        out[e.name] = {"type": "string", "enum": [v.name for v in e.values]}
    # Requests are not generated: GET routes take query parameters, and the two bodies HTTP
    # takes (SubmitJobRequest with the job file's spec, CancelJobRequest) are written by hand.
    for m in pb.DESCRIPTOR.message_types_by_name.values():
        if not m.name.endswith("Request"):
            out[m.name] = message_schema(m)
    return out


# The event stream's events: each one's data is the proto3 JSON of the message WatchJob's
# JobEvent carries for it.
EVENTS = {"job": "Job", "metrics": "MetricRecord", "anomaly": "AnomalyEvent", "log": "LogLine"}


def event_schema():
    return {"oneOf": [
        {"type": "object", "required": ["event", "data"],
         "properties": {"event": {"const": name}, "id": {"type": "string"},
                        "data": {"type": "string", "contentMediaType": "application/json",
                                 "contentSchema": {"$ref": f"#/components/schemas/{msg}"}}}}
        for name, msg in EVENTS.items()]}


def updated(doc):
    doc = copy.deepcopy(doc)
    comp = doc["components"]["schemas"]
    comp.pop("JobDetail", None)
    comp.update(schemas())
    for (path, method), name in ROUTES.items():
        op = doc["paths"].get(path, {}).get(method)
        if op is None:
            raise SystemExit(f"openapi.json has no {method.upper()} {path}")
        op["responses"]["200"]["content"]["application/json"]["schema"] = \
            {"$ref": f"#/components/schemas/{name}"}
    doc["paths"]["/api/v1/jobs/{id}/events"]["get"]["responses"]["200"]["content"][
        "text/event-stream"]["schema"] = event_schema()
    return doc


def main():
    with open(DOC) as f:
        doc = json.load(f)
    new = updated(doc)
    text = json.dumps(new, indent=1, ensure_ascii=False) + "\n"
    if "--check" in sys.argv[1:]:
        with open(DOC) as f:
            if f.read() != text:
                print(f"{DOC} is stale: run scripts/openapi_messages.py", file=sys.stderr)
                sys.exit(1)
        return
    with open(DOC, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
