"""The status models (kuberl.spec.status): the JSON they dump, and the CRD status schema generated from them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kuberl.spec import generate_crd
from kuberl.spec.crd import PRINTER_COLUMNS, status_schema
from kuberl.spec.status import Condition, HeadStatus, JobStatus, RoleStatus


def role(**fields: Any) -> RoleStatus:
    return RoleStatus(**{"desired": 2, "ready": 1, "restarts": 0, "pod_restarts": 0, "members": {}, "handled_uids": [],
                         **fields})


def walk(node: Any, path: str = "") -> list[tuple[str, str, Any]]:
    """(path, key, value) of every key of a schema, depth first."""
    if isinstance(node, list):
        return [hit for i, n in enumerate(node) for hit in walk(n, f"{path}[{i}]")]
    if not isinstance(node, dict):
        return []
    return [hit for k, v in node.items() for hit in [(path, k, v), *walk(v, f"{path}.{k}")]]


def test_the_status_dumps_camel_case_and_leaves_none_out() -> None:
    status = JobStatus(phase="Running", message="m", observed_generation=3, ray_cluster_uid="u", step=0,
                       conditions=[{"type": "Ready", "status": "True"}],
                       roles={"critic": role(standby=None, replicas=0, members={"u1": "c0"}, handled_uids=["u2"])},
                       head=HeadStatus(ready=False, restarts=1, members={}, handled_uids=[]))
    assert status.to_status() == {
        "phase": "Running", "message": "m", "observedGeneration": 3, "rayClusterUID": "u", "step": 0,
        "conditions": [{"type": "Ready", "status": "True"}],
        "roles": {"critic": {"desired": 2, "ready": 1, "restarts": 0, "podRestarts": 0, "replicas": 0,
                             "members": {"u1": "c0"}, "handledUIDs": ["u2"]}},
        "head": {"ready": False, "restarts": 1, "members": {}, "handledUIDs": []},
    }  # a 0 is written, a None is not


def test_the_models_take_python_names_and_wire_names_and_refuse_unknown_fields() -> None:
    assert role(last_failure="x") == RoleStatus.model_validate({**role().to_status(), "lastFailure": "x"})
    with pytest.raises(ValidationError):
        role(surprise=1)
    with pytest.raises(ValidationError):
        JobStatus(phase="Sleeping", message="m", observed_generation=1, conditions=[])
    with pytest.raises(ValidationError):
        Condition(type="Ready", status="Maybe")


def test_the_status_schema_is_generated_from_the_models() -> None:
    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert schema == status_schema()
    assert set(schema["properties"]) == {f.alias or name for name, f in JobStatus.model_fields.items()}
    roles = schema["properties"]["roles"]["additionalProperties"]["properties"]
    assert set(roles) == {f.alias or name for name, f in RoleStatus.model_fields.items()}
    assert set(schema["properties"]["head"]["properties"]) == {f.alias or n for n, f in HeadStatus.model_fields.items()}
    assert schema["properties"]["phase"]["enum"] == ["Pending", "Provisioning", "Running", "Restarting", "Succeeded",
                                                     "Failed", "Suspended"]


def test_the_status_schema_requires_only_a_conditions_type_and_status_and_is_never_null() -> None:
    """A merge patch writes the status; a job refused before anything was made has no roles. None is left out, so
    no field is nullable, and nothing is preserved unknown (the API server prunes what is undeclared)."""
    schema = status_schema()
    keys = walk(schema)
    assert [(path, value) for path, key, value in keys if key == "required"] == [
        (".properties.conditions.items", ["type", "status"])]
    assert not [path for path, key, _ in keys if key in ("nullable", "default", "anyOf", "$ref")]
    assert not [path for path, key, _ in keys if key.startswith("x-kubernetes")]
    assert schema["properties"]["phaseSince"]["format"] == "date-time"


@pytest.mark.parametrize("column", [c for c in PRINTER_COLUMNS if c["jsonPath"].startswith(".status.")],
                         ids=lambda c: c["name"])
def test_printer_columns_read_declared_status_fields(column: dict[str, str]) -> None:
    field = status_schema()["properties"][column["jsonPath"].removeprefix(".status.")]
    assert field["type"] == column["type"]
