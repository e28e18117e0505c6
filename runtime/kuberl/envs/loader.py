"""The environment class of spec.environment: a user's, from `module` and `class`, or a built-in by name (`tools`,
`code_tools`).

The module is imported as a reward module is: from the folder of the manifest first (`add_import_dir`), then the
current folder and the installed packages. Every failure is one EnvironmentImportError line that names the field
(spec.environment.module or spec.environment.class) and the fix: a module that is not there, one that raises while
importing, a class it does not have, a name that is not a class, a class without reset(row) or step(action_text),
and a constructor that fails (the class is built with no arguments).
"""

from __future__ import annotations

import importlib
import inspect
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kuberl.rewards.loader import add_import_dir
from kuberl.spec.model import ENVIRONMENT_BUILTINS, EnvironmentSpec

from .code_tools import CodeToolEnvironment
from .interface import Environment
from .tools import ToolEnvironment

MODULE_FIELD = "spec.environment.module"
CLASS_FIELD = "spec.environment.class"
BUILTIN_ENVIRONMENTS: dict[str, type] = {"tools": ToolEnvironment, "code_tools": CodeToolEnvironment}
assert set(BUILTIN_ENVIRONMENTS) == set(ENVIRONMENT_BUILTINS), "a built-in environment of the spec has no class"
METHODS = {"reset": ("a row", {}, "reset(self, row) returning the first observation (a str) or chat messages"),
           "step": ("the turn's text", "", "step(self, action_text) returning an EnvStep (kuberl.envs)")}


class EnvironmentImportError(ValueError):
    """The environment class cannot be loaded or built; the message names the field and the fix."""


def load_environment_class(module: str, class_name: str | None, manifest_dir: Path | None = None) -> type:
    """The class spec.environment names: a built-in by its module name, or `class_name` in the user's `module`,
    importable from `manifest_dir` first. Checks that it is a class with reset(row) and step(action_text)."""
    if module in BUILTIN_ENVIRONMENTS:
        return BUILTIN_ENVIRONMENTS[module]
    if not class_name:
        raise EnvironmentImportError(f"{CLASS_FIELD}: is required for module {module!r} (fix: set "
                                     f"spec.environment.class to the environment class in {module})")
    if manifest_dir is not None:
        add_import_dir(manifest_dir)
    found = _import(module)
    cls = getattr(found, class_name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(found).items() if inspect.isclass(v) and v.__module__ == found.__name__)
        listed = f"; its classes: {', '.join(classes)}" if classes else ", which defines no class"
        raise EnvironmentImportError(f"{CLASS_FIELD}: module {module!r} has no {class_name!r}{listed} (fix: set "
                                     f"spec.environment.class to the environment class's name)")
    where = f"{module}.{class_name}"
    if not inspect.isclass(cls):
        raise EnvironmentImportError(f"{CLASS_FIELD}: {where} is {_kind(cls)}, not a class (fix: name a class with "
                                     f"reset(row) and step(action_text))")
    for method, (arg_name, arg, shape) in METHODS.items():
        problem = _method_problem(cls, method, arg)
        if problem:
            raise EnvironmentImportError(f"{CLASS_FIELD}: {where} {problem.format(arg=arg_name)} (fix: define "
                                         f"{shape})")
    return cls


def make_environment(env: EnvironmentSpec, manifest_dir: Path | None = None, prompt_key: str = "prompt") -> Environment:
    """A new environment as spec.environment describes it: the built-in tool environment (reading the prompt under
    spec.data.promptKey, `prompt_key`), or the user's class built with no arguments."""
    return environment_factory(env, manifest_dir, prompt_key)()


def environment_factory(env: EnvironmentSpec, manifest_dir: Path | None = None,
                        prompt_key: str = "prompt") -> Callable[[], Environment]:
    """`make_environment` with the class imported once, now: what a process that builds environments from many
    threads at once calls (an import, and the invalidation of the import caches before it, is not thread-safe)."""
    cls = load_environment_class(env.module, env.class_, manifest_dir)

    def make() -> Environment:
        if env.builtin:
            try:
                return cls(prompt_key=prompt_key)
            except Exception as exc:  # code_tools where the sandbox cannot run
                raise EnvironmentImportError(f"{MODULE_FIELD}: the built-in {env.module} environment cannot start: "
                                             f"{_raised(exc)} (fix: run it on Linux >= 5.13 with Landlock, where "
                                             f"this user may create namespaces, or use module tools)") from None
        try:
            return cls()
        except Exception as exc:  # the user's constructor: report it, whatever it raised
            raise EnvironmentImportError(f"{CLASS_FIELD}: {env.module}.{env.class_}() raised {_raised(exc)} (fix: "
                                         f"make the class constructible with no arguments; read settings from the "
                                         f"environment or a file beside it)") from None
    return make


def _import(module: str) -> Any:
    """The user's module, or an EnvironmentImportError naming spec.environment.module."""
    importlib.invalidate_caches()  # a module written since the last import (beside a new manifest) is found
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            raise EnvironmentImportError(
                f"{MODULE_FIELD}: cannot import module {module!r}: no module named {exc.name!r} (fix: put "
                f"{module.replace('.', '/')}.py next to the manifest, install the package in the runtime image, or "
                f"correct spec.environment.module)") from None
        raise EnvironmentImportError(f"{MODULE_FIELD}: importing {module!r} raised {_raised(exc)} (fix: install "
                                     f"{exc.name} in the runtime image, or remove that import)") from None
    except Exception as exc:  # the user's module raised while importing (a SyntaxError included)
        raise EnvironmentImportError(f"{MODULE_FIELD}: importing {module!r} raised {_raised(exc)} (fix: make the "
                                     f"module importable: python -c 'import {module}')") from None


def _method_problem(cls: type, name: str, arg: Any) -> str | None:
    """What is wrong with `cls`'s method `name` (missing, not callable, or not callable with one argument `arg`),
    with {arg} where the argument's description goes; None when it is fine."""
    try:
        raw = inspect.getattr_static(cls, name)
    except AttributeError:
        return f"has no {name} method"
    fn = getattr(cls, name)
    if not callable(fn):
        return f"has {name}, but it is {_kind(raw)}, not a method"
    args = (arg,) if isinstance(raw, (staticmethod, classmethod)) else (None, arg)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return None
    try:
        signature.bind(*args)
    except TypeError:
        shown = ", ".join(signature.parameters)
        return f"has {name}({shown}), which cannot be called with {{arg}} alone"
    return None


def _raised(exc: BaseException) -> str:
    """'ValueError: the message at file.py:12' on one line."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} at {exc.filename}:{exc.lineno}"
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{line} at {frames[-1].filename}:{frames[-1].lineno}" if frames else line


def _kind(value: Any) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"
