"""Every family the driver and the operator define follows Prometheus' naming conventions.

Run over ``kuberl_operator.metrics_reference.catalogue()`` (the driver's PROM_FAMILIES and the
operator's FAMILIES): base units in names (``_seconds``, ``_bytes``, ``_ratio``), ``_total`` on
counters and only there, no reserved suffixes, only the bounded labels of ``LABELS``, and a
``kuberl_build_info`` from each component. The served text of both is also put through
``promtool check metrics`` (Prometheus' own linter) and parsed in both exposition formats.
Renamed families keep their old name for one release, then go.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from kuberl.metrics import PROM_FAMILIES, MetricsSink
from kuberl.metrics.record import Recovery, RoleStep, StepRecord
from kuberl.spec.contract import Reason
from kuberl.version import version
from kuberl_operator.metrics import Metrics
from kuberl_operator.metrics_reference import LABELS, Alias, Family, aliases, catalogue

NAME = re.compile(r"^kuberl_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
# Unit words that are not Prometheus base units, as they would appear in a name.
NON_BASE_UNITS = re.compile(r"_(ms|us|ns|s|secs?|milliseconds|microseconds|nanoseconds|minutes?|hours?|days?|"
                            r"[kmgt]i?b|kilobytes|megabytes|gigabytes|percent|pct|frac|fraction)(_|$)")
# What a help text says about the value -> what the name must then carry.
HELP_UNITS = [
    (re.compile(r"\bunix time\b", re.I), lambda n: n.endswith("_timestamp_seconds"), "end in _timestamp_seconds"),
    (re.compile(r"(?<!per )\bseconds\b|\btime spent\b", re.I), lambda n: "_seconds" in n, "carry _seconds"),
    (re.compile(r"\bmemory\b|\bbytes\b", re.I), lambda n: "_bytes" in n, "carry _bytes"),
    (re.compile(r"\bfraction\b|\butili[sz]ation\b|\bshare of\b", re.I), lambda n: n.endswith("_ratio"),
     "end in _ratio"),
    (re.compile(r"\bper second\b", re.I), lambda n: n.endswith("_per_second"), "end in _per_second"),
]
RESERVED = ("_bucket", "_count", "_sum", "_created")


def problems(f: Family) -> list[str]:  # noqa: C901 -- one check per naming convention, listed flat on purpose
    """Every convention a family breaks (empty when it follows them all)."""
    out = []
    if not NAME.match(f.name):
        out.append("name is not kuberl_ + snake_case")
    if f.kind == "counter" and not f.name.endswith("_total"):
        out.append("a counter's name ends in _total")
    if f.kind != "counter" and f.name.endswith("_total"):
        out.append(f"a {f.kind} must not end in _total (that suffix means a counter)")
    if f.kind == "histogram" and not f.name.endswith(("_seconds", "_bytes")):
        out.append("a histogram's name ends in its base unit")
    if f.name.endswith(RESERVED):
        out.append(f"ends in a suffix Prometheus reserves ({', '.join(RESERVED)})")
    if m := NON_BASE_UNITS.search(f.name):
        out.append(f"'{m.group(1)}' is not a base unit: use _seconds, _bytes or _ratio")
    for pattern, ok, rule in HELP_UNITS:
        if pattern.search(f.help) and not ok(f.name):
            out.append(f"the help says {pattern.search(f.help).group(0)!r}: the name must {rule}")
    if "since the job began" in f.help and f.kind != "counter":
        out.append("a count since the job began is a counter")
    for label in f.labels:
        if label not in LABELS:
            out.append(f"label {label!r} is not one of the bounded labels (metrics_reference.LABELS)")
        if label == "le" or label.startswith("__"):
            out.append(f"label {label!r} is reserved")
    if not f.help.strip() or not f.help.rstrip().endswith("."):
        out.append("help is one or more sentences")
    return out


@pytest.mark.parametrize("family", catalogue(), ids=lambda f: f"{f.component}:{f.name}")
def test_family_follows_conventions(family: Family) -> None:
    assert not problems(family), f"{family.name}: " + "; ".join(problems(family))


@pytest.mark.parametrize("bad, broken", [
    (Family("kuberl_step_latency_ms", "gauge", "Latency of a step in milliseconds.", ("job",), "driver"), "base unit"),
    (Family("kuberl_restarts", "counter", "Restarts.", ("job",), "driver"), "_total"),
    (Family("kuberl_queue_total", "gauge", "Items in a queue.", ("job",), "driver"), "means a counter"),
    (Family("kuberl_wait", "gauge", "Seconds spent waiting.", ("job",), "driver"), "_seconds"),
    (Family("kuberl_hbm", "gauge", "Peak GPU memory.", ("job",), "driver"), "_bytes"),
    (Family("kuberl_clip_frac", "gauge", "Fraction of clipped tokens.", ("job",), "driver"), "base unit"),
    (Family("kuberl_samples", "gauge", "Samples scored per second.", ("job",), "driver"), "_per_second"),
    (Family("kuberl_fails", "gauge", "Failures since the job began.", ("job",), "driver"), "is a counter"),
    (Family("kuberl_step_reward", "gauge", "Reward of one step.", ("job", "step"), "driver"), "bounded labels"),
    (Family("kuberl_pod_up", "gauge", "A pod is up.", ("job", "pod_uid"), "operator"), "bounded labels"),
    (Family("kuberl_requests_count", "gauge", "Requests.", ("job",), "operator"), "reserves"),
    (Family("kuberl_Step", "gauge", "Step.", ("job",), "driver"), "snake_case"),
])
def test_the_checks_catch_a_broken_family(bad: Family, broken: str) -> None:
    assert any(broken in p for p in problems(bad)), problems(bad)


def test_build_info_from_each_component() -> None:
    infos = {f.component: f for f in catalogue() if f.name == "kuberl_build_info"}
    assert set(infos) == {"driver", "operator"}
    for f in infos.values():
        assert f.kind == "gauge" and {"version", "component"} <= set(f.labels)


# -- the served text ------------------------------------------------------------------------------
# One record with every kind of key the driver turns into a sample (pattern keys for one role each).
RECORD = StepRecord(
    step=3, reward_mean=0.5, stats={"kl": 0.01, "kl_coef": 0.001, "entropy": 1.2, "clip_frac": 0.1,
                                    "env_turns_mean": 2.0, "env_failed": 1.0, "env_tool_calls": 3.0,
                                    "env_tool_errors": 1.0, "env_seconds": 0.2},
    response_length_mean=6.0, rollout_tokens_per_s=900.0, train_tokens_per_s=1800.0, mfu=0.3,
    phases={"rollout": 0.5}, step_s=1.0, staleness=1,
    roles={"critic": RoleStep(restarts=1, recoveries=[Recovery("critic", 3, "values", Reason.WORKER_DIED, "killed",
                                                               detect_s=0.1, ready_s=2.0, replay_s=0.3, steps_lost=1)]),
           "actor": RoleStep(restarts=0, worst_link="PIX", memory={"gpu_peak": 2**30, "rss_peak": 2**31})})


def driver_text(tmp_path: Path, openmetrics: bool = False) -> str:
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    sink = MetricsSink(tmp_path, "demo", total_steps=3, progress=False, prometheus_port=0)
    try:
        sink.log(RECORD)
        return (generate_openmetrics if openmetrics else generate_latest)(sink.registry).decode()
    finally:
        sink.close()


def operator_text(openmetrics: bool = False) -> str:
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from kuberl.spec import load_manifest

    m = Metrics()
    spec = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").spec
    m.observe("ns", "j", {"phase": "Running", "roles": {"actor": {"restarts": 1, "ready": 1, "desired": 1,
                                                                  "worstLink": "NV4"}}}, spec)
    with m.reconcile():
        pass
    return (generate_openmetrics if openmetrics else generate_latest)(m.registry).decode()


def test_every_driver_family_is_served(tmp_path: Path) -> None:
    text = driver_text(tmp_path)
    for name in PROM_FAMILIES:
        assert f"\n# TYPE {name} " in "\n" + text, f"{name}: not served for a record with every kind of key"


@pytest.mark.parametrize("component", ["driver", "operator"])
def test_promtool_check_metrics_passes(component: str, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed: `make prometheus` installs Debian's prometheus")
    text = driver_text(tmp_path) if component == "driver" else operator_text()
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr


@pytest.mark.parametrize("component", ["driver", "operator"])
def test_both_exposition_formats_parse(component: str, tmp_path: Path) -> None:
    """Prometheus asks for OpenMetrics first: a counter `x_total` is family `x` there, so an alias `x`
    would be a second family of the same name and fail the scrape."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    for openmetrics, parse in ((False, parse_text), (True, parse_openmetrics)):
        text = driver_text(tmp_path, openmetrics) if component == "driver" else operator_text(openmetrics)
        names = [f.name for f in parse(text)]
        assert len(names) == len(set(names)), f"duplicate families: {sorted(n for n in names if names.count(n) > 1)}"
    info = [line for line in text.splitlines() if line.startswith("kuberl_build_info{")]
    assert len(info) == 1 and info[0].endswith(" 1.0") and f'version="{version()}"' in info[0], info


# -- renames --------------------------------------------------------------------------------------
@pytest.mark.parametrize("alias", aliases(), ids=lambda a: a.old)
def test_renamed_family_keeps_its_old_name_for_one_release(alias: Alias, tmp_path: Path) -> None:
    assert alias.new in PROM_FAMILIES and alias.old not in PROM_FAMILIES
    assert Version(version()) < Version(alias.removed_in), (
        f"{alias.old} was to go in {alias.removed_in}: remove it from kuberl.metrics.PROM_ALIASES")
    samples = {}
    for line in driver_text(tmp_path).splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            samples[head] = value
    new = {head[len(alias.new):]: v for head, v in samples.items() if head.startswith(alias.new + "{")}
    old = {head[len(alias.old):]: v for head, v in samples.items() if head.startswith(alias.old + "{")}
    assert new and old == new, f"{alias.old} must serve the same series as {alias.new}: {old} vs {new}"
    assert f"# TYPE {alias.old} gauge" in driver_text(tmp_path)
