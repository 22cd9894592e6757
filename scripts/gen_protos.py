"""Generate the Python stubs of every .proto under proto/ into a package directory.

Usage: python scripts/gen_protos.py [OUT_DIR]   (default: services/faultmesh/_pb)

protoc writes absolute imports (``import recover_pb2``); they are rewritten to package-relative
imports so the stubs live inside ``faultmesh._pb``. The drift test (tests/test_protos.py) runs this
into a temporary directory and compares it with the committed stubs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIRS = {
    ROOT / "proto" / "upstream": "upstream",
    ROOT / "proto" / "faultmesh" / "v1": "faultmesh_v1",
}


def generate(out_dir: Path) -> list[Path]:
    """Generate *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto; return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for src_dir in PROTO_DIRS:
        for proto in sorted(src_dir.glob("*.proto")):
            args = [
                "grpc_tools.protoc",
                f"-I{src_dir}",
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                str(proto),
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {proto}")
    init = out_dir / "__init__.py"
    init.write_text('"""Generated gRPC stubs (scripts/gen_protos.py). Do not edit."""\n')
    for path in sorted(out_dir.glob("*_pb2*.py")):
        text = path.read_text()
        fixed = re.sub(r"^import (\w+_pb2) as ", r"from . import \1 as ", text, flags=re.M)
        path.write_text(fixed)
        written.append(path)
    written.extend(sorted(out_dir.glob("*.pyi")))
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "services" / "faultmesh" / "_pb"
    for p in generate(out):
        print(p.relative_to(out.parent) if p.is_relative_to(out.parent) else p)
