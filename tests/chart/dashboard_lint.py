"""Our own check of a Grafana dashboard against the rules of Grafana's dashboard linter
(github.com/grafana/dashboard-linter).

The linter itself could not be built here (the Go module proxy refuses the module), so each rule is
written from its documentation (docs/index.md and docs/rules/*.md of that repository), not from its
code. Exclusions come from a `.lint` file beside the dashboard, in the linter's own format
(`exclusions: {rule: {reason, entries: [{panel, targetIdx}]}}`, `settings: {rule: {...}}`), so the same
file serves the upstream linter once it can be built.

PromQL validity (target-promql-rule, template-label-promql-rule) is judged by Prometheus' own parser,
through `promtool check rules`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .dashboard import LABEL_VALUES, fill, vector_selectors

# Unit ids from Grafana's value-format categories (packages/grafana-data/src/valueFormats/categories.ts):
# the ones a training dashboard can want. A unit outside this list fails panel-units-rule.
GRAFANA_UNITS = frozenset({
    "none", "short", "percent", "percentunit", "sci", "locale",
    "ns", "µs", "ms", "s", "m", "h", "d", "dtdurationms", "dtdurations", "dthms", "hertz",
    "bits", "bytes", "kbytes", "mbytes", "gbytes", "decbits", "decbytes", "deckbytes", "decmbytes", "decgbytes",
    "bps", "Bps", "pps", "cps", "ops", "reqps", "rps", "wps", "iops", "cpm", "opm",
    "flops", "mflops", "gflops", "tflops", "pflops", "watt", "kwatt", "celsius",
    "dateTimeAsIso", "dateTimeFromNow",
})
UNIT_PANELS = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}
DATASOURCE_PANELS = {"singlestat", "graph", "table", "timeseries", "stat", "gauge"}
RANGE_FUNCTIONS = re.compile(r"\b(rate|irate|increase)\s*\(")
COUNTER_FUNCTIONS = {"rate", "irate", "increase"}


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    panel: str | None = None
    target: int | None = None  # index of the target in the panel (the linter's targetIdx)


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str
    check: Callable[[dict[str, Any], dict[str, Any]], list[Violation]]


RULES: dict[str, Rule] = {}
# The rules the linter's docs list (docs/index.md, docs/rules/): each is in RULES, or excluded with a
# reason in the dashboard's .lint (the LogQL rules, for one: there are no Loki targets here).
UPSTREAM_RULES = (
    "template-datasource-rule", "template-job-rule", "template-instance-rule", "template-label-promql-rule",
    "template-on-time-change-reload-rule", "template-required-variables-rule", "panel-datasource-rule",
    "panel-title-description-rule", "panel-units-rule", "panel-no-targets-rule", "target-logql-rule",
    "target-logql-auto-rule", "target-promql-rule", "target-rate-interval-rule", "target-job-rule",
    "target-instance-rule", "target-required-matchers-rule", "target-counter-agg-rule", "uneditable-dashboard",
)


def rule(name: str, summary: str) -> Callable:
    def register(fn: Callable[[dict[str, Any], dict[str, Any]], list[Violation]]) -> Callable:
        RULES[name] = Rule(name, summary, fn)
        return fn
    return register


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def variables(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return dash.get("templating", {}).get("list", [])


def uses_datasource_variable(ds: Any) -> bool:
    uid = ds.get("uid") if isinstance(ds, dict) else ds
    return uid in ("$datasource", "${datasource}")


def _template_rule(dash: dict[str, Any], rule_name: str, var_name: str) -> list[Violation]:
    found = [v for v in variables(dash) if v["name"] == var_name]
    if not found:
        return [Violation(rule_name, f"no template variable named {var_name!r}")]
    v, out = found[0], []
    if v.get("label") != var_name:
        out.append(Violation(rule_name, f"variable {var_name} is labelled {v.get('label')!r}, not {var_name!r}"))
    if not uses_datasource_variable(v.get("datasource")):
        out.append(Violation(rule_name, f"variable {var_name} does not use the $datasource variable"))
    query = v.get("query", {}).get("query") if isinstance(v.get("query"), dict) else v.get("query")
    if v.get("type") != "query" or not query or not LABEL_VALUES.match(query):
        out.append(Violation(rule_name, f"variable {var_name} is not a Prometheus label_values query"))
    if not v.get("multi"):
        out.append(Violation(rule_name, f"variable {var_name} is not multi-select"))
    if v.get("allValue") != ".+":
        out.append(Violation(rule_name, f"variable {var_name} has allValue {v.get('allValue')!r}, not '.+'"))
    return out


@rule("template-datasource-rule", "exactly one data source variable, named datasource, labelled Data Source")
def template_datasource(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    found = [v for v in variables(dash) if v["type"] == "datasource"]
    if len(found) != 1:
        return [Violation("template-datasource-rule", f"{len(found)} data source variables, not one")]
    v, out = found[0], []
    if v["name"] != "datasource" or v.get("label") != "Data Source":
        out.append(Violation("template-datasource-rule", f"named {v['name']!r} labelled {v.get('label')!r}"))
    if v.get("query") not in ("prometheus", "loki"):
        out.append(Violation("template-datasource-rule", f"data source type {v.get('query')!r}"))
    return out


@rule("template-job-rule", "a job variable: label job, $datasource, label_values query, multi, allValue .+")
def template_job(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return _template_rule(dash, "template-job-rule", "job")


@rule("template-instance-rule", "an instance variable, configured like the job variable")
def template_instance(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return _template_rule(dash, "template-instance-rule", "instance")


@rule("template-required-variables-rule", "a variable for each name in settings.variables, like the job one")
def template_required_variables(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return [x for name in settings.get("variables", [])
            for x in _template_rule(dash, "template-required-variables-rule", name)]


@rule("template-on-time-change-reload-rule", "query variables refresh on time range change")
def template_reload(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return [Violation("template-on-time-change-reload-rule", f"variable {v['name']}: refresh {v.get('refresh')}, not 2")
            for v in variables(dash) if v["type"] == "query" and v.get("refresh") != 2]


@rule("panel-datasource-rule", "every panel uses the $datasource variable")
def panel_datasource(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    out = []
    for p in panels(dash):
        if p["type"] in DATASOURCE_PANELS:
            sources = [p.get("datasource")] + [t.get("datasource") for t in p.get("targets", []) if t.get("datasource")]
            if not all(uses_datasource_variable(ds) for ds in sources):
                out.append(Violation("panel-datasource-rule", "does not use $datasource", p["title"]))
    return out


@rule("panel-title-description-rule", "every panel has a title and a description")
def panel_title_description(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return [Violation("panel-title-description-rule", "missing title or description", p.get("title"))
            for p in panels(dash) if p["type"] in UNIT_PANELS and not (p.get("title") and p.get("description"))]


@rule("panel-units-rule", "every panel has a unit Grafana knows")
def panel_units(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    out = []
    for p in panels(dash):
        defaults = p.get("fieldConfig", {}).get("defaults", {})
        if p["type"] not in UNIT_PANELS or defaults.get("mappings"):
            continue  # value mappings exempt a panel, as in the linter
        if p["type"] == "stat" and p.get("options", {}).get("reduceOptions", {}).get("fields", "") not in ("", None):
            continue  # a stat showing non-numeric fields is exempt too
        if defaults.get("unit") not in GRAFANA_UNITS:
            out.append(Violation("panel-units-rule", f"unit {defaults.get('unit')!r} is no Grafana unit", p["title"]))
    return out


@rule("panel-no-targets-rule", "every panel has at least one target")
def panel_no_targets(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return [Violation("panel-no-targets-rule", "no targets", p["title"]) for p in panels(dash) if not p.get("targets")]


def each_target(dash: dict[str, Any]):
    for p in panels(dash):
        for i, t in enumerate(p.get("targets", [])):
            yield p, i, t["expr"]


@rule("target-rate-interval-rule", "rate, irate and increase range over $__rate_interval")
def target_rate_interval(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    out = []
    for p, i, expr in each_target(dash):
        for m in RANGE_FUNCTIONS.finditer(expr):
            ranges = re.findall(r"\[([^\]]*)\]", _call_body(expr, m.end() - 1))
            if ranges and any(r.strip() != "$__rate_interval" for r in ranges):
                out.append(Violation("target-rate-interval-rule", f"{m.group(1)} over {ranges}", p["title"], i))
    return out


def _call_body(expr: str, open_paren: int) -> str:
    """The text inside the parentheses that open at ``open_paren``."""
    depth = 0
    for j in range(open_paren, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[j], 0)
        if depth == 0:
            return expr[open_paren + 1:j]
    return expr[open_paren + 1:]


def _missing(dash: dict[str, Any], rule_name: str, matcher: tuple[str, str, str]) -> list[Violation]:
    """A violation for every vector selector of every target without this (label, op, quoted value)."""
    return [Violation(rule_name, f"{text} lacks {matcher[0]}{matcher[1]}{matcher[2]}", p["title"], i)
            for p, i, expr in each_target(dash) for text, matchers in vector_selectors(expr) if matcher not in matchers]


@rule("target-job-rule", 'every selector matches job=~"$job"')
def target_job(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return _missing(dash, "target-job-rule", ("job", "=~", '"$job"'))


@rule("target-instance-rule", 'every selector matches instance=~"$instance"')
def target_instance(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return _missing(dash, "target-instance-rule", ("instance", "=~", '"$instance"'))


@rule("target-required-matchers-rule", "every selector has the matchers of settings.matchers")
def target_required_matchers(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    out = []
    for matcher in settings.get("matchers", []):
        parsed = re.match(r'^([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*(".*")$', matcher)
        assert parsed, f"target-required-matchers-rule: cannot read the matcher {matcher!r}"
        out += _missing(dash, "target-required-matchers-rule", parsed.groups())
    return out


@rule("target-counter-agg-rule", "a counter (_total) is read through rate, irate or increase")
def target_counter_agg(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    out = []
    for p, i, expr in each_target(dash):
        for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*_total)\b", expr):
            enclosing = [f.group(1) for f in re.finditer(r"\b(\w+)\s*\(", expr)
                         if f.end() - 1 < m.start() < f.end() + len(_call_body(expr, f.end() - 1))]
            if not COUNTER_FUNCTIONS & set(enclosing):
                out.append(Violation("target-counter-agg-rule", f"{m.group(1)} is not in rate/irate/increase",
                                     p["title"], i))
    return out


@rule("uneditable-dashboard", "the dashboard is not editable in the UI (it is provisioned from code)")
def uneditable(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
    return [Violation("uneditable-dashboard", "editable is true")] if dash.get("editable", True) else []


def promql_errors(exprs: dict[str, str]) -> dict[str, str]:
    """name -> Prometheus' parse error, for each expression promtool refuses."""
    if shutil.which("promtool") is None:
        raise FileNotFoundError("promtool")
    groups = [{"name": "lint", "rules": [{"record": f"lint_{i}", "expr": e} for i, e in enumerate(exprs.values())]}]
    names = list(exprs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exprs.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}))
        proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return {names[int(m.group(1))]: m.group(2)
            for m in re.finditer(r'"lint_(\d+)": could not parse expression: (.*)', proc.stdout + proc.stderr)}


# Values Grafana would put in the variables, to hand Prometheus' parser the query it would see.
SAMPLE_VALUES = {"namespace": "team-a", "job": "ppo", "instance": "10.0.0.1:9500"}


Located = dict[str, tuple[str | None, int | None, str]]  # key -> (panel, target index, PromQL)


def _parse_rule(name: str, exprs: Callable[[dict[str, Any]], Located]) -> Callable:
    def check(dash: dict[str, Any], settings: dict[str, Any]) -> list[Violation]:
        found = exprs(dash)
        errors = promql_errors({key: fill(e, SAMPLE_VALUES, 15, 15, 3600) for key, (_, _, e) in found.items()})
        return [Violation(name, errors[key], found[key][0], found[key][1]) for key in errors]
    return check


def _target_exprs(dash: dict[str, Any]) -> Located:
    return {f"{p['title']}/{i}": (p["title"], i, expr) for p, i, expr in each_target(dash)}


def _variable_exprs(dash: dict[str, Any]) -> Located:
    out = {}
    for v in variables(dash):
        if v["type"] == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = LABEL_VALUES.match(query)
            out[v["name"]] = (None, None, m.group(1) if m else query)
    return out


RULES["target-promql-rule"] = Rule("target-promql-rule", "every target is valid PromQL (Prometheus' parser)",
                                   _parse_rule("target-promql-rule", _target_exprs))
RULES["template-label-promql-rule"] = Rule("template-label-promql-rule",
                                           "every label_values selector is valid PromQL (Prometheus' parser)",
                                           _parse_rule("template-label-promql-rule", _variable_exprs))


@dataclass(frozen=True)
class Config:
    """A `.lint` file: exclusions (rule -> reason and optional entries) and per-rule settings."""

    exclusions: dict[str, dict[str, Any]]
    settings: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, path: Path) -> Config:
        raw = yaml.safe_load(path.read_text()) if path.exists() else {}
        return cls({k: v or {} for k, v in (raw.get("exclusions") or {}).items()}, raw.get("settings") or {})

    def excludes(self, v: Violation) -> bool:
        ex = self.exclusions.get(v.rule)
        if ex is None:
            return False
        entries = ex.get("entries")
        if not entries:
            return True
        return any(e.get("panel") in (None, v.panel) and e.get("targetIdx") in (None, v.target) for e in entries)


def lint(dash: dict[str, Any], config: Config) -> tuple[list[Violation], list[Violation]]:
    """(violations the config does not exclude, violations it excludes) over every rule."""
    found = [v for r in RULES.values() for v in r.check(dash, config.settings.get(r.name, {}))]
    return [v for v in found if not config.excludes(v)], [v for v in found if config.excludes(v)]
