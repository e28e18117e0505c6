"""Load and validate RLTrainingJob manifests from YAML text, files or dicts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from .errors import SpecError, SpecInvalid, from_validation_error
from .model import API_VERSION, KIND, OPTIM_ALIASES, RLTrainingJob
from .yaml_loader import load_all


def validate_manifest(obj: Any) -> RLTrainingJob:
    """A parsed manifest (dict) -> RLTrainingJob, or SpecInvalid listing every problem."""
    if not isinstance(obj, dict):
        raise SpecInvalid([SpecError("(manifest)", f"must be a mapping, got {type(obj).__name__}",
                                     f"write an {KIND} manifest with apiVersion, kind, metadata and spec")])
    if obj.get("kind") != KIND:
        raise SpecInvalid([SpecError("kind", f"must be {KIND} (got {obj.get('kind')!r})", f"set kind: {KIND}")])
    if obj.get("apiVersion") != API_VERSION:
        raise SpecInvalid([SpecError("apiVersion", f"must be {API_VERSION} (got {obj.get('apiVersion')!r})",
                                     f"set apiVersion: {API_VERSION}")])
    try:
        # by alias only: a manifest spells fields as the CRD does (batchSize); a snake_case key would
        # be pruned by the API server, so it is an unknown field here too
        return RLTrainingJob.model_validate(obj, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise SpecInvalid(from_validation_error(exc)) from None


def parse_yaml(text: str, source: str = "<manifest>") -> Any:
    """YAML text -> object; a parse failure, a duplicate key or an alias bomb becomes SpecInvalid naming the line."""
    try:
        docs = [d for d in load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        fix = ("keep one of the two keys" if problem.startswith("duplicate key")
               else "write the values out instead of the alias" if "alias" in problem
               else "fix the YAML syntax (indentation, colons, quotes)")
        raise SpecInvalid([SpecError(source, f"is not valid YAML at {where}: {problem}", fix)]) from None
    if len(docs) != 1:
        raise SpecInvalid([SpecError(source, f"must hold exactly one YAML document (found {len(docs)})",
                                     f"put one {KIND} in the file")])
    return docs[0]


_PART = re.compile(r"^([A-Za-z_][\w-]*)((?:\[\d+\])*)$")


def apply_set(obj: dict[str, Any], text: str) -> None:
    """Apply one `--set path=value` to a parsed manifest. The path is under `spec` unless it starts with
    `spec.` or `metadata.` (`trainer.steps=10`, `algorithm.kl.coef=0.02`, `resilience.faults[0].step=3`);
    the value is read as YAML (10 -> int, 0.02 -> float, true -> bool, "[a, b]" -> list)."""
    path, eq, raw = text.partition("=")
    if not eq or not path.strip():
        raise SpecInvalid([SpecError(f"--set {text}", "is not PATH=VALUE", "write e.g. --set trainer.steps=10")])
    try:
        value = parse_value(raw)
    except yaml.YAMLError as exc:
        raise SpecInvalid([SpecError(f"--set {text}", f"has a value that is not YAML ({getattr(exc, 'problem', exc)})",
                                     "quote the value")]) from None
    _assign(obj, _set_steps(path.strip(), text), value, text)


def _set_steps(path: str, text: str) -> list[str | int]:
    """The keys and list indices of a `--set` path (`text` is the whole option, for errors)."""
    parts = path.split(".")
    if parts[0] not in ("spec", "metadata"):
        parts = ["spec", *parts]
    steps: list[str | int] = []
    for part in parts:
        m = _PART.match(part)
        if not m:
            raise SpecInvalid([SpecError(f"--set {text}", f"has a bad path element {part!r}",
                                         "use dotted field names, e.g. trainer.steps")])
        steps.append(m.group(1))
        steps.extend(int(i) for i in re.findall(r"\d+", m.group(2)))
    return steps


def _assign(obj: dict[str, Any], steps: list[str | int], value: Any, text: str) -> None:
    """Set the value at `steps`, making the maps and lists on the way that are missing or null."""
    node: Any = obj
    for i, key in enumerate(steps):
        last = i == len(steps) - 1
        where = ".".join(str(s) for s in steps[: i + 1])
        if isinstance(key, int):
            if not isinstance(node, list) or key >= len(node):
                raise SpecInvalid([SpecError(f"--set {text}", f"{where}: no list element {key}",
                                             "set an element that exists in the manifest")])
        elif not isinstance(node, dict):
            raise SpecInvalid([SpecError(f"--set {text}", f"{where}: its parent is not a mapping", "check the path")])
        if last:
            node[key] = value
        else:
            if isinstance(key, str) and (key not in node or node[key] is None):
                node[key] = [] if isinstance(steps[i + 1], int) else {}
            node = node[key]


def parse_value(raw: str) -> Any:
    """A `--set` value: one YAML scalar or flow collection; empty is the empty string."""
    docs = load_all(raw) if raw.strip() else [""]
    return docs[0] if docs else ""


def load_manifest(path: str | Path, overrides: Sequence[str] = ()) -> RLTrainingJob:
    """Read, parse and validate a manifest file, with `--set PATH=VALUE` overrides applied first
    (so an override gets the same field-named errors as the file)."""
    return validate_manifest(manifest_with(path, overrides))


def manifest_with(path: str | Path, overrides: Sequence[str] = ()) -> Any:
    """Read and parse a manifest file and apply `--set PATH=VALUE` overrides (not validated)."""
    obj = read_manifest(path)
    for text in overrides:
        if not isinstance(obj, dict):
            break  # validate_manifest reports the non-mapping document
        apply_set(obj, text)
    return obj


def deprecations(obj: Any) -> list[str]:
    """A note per deprecated field a parsed manifest sets (spec.trainer's optimizer fields), naming what replaces it."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    trainer = spec.get("trainer") if isinstance(spec, dict) else None
    given = [old for old in OPTIM_ALIASES if isinstance(trainer, dict) and to_camel(old) in trainer]
    return [f"spec.trainer.{to_camel(old)} is deprecated (accepted for one more version): write "
            f"{' and '.join(f'spec.roles.{role}.optim.{to_camel(new)}' for role in roles)} instead"
            for old in given for roles, new in [OPTIM_ALIASES[old]]]


def read_manifest(path: str | Path) -> Any:
    """Read and parse a manifest file (not validated)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecInvalid([SpecError(str(p), f"cannot be read: {exc.strerror or exc}", "check the path")]) from None
    except UnicodeDecodeError as exc:
        raise SpecInvalid([SpecError(str(p), f"is not UTF-8 text (byte {exc.start})",
                                     "save the manifest as UTF-8 YAML")]) from None
    return parse_yaml(text, str(p))
