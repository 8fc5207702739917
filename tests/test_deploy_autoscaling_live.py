"""The autoscaler's signal, live: a real Prometheus with the shipped recording rules scrapes a real
`attnserve serve`; a load step must lift the series the HPA reads (through the prometheus-adapter rule's
query) over the HPA's target while the load lasts, from under it before, and bring it back under after.

The served model runs with --max-rows 8 (and beams of at most 4), so that a step of 12 clients with 4 beams each wants more rows than
a replica has; Prometheus scrapes and evaluates every second. Skipped where the `prometheus` binary is absent.
"""

from __future__ import annotations

import concurrent.futures
import threading

import grpc
import pytest
import yaml

from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME
from deploy_monitoring import DEPLOY
from served_process import WAIT
from test_deploy_prometheus_live import PROMETHEUS, _wait_for, _wait_for_scrape, prometheus_on

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs the prometheus binary (Debian package `prometheus`, which .ci/run installs)"
)
CLIENTS = 12


def _hpa_target() -> tuple[str, float]:
    """(the HPA's custom metric, its per-pod target value)."""
    hpa = yaml.safe_load((DEPLOY / "k8s" / "base" / "hpa.yaml").read_text())
    (metric,) = hpa["spec"]["metrics"]
    value = metric["pods"]["target"]["averageValue"]
    return metric["pods"]["metric"]["name"], float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def _adapter_query(name: str) -> str:
    """The PromQL prometheus-adapter runs for `name`, its template filled in for this one target."""
    adapter = yaml.safe_load((DEPLOY / "k8s" / "base" / "prometheus-adapter.yaml").read_text())
    (rule,) = [r for r in yaml.safe_load(adapter["data"]["config.yaml"])["rules"] if r["name"]["as"] == name]
    series = rule["seriesQuery"].split("{")[0]
    query = rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", 'job="attnserve"')
    return query.replace("<<.GroupBy>>", "instance")  # in a cluster: namespace, pod


def test_a_load_step_lifts_the_autoscalers_metric_over_its_target(tmp_path, tiny_model_repo):
    name, target = _hpa_target()
    query = _adapter_query(name)
    with prometheus_on(tmp_path, tiny_model_repo, ["--max-rows", "8", "--max-beam-size", "4"]) as (prometheus, server):
        _wait_for(lambda: prometheus.query(query), "the first recorded row demand")

        def demand() -> float:
            (series,) = prometheus.query(query)
            return float(series["value"][1])

        assert demand() < target  # idle
        stop = threading.Event()
        request = pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text="Knowledge is power. " * 3),
                                     decoding=pb.DecodingOptions(beam_size=4, max_new_tokens=40))
        with grpc.insecure_channel(server.address) as channel, concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            stub = pb_grpc.AttnServeStub(channel)

            def client() -> int:
                answered = 0
                while not stop.is_set():
                    stub.Generate(request, timeout=WAIT)
                    answered += 1
                return answered

            clients = [pool.submit(client) for _ in range(CLIENTS)]
            try:
                peak = [0.0]

                def crossed() -> bool:
                    peak[0] = max(peak[0], demand())
                    return peak[0] > target

                _wait_for(crossed, f"{name} over its target {target}", explain=lambda: f"peak {peak[0]}")
            finally:
                stop.set()
                answered = sum(c.result() for c in clients)
        _wait_for_scrape(prometheus)
        _wait_for(lambda: demand() < target, f"{name} back under {target} once the load stopped")
    assert answered > 0
    print(f"{name}: idle < {target}, peak {peak[0]:.2f} under {CLIENTS} clients x 4 beams, back under after")
