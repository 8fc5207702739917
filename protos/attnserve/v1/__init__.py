"""attnserve.v1: generated protobuf and gRPC stubs (see protos/generate.py)."""
