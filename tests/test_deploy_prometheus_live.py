"""A real Prometheus, on loopback, scrapes a real `attnserve serve` under a short bounded load and answers
every query of the dashboard and the recording rules with data.

Prometheus runs the shipped scrape job and rule files; only its target and intervals (1 s, so that the
test does not wait minutes) are the test's. Skipped where the `prometheus` binary is absent.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import grpc
import pytest
import yaml

from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME
from deploy_monitoring import PROMETHEUS_CONFIG, RULE_FILES, dashboard_queries, recording_queries
from served_process import WAIT, free_port, served

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs the prometheus binary (Debian package `prometheus`, which .ci/run installs)"
)


class Prometheus:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"

    def query(self, promql: str) -> list[dict]:
        """The instant vector `promql` evaluates to now (raises on a query Prometheus rejects)."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=WAIT) as page:
            answer = json.load(page)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=WAIT) as page:
            return json.load(page)


@pytest.fixture
def prometheus_scraping(tmp_path, tiny_model_repo):
    """(Prometheus, served process): Prometheus with the shipped config, aimed at a fresh server."""
    with prometheus_on(tmp_path, tiny_model_repo) as started:
        yield started


@contextlib.contextmanager
def prometheus_on(tmp_path, repository, serve_args=()):
    """(Prometheus, served process): the shipped scrape job and rules, every 1 s, aimed at a fresh server."""
    command = [sys.executable, "-m", "attnserve.clients.cli"]
    with served(command, str(repository), extra_args=serve_args) as server:
        config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(path) for path in RULE_FILES]
        (job,) = config["scrape_configs"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{server.metrics_port}"]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        command = [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}"]
        command += [f"--web.listen-address=127.0.0.1:{port}"]
        with open(tmp_path / "prometheus.log", "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            prometheus = Prometheus(port)
            _wait_for(lambda: _answers(prometheus), "Prometheus to start", tmp_path / "prometheus.log")
            yield prometheus, server
        finally:
            process.terminate()
            process.wait(timeout=WAIT)


def test_every_dashboard_and_recording_query_returns_data(prometheus_scraping, tmp_path):
    prometheus, server = prometheus_scraping
    _wait_for(lambda: prometheus.query('up{job="attnserve"} == 1'), "the first scrape")
    # Three rounds of load, a scrape after each: rates need increases between samples, not one jump.
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        for _ in range(3):
            _load(stub)
            _wait_for_scrape(prometheus)
        _until_a_deadline_passes_on_the_server(stub, server)
        _wait_for_scrape(prometheus)

    queries = {**dashboard_queries(), **{f"recording rule {name}": expr for name, expr in recording_queries().items()}}
    queries |= {f"recorded series {name}": name for name in recording_queries()}  # the rules really ran
    missing: dict[str, str] = {}

    def all_answered() -> bool:
        missing.clear()
        missing.update({title: q for title, q in queries.items() if not _finite(prometheus.query(q))})
        return not missing

    _wait_for(all_answered, "every query to return data", explain=lambda: f"no data: {json.dumps(missing, indent=1)}")
    rules = prometheus.get("/api/v1/rules")["data"]["groups"]
    assert [r["name"] for g in rules for r in g["rules"] if r["health"] != "ok"] == []


def _load(stub) -> None:
    """A burst of concurrent requests of every shape the panels show: greedy, beam, streamed, refused."""
    text = pb.TextInput(text="Knowledge is power. Open the file.")
    requests = [pb.GenerateRequest(model=TINY_MODEL_NAME, text=text, decoding=pb.DecodingOptions(max_new_tokens=8))] * 6
    requests += [pb.GenerateRequest(model=TINY_MODEL_NAME, text=text, decoding=pb.DecodingOptions(beam_size=4, max_new_tokens=8))] * 2
    bad = pb.GenerateRequest(model=TINY_MODEL_NAME, text=text, target_language="fr")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(stub.Generate, r, timeout=WAIT) for r in requests]
        answers += [pool.submit(lambda r: list(stub.GenerateStream(r, timeout=WAIT)), requests[0]) for _ in range(2)]
        for answer in answers:
            answer.result()
        with pytest.raises(grpc.RpcError):
            stub.Generate(bad, timeout=WAIT)


def _until_a_deadline_passes_on_the_server(stub, server, rounds: int = 30) -> None:
    """Sends bursts with deadlines too short for a beam search until the server counts one it missed, or
    refused as one it could not meet (deadline-aware admission, server/engine/cost.py).

    The error-ratio rule needs a server-side failure; whether a 10 ms deadline expires in the server (and
    not in the client before sending) depends on timing, so try a bounded number of bursts.
    """
    slow = pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text="Knowledge is power. " * 4),
                              decoding=pb.DecodingOptions(beam_size=8, max_new_tokens=40))
    for _ in range(rounds):
        calls = [stub.Generate.future(slow, timeout=0.01) for _ in range(8)]
        for call in calls:
            call.exception()
        page = server.metrics()
        if 'code="DEADLINE_EXCEEDED"' in page or 'reason="deadline"' in page:
            return
    pytest.fail(f"no request missed its deadline on the server in {rounds} bursts")


def _wait_for_scrape(prometheus: Prometheus) -> None:
    def scraped_at() -> float:
        return float(prometheus.query('timestamp(up{job="attnserve"})')[0]["value"][1])

    first = scraped_at()
    _wait_for(lambda: scraped_at() > first, "the next scrape")


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def _answers(prometheus: Prometheus) -> bool:
    try:
        return prometheus.get("/api/v1/status/runtimeinfo")["status"] == "success"
    except OSError:
        return False


def _wait_for(predicate, what: str, log=None, explain=None) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            detail = explain() if explain else (log.read_text()[-3000:] if log else "")
            pytest.fail(f"timed out waiting for {what}\n{detail}")
        time.sleep(0.2)
