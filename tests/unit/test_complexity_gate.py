"""The complexity gate's exceptions (`# noqa: C901` on a def line) are exactly the ones docs/architecture.md lists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("runtime", "operator", "bench", "tests", "examples", "cluster", "images")
DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)\(.*#\s*noqa:[^#]*\bC901\b", re.M)


def exempted() -> set[str]:
    """`path::function` of every def line that carries `# noqa: C901`."""
    found = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*.py"):
            if "gomod" in path.parts:
                continue
            found |= {f"{path.relative_to(REPO)}::{m}" for m in DEF.findall(path.read_text(errors="replace"))}
    return found


def documented() -> set[str]:
    """The functions in the table between the complexity-exceptions markers of docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("<!-- complexity-exceptions -->")[1].split("<!-- /complexity-exceptions -->")[0]
    return set(re.findall(r"^\| `([^`]+::\w+)` \|", table, re.M))


def test_every_complexity_exception_is_documented_and_every_documented_one_exists() -> None:
    assert exempted() == documented()
