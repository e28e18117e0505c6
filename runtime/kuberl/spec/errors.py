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
        return _wrong_type(kind.split("_")[0], what, err.get("input"), path)
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}", f"use lowercase letters, digits and '-' for {path}"
    if kind == "too_long" or kind == "string_too_long":
        return err["msg"].lower(), f"shorten {path}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg, f"correct {path}"


def shown(value: Any) -> str:
    """A manifest value as YAML writes it, on one short line: true, null, 1e+12, 'text', a list of 3."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e6:
        mantissa, exponent = f"{value:.15e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"  # 1e+12, not 1000000000000.0
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number_text(value: Any) -> float | None:
    """The number a string spells (' 7', '1e-3', '16'), or None: text that YAML did not read as a number."""
    if not isinstance(value, str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def _yaml_float(number: float) -> str:
    """How to write a float so that YAML 1.1 (PyYAML) reads a number, not text: a dot, and a signed exponent."""
    text = repr(number)
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{'' if exponent[0] in '+-' else '+'}{exponent}"
    return text


def _wrong_type(kind: str, what: str, value: Any, path: str) -> tuple[str, str]:
    """(message, fix) for a value of the wrong type: no coercion, so say what was given and how to write it."""
    got = shown(value)
    if kind == "int":
        if isinstance(value, bool):
            return f"must be an integer, not a boolean (got {got})", f"set {path} to a whole number, e.g. 1"
        number = value if isinstance(value, float) else _number_text(value)
        if number is not None:
            example = f" (e.g. {int(number)})" if number.is_integer() and abs(number) < 1e6 else ""
            given = f"{got}, a float" if isinstance(value, float) else f"the text {got}"
            return (f"must be an integer (got {given})",
                    f"write {path} as a whole number in digits, without quotes, a dot or an exponent{example}")
    if kind == "float" and (number := _number_text(value)) is not None:
        why = ("YAML reads an exponent without a dot as text" if "e" in value.lower() and "." not in value
               else "a quoted number is text")
        return f"must be a number (got the text {got}: {why})", f"write {path} as {_yaml_float(number)}"
    if kind == "bool" and isinstance(value, (str, int, float)):
        return f"must be true or false (got {got})", f"write {path} as true or false, without quotes"
    if kind == "string" and isinstance(value, (bool, int, float)):
        return f"must be a string (got {got})", f'quote the value of {path}: "{got}"'
    return f"must be {what} (got {got})", f"give {path} {what} value"


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
