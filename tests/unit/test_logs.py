"""kuberl.logs: the text and JSON formats, level filtering, streams, the environment and the command-line flags."""

from __future__ import annotations

import json
import logging
import sys
import threading

import pytest

from kuberl import logs
from kuberl.cli import build_parser, main
from kuberl.run import print_worker_lines


@pytest.fixture(autouse=True)
def default_logging(monkeypatch):
    """Each test starts from the default (info, text) and leaves it so; the environment is restored."""
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    logs.setup()
    yield
    logs.setup()


def test_the_text_format_keeps_the_message_and_says_the_level_and_job(capsys) -> None:
    log = logs.get("run")
    log.info("resuming from step 2 (/tmp/x/step_2)", extra={"job": "quickstart", "step": 2})
    log.warning("the trained model was not exported: no checkpoint")
    log.error("the driver exits 6")
    out, err = capsys.readouterr()
    assert out == "kuberl: [quickstart] resuming from step 2 (/tmp/x/step_2)\n"
    assert err.splitlines() == ["kuberl: warning: the trained model was not exported: no checkpoint",
                                "kuberl: error: the driver exits 6"]


def test_a_call_site_keeps_the_stream_its_message_always_had(capsys) -> None:
    logs.get("checkpoint").warning("checkpoint write to /c failed", extra=logs.STDOUT)
    logs.get("placement").info("actor rank 1: GPU topology from NVML", extra=logs.STDERR)
    out, err = capsys.readouterr()
    assert out == "kuberl: warning: checkpoint write to /c failed\n"
    assert err == "kuberl: actor rank 1: GPU topology from NVML\n"


def test_json_lines_parse_with_time_level_logger_message_and_the_call_sites_fields(capsys) -> None:
    logs.setup("info", "json")
    logs.get("resilience").info("role ref rank 0 stacks before it is killed:\n  File x",
                                extra={"role": "ref", "rank": 0})
    logs.get("metrics").warning("m.jsonl: no room", extra={"step": 7, "stream": "stdout"})
    out, err = capsys.readouterr()
    first, second = json.loads(out.splitlines()[0]), json.loads(out.splitlines()[1])
    assert err == ""
    assert first.keys() == {"time", "level", "logger", "message", "role", "rank"} and first["rank"] == 0
    assert (first["level"], first["logger"], first["role"]) == ("info", "kuberl.resilience", "ref")
    assert first["message"] == "role ref rank 0 stacks before it is killed:\n  File x"
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert second == {**second, "level": "warning", "logger": "kuberl.metrics", "step": 7}
    assert "stream" not in second


def test_a_json_line_carries_the_traceback(capsys) -> None:
    logs.setup("info", "json")
    try:
        raise OSError("disk full")
    except OSError:
        logs.get("run").exception("export failed")
    doc = json.loads(capsys.readouterr().err)
    assert doc["level"] == "error" and "OSError: disk full" in doc["exception"]


@pytest.mark.parametrize("fmt", logs.FORMATS)
def test_records_below_the_level_are_dropped(capsys, fmt) -> None:
    logs.setup("warning", fmt)
    log = logs.get("progress")
    log.debug("d")
    log.info("i")
    log.warning("w")
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "w" in err
    logs.setup("debug", fmt)
    log.debug("d")
    assert "d" in capsys.readouterr().out


def test_the_existing_module_loggers_share_the_handler(capsys) -> None:
    logging.getLogger("kuberl.rollout.hf").warning("hf rollout: fast path unavailable (x); using transformers generate")
    assert capsys.readouterr().err == "kuberl: warning: hf rollout: fast path unavailable (x); using transformers " \
                                      "generate\n"


def test_setup_puts_the_choice_in_the_environment_for_worker_processes(monkeypatch) -> None:
    logs.setup("DEBUG", "Json")
    assert logs.from_env() == ("debug", "json") and logs.environ() == {logs.LEVEL_ENV: "debug", logs.FORMAT_ENV: "json"}
    logs.setup()
    assert logs.environ() == {}  # the default: a Ray actor starts without a runtime_env of ours
    monkeypatch.setenv(logs.LEVEL_ENV, "loud")
    monkeypatch.setenv(logs.FORMAT_ENV, "xml")
    assert logs.from_env() == ("info", "text")  # a worker falls back to the default


def test_a_worker_process_sets_up_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(logs.LEVEL_ENV, "error")
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    logs.setup_from_env()
    logger = logging.getLogger("kuberl")
    assert logger.level == logging.ERROR and not logger.propagate
    assert [type(h.formatter) for h in logger.handlers] == [logs.JsonFormatter]


def test_setup_and_get_refuse_what_is_not_a_choice() -> None:
    with pytest.raises(ValueError, match="log level 'loud': one of debug, info, warning, error"):
        logs.setup("loud")
    with pytest.raises(ValueError, match="log format 'xml'"):
        logs.setup("info", "xml")
    with pytest.raises(ValueError, match="unknown log subsystem 'misc'"):
        logs.get("misc")


def test_every_command_takes_the_flags_with_defaults_from_the_environment(monkeypatch) -> None:
    assert build_parser().parse_args(["crd", "--log-level", "WARNING", "--log-format", "json"]).log_level == "warning"
    monkeypatch.setenv(logs.LEVEL_ENV, "debug")
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    args = build_parser().parse_args(["validate", "job.yaml"])
    assert (args.log_level, args.log_format) == ("debug", "json")


def test_a_bad_flag_or_variable_is_a_usage_error(monkeypatch, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["crd", "--log-level", "loud"])
    assert exc.value.code == 2 and "log level 'loud': one of debug, info, warning, error" in capsys.readouterr().err
    monkeypatch.setenv(logs.FORMAT_ENV, "xml")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["crd"])
    assert "log format 'xml'" in capsys.readouterr().err


def test_the_cli_sets_up_logging_before_the_command(tmp_path) -> None:
    assert main(["crd", "-o", str(tmp_path / "crd.yaml"), "--log-level", "error", "--log-format", "json"]) == 0
    assert logging.getLogger("kuberl").level == logging.ERROR
    assert logs.from_env() == ("error", "json")


def test_printed_as_json_makes_each_printed_line_an_object_and_keeps_json_lines_whole(capsys) -> None:
    logs.setup("info", "json")
    with logs.printed_as_json(True):
        print("done: job 'q', 2 steps")
        print("", file=sys.stderr)  # a blank line is dropped
        logs.get("run").warning("no checkpoint", extra={"job": "q"})
        sys.stderr.write("partial ")
        worker = threading.Thread(target=print, args=("from another thread",))
        worker.start()
        worker.join()
        sys.stderr.write("line")  # written out at the end, without its newline
    out, err = capsys.readouterr()
    (done, other), (warned, partial) = map(json.loads, out.splitlines()), map(json.loads, err.splitlines())
    assert done == {**done, "level": "info", "logger": "stdout", "message": "done: job 'q', 2 steps"}
    assert other["message"] == "from another thread" and partial["message"] == "partial line"
    assert partial == {**partial, "level": "warning", "logger": "stderr"}
    assert warned == {**warned, "logger": "kuberl.run", "message": "no checkpoint", "job": "q"}


def test_printed_as_json_changes_nothing_in_text_mode(capsys) -> None:
    stdout = sys.stdout
    with logs.printed_as_json(False):
        assert sys.stdout is stdout
        print("done: job 'q'")
        logs.get("run").info("resuming")
    assert capsys.readouterr().out == "done: job 'q'\nkuberl: resuming\n"


def test_a_forwarded_ray_worker_line_is_one_object_with_the_actor_and_pid(capsys) -> None:
    logs.setup("info", "json")
    worker_json = json.dumps({"time": "t", "level": "info", "logger": "kuberl.placement", "message": "m", "rank": 1})
    print_worker_lines({"pid": "41", "ip": "10.0.0.5", "is_err": True, "actor_name": "ActorWorker",
                        "lines": ["plain text", worker_json, " "]})
    first, second = map(json.loads, capsys.readouterr().err.splitlines())
    assert first == {**first, "level": "warning", "logger": "stderr", "message": "plain text", "actor": "ActorWorker",
                     "pid": 41, "ip": "10.0.0.5"}
    assert second == {**json.loads(worker_json), "actor": "ActorWorker", "pid": 41, "ip": "10.0.0.5"}
