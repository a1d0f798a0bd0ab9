"""The observability the chart ships: the PrometheusRule (the alerts of docs/operations.md),
the Grafana dashboard's ConfigMap and the workers' PodMonitor; and every query in them against
a real scrape of the coordinator (the worker's and the streams application's series are checked
against their own scrapes in tests/client/test_worker.py and tests/streams/test_metrics.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema
import pytest

from tests.deploy.test_helm_chart import (
    CHART_DIR,
    WORKER_ON_KEDA,
    container,
    named,
    one,
    render,
    with_values,
)
from tests.fixtures.coordinator import MakeDatabase
from tests.observability import DASHBOARD, dashboard_queries, exporter_of, problems, selectors
from tests.test_metrics import join_and_commit, scrape, serving
from tests.waiting import until

FULLNAME = "kr-keyrange"
PER_GROUP_ALERTS = {"KeyrangeLagGrowing", "KeyrangeGroupEmpty"}

# The fields of the Prometheus Operator's CRDs (monitoring.coreos.com/v1) the chart uses,
# strict: a misspelt field fails here as the API server would refuse it.
_DURATION = {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
RULE_SPEC_SCHEMA = {
    "type": "object",
    "required": ["groups"],
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": _DURATION,
                    "rules": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["alert", "expr"],
                            "additionalProperties": False,
                            "properties": {
                                "alert": {"type": "string", "minLength": 1},
                                "expr": {"type": "string", "minLength": 1},
                                "for": _DURATION,
                                "labels": _STRINGS,
                                "annotations": _STRINGS,
                            },
                        },
                    },
                },
            },
        }
    },
}
POD_MONITOR_SPEC_SCHEMA = {
    "type": "object",
    "required": ["selector", "podMetricsEndpoints"],
    "additionalProperties": False,
    "properties": {
        "selector": {"type": "object"},
        "namespaceSelector": {"type": "object"},
        "podMetricsEndpoints": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "port": {"type": "string"},
                    "path": {"type": "string"},
                    "interval": _DURATION,
                    "scrapeTimeout": _DURATION,
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def alerts(chart: helm.Chart, **rule: Any) -> dict[str, dict[str, Any]]:
    rendered = one(
        render(chart, with_values(prometheusRule={"enabled": True, **rule})), "PrometheusRule"
    )
    jsonschema.validate(rendered["spec"], RULE_SPEC_SCHEMA)
    return {r["alert"]: r for group in rendered["spec"]["groups"] for r in group["rules"]}


def test_every_shipped_query_parses_and_reads_series_of_a_known_exporter(
    chart: helm.Chart,
) -> None:
    queries = dashboard_queries() + [rule["expr"] for rule in alerts(chart).values()]
    read = {selector.name for query in queries for selector in selectors(query)}
    assert {exporter_of(name) for name in read} == {"coordinator", "worker", "streams"}
    assert all(name.startswith("keyrange_") for name in read)


def test_the_dashboard_is_one_grid_of_uniquely_numbered_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        place = panel["gridPos"]
        assert place["x"] + place["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and panel["description"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"
    rows = [panel["title"] for panel in panels if panel["type"] == "row"]
    assert rows == ["Groups", "Workers", "Streams"]


def test_the_rule_carries_the_documented_alerts_with_the_thresholds_of_its_values(
    chart: helm.Chart,
) -> None:
    rules = alerts(
        chart,
        thresholds={
            "serverErrorRatio": 0.05,
            "slowCommitP99Seconds": 0.25,
            "icRangesStored": 5000,
            "rebalancesPerMinute": 3,
            "stuckCallSeconds": 120,
            "lagGrowingFor": "1h",
        },
        severity="critical",
    )
    assert set(rules) == {
        "KeyrangeServerErrors",
        "KeyrangeSlowCommits",
        "KeyrangeStableOffsetStuck",
        "KeyrangeICRangesHigh",
        "KeyrangeICLimitReached",
        "KeyrangeRebalanceStorm",
        "KeyrangeStuckCallHoldsSlice",
        *PER_GROUP_ALERTS,
    }
    assert rules["KeyrangeServerErrors"]["expr"].rstrip().endswith("> 0.05")
    assert rules["KeyrangeSlowCommits"]["expr"].rstrip().endswith("> 0.25")
    assert rules["KeyrangeICRangesHigh"]["expr"].endswith("> 5000")
    assert rules["KeyrangeRebalanceStorm"]["expr"].endswith("> 3")
    assert rules["KeyrangeStuckCallHoldsSlice"]["expr"].endswith("> 120")
    assert rules["KeyrangeLagGrowing"]["for"] == "1h"
    assert {rule["labels"]["severity"] for rule in rules.values()} == {"critical"}
    # Prometheus fills in the labels at alert time, so the template must leave them to it.
    assert "{{ $labels.group_id }}" in rules["KeyrangeGroupEmpty"]["annotations"]["summary"]


def test_per_group_alerts_can_be_left_out_when_prometheus_has_no_metrics_token(
    chart: helm.Chart,
) -> None:
    rules = alerts(chart, perGroupRules=False)
    assert rules and not PER_GROUP_ALERTS & set(rules)


def test_the_rule_goes_where_prometheus_selects_rules(chart: helm.Chart) -> None:
    objects = render(
        chart,
        with_values(
            prometheusRule={
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"release": "kube-prometheus-stack"},
            }
        ),
    )
    rule = one(objects, "PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_dashboard_configmap_carries_the_dashboard_for_the_grafana_sidecar(
    chart: helm.Chart,
) -> None:
    objects = render(chart, with_values(grafanaDashboard={"enabled": True, "folder": "Kafka"}))
    config_map = named(objects, "ConfigMap", f"{FULLNAME}-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"]["grafana_folder"] == "Kafka"
    assert json.loads(config_map["data"]["keyrange.json"]) == json.loads(DASHBOARD.read_text())
    default = render(chart, with_values())
    assert not [o for o in default if o["metadata"]["name"] == f"{FULLNAME}-dashboard"]


def test_workers_serve_metrics_on_a_named_port_that_a_pod_monitor_scrapes(
    chart: helm.Chart,
) -> None:
    objects = render(chart, with_values(worker=WORKER_ON_KEDA, serviceMonitor={"enabled": True}))
    worker = named(objects, "Deployment", f"{FULLNAME}-worker")
    env = {entry["name"]: entry.get("value") for entry in container(worker)["env"]}
    assert env["KEYRANGE_WORKER_METRICS_PORT"] == "9400"
    assert container(worker)["ports"] == [
        {"name": "metrics", "containerPort": 9400, "protocol": "TCP"}
    ]
    monitor = one(objects, "PodMonitor")
    jsonschema.validate(monitor["spec"], POD_MONITOR_SPEC_SCHEMA)
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    pod_labels = worker["spec"]["template"]["metadata"]["labels"]
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= pod_labels.items()

    without = render(
        chart,
        with_values(worker={**WORKER_ON_KEDA, "metricsPort": 0}, serviceMonitor={"enabled": True}),
    )
    worker = named(without, "Deployment", f"{FULLNAME}-worker")
    assert "ports" not in container(worker)
    assert "KEYRANGE_WORKER_METRICS_PORT" not in {e["name"] for e in container(worker)["env"]}
    assert "PodMonitor" not in {o["kind"] for o in without}


async def test_every_coordinator_series_the_dashboard_and_alerts_read_is_exported(
    make_migrated_database: MakeDatabase, chart: helm.Chart
) -> None:
    queries = dashboard_queries() + [rule["expr"] for rule in alerts(chart).values()]
    async with serving(await make_migrated_database(), metrics_group_labels=True) as api:
        await join_and_commit(api, "dashboard-group")

        async def per_group_series() -> bool:
            return 'keyrange_group_member_load{bound="max",group_id="dashboard-group"}' in (
                await scrape(api)
            )

        await until(per_group_series, 10, "the group's series")
        page = await scrape(api)
    assert problems(queries, page, "coordinator") == []
