#!/usr/bin/env bash
# Builds the attnserve image with podman and runs it: health, one translation, a clean stop on SIGTERM.
# Needs root and Debian's mmdebstrap podman runc fuse-overlayfs uidmap slirp4netns (.ci/run installs them).
# No container registry is assumed: the base image is bootstrapped from the machine's own Debian mirror
# (cached under $ATTNSERVE_CACHE) and imported into podman.
#   deploy/smoke-container.sh            prints the image size and the build time, exits non-zero on failure
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. Podman's settings and the base image (a minimal Debian with Python from this machine's own mirror).
source deploy/podman-env.sh
image=localhost/attnserve:smoke
container=attnserve-smoke-$$
port=${SMOKE_PORT:-50061}
metrics_port=${SMOKE_METRICS_PORT:-9474}

# 2. The image. pip inside the build trusts the host's CA bundle, mounted read-only, never copied in.
started=$(date +%s)
podman build --format docker --network host --build-arg BASE="$base_image" --build-arg PIP_CERT="$ca_bundle" \
  -v "$ca_bundle:$ca_bundle:ro" -t "$image" .
build_seconds=$(( $(date +%s) - started ))
size=$(podman image inspect "$image" --format '{{.Size}}')
echo "image $image: $(( size / 1024 / 1024 )) MiB, built in ${build_seconds} s"

# 3. Run it as users would (default command), on other ports so that nothing local collides.
cleanup() { podman rm -f "$container" >/dev/null 2>&1 || true; }
trap cleanup EXIT
podman run -d --name "$container" --network host "$image" \
  serve --models /models --port "$port" --metrics-port "$metrics_port" >/dev/null
"$python" - "$port" "$metrics_port" <<'PY'
import sys, time, urllib.request
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from attnserve.clients.client import Client

port, metrics_port = sys.argv[1], sys.argv[2]
address = f"127.0.0.1:{port}"
with grpc.insecure_channel(address) as channel:
    grpc.channel_ready_future(channel).result(timeout=120)  # the port opens once the models are loaded
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
assert status == health_pb2.HealthCheckResponse.SERVING, status
with Client(address, timeout=60) as client:
    result = client.translate("Open the file", to="zh-TW")
print(f"health SERVING; 'Open the file' -> {result.text!r}")
assert result.text, "empty translation"
with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
    assert 'attnserve_requests_total{code="OK",model="translate-zh-en"} 1.0' in page.read().decode()
print("metrics count the request")
PY
# The image's own HEALTHCHECK command, run inside the container against its port.
podman exec "$container" /opt/attnserve/bin/python /usr/local/bin/attnserve-healthcheck "localhost:$port"

# 4. SIGTERM: drain and exit 0 within the grace period.
podman stop --time 20 "$container" >/dev/null
code=$(podman inspect "$container" --format '{{.State.ExitCode}}')
podman logs "$container" 2>&1 | tail -3
[[ $code == 0 ]] || { echo "the container exited with $code after SIGTERM" >&2; exit 1; }
echo "stopped cleanly (exit 0)"
