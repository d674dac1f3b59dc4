#!/bin/sh
# Regenerates the client's message and stub modules from proto/ztrain.proto with Debian's protoc
# and grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc). The output is committed, so
# `pip install ./clients/python` needs no compiler; tests/service/test_python_client.py fails
# when it is older than the .proto.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/ztrain/_gen}
protoc -I "$here/../../proto" -I /usr/include --python_out="$out" --grpc_out="$out" \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin ztrain.proto
# The plugin imports the messages as a top-level module; inside the package they are a sibling.
sed -i 's/^import ztrain_pb2 as ztrain__pb2$/from . import ztrain_pb2 as ztrain__pb2/' \
  "$out/ztrain_pb2_grpc.py"
