"""The gRPC wire protocol (`collector.proto`) and its generated code; regenerate with scripts/gen_proto.sh."""

__all__: list[str] = []
