"""deploy/prometheus and deploy/grafana: rules tested with promtool, names checked against the server.

The live check (a real Prometheus scraping a real server) is in test_deploy_prometheus_live.py.
"""

from __future__ import annotations

import shutil
import subprocess

import grpc
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME
from deploy_monitoring import (
    DEPLOY,
    PROMETHEUS_CONFIG,
    alert_queries,
    dashboard,
    dashboard_queries,
    metric_names,
    recorded_names,
    recording_queries,
)
from fakes import WAIT

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="needs promtool (Debian package `prometheus`, which .ci/run installs)"
)


@needs_promtool
@pytest.mark.parametrize("test_file", sorted((DEPLOY / "prometheus" / "tests").glob("*_test.yml")), ids=lambda p: p.name)
def test_promtool_rule_tests_pass(test_file):
    done = subprocess.run([PROMTOOL, "test", "rules", test_file.name], cwd=test_file.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_prometheus_config_and_rules_are_valid():
    done = subprocess.run([PROMTOOL, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_has_a_promtool_test():
    tested = "\n".join(path.read_text() for path in (DEPLOY / "prometheus" / "tests").glob("*_test.yml"))
    assert [name for name in alert_queries() if f"alertname: {name}" not in tested] == []
    assert [name for name in recording_queries() if f"expr: {name}" not in tested and f"({name}," not in tested] == []


def test_recorded_series_the_dashboard_and_alerts_read_are_recorded():
    recorded = set(recording_queries())
    used = set().union(*(recorded_names(q) for q in [*dashboard_queries().values(), *alert_queries().values()]))
    assert used - recorded == set()


def test_every_metric_the_dashboard_and_rules_use_is_exposed_by_the_server(tiny_server):
    background, _ = tiny_server
    with grpc.insecure_channel(background.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        stub.Generate(pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text="Open the file")), timeout=WAIT)
        with pytest.raises(grpc.RpcError):  # a refused request: the rejection counter gets its first series
            stub.Generate(pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text="x"), target_language="fr"))
    exposed = {
        sample.name for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()) for sample in family.samples
    }
    queries = [*dashboard_queries().values(), *recording_queries().values(), *alert_queries().values()]
    used = set().union(*(metric_names(query) for query in queries))
    assert len(used) >= 15  # the parser found the queries' names at all
    assert used - exposed == set()


def test_dashboard_panels_have_a_query_a_data_source_and_their_own_place():
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in board["panels"]:
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
        box = panel["gridPos"]
        area = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        assert box["x"] + box["w"] <= 24
        cells |= area
    # Every panel of attnserve's own series follows the model selector.
    for title, query in dashboard_queries().items():
        if metric_names(query) or recorded_names(query):
            assert 'model=~".*"' in query or title.startswith("variable"), title


def test_grafana_provisioning_points_at_the_dashboard_folder_compose_mounts():
    import yaml

    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "attnserve.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert any(m.startswith("./grafana/dashboards:") and m.split(":")[1] == path for m in mounts), mounts
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
