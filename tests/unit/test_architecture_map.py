"""docs/architecture.md's map of the runtime names every module under runtime/kuberl, and only modules that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "runtime" / "kuberl"


def holds_code(path: Path) -> bool:
    """Whether a module has more than a docstring (an `__init__.py` with only one is left out of the map)."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def modules() -> set[str]:
    """Every `.py` file under runtime/kuberl, by its path relative to it, but code-less `__init__.py` files."""
    return {p.relative_to(RUNTIME).as_posix() for p in RUNTIME.rglob("*.py")
            if "__pycache__" not in p.parts and (p.name != "__init__.py" or holds_code(p))}


def mapped() -> list[str]:
    """The module column of the tables between the runtime-map markers of docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("<!-- runtime-map -->")[1].split("<!-- /runtime-map -->")[0]
    return re.findall(r"^\| `([^`]+\.py)` \|", block, re.M)


def test_every_runtime_module_is_in_the_architecture_map() -> None:
    assert sorted(modules() - set(mapped())) == []


def test_the_architecture_map_names_only_modules_that_exist_each_once() -> None:
    named = mapped()
    assert sorted(set(named) - modules()) == []
    assert sorted({n for n in named if named.count(n) > 1}) == []
