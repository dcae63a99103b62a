"""Generate protocol/pb/*_pb2*.py from proto/hetspec/v1/*.proto (the only way they are made).

    python -m protocol.gen_proto            # write the generated modules
    python -m protocol.gen_proto --check    # exit 1 if the committed ones are stale

The .proto files live under proto/hetspec/v1 and are compiled with the virtual include
path protocol/pb, so the generated imports read `from protocol.pb import ..._pb2`.
"""

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "proto" / "hetspec" / "v1"
VIRTUAL = "protocol/pb"


def generate(out_root: Path) -> list[Path]:
    """Run protoc (grpcio-tools) into out_root; return the generated files, relative to it."""
    from grpc_tools import protoc

    protos = sorted(p.name for p in SOURCE.glob("*.proto"))
    args = ["protoc", f"-I{VIRTUAL}={SOURCE}", f"-I{_grpc_include()}", f"--python_out={out_root}",
            f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", *[f"{VIRTUAL}/{p}" for p in protos]]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out_root) for p in (out_root / VIRTUAL).glob("*_pb2*"))


def _grpc_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        committed = sorted(p.relative_to(ROOT) for p in (ROOT / VIRTUAL).glob("*_pb2*"))
        if args.check:
            stale = [str(p) for p in fresh if not (ROOT / p).exists() or not filecmp.cmp(Path(tmp) / p, ROOT / p, shallow=False)]
            stale += [str(p) for p in committed if p not in fresh]
            if stale:
                print(f"stale generated code: {', '.join(stale)}; run python -m protocol.gen_proto", file=sys.stderr)
                return 1
            return 0
        for p in committed:
            (ROOT / p).unlink()
        for p in fresh:
            (ROOT / p).write_bytes((Path(tmp) / p).read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
