"""Generates the Python gRPC stubs for protos/attnserve/v1/*.proto.

The proto package `attnserve.v1` lives in `protos/attnserve/v1/`, which pyproject.toml installs as the
Python package `attnserve.v1`, so the generated `from attnserve.v1 import ...` lines need no rewriting.
protoc writes each stub under `<out>/attnserve/v1/`, mirroring the .proto's path: setup.py passes the
build directory for a wheel (the source tree stays untouched, and may be read-only) and the source tree
itself for an editable install, which imports from there. Run it by hand after editing a .proto file.
"""

import pathlib
import sys

PROTO_ROOT = pathlib.Path(__file__).resolve().parent


def generate(out_root: str | pathlib.Path = PROTO_ROOT) -> list[pathlib.Path]:
    """Writes the stubs under `out_root` (a folder that holds, or will hold, the `attnserve` package).

    Returns:
        The generated files.
    """
    from grpc_tools import protoc  # build-time only dependency

    out_root = pathlib.Path(out_root)
    (out_root / "attnserve" / "v1").mkdir(parents=True, exist_ok=True)
    proto_include = pathlib.Path(protoc.__file__).parent / "_proto"
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("attnserve/v1/*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{proto_include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {sources}")
    return sorted((out_root / "attnserve" / "v1").glob("*_pb2*.py*"))


if __name__ == "__main__":
    generate()
    sys.exit(0)
