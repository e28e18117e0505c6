"""Apply: the examples pass the API server's own schema with strict field validation; bad manifests
are refused by the server naming the field, or (what only the operator can judge) fail InvalidSpec."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from localkube.api import JOBS, RAYCLUSTERS, RLTJ, Api, ApiError

from .jobs import condition, describe, events, manifest, status
from .operator_process import OperatorProcess
from .waits import holds, wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
pytestmark = pytest.mark.netns


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_each_example_is_accepted_with_strict_field_validation(ns: Api, release: str, kubectl, example: Path) -> None:
    out = kubectl(
        "apply", "--server-side", "--dry-run=server", "--validate=strict", "-n", ns.namespace, "-f", str(example)
    )
    assert "serverside-applied (server dry run)" in out.stdout, out.stdout + out.stderr


def edited(name: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(manifest(name))
    node = body
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return body


@pytest.mark.parametrize(
    "path, value, words",
    [
        (("spec", "trainer", "stepz"), 10, ['unknown field "spec.trainer.stepz"']),
        (("spec", "trainer", "steps"), "ten", ["spec.trainer.steps", "integer"]),
        (("spec", "roles", "actor", "replicas"), -1, ["spec.roles.actor.replicas", "greater than or equal to 0"]),
        (("spec", "algorithm"), {"name": "dpo"}, ["spec.algorithm.name", "Unsupported value"]),
    ],
    ids=["misspelt-field", "wrong-type", "out-of-range", "unknown-enum"],
)
def test_the_server_refuses_a_bad_manifest_naming_the_field(
    ns: Api, release: str, job_name: str, path: tuple[str, ...], value: Any, words: list[str]
) -> None:
    with pytest.raises(ApiError) as refused:
        ns.create(RLTJ, edited(job_name, path, value), strict=True)
    assert refused.value.status in (400, 422), refused.value
    for word in words:
        assert word in refused.value.message, refused.value.message
    assert ns.get(RLTJ, job_name) is None


def test_kubectl_names_the_field_too(ns: Api, release: str, job_name: str, kubectl, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(edited(job_name, ("spec", "trainer", "stepz"), 10)))
    out = kubectl("apply", "--server-side", "--validate=strict", "-n", ns.namespace, "-f", str(path), check=False)
    assert out.returncode != 0 and "spec.trainer.stepz" in out.stderr, out.stderr


def test_what_only_the_operator_can_judge_fails_invalid_spec_once(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    # Passes the CRD schema (the API server admits it) but breaks a cross-field rule of the model.
    ns.create(RLTJ, manifest(job_name, algorithm={"name": "grpo", "groupSize": 1}), strict=True)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Failed", 60, "phase Failed", ctx)
    failed = condition(ns, job_name, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec" and failed["observedGeneration"] == 1
    assert "spec.algorithm.groupSize" in failed["message"]
    event = wait_for(lambda: events(ns, job_name, "InvalidSpec"), 30, "an InvalidSpec Event", ctx)
    assert event[0]["type"] == "Warning" and "spec.algorithm.groupSize" in event[0]["message"]
    # No retries, no crash loop, nothing made; the operator goes on.
    holds(
        lambda: (
            len(events(ns, job_name, "InvalidSpec")) == 1
            and event[0].get("count", 1) == 1
            and operator.alive()
            and ns.get(RAYCLUSTERS, job_name) is None
            and ns.get(JOBS, f"{job_name}-driver") is None
        ),
        5,
        "one InvalidSpec, nothing made",
    )


@pytest.mark.parametrize(
    "placement, roles, field",
    [
        ({"policy": "required"}, {"actor": {"replicas": 1, "gpus": 16}}, "spec.roles.actor.gpus"),
        ({"policy": "required", "mode": "dra", "minLink": "NV"}, {"actor": {"gpus": 4}}, "spec.placement.minLink"),
    ],
    ids=["replica-bigger-than-a-node", "dra-cannot-ask-for-nvlink"],
)
def test_an_impossible_required_placement_fails_before_anything_is_made(
    ns: Api, operator: OperatorProcess, job_name: str, placement: dict, roles: dict, field: str
) -> None:
    ns.create(RLTJ, manifest(job_name, placement=placement, roles=roles), strict=True)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Failed", 60, "phase Failed", ctx)
    failed, degraded = condition(ns, job_name, "Failed"), condition(ns, job_name, "PlacementDegraded")
    assert failed["reason"] == "PlacementDegraded" and degraded["status"] == "True" and field in degraded["message"]
    holds(
        lambda: ns.get(RAYCLUSTERS, job_name) is None and len(events(ns, job_name, "PlacementDegraded")) == 1,
        3,
        "nothing created, one Event",
    )
