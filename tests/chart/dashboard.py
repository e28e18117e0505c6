"""The chart's Grafana dashboard as data: its targets, the metrics they name, and their PromQL with
Grafana's variables filled in the way Grafana fills them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .render import CHART

DASHBOARD = CHART / "dashboards" / "kuberl-training.json"


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@dataclass(frozen=True)
class Target:
    panel: str
    ref: str
    expr: str
    legend: str

    def __str__(self) -> str:
        return f"panel {self.panel!r} target {self.ref}"


def targets(dash: dict[str, Any]) -> list[Target]:
    return [Target(p["title"], t["refId"], t["expr"], t.get("legendFormat", ""))
            for p in dash["panels"] for t in p.get("targets", [])]


def variable_queries(dash: dict[str, Any]) -> dict[str, str]:
    """name -> query of each query variable (`label_values(...)` for Prometheus)."""
    return {v["name"]: (v["query"]["query"] if isinstance(v["query"], dict) else v["query"])
            for v in dash["templating"]["list"] if v["type"] == "query"}


def expressions(dash: dict[str, Any]) -> list[str]:
    return [t.expr for t in targets(dash)] + list(variable_queries(dash).values())


STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")')
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
IDENT = re.compile(r"\b(kuberl_[a-zA-Z0-9_:]*)\b")
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$", re.S)


def metrics_in(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it is matched or grouped on) for every kuberl_* metric in a PromQL expression."""
    found: list[tuple[str, set[str]]] = []
    grouped = {label.strip() for _, labels in GROUPING.findall(expr) for label in labels.split(",") if label.strip()}
    for name, body in SELECTOR.findall(expr):
        matchers = MATCHER.findall(body)
        labels = {label for label, _, _ in matchers if label != "__name__"}
        names = [name] if name else []
        for label, op, value in matchers:
            if label == "__name__":
                assert op in {"=", "=~"}, f"negative __name__ matcher in {expr}"
                names += value.strip('"').split("|")
        found += [(n, labels | grouped) for n in names]
    bare = GROUPING.sub(" ", SELECTOR.sub(" ", STRING.sub('""', expr)))
    found += [(n, grouped) for n in IDENT.findall(bare)]
    return found


def matchers_in(expr: str) -> list[tuple[str, str, str]]:
    """(label, operator, quoted value) of every label matcher in a PromQL expression."""
    return [m for _, body in SELECTOR.findall(expr) for m in MATCHER.findall(body)]


def vector_selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(selector text, its matchers) of every vector selector: `name{...}`, `{...}`, and a bare kuberl_* name."""
    found = [(m.group(0), MATCHER.findall(m.group(2))) for m in SELECTOR.finditer(expr)]
    bare = GROUPING.sub(" ", SELECTOR.sub(" ", STRING.sub('""', expr)))
    return found + [(name, []) for name in IDENT.findall(bare)]


def rate_interval(step_s: float, scrape_s: float) -> float:
    """Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)."""
    return max(step_s + scrape_s, 4 * scrape_s)


def fill(expr: str, variables: dict[str, str], step_s: float, scrape_s: float, range_s: float) -> str:
    """A target's PromQL as Grafana sends it: $var / ${var} replaced by its (single) value, the
    built-in interval variables by durations."""
    builtins = {"__rate_interval": f"{rate_interval(step_s, scrape_s):g}s", "__interval": f"{step_s:g}s",
                "__range": f"{range_s:.0f}s"}
    values = {**builtins, **variables}

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"dashboard variable ${name} has no value (in {expr!r})")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)
