"""deploy/k8s: both kustomize overlays rendered, validated against Kubernetes' schemas, and checked against the server.

Rendering uses `kubectl kustomize` (kustomize v5 built into kubectl >= 1.27). Without kubectl, the base is
read from the files its kustomization.yaml lists (it only adds a label, which nothing here checks) and
the GPU overlay, whose patches need kustomize, is skipped.

Validation: kubernetes-validate --strict (unknown fields are errors) against the oldest Kubernetes the
manifests need (1.30: the preStop sleep action is on by default there) and the newest the validator knows.
The ServiceMonitor is a CRD of the Prometheus Operator, which has no schema there: it is skipped by name.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import re
import shutil
import subprocess

import grpc
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from attnserve.server.edge import serve_options
from deploy_monitoring import DEPLOY, alert_queries, metric_names, recording_queries
from fakes import WAIT

K8S = DEPLOY / "k8s"
OVERLAYS = ("base", "gpu")
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# Kinds whose schemas are not Kubernetes' own (CustomResourceDefinitions): skipped, and only these.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
KUBECTL = shutil.which("kubectl")


def render(overlay: str) -> list[dict]:
    """The overlay's resources as kustomize renders them."""
    folder = K8S / overlay
    if KUBECTL is not None:
        done = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return list(yaml.safe_load_all(done.stdout))
    if overlay != "base":
        pytest.skip("the GPU overlay's patches need kustomize (`kubectl kustomize`); kubectl is not installed")
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in yaml.safe_load_all((folder / name).read_text())]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


def one(resources: list[dict], kind: str, name: str | None = None) -> dict:
    found = [r for r in resources if r["kind"] == kind and name in (None, r["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(resources: list[dict]) -> dict:
    (server,) = one(resources, "Deployment")["spec"]["template"]["spec"]["containers"]
    return server


def serve_args(resources: list[dict]) -> serve_options.ServeOptions:
    """The container's arguments, parsed by `attnserve serve`'s own flags (so a typo fails here)."""
    command, *flags = container(resources)["args"]
    assert command == "serve"
    parser = argparse.ArgumentParser(exit_on_error=False)
    serve_options.add_arguments(parser)
    return serve_options.from_args(parser.parse_args(flags))


def test_every_resource_is_valid_for_kubernetes(rendered):
    overlay, resources = rendered
    kinds = {(r["apiVersion"], r["kind"]) for r in resources}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap"} <= {k for _, k in kinds}
    assert CRD_KINDS <= kinds
    for version in KUBERNETES_VERSIONS:
        for resource in resources:
            if (resource["apiVersion"], resource["kind"]) in CRD_KINDS:
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # skipped because it has no schema
                    kubernetes_validate.validate(resource, version, strict=True)
                continue
            kubernetes_validate.validate(resource, version, strict=True)


def test_strict_validation_refuses_a_misspelt_field(rendered):
    _, resources = rendered
    deployment = copy.deepcopy(one(resources, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["servce"] = ""
    with pytest.raises(kubernetes_validate.ValidationError, match="servce"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_probes_ask_health_names_the_server_reports_serving(rendered, fake_server):
    _, resources = rendered
    server = container(resources)
    options = serve_args(resources)
    probes = [server[name] for name in ("startupProbe", "readinessProbe", "livenessProbe")]
    ports = {port["name"]: port["containerPort"] for port in server["ports"]}
    assert all(probe["grpc"]["port"] == ports["grpc"] == options.port for probe in probes)
    background, _ = fake_server
    with grpc.insecure_channel(background.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for probe in probes:
            answer = health.Check(health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")), timeout=WAIT)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, probe


def test_termination_grace_is_the_prestop_pause_the_drain_and_the_servers_close_bound(rendered):
    from attnserve.server.edge.app import CLOSE_SECONDS

    _, resources = rendered
    pod = one(resources, "Deployment")["spec"]["template"]["spec"]
    pause = container(resources)["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = serve_args(resources).grace_seconds
    # The server stops within --grace-seconds + CLOSE_SECONDS of SIGTERM (engine processes included).
    assert pod["terminationGracePeriodSeconds"] == pause + drain + CLOSE_SECONDS


def test_the_pod_runs_as_the_images_non_root_user(rendered):
    _, resources = rendered
    pod = one(resources, "Deployment")["spec"]["template"]["spec"]
    image_user = re.search(r"^USER (\d+)$", (DEPLOY.parent / "Dockerfile").read_text(), re.MULTILINE).group(1)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(image_user)
    context = container(resources)["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= container(resources)["resources"]["requests"].keys()
    assert {"cpu", "memory"} <= container(resources)["resources"]["limits"].keys()


def test_the_autoscaler_reads_a_recorded_series_of_exposed_metrics_through_the_adapter_rule(rendered, fake_server):
    _, resources = rendered
    hpa = one(resources, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(resources, "Deployment")["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    config = yaml.safe_load(one(resources, "ConfigMap", "attnserve-prometheus-adapter")["data"]["config.yaml"])
    (rule,) = [r for r in config["rules"] if r["name"]["as"] == name]
    series = re.match(r"[\w:]+", rule["seriesQuery"]).group()
    assert re.fullmatch(rule["name"]["matches"], series)
    assert {o["resource"] for o in rule["resources"]["overrides"].values()} == {"namespace", "pod"}
    recorded = recording_queries()[series]  # a recording rule of deploy/prometheus, promtool-tested
    assert "without (model)" in recorded  # keeps the namespace and pod labels the adapter maps
    exposed = {s.name for f in text_string_to_metric_families(generate_latest(REGISTRY).decode()) for s in f.samples}
    assert metric_names(recorded) <= exposed  # fake_server's model makes the load gauges appear


def test_services_select_the_pods_and_the_scrape_job_is_the_one_the_alerts_watch(rendered):
    _, resources = rendered
    pod_labels = one(resources, "Deployment")["spec"]["template"]["metadata"]["labels"]
    ports = {port["name"]: port["containerPort"] for port in container(resources)["ports"]}
    services = [r for r in resources if r["kind"] == "Service"]
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert all(port["targetPort"] in ports for port in service["spec"]["ports"])
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    assert [p["targetPort"] for s in headless for p in s["spec"]["ports"]] == ["grpc"]
    assert len(services) - len(headless) == 1
    assert one(resources, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    monitor = one(resources, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and serve_args(resources).metrics_port == ports["metrics"]
    assert serve_args(resources).metrics_host == "0.0.0.0"  # loopback would be out of Prometheus' reach
    assert serve_args(resources).host == "0.0.0.0"  # and out of the Service's and the probes' reach
    scraped = [
        s for s in services
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        and any(p["name"] == endpoint["port"] for p in s["spec"]["ports"])
    ]
    # Without `jobLabel` the Prometheus Operator names the job after the Service.
    assert "jobLabel" not in monitor["spec"]
    (job,) = {m for query in alert_queries().values() for m in re.findall(r'job="([^"]+)"', query)}
    assert [s["metadata"]["name"] for s in scraped] == [job]


def test_the_gpu_overlay_asks_for_a_gpu_and_runs_on_cuda():
    base, gpu = render("base"), render("gpu")
    assert container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert serve_args(gpu).device == "cuda" and serve_args(base).device == "cpu"
    assert (serve_args(gpu).max_rows, serve_args(base).max_rows) == (64, 16)  # the HPA's rows differ too
    assert container(gpu)["image"] != container(base)["image"]
    assert container(gpu)["image"].endswith("-gpu")
