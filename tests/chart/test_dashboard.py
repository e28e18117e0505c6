"""The Grafana dashboard queries only metrics the code exports, with labels those metrics carry.

Known names come from the code itself: the runtime's ``kuberl.metrics.PROM_FAMILIES`` (each
labelled ``job`` plus its own labels) and the operator's ``kuberl_operator.metrics.FAMILIES`` (with the
names Prometheus scrapes: histograms as ``_bucket``/``_sum``/``_count``).
"""

from __future__ import annotations

import pytest

from .dashboard import dashboard, expressions, metrics_in

# Labels Prometheus adds to every scraped series (prometheus-operator's relabelling, podTargetLabels).
TARGET_LABELS = {"namespace", "pod", "container", "instance", "endpoint", "service", "job",
                 "kuberl_io_job", "kuberl_io_role", "le"}


def exported() -> dict[str, set[str]]:
    """Every sample name the driver and the operator expose -> its label names (their FAMILIES tables),
    and the deprecated names the driver still serves."""
    from kuberl_operator.metrics_reference import aliases, catalogue

    names: dict[str, set[str]] = {}
    for family in catalogue():
        for name, labels in family.exposed().items():
            names.setdefault(name, set()).update(labels)
    return names | {a.old: names[a.new] for a in aliases()}


def test_parser_sees_names_in_every_form() -> None:
    got = metrics_in('sum by (le) (rate(kuberl_a_bucket{job=~"$job"}[5m])) / kuberl_b '
                     '+ on (role) label_values({__name__=~"kuberl_c|kuberl_d", namespace="x"}, job)')
    assert {n for n, _ in got} == {"kuberl_a_bucket", "kuberl_b", "kuberl_c", "kuberl_d"}
    assert dict(got)["kuberl_a_bucket"] == {"job", "le", "role"}


def test_every_dashboard_metric_exists_in_code() -> None:
    known = exported()
    problems = []
    for expr in expressions(dashboard()):
        used = metrics_in(expr)
        assert used or "kuberl_" not in expr, f"no metric recognised in {expr!r}"
        for name, labels in used:
            if name not in known:
                problems.append(f"{name}: not exported by the runtime or the operator (in {expr!r})")
            elif labels - known[name] - TARGET_LABELS:
                problems.append(f"{name}: has no label {sorted(labels - known[name] - TARGET_LABELS)} (in {expr!r})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("metric", [
    "kuberl_rollout_tokens_per_second", "kuberl_train_tokens_per_second", "kuberl_phase_seconds",
    "kuberl_reward_mean", "kuberl_kl", "kuberl_mfu_ratio", "kuberl_rollout_staleness_steps",
    "kuberl_role_group_restarts_total",
    "kuberl_recovery_seconds",
    "kuberl_operator_role_ready_replicas", "kuberl_role_memory_bytes",
])
def test_dashboard_shows(metric: str) -> None:
    """The issue's list: tokens/s, step time by phase, reward, KL, MFU, per-role restarts and recovery,
    per-role ready replicas, GPU memory per role; and issue 14's rollout staleness."""
    panels = [p for p in dashboard()["panels"] for t in p.get("targets", []) if metric in {n for n,
                                                                                           _ in metrics_in(t["expr"])}]
    assert panels, f"no panel queries {metric}"


def test_per_role_panels_split_by_role() -> None:
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            for name, labels in metrics_in(target["expr"]):
                if name in {"kuberl_role_group_restarts_total", "kuberl_recovery_seconds", "kuberl_role_memory_bytes",
                            "kuberl_operator_role_ready_replicas"} and panel["type"] == "timeseries":
                    assert "role" in labels and "{{role}}" in target["legendFormat"], panel["title"]


def test_dashboard_is_well_formed() -> None:
    dash = dashboard()
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        cell = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & cell, f"{panel['title']} overlaps another panel"
        cells |= cell
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"] and panel.get("description"), panel["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= variables
