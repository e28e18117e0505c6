"""Load and validate RLTrainingJob manifests from YAML text, files or dicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import SpecError, SpecInvalid, from_validation_error
from .model import API_VERSION, KIND, RLTrainingJob


def validate_manifest(obj: Any) -> RLTrainingJob:
    """A parsed manifest (dict) -> RLTrainingJob, or SpecInvalid listing every problem."""
    if not isinstance(obj, dict):
        raise SpecInvalid([SpecError("(manifest)", f"must be a mapping, got {type(obj).__name__}", f"write an {KIND} manifest with apiVersion, kind, metadata and spec")])
    if obj.get("kind") != KIND:
        raise SpecInvalid([SpecError("kind", f"must be {KIND} (got {obj.get('kind')!r})", f"set kind: {KIND}")])
    if obj.get("apiVersion") != API_VERSION:
        raise SpecInvalid([SpecError("apiVersion", f"must be {API_VERSION} (got {obj.get('apiVersion')!r})", f"set apiVersion: {API_VERSION}")])
    try:
        return RLTrainingJob.model_validate(obj)
    except ValidationError as exc:
        raise SpecInvalid(from_validation_error(exc)) from None


def parse_yaml(text: str, source: str = "<manifest>") -> Any:
    """YAML text -> object; a parse failure becomes SpecInvalid naming the line."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecInvalid([SpecError(source, f"is not valid YAML at {where}: {problem}", "fix the YAML syntax (indentation, colons, quotes)")]) from None
    if len(docs) != 1:
        raise SpecInvalid([SpecError(source, f"must hold exactly one YAML document (found {len(docs)})", f"put one {KIND} in the file")])
    return docs[0]


def load_manifest(path: str | Path) -> RLTrainingJob:
    """Read, parse and validate a manifest file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecInvalid([SpecError(str(p), f"cannot be read: {exc.strerror or exc}", "check the path")]) from None
    except UnicodeDecodeError as exc:
        raise SpecInvalid([SpecError(str(p), f"is not UTF-8 text (byte {exc.start})", "save the manifest as UTF-8 YAML")]) from None
    return validate_manifest(parse_yaml(text, str(p)))
