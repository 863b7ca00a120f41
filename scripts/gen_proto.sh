#!/usr/bin/env bash
# Regenerates the Python code of argus/proto/*.proto in place, with typed stubs (mypy-protobuf)
# for the messages and the gRPC service, so the code that uses them is type-checked.
# tests/test_proto.py checks that running this changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I . \
  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. \
  argus/proto/collector.proto
