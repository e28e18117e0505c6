"""The load benchmark runs end to end (5 jobs) and finds nothing lost or duplicated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_operator_load_quick(cluster_cache: Path, netns: None) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "operator_load.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = {
        r["metric"]: r for r in map(json.loads, (line for line in proc.stdout.splitlines() if line.startswith("{")))
    }
    assert records["jobs_lost_or_duplicated"]["lost"] == [] and records["jobs_lost_or_duplicated"]["duplicated"] == []
    assert records["jobs_all_running_s"]["value"] > 0 and records["reconcile_latency_s"]["reconciles"] > 0
    assert records["operator_rss_mib"]["peak"] > 0
