"""The checked-in gRPC code is what scripts/gen_proto.sh generates from the .proto."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ["collector_pb2.py", "collector_pb2.pyi", "collector_pb2_grpc.py", "collector_pb2_grpc.pyi"]


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    work = tmp_path / "tree"
    (work / "argus" / "proto").mkdir(parents=True)
    (work / "scripts").mkdir()
    shutil.copy(ROOT / "argus" / "proto" / "collector.proto", work / "argus" / "proto")
    shutil.copy(ROOT / "scripts" / "gen_proto.sh", work / "scripts")
    subprocess.run(["bash", str(work / "scripts" / "gen_proto.sh")], check=True)
    for name in GENERATED:
        fresh = (work / "argus" / "proto" / name).read_text()
        assert fresh == (ROOT / "argus" / "proto" / name).read_text(), (
            f"{name} is stale: run scripts/gen_proto.sh"
        )


def test_service_name() -> None:
    from argus.proto import collector_pb2

    assert collector_pb2.DESCRIPTOR.services_by_name["Collector"].full_name == "argus.v1.Collector"
