"""The queries of deploy/: every PromQL expression the Grafana dashboard and the Prometheus rules run.

Imported by the monitoring tests (tests/ is on sys.path), so that the metric-name check and the live
Prometheus check read the same list.
"""

from __future__ import annotations

import json
import pathlib
import re

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULE_FILES = [DEPLOY / "prometheus" / "rules" / name for name in ("recording.yml", "alerts.yml")]
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "attnserve.json"

# What Grafana substitutes for its variables when it runs a panel's query: all models, a 1-minute window.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$model": ".*"}


def rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def recording_queries() -> dict[str, str]:
    """Recorded series name -> the expression that records it."""
    return {rule["record"]: rule["expr"].strip() for rule in rules() if "record" in rule}


def alert_queries() -> dict[str, str]:
    return {rule["alert"]: rule["expr"].strip() for rule in rules() if "alert" in rule}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> dict[str, str]:
    """'panel title / refId' -> the panel's query with Grafana's variables filled in; the model selector's too."""
    queries = {}
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            queries[f"{panel['title']} / {target['refId']}"] = grafana_to_promql(target["expr"])
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(METRIC, LABEL) is Grafana's; Prometheus answers the same question like this.
            metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"]).groups()
            queries[f"variable {variable['name']}"] = f"group by ({label}) ({metric})"
    return queries


def grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The server's series names an expression reads, as exposed (`..._bucket`, `..._total`).

    Recorded series (`model:attnserve_...:p99_rate5m`) are not the server's: the colons rule them out.
    """
    return set(re.findall(r"(?<![:\w])attnserve_[a-z_]+\b(?!:)", expr))


def recorded_names(expr: str) -> set[str]:
    return set(re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", expr))
