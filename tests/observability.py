"""The queries the chart ships (the Grafana dashboard's panels and the PrometheusRule's
alerts) against what the code exports, so neither can rot when a metric is renamed or loses a
label. A query is parsed with a PromQL parser; its series are then looked up in a real scrape of
the process that exports them (the coordinator, a worker, a streams application)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

CHART_DIR = Path(__file__).resolve().parent.parent / "helm" / "keyrange"
DASHBOARD = CHART_DIR / "dashboards" / "keyrange.json"

# Added by Prometheus to every scraped series (target labels), or by the histogram itself.
TARGET_LABELS = frozenset(
    {"instance", "job", "pod", "namespace", "container", "service", "endpoint", "le"}
)
# Which process exports a series, by its name.
EXPORTERS = {
    "keyrange_worker_": "worker",
    "keyrange_streams_": "streams",
    "keyrange_": "coordinator",
}


_WRAPPERS = (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)


@dataclass
class Selector:
    """A series a query reads, the labels it matches on, and the labels it groups it by."""

    name: str
    labels: set[str] = field(default_factory=set)


def exporter_of(name: str) -> str:
    return next(who for prefix, who in EXPORTERS.items() if name.startswith(prefix))


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(_label_values_selector(variable["definition"]))
    return queries


def _label_values_selector(definition: str) -> str:
    """``label_values(metric, label)`` as the selector ``max by (label) (metric)``."""
    inner = definition.removeprefix("label_values(").removesuffix(")")
    metric, label = (part.strip() for part in inner.split(","))
    return f"max by ({label}) ({metric})"


def selectors(query: str) -> list[Selector]:
    """The series ``query`` reads; labels a ``by``/``on`` clause names are charged to every
    series under it, as they must exist on them for the clause to mean anything."""
    found: list[Selector] = []
    _walk(promql_parser.parse(query.replace("$group", "x")), set(), found)
    return found


def _walk(node: Any, grouping: set[str], found: list[Selector]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        labels = {m.name for m in node.matchers.matchers if m.name != "__name__"}
        found.append(Selector(node.name, labels | grouping))
    elif isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, grouping, found)
    elif isinstance(node, promql_parser.AggregateExpr):
        labels = set(node.modifier.labels) if node.modifier is not None else set()
        by = labels if str(node.modifier).startswith("by") else set()
        _walk(node.expr, grouping | by, found)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            _walk(arg, grouping, found)
    elif isinstance(node, promql_parser.BinaryExpr):
        matching = set()
        if node.modifier is not None and node.modifier.matching is not None:
            matching = set(node.modifier.matching.labels)
        _walk(node.lhs, grouping | matching, found)
        _walk(node.rhs, grouping | matching, found)
    elif isinstance(node, _WRAPPERS):
        _walk(node.expr, grouping, found)


def exported(page: str) -> dict[str, set[str] | None]:
    """Every series name a Prometheus text page exports, with its label names (None where the
    family has no sample, so only its name is known)."""
    series: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(page):
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
        }.get(family.type, ("",))
        for suffix in suffixes:
            series.setdefault(family.name + suffix, None)
        for sample in family.samples:
            known = series.get(sample.name) or set()
            series[sample.name] = known | set(sample.labels)
    return series


def problems(queries: list[str], page: str, exporter: str) -> list[str]:
    """What is wrong with the queries' series of ``exporter`` against its scrape ``page``."""
    series = exported(page)
    wrong: list[str] = []
    for query in queries:
        for selector in selectors(query):
            if exporter_of(selector.name) != exporter:
                continue
            if selector.name not in series:
                wrong.append(f"{selector.name} is not exported (in {query!r})")
                continue
            labels = series[selector.name]
            if labels is None:
                continue
            unknown = selector.labels - labels - TARGET_LABELS
            if unknown:
                wrong.append(f"{selector.name} has no label {sorted(unknown)} (in {query!r})")
    return wrong
