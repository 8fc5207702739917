"""Generates the Python gRPC stubs for protos/attnserve/v1/*.proto next to the .proto files.

The proto package `attnserve.v1` lives in `protos/attnserve/v1/`, which pyproject.toml installs as the
Python package `attnserve.v1`, so the generated `from attnserve.v1 import ...` lines need no rewriting.
Run by setup.py on every build and editable install; run it by hand after editing a .proto file.
"""

import pathlib
import sys

PROTO_ROOT = pathlib.Path(__file__).resolve().parent


def generate() -> None:
    from grpc_tools import protoc  # build-time only dependency

    proto_include = pathlib.Path(protoc.__file__).parent / "_proto"
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("attnserve/v1/*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{proto_include}",
        f"--python_out={PROTO_ROOT}",
        f"--pyi_out={PROTO_ROOT}",
        f"--grpc_python_out={PROTO_ROOT}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {sources}")


if __name__ == "__main__":
    generate()
    sys.exit(0)
