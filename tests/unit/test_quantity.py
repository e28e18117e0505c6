"""Kubernetes quantities: tests/data/quantities.yaml (examples from Kubernetes' documentation) through the spec
model, the CRD's pattern, and apimachinery's own parser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from kuberl.spec import SpecInvalid, generate_crd, validate_manifest
from kuberl.spec.model import Resources
from kuberl.spec.quantity import INT64_MAX, QUANTITY_PATTERN, QuantityError, format_quantity, parse_quantity

DATA = Path(__file__).resolve().parents[1] / "data"
TABLE = yaml.safe_load((DATA / "quantities.yaml").read_text())["quantities"]
TEXT_ROWS = [r for r in TABLE if isinstance(r["quantity"], str) or type(r["quantity"]) is int]


def row_id(row: dict) -> str:
    return repr(row["quantity"])


def test_table_covers_what_the_issue_names() -> None:
    given = {r["quantity"] for r in TABLE}
    assert {"1e3", ".5", "100m", "2", 2, "1Pi", "1Ei"} <= given
    assert {r["source"] for r in TABLE} == {"resource-units", "quantity-reference", "parser", "issue"}
    assert all(("value" in r) == r["valid"] for r in TABLE)


@pytest.mark.parametrize("row", TEXT_ROWS, ids=row_id)
def test_parse_quantity_follows_kubernetes(row: dict) -> None:
    text = str(row["quantity"])
    if row["valid"]:
        assert parse_quantity(text) == Decimal(row["value"])
    else:
        with pytest.raises(QuantityError):
            parse_quantity(text)


@pytest.mark.parametrize("row", [r for r in TEXT_ROWS if r["valid"] and Decimal(r["value"]).is_finite()
                                 and Decimal(r["value"]) >= 0], ids=row_id)
def test_format_quantity_writes_a_quantity_of_the_same_value(row: dict) -> None:
    """What the operator writes for the summed resources of colocated roles parses back to the exact value."""
    text = format_quantity(Decimal(row["value"]))
    assert re.fullmatch(QUANTITY_PATTERN, text) and parse_quantity(text) == Decimal(row["value"]), text


def test_format_quantity_picks_readable_units() -> None:
    assert [format_quantity(parse_quantity(a) + parse_quantity(b)) for a, b in
            [("4", "500m"), ("32Gi", "16Gi"), ("1Gi", "512Mi"), ("1", "1"), ("1G", "1Gi"), ("1n", "0")]] == [
        "4500m", "48Gi", "1536Mi", "2", "2073741824", "1n"]
    with pytest.raises(QuantityError):
        format_quantity(Decimal(-1))


@pytest.mark.parametrize("row", TEXT_ROWS, ids=row_id)
def test_crd_pattern_is_the_grammar(row: dict) -> None:
    """The CRD's pattern admits exactly the valid rows, but the one it cannot count to (an int64 exponent)."""
    matches = re.fullmatch(QUANTITY_PATTERN, str(row["quantity"])) is not None
    assert matches == (row["valid"] or row.get("patternAdmits", False))


@pytest.mark.parametrize("field", ["cpu", "memory"])
@pytest.mark.parametrize("row", TABLE, ids=row_id)
def test_spec_model_takes_valid_positive_quantities(row: dict, field: str) -> None:
    """Through a whole manifest: accepted when Kubernetes accepts the quantity and it is a usable amount
    (more than 0, at most 2^63-1, and for memory at least one byte); otherwise one error naming the field."""
    value = Decimal(row["value"]) if row["valid"] else None
    usable = value is not None and 0 < value <= INT64_MAX and (field == "cpu" or value >= 1)
    obj = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "q"},
           "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                    "roles": {"actor": {"resources": {field: row["quantity"]}}}}}
    if usable:
        res = validate_manifest(obj).spec.roles.actor.resources
        assert getattr(res, field) == str(row["quantity"])
        if field == "cpu":
            assert res.cpu_cores() == float(value)
    else:
        with pytest.raises(SpecInvalid) as info:
            validate_manifest(obj)
        errors = [str(e) for e in info.value.errors]
        assert len(errors) == 1 and errors[0].startswith(f"spec.roles.actor.resources.{field}: "), errors


@pytest.mark.parametrize("text, cores", [("1e3", 1000.0), (".5", 0.5), ("100m", 0.1), ("2", 2.0), (2, 2.0),
                                          ("1.5", 1.5), ("250m", 0.25), ("1E-3", 0.001), ("5.", 5.0), ("1k", 1000.0)])
def test_cpu_cores_for_every_form(text, cores) -> None:
    assert Resources(cpu=text).cpu_cores() == cores


def test_errors_say_how_to_write_it() -> None:
    cases = {0.5: '"0.5"', "400m": "512Mi", "-1": "more than 0", "1e19": "2^63-1", "2 cores": "500m"}
    for given, hint in cases.items():
        field = "memory" if given == "400m" else "cpu"
        with pytest.raises(ValueError) as info:
            Resources(**{field: given})
        assert hint in str(info.value), (given, str(info.value))


def test_crd_declares_int_or_string_with_the_pattern() -> None:
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    resources = spec["properties"]["roles"]["properties"]["actor"]["properties"]["resources"]["properties"]
    for field, default in (("cpu", "1"), ("memory", "4Gi")):
        node = resources[field]
        assert node["x-kubernetes-int-or-string"] is True and "type" not in node  # structural: no type beside it
        assert node["pattern"] == QUANTITY_PATTERN and node["default"] == default


def _apimachinery_parser(tmp: Path) -> Path:
    """Build tests/data/quantity_parse against k8s.io/apimachinery from the Go module cache, offline."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        pytest.skip("no Go toolchain: apimachinery's parser cannot be built here (the Python checks above still ran)")
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "GOWORK": "off"}
    modcache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, env=env).stdout.strip()
    if not (Path(modcache) / "k8s.io" / "apimachinery@v0.37.2").is_dir():
        pytest.skip(f"k8s.io/apimachinery@v0.37.2 is not in the Go module cache ({modcache}): "
                    "the real-cluster build fetches it")
    src = tmp / "quantity_parse"
    shutil.copytree(DATA / "quantity_parse", src)
    done = subprocess.run([go, "build", "-o", str(tmp / "quantity_parse.bin"), "."], cwd=src, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return tmp / "quantity_parse.bin"


def test_table_against_apimachinery(tmp_path: Path) -> None:
    """Every valid/value/canonical entry is what Kubernetes' own resource.ParseQuantity says, and the CRD's
    pattern, compiled by Go's regexp as an API server compiles it, admits what the table says it does."""
    binary = _apimachinery_parser(tmp_path)
    texts = [str(r["quantity"]) for r in TEXT_ROWS]
    done = subprocess.run([str(binary), QUANTITY_PATTERN], input="".join(json.dumps(t) + "\n" for t in texts),
                          capture_output=True, text=True, timeout=60, check=True)
    seen = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["quantity"] for s in seen] == texts
    for row, got in zip(TEXT_ROWS, seen):
        assert got["valid"] == row["valid"], row
        assert got["patternMatches"] == (row["valid"] or row.get("patternAdmits", False)), row
        if row["valid"]:
            assert Decimal(got["value"]) == Decimal(row["value"]) and got["canonical"] == row["canonical"], (row, got)
