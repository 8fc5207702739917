"""deploy/envoy/grpc-web.yaml, the Envoy configuration docs/http-api.md offers grpc-web users, by structure
(no Envoy binary here): it routes the service the .proto defines, runs grpc_web before the router, allows
the headers grpc-web sends, and speaks HTTP/2 to the server."""

from __future__ import annotations

import pathlib

import pytest

from attnserve.v1 import attnserve_pb2 as pb

yaml = pytest.importorskip("yaml", reason="reading the configuration needs pyyaml (the `dev` extra)")

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "deploy" / "envoy" / "grpc-web.yaml"


def test_the_envoy_configuration_fits_the_service():
    config = yaml.safe_load(CONFIG.read_text())
    (listener,) = config["static_resources"]["listeners"]
    (manager,) = listener["filter_chains"][0]["filters"]
    http = manager["typed_config"]
    filters = [f["name"] for f in http["http_filters"]]
    assert filters == ["envoy.filters.http.grpc_web", "envoy.filters.http.cors", "envoy.filters.http.router"]
    (host,) = http["route_config"]["virtual_hosts"]
    service = pb.DESCRIPTOR.services_by_name["AttnServe"].full_name
    (route,) = host["routes"]
    assert route["match"]["prefix"] == f"/{service}/" and route["route"]["cluster"] == "attnserve"
    cors = host["typed_per_filter_config"]["envoy.filters.http.cors"]
    allowed = {h.strip() for h in cors["allow_headers"].split(",")}
    assert {"content-type", "x-grpc-web", "authorization", "grpc-timeout"} <= allowed
    assert {"grpc-status", "grpc-message"} <= {h.strip() for h in cors["expose_headers"].split(",")}
    (cluster,) = config["static_resources"]["clusters"]
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert endpoint["port_value"] == 50051
