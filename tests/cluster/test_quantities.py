"""The quantity table (tests/data/quantities.yaml) against the real kube-apiserver: an RLTrainingJob whose
spec.roles.actor.resources.cpu is the row's quantity is admitted exactly when the row is valid (the CRD's
x-kubernetes-int-or-string and pattern; the one invalid row the pattern cannot refuse is marked
patternAdmits), and a Pod's resources take every valid non-negative row, written back as its canonical form;
except that a Pod's cpu is rounded up to a millicore (1m), as the quantity reference says: the table's canonical
form is apimachinery's Quantity.String, which keeps 100u (and 1e-20 becomes 1e-3: the exponent form stays).
Server-side dry runs: the API server validates and answers, and stores nothing."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from localkube.api import PODS, RLTJ, Api, ApiError

from .jobs import manifest

pytestmark = pytest.mark.netns
TABLE = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "quantities.yaml").read_text())["quantities"]


def dry_create(api: Api, resource: str, body: dict[str, Any]) -> dict[str, Any] | str:
    """The object the API server would store, or its refusal's message."""
    try:
        return api.request("POST", api.url(resource, query={"dryRun": "All", "fieldValidation": "Strict"}), body)
    except ApiError as exc:
        if exc.status != 422:
            raise
        return exc.message


def test_the_crd_admits_exactly_the_valid_quantities(ns: Api, release: str) -> None:  # the chart brings the CRD
    wrong = []
    for i, row in enumerate(TABLE):
        body = manifest(f"q-{i}", roles={"actor": {"resources": {"cpu": row["quantity"], "memory": "4Gi"}}})
        answer = dry_create(ns, RLTJ, body)
        admitted = isinstance(answer, dict)
        if admitted != (row["valid"] or row.get("patternAdmits", False)):
            wrong.append((row["quantity"], row["valid"], answer if not admitted else "admitted"))
        elif admitted:
            assert answer["spec"]["roles"]["actor"]["resources"]["cpu"] == row["quantity"]  # kept as written
        else:
            assert "spec.roles.actor.resources.cpu" in answer, answer
    assert wrong == [], "the API server disagrees with the table (quantity, valid, answer)"


def test_pods_take_every_valid_quantity_in_its_canonical_form(ns: Api) -> None:
    rows = [r for r in TABLE if r["valid"] and Decimal(r["value"]) >= 0]
    assert len(rows) > 40
    wrong = []
    for i, row in enumerate(rows):
        container = {"name": "c", "image": "x", "resources": {"requests": {"cpu": row["quantity"]}}}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"q-{i}"}, "spec": {"containers": [container]}}
        answer = dry_create(ns, PODS, pod)
        got = answer["spec"]["containers"][0]["resources"]["requests"]["cpu"] if isinstance(answer, dict) else answer
        want = row["canonical"]
        if 0 < Decimal(row["value"]) < Decimal("0.001"):  # a Pod's cpu: rounded up to 1m, written in the row's format
            want = "1e-3" if "e" in str(row["quantity"]).lower() else "1m"
        if got != want:
            wrong.append((row["quantity"], want, got))
    assert wrong == [], "canonical forms differ (quantity, table, API server)"
