"""JSON logs where log collectors read them: every process in a job's pods, and the operator's kopf logging."""

from __future__ import annotations

import json
import logging

import pytest

from kuberl import logs
from kuberl_operator import builders
from kuberl_operator.cli import kopf_logging

from .test_builders import OPTS, by_kind, job


def containers(objs: list[dict]) -> dict[str, dict]:
    """Every container of a job's pods by pod and name: the head, each worker group, the driver Job's."""
    kinds = by_kind(objs)
    ray = kinds["RayCluster"]["spec"]
    pods = {"head": ray["headGroupSpec"]["template"]["spec"], "driver": kinds["Job"]["spec"]["template"]["spec"],
            **{g["groupName"]: g["template"]["spec"] for g in ray["workerGroupSpecs"]}}
    return {f"{pod}/{c['name']}": c for pod, spec in pods.items()
            for c in [*spec["containers"], *spec.get("initContainers", [])]}


def test_every_kuberl_process_in_a_jobs_pods_logs_json_lines() -> None:
    found = containers(builders.all_objects(job(), {}, "t", OPTS))
    kuberl = {name: c for name, c in found.items() if name.split("/")[1] in ("ray-head", "ray-worker", "driver",
                                                                               "reporter")}
    assert {"driver/driver", "driver/reporter", "head/ray-head", "actor/ray-worker"} <= set(kuberl)
    for name, container in kuberl.items():
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[logs.FORMAT_ENV] == "json", name
        assert logs.LEVEL_ENV not in env, name  # the default level, or the driver's --log-level through Ray


@pytest.fixture
def root_logging():
    """The root logger as it was: kopf_logging replaces its handler and level."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_kopf_logs_json_lines_with_the_operators_records_when_asked(root_logging, capsys) -> None:
    kopf_logging("warning", "json")
    assert root_logging.level == logging.WARNING
    logging.getLogger("kuberl_operator.reconcile").info("dropped below the level")
    logging.getLogger("kuberl_operator.reconcile").warning("could not post the %s Event of %s", "Started", "ml/j")
    line = json.loads(capsys.readouterr().err)
    assert line["message"] == "could not post the Started Event of ml/j" and line["severity"] == "warn"


def test_kopf_keeps_its_text_format_by_default(root_logging, capsys) -> None:
    kopf_logging("info", "text")
    assert root_logging.level == logging.INFO
    logging.getLogger("kuberl_operator.reconcile").info("status of ml/j kept changing under us")
    err = capsys.readouterr().err
    assert err.startswith("[") and "kuberl_operator.reco" in err and "[INFO    ] status of ml/j" in err
