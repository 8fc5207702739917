#!/usr/bin/env bash
# Brings deploy/compose.yaml up for real with podman-compose (attnserve + Prometheus; Grafana's image cannot be
# fetched without a registry, so its files are validated by the tests instead) and checks what a user checks:
# Prometheus finds the attnserve target up over the compose network, loads the rule files, and a request
# sent to attnserve shows up in a Prometheus query. Then `down`.
# Run after deploy/smoke-container.sh (it reuses that image, tagged as the compose file's attnserve image).
#   deploy/smoke-compose.sh        exits non-zero on failure
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/podman-env.sh

# podman-compose from PyPI: Debian's 1.0.3 mishandles networking and exits 0 on errors.
"$python" -m podman_compose --version >/dev/null 2>&1 || "$python" -m pip install -q podman-compose==1.6.0
compose=("$python" -m podman_compose -f deploy/compose.yaml)

# The images, built the way the compose file's `build` sections say, from the local base (no registry).
podman image exists localhost/attnserve:smoke || deploy/smoke-container.sh
podman tag localhost/attnserve:smoke localhost/attnserve:latest
podman build --quiet --format docker --network host --build-arg BASE="$base_image" \
  -t localhost/attnserve-prometheus:latest deploy/prometheus >/dev/null

down() { "${compose[@]}" down >/dev/null 2>&1 || true; }
trap down EXIT
down  # a previous run's leftovers
log=$(mktemp)
"${compose[@]}" up -d --no-build attnserve prometheus >"$log" 2>&1 || { cat "$log"; exit 1; }
# podman-compose reports some failures only in its output.
if grep -q "^Error:" "$log"; then cat "$log"; exit 1; fi

"$python" - <<'PY'
import json, time, urllib.parse, urllib.request

import grpc

from attnserve.clients.client import Client


def prometheus(path, **query):
    url = f"http://127.0.0.1:9090/api/v1/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as page:
        return json.load(page)["data"]


def wait_for(what, check, seconds=120):
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = check()
        except OSError:  # not listening yet
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(2)


with grpc.insecure_channel("127.0.0.1:50051") as channel:
    grpc.channel_ready_future(channel).result(timeout=120)
with Client("127.0.0.1:50051", timeout=60) as client:
    print("attnserve:", repr(client.translate("Open the file", to="zh-TW").text))
targets = wait_for("the attnserve target to be up", lambda: [
    t for t in prometheus("targets")["activeTargets"] if t["labels"]["job"] == "attnserve" and t["health"] == "up"])
print("Prometheus target", targets[0]["scrapeUrl"], "up (compose network, service name)")
groups = prometheus("rules")["groups"]
rules = sum(len(g["rules"]) for g in groups)
assert rules, "Prometheus loaded no rules"
print(f"Prometheus loaded {len(groups)} rule groups, {rules} rules")
result = wait_for("the request to reach Prometheus", lambda: prometheus(
    "query", query='sum(attnserve_requests_total{code="OK"})')["result"])
print("Prometheus query sum(attnserve_requests_total{code=\"OK\"}) =", result[0]["value"][1])
PY
echo "compose: attnserve and Prometheus up, scraped and queried; taking it down"
