"""docs/metrics.md is generated from the code, and the committed file is current."""

from __future__ import annotations

from pathlib import Path

from kuberl_operator.metrics_reference import aliases, catalogue, main, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_committed_reference_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/metrics.md is stale: run `python -m kuberl_operator.metrics_reference -o docs/metrics.md`")


def test_reference_lists_every_family_and_rename() -> None:
    text = render()
    for family in catalogue():
        assert f"| `{family.name}` | {family.kind} |" in text, family.name
    for alias in aliases():
        assert f"| `{alias.old}` | `{alias.new}` | {alias.removed_in} |" in text, alias.old


def test_generator_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "metrics.md"
    assert main(["-o", str(out)]) == 0
    assert out.read_text() == render()
