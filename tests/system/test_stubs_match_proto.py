"""The committed gRPC stubs are exactly what the .proto generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUBS = ("indexer_pb2.py", "indexer_pb2_grpc.py", "indexer_pb2.pyi", "indexer_pb2_grpc.pyi")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "protos"),
            f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={Path(sys.executable).parent / 'protoc-gen-mypy_grpc'}",
            f"--mypy_grpc_out={tmp_path}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--mypy_out={tmp_path}",
            str(ROOT / "protos/toolsearch/v1/indexer.proto"),
        ],
        check=True,
        capture_output=True,
    )
    for name in STUBS:
        fresh = (tmp_path / "toolsearch/v1" / name).read_text()
        committed = (ROOT / "toolsearch/v1" / name).read_text()
        assert fresh == committed, f"toolsearch/v1/{name} is stale: run scripts/gen-protos"
