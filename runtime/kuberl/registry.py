"""Registries: named implementations of one extension point, and user code by import path.

    ADVANTAGE_ESTIMATORS = Registry("advantage estimator", "spec.algorithm.advantageEstimator", BUILTIN_NAMES)

    @ADVANTAGE_ESTIMATORS.register("gae")
    def gae(inputs): ...

    ADVANTAGE_ESTIMATORS.get("gae")              # a built-in, by name
    ADVANTAGE_ESTIMATORS.get("mypkg.mod:fn")     # user code, imported on first use

The built-in names are defined once, in the spec (pure, so the operator can check a manifest
without importing the runtime); a registry only attaches implementations to them. An entry that
cannot be resolved raises one line naming the spec field and the fix.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    """An unknown name or an import path that does not resolve; the message names the field and the fix."""


def import_object(path: str, field: str, what: str = "function",
                  error: type[ValueError] = RegistryError) -> object:
    """`package.module:name` -> the object; any failure is one `error` line naming `field` and the fix."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise error(f"{field}: cannot import module {module_name!r} ({exc}) (fix: put the module next to the "
                    "manifest, install the package in the runtime image, or correct the path)") from None
    except Exception as exc:  # the user's module raised while importing
        raise error(f"{field}: importing {module_name!r} raised {type(exc).__name__}: {exc} "
                    "(fix: make the module importable)") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise error(f"{field}: module {module_name!r} has no attribute {attr!r} (fix: check the {what} name)")
    if not callable(obj):
        raise error(f"{field}: {path} is not callable (fix: point it at a {what})")
    return obj


class Registry(Generic[T]):
    """Implementations by name (`register`) or by import path (`lazy`, and any user path)."""

    def __init__(self, kind: str, field: str, names: tuple[str, ...], error: type[ValueError] = RegistryError):
        self.kind, self.field, self.names, self.error = kind, field, names, error
        self._entries: dict[str, T] = {}
        self._paths: dict[str, str] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: the implementation of built-in `name` (one of the spec's names for this kind)."""
        if name not in self.names:
            raise ValueError(f"{name!r} is not a built-in {self.kind} of the spec ({', '.join(self.names)})")

        def add(obj: T) -> T:
            self._entries[name] = obj
            return obj

        return add

    def lazy(self, name: str, path: str) -> None:
        """Built-in `name` is the object at import path `path`, imported on first use."""
        if name not in self.names:
            raise ValueError(f"{name!r} is not a built-in {self.kind} of the spec ({', '.join(self.names)})")
        self._paths[name] = path

    def get(self, key: str, field: str | None = None) -> T:
        """A built-in by name, or user code by import path `package.module:name`."""
        if key in self._entries:
            return self._entries[key]
        where = field or self.field
        if key in self._paths or ":" in key:
            obj = import_object(self._paths.get(key, key), where, self.kind.split()[-1], self.error)
            if key in self._paths:  # user paths are not kept: their module may change between loads
                self._entries[key] = obj  # type: ignore[assignment]
            return obj  # type: ignore[return-value]
        raise self.error(f"{where}: unknown {self.kind} {key!r}; allowed: {', '.join(self.names)} "
                         f"(fix: use one of them or an import path package.module:function)")
