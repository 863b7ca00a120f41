#!/usr/bin/env bash
# Regenerates the Python code of argus/proto/*.proto in place.
# tests/test_proto.py checks that running this changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  argus/proto/collector.proto
