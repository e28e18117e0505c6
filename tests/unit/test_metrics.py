"""Metrics: the MFU formula, metrics.jsonl (one object per step, truncated on resume), Prometheus, PNG."""

from __future__ import annotations

import json
import math
import socket
import urllib.request
from pathlib import Path

import pytest

from kuberl.metrics import MetricsSink, mfu, plot_reward_curve, plot_timeline, read_jsonl
from kuberl.metrics.record import RoleStep, Span, StepRecord, uncovered_s

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_mfu_by_hand() -> None:
    # 6 * 1e9 params * 2000 tokens = 1.2e13 FLOPs; over 2 s on 3 devices of 1e12 FLOP/s = 6e12 -> 2.0
    assert mfu(10**9, 2000, 2.0, 1e12, devices=3) == pytest.approx(2.0)
    # 6 * 5e8 * 1000 = 3e12 FLOPs in 10 s on one 1e12 device -> 0.3
    assert mfu(5 * 10**8, 1000, 10.0, 1e12) == pytest.approx(0.3)
    assert mfu(10**9, 1000, 0.0, 1e12) == 0.0
    assert mfu(10**9, 1000, 1.0, 0.0) == 0.0


def flat(step: int, reward: float = 0.5) -> dict:
    return {"step": step, "reward_mean": reward, "kl": 0.01 * step, "rollout_tokens_per_s": 100.0, "time_step_s": 0.1}


def record(step: int, reward: float = 0.5, **extra) -> StepRecord:
    """The step record whose metrics.jsonl object is `flat(step, reward)`."""
    stats = {"kl": extra.pop("kl", 0.01 * step)}
    return StepRecord(step=step, reward_mean=reward, stats=stats, rollout_tokens_per_s=100.0, step_s=0.1, extra=extra)


def test_sink_writes_one_json_object_per_log(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sink = MetricsSink(tmp_path, "job", total_steps=3, progress=False)
    for step in (1, 2, 3):
        sink.log(record(step, reward=step / 10))
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert [json.loads(line) for line in lines] == [flat(s, s / 10) for s in (1, 2, 3)]
    out = capsys.readouterr().out
    assert "[job] step 3/3" in out and "reward=0.3" in out


def test_sink_truncates_records_past_the_resume_step(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, "job", total_steps=6, progress=False)
    for step in range(1, 6):
        sink.log(record(step))
    sink.close()
    resumed = MetricsSink(tmp_path, "job", total_steps=6, start_step=2, progress=False)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    resumed.log(record(3, reward=0.9))
    resumed.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["reward_mean"] == 0.9


def test_torn_last_line_is_dropped_on_resume_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A crash mid-write leaves half a line (here with a cut multi-byte character): the resume keeps the
    whole records, drops the torn one with a warning naming the line, and appends after them."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 3, "note": "\xc3')
    sink = MetricsSink(tmp_path, "job", total_steps=4, start_step=2, progress=False)
    sink.log(StepRecord(step=3, reward_mean=0.5))
    sink.close()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    err = capsys.readouterr().err
    assert f"warning: {path}:3: dropped a line that is not a whole JSON record" in err and "Traceback" not in err


def test_sink_creates_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    MetricsSink(out, "job", total_steps=1, progress=False).close()
    assert (out / "metrics.jsonl").read_text() == ""


def scrape(port: int) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_prometheus_serves_gauges_on_loopback(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, "demo", total_steps=2, progress=False, prometheus_port=0)
    try:
        assert sink.port and sink.port > 0
        sink.log(record(1, reward=0.25, kl=math.nan, note="text"))
        text = scrape(sink.port)
        assert 'kuberl_reward_mean{job="demo"} 0.25' in text
        assert 'kuberl_step{job="demo"} 1.0' in text
        assert "kuberl_kl{" not in text and "kuberl_note" not in text  # non-finite / non-numeric skipped
        sink.log(record(2, reward=0.75))
        assert 'kuberl_reward_mean{job="demo"} 0.75' in scrape(sink.port)
        assert 'kuberl_kl{job="demo"} 0.02' in scrape(sink.port)
    finally:
        sink.close()


def test_prometheus_types_timestamp_and_build_info(tmp_path: Path) -> None:
    import time

    from kuberl.version import version

    sink = MetricsSink(tmp_path, "demo", total_steps=2, progress=False, prometheus_port=0)
    try:
        before = time.time()
        rec = record(1)
        rec.roles["critic"] = RoleStep(restarts=2)
        sink.log(rec)
        text = scrape(sink.port)
    finally:
        sink.close()
    assert "# TYPE kuberl_role_group_restarts_total counter" in text
    assert 'kuberl_role_group_restarts_total{job="demo",role="critic"} 2.0' in text
    assert 'kuberl_role_restarts{job="demo",role="critic"} 2.0' in text  # the old name, until 0.2.0
    stamp = [line for line in text.splitlines() if line.startswith('kuberl_last_step_timestamp_seconds{job="demo"}')]
    assert stamp and before <= float(stamp[0].split()[-1]) <= time.time()
    assert f'kuberl_build_info{{component="driver",job="demo",version="{version()}"}} 1.0' in text


def test_prometheus_serves_each_steps_staleness(tmp_path: Path) -> None:
    """kuberl_rollout_staleness_steps is the last step's `staleness` (0 on-policy, 1 one-step-off); a record
    without one (None) serves none rather than a made-up 0."""
    sink = MetricsSink(tmp_path, "demo", total_steps=3, progress=False, prometheus_port=0)
    try:
        sink.log(StepRecord(step=1))
        assert "kuberl_rollout_staleness_steps{" not in scrape(sink.port)
        for step, staleness in ((2, 0), (3, 1)):
            sink.log(StepRecord(step=step, staleness=staleness))
            text = scrape(sink.port)
            assert "# TYPE kuberl_rollout_staleness_steps gauge" in text
            assert f'kuberl_rollout_staleness_steps{{job="demo"}} {float(staleness)}' in text
    finally:
        sink.close()


def test_prometheus_port_is_released_on_close(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, "demo", total_steps=1, progress=False, prometheus_port=0)
    port = sink.port
    sink.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_plot_reward_curve_writes_png(tmp_path: Path) -> None:
    jsonl = tmp_path / "run" / "metrics.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text("".join(json.dumps(flat(s, reward=s / 20)) + "\n" for s in range(1, 16)))
    png = plot_reward_curve(jsonl, tmp_path / "curve.png")
    assert png == tmp_path / "curve.png"
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_plot_reward_curve_with_no_records(tmp_path: Path) -> None:
    png = plot_reward_curve(tmp_path / "missing.jsonl", tmp_path / "empty.png")
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_other_is_the_steps_time_that_no_span_covers() -> None:
    """Overlapping spans count once, a rollout sent before the step from its start, time past the step not."""
    spans = [Span("actor", "rollout", -1.5, 0.5), Span("ref", "ref", 1.0, 2.0), Span("critic", "values", 1.5, 3.0),
             Span("actor", "update_actor", 4.0, 6.5)]
    assert uncovered_s(spans, 6.0) == pytest.approx(0.5 + 1.0)  # 0.5-1.0 and 3.0-4.0
    assert uncovered_s([], 2.0) == 2.0 and uncovered_s(spans[1:2], 1.5) == pytest.approx(1.0)


def test_step_timeline_in_the_record_and_its_gantt_chart(tmp_path: Path) -> None:
    ref, values = Span("ref", "ref", 1.0, 2.0), Span("critic", "values", 1.5, 3.0)
    update = Span("actor", "update_actor", 4.0, 6.0)
    ahead = Span("actor", "rollout", -1.5, 0.5)  # the next step's rollout, sent 1.5 s before that step began
    assert ref.overlaps(values) and values.overlaps(ref) and not ref.overlaps(update)
    assert update.overlaps(ahead, offset_s=5.0) and not update.overlaps(ahead, offset_s=8.0)
    first = StepRecord(step=1, timeline=[ref, values, update], start_s=0.0, staleness=0)
    second = StepRecord(step=2, timeline=[ahead, Span("driver", "advantage", 1.0, 1.1)], start_s=5.0, staleness=1)
    rows = [first.flat(), second.flat()]
    assert rows[1]["staleness"] == 1 and rows[1]["step_start_s"] == 5.0
    assert rows[0]["timeline"][1] == {"role": "critic", "phase": "values", "start_s": 1.5, "end_s": 3.0}
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    png = plot_timeline(jsonl, tmp_path / "timeline.png")
    assert png is not None and png.read_bytes()[:8] == PNG_MAGIC
    assert "timeline" not in StepRecord(step=3).flat()
    (tmp_path / "empty.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    assert plot_timeline(tmp_path / "empty.jsonl", tmp_path / "none.png") is None


def test_a_full_disk_keeps_the_rows_and_never_tears_a_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    """A write cut short by a full disk is taken back; the rows wait in memory and are written, in order, once
    there is room; one warning per streak; a writer that raises (a tracker on the same disk) does not stop
    the others."""
    import errno
    import os

    from kuberl.metrics import jsonl

    class Broken:
        def write(self, rec: StepRecord) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            pass

    sink = MetricsSink(tmp_path, "job", total_steps=5, progress=False)
    sink.add(Broken())
    sink.log(record(1))
    real_write = os.write

    def half_then_full(fd: int, data) -> int:  # the disk takes a few bytes, then refuses
        real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonl.os, "write", half_then_full)
    sink.log(record(2))
    sink.log(record(3))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]  # no torn line left behind
    monkeypatch.setattr(jsonl.os, "write", real_write)
    sink.log(record(4))
    sink.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    err = capsys.readouterr().err
    assert err.count("kept in memory until there is room again") == 1
    assert err.count("Broken could not write") == 1  # once per streak, not once per step
