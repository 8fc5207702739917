"""Exits 0 when the attnserve at ADDRESS (default localhost:50051) reports SERVING on gRPC health, else 1.

The container's HEALTHCHECK; Kubernetes asks the same service with its native gRPC probe instead.
"""

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(address: str) -> int:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    except grpc.RpcError as error:
        print(f"{address}: {error.code().name}", file=sys.stderr)
        return 1
    print(f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "localhost:50051"))
