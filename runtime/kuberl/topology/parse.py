"""Parse the text printed by ``nvidia-smi topo -m``.

The table is whitespace-separated (tabs in the raw output, often spaces once copied), so cells are
split on any whitespace and the multi-word headings (``CPU Affinity``, ``NUMA Affinity``,
``GPU NUMA ID``) are recognised by their words. NIC columns and rows are read past and dropped; the
legend and any ``#`` comment lines are ignored.
"""

from __future__ import annotations

import re

from kuberl.topology.matrix import LinkMatrix, TopologyError, is_link_level

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_GPU = re.compile(r"GPU(\d+)")
_WORD = re.compile(r"[A-Za-z]+\d*")
_HEADINGS = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))


def parse_nvidia_smi_topo(text: str) -> LinkMatrix:
    """Parse ``nvidia-smi topo -m`` output into a GPU-only :class:`LinkMatrix`.

    Raises :class:`TopologyError` (one-line message) on truncated or malformed input.
    """
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    lines = [line for line in lines if not line.lstrip().startswith("#")]
    start, columns, headings = _header(lines)
    gpus = [c for c in columns if _GPU.fullmatch(c)]
    rows: dict[str, tuple[list[str], dict[str, str]]] = {}
    for line in lines[start + 1 :]:
        tokens = line.split()
        if not tokens:
            if rows:
                break
            continue
        label = tokens[0]
        if not _GPU.fullmatch(label):
            continue  # NIC rows
        if label not in gpus:
            raise TopologyError(f"row {label} has no column in the header")
        if label in rows:
            raise TopologyError(f"duplicate row {label}")
        rows[label] = _row(label, tokens[1:], columns, headings)
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise TopologyError(f"no row for {', '.join(missing)} (input truncated?)")
    links = [[rows[g][0][columns.index(h)] for h in gpus] for g in gpus]
    return LinkMatrix(
        names=gpus,
        indices=[int(_GPU.fullmatch(g).group(1)) for g in gpus],  # type: ignore[union-attr]
        links=links,
        cpu_affinity=[_value(rows[g][1].get("CPU Affinity")) for g in gpus],
        numa_affinity=[_value(rows[g][1].get("NUMA Affinity")) for g in gpus],
        source="nvidia-smi",
    )


def _header(lines: list[str]) -> tuple[int, list[str], list[str]]:
    """Find the header row: it names GPU columns and holds no link level (data rows do)."""
    for at, line in enumerate(lines):
        tokens = line.split()
        if any(_GPU.fullmatch(t) for t in tokens) and not any(is_link_level(t) for t in tokens):
            columns, headings = _split_header(tokens)
            return at, columns, headings
    raise TopologyError("no GPU header row found (expected a line like 'GPU0 GPU1 ... CPU Affinity')")


def _split_header(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Split header words into device columns and trailing headings (``CPU Affinity``, ...)."""
    columns: list[str] = []
    headings: list[str] = []
    i = 0
    while i < len(tokens):
        heading = next((h for h in _HEADINGS if tuple(tokens[i : i + len(h)]) == h), None)
        if heading is not None:
            headings.append(" ".join(heading))
            i += len(heading)
        elif headings:
            raise TopologyError(f"unrecognised header column {tokens[i]!r} after {headings[-1]!r}")
        else:
            columns.append(tokens[i])
            i += 1
    if len(set(columns)) != len(columns):
        raise TopologyError(f"duplicate device column in header: {' '.join(columns)}")
    return columns, headings


def _row(label: str, cells: list[str], columns: list[str], headings: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split one GPU row into its link cells (one per device column) and heading values."""
    n = 0
    while n < len(cells) and is_link_level(cells[n]):
        n += 1
    if n < len(columns) and n < len(cells) and _WORD.fullmatch(cells[n]):
        raise TopologyError(f"row {label} has unknown link level {cells[n]!r} in column {columns[n]}")
    if n != len(columns):
        raise TopologyError(f"row {label} has {n} link cells, expected {len(columns)}")
    values = cells[n:]
    if len(values) != len(headings):
        want = ", ".join(headings) or "none"
        raise TopologyError(f"row {label} has {len(values)} affinity cells, expected {len(headings)} ({want})")
    return [c.upper() for c in cells[:n]], dict(zip(headings, values))


def _value(cell: str | None) -> str | None:
    return None if cell is None or cell.upper() == "N/A" else cell
