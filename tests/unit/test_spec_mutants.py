"""Property: every mutant of a valid example (a key renamed at any level, a value of another type, a value past its
bound) is either refused with one line per problem, each naming the mutated field and a fix, or valid.

The mutants are drawn by hypothesis, derandomized (the same ones every run) and bounded in number, from each
manifest of examples/ as written and as fully dumped (every field with its default, so that every section's
fields are mutated, not only those the examples set).
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from kuberl.spec import RLTrainingJob, SpecInvalid, parse_yaml, validate_manifest
from kuberl.spec.errors import field_path
from kuberl.spec.quantity import quantity_text

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))
SETTINGS = settings(derandomize=True, max_examples=250, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@dataclass(frozen=True)
class Slot:
    """One key of a spec section in a manifest: its path from the manifest's root, its field, its parent model."""

    path: tuple[str | int, ...]
    field: FieldInfo
    model: type[BaseModel]

    @property
    def text(self) -> str:
        return field_path(self.path)


def section(annotation: Any) -> type[BaseModel] | None:
    """The model a field's annotation holds directly or in Optional[...] (not in a list or a map)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next((m for a in typing.get_args(annotation) if (m := section(a)) is not None), None)
    return None


def inner(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """('list' or 'map', Model) for list[Model] or dict[str, Model] (in Optional[...] too), else None."""
    for a in (annotation, *typing.get_args(annotation)):
        origin, args = typing.get_origin(a), typing.get_args(a)
        if origin is list and args and section(args[0]):
            return "list", section(args[0])
        if origin is dict and len(args) == 2 and section(args[1]):
            return "map", section(args[1])
    return None


def slots(model: type[BaseModel], obj: dict, path: tuple = ()) -> list[Slot]:
    """Every key of `obj` that is a field of `model`, at every level (into sections, lists and maps of sections)."""
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    out = []
    for key, value in obj.items():
        field = fields.get(key)
        if field is None:
            continue
        here = (*path, key)
        out.append(Slot(here, field, model))
        if (sub := section(field.annotation)) is not None and isinstance(value, dict):
            out += slots(sub, value, here)
        elif (shape := inner(field.annotation)) is not None:
            kind, sub = shape
            items = enumerate(value) if kind == "list" and isinstance(value, list) else (
                value.items() if kind == "map" and isinstance(value, dict) else ())
            for k, item in items:
                if isinstance(item, dict):
                    out += slots(sub, item, (*here, k))
    return out


def accepts(field: FieldInfo, value: Any) -> bool:
    """Whether the field's type takes `value` as it is, with no coercion (bounds and patterns aside)."""
    if any(isinstance(m, BeforeValidator) and m.func is quantity_text for m in field.metadata):
        return type(value) in (str, int) or (type(value) is float and value.is_integer())  # 2.0: kubectl sends 2
    return _accepts(field.annotation, value)


def _accepts(annotation: Any, value: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in typing.get_args(annotation))
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(annotation))
    if origin is list:
        return type(value) is list
    if origin is dict or annotation is dict:
        return type(value) is dict
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return type(value) is dict
    if annotation is float:
        return type(value) in (int, float)
    return type(value) is annotation


def manifests() -> list[tuple[str, dict]]:
    """(name, manifest) of each example, as written and fully dumped."""
    out = []
    for path in EXAMPLES:
        obj = parse_yaml(path.read_text(), str(path))
        full = validate_manifest(obj).model_dump(by_alias=True, exclude_none=True, mode="json")
        out += [(path.name, obj), (f"{path.name} (full)", full)]
    return out


MANIFESTS = manifests()


def value_at(obj: Any, path: tuple) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def with_value(obj: Any, path: tuple, value: Any) -> Any:
    """A deep copy of `obj` with the value at `path` replaced."""
    import copy

    out = copy.deepcopy(obj)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def renamed(obj: Any, path: tuple, new: str) -> Any:
    """A deep copy of `obj` with the key at `path` renamed to `new`, in place in the key order."""
    import copy

    out = copy.deepcopy(obj)
    node = out
    for part in path[:-1]:
        node = node[part]
    items = [(new if k == path[-1] else k, v) for k, v in node.items()]
    node.clear()
    node.update(items)
    return out


def outcome(obj: dict) -> list[str] | None:
    """None when valid, else the error lines."""
    try:
        job = validate_manifest(obj)
    except SpecInvalid as exc:
        lines = [str(e) for e in exc.errors]
        assert lines and len(lines) == len(set(lines)), lines  # no problem told twice
        for line in lines:
            assert "\n" not in line and "(fix: " in line and "Traceback" not in line, line
        return lines
    assert isinstance(job, RLTrainingJob)
    return None


def names(line: str, slot: Slot) -> bool:
    """Whether an error line names the mutated field: its field is the slot or inside it, the line gives the slot's
    whole path, or its field is a section above the slot and the message names the slot's key."""
    field = line.split(": ", 1)[0]
    at, key = slot.text, str(slot.path[-1])
    if field == at or field.startswith((at + ".", at + "[")) or at in line:
        return True
    return at.startswith(field + ".") and key in line.split(": ", 1)[1]


def typo(key: str, how: int, where: int) -> str:
    """A misspelling of `key`: a letter dropped, doubled or swapped with the next, snake_case, or an extra letter."""
    i = where % len(key)
    if how == 0 and len(key) > 1:
        return key[:i] + key[i + 1:]
    if how == 1:
        return key[:i] + key[i] + key[i:]
    if how == 2 and len(key) > 1:
        i = min(i, len(key) - 2)
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    if how == 3 and any(c.isupper() for c in key):
        return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
    return key + "x"


def known_keys(slot: Slot) -> set[str]:
    return {(f.alias or name) for name, f in slot.model.model_fields.items()}


@SETTINGS
@given(st.data())
def test_a_renamed_key_is_refused_naming_it(data: st.DataObject) -> None:
    name, obj = data.draw(st.sampled_from(MANIFESTS), label="manifest")
    slot = data.draw(st.sampled_from(slots(RLTrainingJob, obj)), label="key")
    new = typo(str(slot.path[-1]), data.draw(st.integers(0, 4)), data.draw(st.integers(0, 40)))
    if new in known_keys(slot) or new == slot.path[-1]:
        return  # another field, not a misspelling: nothing to refuse
    lines = outcome(renamed(obj, slot.path, new))
    assert lines is not None, f"{name}: {slot.text} renamed to {new} was accepted"
    renamed_at = field_path((*slot.path[:-1], new))
    for line in lines:
        field = line.split(": ", 1)[0]
        assert field in (renamed_at, slot.text), (name, slot.text, new, lines)
    if slot.path not in (("kind",), ("apiVersion",)):  # checked before the fields: the one line names the old key
        assert any(line.startswith(f"{renamed_at}: is not a known field") for line in lines), (name, lines)


SWAPS = [True, False, 2.0, 1.5, 1.0e12, 7, "7", "1e-3", "text", [1], {"a": 1}, None]


@SETTINGS
@given(st.data())
def test_a_value_of_another_type_is_refused_naming_it(data: st.DataObject) -> None:
    name, obj = data.draw(st.sampled_from(MANIFESTS), label="manifest")
    slot = data.draw(st.sampled_from(slots(RLTrainingJob, obj)), label="field")
    current = value_at(obj, slot.path)
    value = data.draw(st.sampled_from([v for v in SWAPS if type(v) is not type(current)]), label="value")
    lines = outcome(with_value(obj, slot.path, value))
    event("valid" if lines is None else "refused")
    if not accepts(slot.field, value):
        assert lines is not None, f"{name}: {slot.text} = {value!r} was accepted"
        scalar = not isinstance(value, (list, dict))
        assert not scalar or len(lines) == 1, (name, slot.text, value, lines)
    for line in lines or []:
        assert names(line, slot), (name, slot.text, value, lines)


def bounds(field: FieldInfo) -> list[tuple[str, Any]]:
    return [(type(m).__name__.lower(), getattr(m, type(m).__name__.lower())) for m in field.metadata
            if isinstance(m, (annotated_types.Ge, annotated_types.Gt, annotated_types.Le, annotated_types.Lt))]


def past(kind: str, bound: Any, integer: bool) -> Any:
    """The nearest value on the wrong side of a bound (an integer for an integer field)."""
    step = 1 if integer else max(abs(bound) * 0.5, 0.5)
    return {"ge": bound - step, "gt": bound, "le": bound + step, "lt": bound}[kind]


def bounded_slots(obj: dict) -> list[Slot]:
    return [s for s in slots(RLTrainingJob, obj) if bounds(s.field)]


@SETTINGS
@given(st.data())
def test_a_value_past_its_bound_is_refused_naming_it(data: st.DataObject) -> None:
    name, obj = data.draw(st.sampled_from([m for m in MANIFESTS if bounded_slots(m[1])]), label="manifest")
    slot = data.draw(st.sampled_from(bounded_slots(obj)), label="field")
    kind, bound = data.draw(st.sampled_from(bounds(slot.field)), label="bound")
    integer = _accepts(slot.field.annotation, 1) and not _accepts(slot.field.annotation, 1.5)
    value = past(kind, bound, integer)
    lines = outcome(with_value(obj, slot.path, value))
    assert lines is not None, f"{name}: {slot.text} = {value!r} (past {kind} {bound}) was accepted"
    assert len(lines) == 1 and lines[0].startswith(f"{slot.text}: must be "), (name, slot.text, value, lines)


@pytest.mark.parametrize("name, obj", MANIFESTS, ids=[n for n, _ in MANIFESTS])
def test_the_examples_are_valid_and_have_fields_to_mutate(name: str, obj: dict) -> None:
    assert outcome(obj) is None, name
    assert len(slots(RLTrainingJob, obj)) >= 10
