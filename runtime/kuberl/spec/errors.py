"""Turn pydantic / YAML failures into one-line, field-named errors with a fix."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True)
class SpecError:
    """One problem in a manifest: `field` is a dotted path such as ``spec.roles.actor.gpus``."""

    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message} (fix: {self.fix})"


class SpecInvalid(ValueError):
    """A manifest failed validation; `errors` holds every problem found."""

    def __init__(self, errors: list[SpecError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors

    def report(self) -> int:
        """Print one `error: ...` line per problem on stderr; returns the CLI exit code (1)."""
        import sys

        for err in self.errors:
            print(f"error: {err}", file=sys.stderr)
        return 1


def field_path(loc: Iterable[Any]) -> str:
    """('spec', 'roles', 'actor', 'gpus') -> 'spec.roles.actor.gpus'; list indices as [i]."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "a boolean", "string": "a string",
               "list": "a list", "dict": "a mapping", "model": "a mapping"}


def _describe(err: dict) -> tuple[str, str]:
    """(message, fix) for one pydantic error dict."""
    kind, ctx, path = err["type"], err.get("ctx") or {}, field_path(err["loc"])
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "")
        return f"must be {op} {bound}", f"set {path} to a value {op} {bound}"
    if kind == "missing":
        return "is required", f"add {path}"
    if kind == "extra_forbidden":
        guess = did_you_mean(tuple(err["loc"]))
        if guess:
            return f"is not a known field (did you mean {guess}?)", f"rename {path} to {guess}"
        return "is not a known field", f"remove {path} or check its spelling (see `kubectl explain rltj.spec`)"
    if kind in ("literal_error", "enum"):
        expected = ctx.get("expected", "")
        return f"must be one of {expected}", f"set {path} to one of {expected}"
    what = _TYPE_WORDS.get(kind.split("_")[0])
    if what and kind.endswith(("_parsing", "_type")):
        return f"must be {what} (got {err.get('input')!r})", f"give {path} {what} value"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}", f"use lowercase letters, digits and '-' for {path}"
    if kind == "too_long" or kind == "string_too_long":
        return err["msg"].lower(), f"shorten {path}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg, f"correct {path}"


def known_fields(loc: tuple) -> list[str]:
    """The YAML (alias) names of the fields of the section at `loc` (a path into RLTrainingJob)."""
    import typing

    from pydantic import BaseModel

    from .model import RLTrainingJob

    def section(annotation: Any) -> Any:
        """The BaseModel inside Optional[...] / list[...], or None."""
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        for arg in typing.get_args(annotation):
            found = section(arg)
            if found is not None:
                return found
        return None

    model: Any = RLTrainingJob
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == part), None)
        model = section(field.annotation) if field is not None else None
        if model is None:
            return []
    return [f.alias or name for name, f in model.model_fields.items()]


def did_you_mean(loc: tuple) -> str:
    """The known field closest to an unknown key at `loc` ('batch_size' -> 'batchSize'), or ''."""
    import difflib

    key, known = str(loc[-1]), known_fields(loc[:-1])
    camel = key.split("_")[0] + "".join(w[:1].upper() + w[1:] for w in key.split("_")[1:])
    lowered = {k.lower(): k for k in known}
    if camel in known or key.lower() in lowered:
        return camel if camel in known else lowered[key.lower()]
    close = difflib.get_close_matches(camel, known, n=1, cutoff=0.6)
    return close[0] if close else ""


def from_validation_error(exc: ValidationError, prefix: tuple = ()) -> list[SpecError]:
    """All problems in a pydantic ValidationError, with cross-field problems expanded."""
    from .model import CrossFieldError

    out: list[SpecError] = []
    for err in exc.errors(include_url=False):
        cause = (err.get("ctx") or {}).get("error")
        loc = prefix + tuple(err["loc"])
        if isinstance(cause, CrossFieldError):
            for sub, message, fix in cause.problems:
                out.append(SpecError(field_path(loc) + "." + sub, message, fix))
            continue
        message, fix = _describe({**err, "loc": loc})
        out.append(SpecError(field_path(loc) or "(manifest)", message, fix))
    return out
