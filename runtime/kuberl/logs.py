"""kuberl's diagnostics: the standard `logging` module, one logger per subsystem under `kuberl`, one format.

What a command prints as its result (`kuberl validate`'s verdict, the progress bar or per-step lines, the
closing `done:` summary, `render`'s YAML, one `error:` line per bad input) stays plain output. Everything
else is a log record of one of the loggers `kuberl.<subsystem>` (`SUBSYSTEMS`), written by one handler on
the `kuberl` logger:

- text (the default, for a person at a terminal): ``kuberl: [job] warning: message``, the ``[job] `` part
  when the call site names a job, the level's word for every level but info. Info and below go to stdout,
  warnings and errors to stderr, except where a call site keeps the stream its message always had
  (`STDOUT`, `STDERR`).
- json (``KUBERL_LOG_FORMAT=json`` or ``--log-format json``; the operator sets it in every pod it makes):
  one JSON object per line, with ``time``, ``level``, ``logger``, ``message`` and the call site's
  `FIELDS` (job, role, rank, step), so a log collector parses them. Under `printed_as_json` (`kuberl run`)
  every other line printed too, a command's result lines included: each becomes the ``message`` of an object
  whose ``logger`` is ``stdout`` or ``stderr`` (`line_record`), and so do the lines a Ray worker process
  prints, forwarded to the driver (kuberl.run), with the worker's ``actor`` and ``pid``.

Until a command calls `setup`, the handler is the text one at level info (a library use, a test). `setup`
also writes the choice into the environment, which a local Ray's worker processes inherit; a worker process
calls `setup_from_env` when it starts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any, TextIO

LEVEL_ENV = "KUBERL_LOG_LEVEL"  # debug, info (default), warning or error
FORMAT_ENV = "KUBERL_LOG_FORMAT"  # text (default) or json
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
SUBSYSTEMS = (
    "run",  # `kuberl run`: resume, --restart, export
    "resilience",  # restarts, standbys, hang diagnoses, calls sent again, the driver's link to the Ray head
    "checkpoint",  # checkpoints and per-step snapshots: saves, incomplete ones removed
    "metrics",  # metrics.jsonl and the other metric writers
    "progress",  # the driver's progress reports and the reporter sidecar
    "placement",  # GPU topology and rank placement
    "scale",  # resizing a role between two steps (named after `kuberl scale`)
    "rollout",  # rollout engines (kuberl.rollout.<engine>)
    "kernels",  # fused kernels and optimiser steps (kuberl.training.kernels.<module>)
)
FIELDS = ("job", "role", "rank", "step")  # a record's extra fields that the JSON line carries
ROOT = "kuberl"
STDOUT: dict[str, Any] = {"stream": "stdout"}  # extra= of a call whose message has always gone to stdout
STDERR: dict[str, Any] = {"stream": "stderr"}  # extra= of a call whose message has always gone to stderr


def get(subsystem: str) -> logging.Logger:
    """The logger `kuberl.<subsystem>`, one of `SUBSYSTEMS`."""
    if subsystem not in SUBSYSTEMS:
        raise ValueError(f"unknown log subsystem {subsystem!r}: one of {', '.join(SUBSYSTEMS)}")
    return logging.getLogger(f"{ROOT}.{subsystem}")


def level_word(levelno: int) -> str:
    """logging.WARNING -> "warning"."""
    return logging.getLevelName(levelno).lower()


class TextFormatter(logging.Formatter):
    """``kuberl: [job] warning: message`` (no level word at info), a traceback on the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        job = getattr(record, "job", None)
        where = f"[{job}] " if job else ""
        level = "" if record.levelno == logging.INFO else f"{level_word(record.levelno)}: "
        text = f"{ROOT}: {where}{level}{record.getMessage()}"
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601, ms), level, logger, message, the `FIELDS` it has."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": level_word(record.levelno),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update({key: getattr(record, key) for key in FIELDS if getattr(record, key, None) is not None})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def stream_of(record: logging.LogRecord) -> str:
    """"stdout" or "stderr": the call site's choice, else stderr from warning up."""
    return getattr(record, "stream", None) or ("stderr" if record.levelno >= logging.WARNING else "stdout")


class ConsoleHandler(logging.Handler):
    """Writes each record to sys.stdout or sys.stderr (`stream_of`) as they are at that moment, so a
    redirected or captured stream gets it, and flushes it at once (a SIGKILL loses no line)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream: TextIO = sys.stderr if stream_of(record) == "stderr" else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging never raises into the caller
            self.handleError(record)


def json_object(line: str) -> dict[str, Any] | None:
    """The JSON object `line` is (a JSON log line), else None."""
    if not line.startswith("{"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def line_record(line: str, stream: str, **fields: Any) -> str:
    """A printed line (no newline) as a JSON log line with `fields` added: a JSON object stays that object;
    any other line is the message of a record of logger `stream` ("stdout", at info, or "stderr", at warning)."""
    doc = json_object(line)
    if doc is None:
        doc = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
               "level": "warning" if stream == "stderr" else "info", "logger": stream, "message": line}
    doc.update(fields)
    return json.dumps(doc, default=str)


class JsonLines(io.TextIOBase):
    """A text stream that writes each whole line written to it to `stream` as a JSON object (`line_record`);
    blank lines are dropped, a line without its newline waits for it (or `close`), each thread's apart (`print`
    writes the text and the newline in two calls, between which another thread may write)."""

    def __init__(self, stream: TextIO, name: str):
        super().__init__()
        self.stream, self.name, self.lock = stream, name, threading.Lock()
        self.pending: dict[int, str] = {}  # per thread: the start of a line still without its newline

    def write(self, text: str) -> int:
        with self.lock:
            self._write(threading.get_ident(), text)
        return len(text)

    def _write(self, thread: int, text: str) -> None:
        *lines, self.pending[thread] = (self.pending.pop(thread, "") + text).split("\n")
        self.stream.write("".join(line_record(line, self.name) + "\n" for line in lines if line.strip()))

    def flush(self) -> None:
        self.stream.flush()

    def close(self) -> None:
        """Write every thread's line still without its newline; the wrapped stream stays open."""
        with self.lock:
            for thread in list(self.pending):
                self._write(thread, "\n")
        self.flush()
        super().close()

    def isatty(self) -> bool:
        return False  # JSON lines are for a collector: no progress bar

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


@contextlib.contextmanager
def printed_as_json(json_mode: bool) -> Iterator[None]:
    """Within, when `json_mode`: every line written to sys.stdout or sys.stderr comes out as a JSON object
    (`JsonLines`), so all a command prints parses; otherwise nothing changes."""
    if not json_mode:
        yield
        return
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = JsonLines(out, "stdout"), JsonLines(err, "stderr")
    try:
        yield
    finally:
        sys.stdout.close()
        sys.stderr.close()
        sys.stdout, sys.stderr = out, err


def level_of(text: str) -> int:
    """"warning" (any case) -> logging.WARNING; ValueError naming the choices otherwise."""
    if text.lower() not in LEVELS:
        raise ValueError(f"log level {text!r}: one of {', '.join(LEVELS)}")
    return logging.getLevelName(text.upper())


def format_of(text: str) -> str:
    """"json" or "text" (any case); ValueError naming the choices otherwise."""
    if text.lower() not in FORMATS:
        raise ValueError(f"log format {text!r}: one of {', '.join(FORMATS)}")
    return text.lower()


def setup(level: str = "info", fmt: str = "text") -> None:
    """Send the `kuberl` loggers' records at `level` and up to one `ConsoleHandler` in format `fmt`
    (replacing any earlier setup), and put both in the environment for the processes this one starts."""
    level, fmt = level_word(level_of(level)), format_of(fmt)
    _install(level, fmt)
    os.environ[LEVEL_ENV], os.environ[FORMAT_ENV] = level, fmt


def _install(level: str, fmt: str) -> None:
    handler = ConsoleHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger = logging.getLogger(ROOT)
    logger.handlers[:] = [handler]
    logger.setLevel(level_of(level))
    logger.propagate = False  # one line per record, whatever a library did to the root logger


def from_env() -> tuple[str, str]:
    """(level, format) from `LEVEL_ENV` and `FORMAT_ENV`; info and text where unset or not one of the choices
    (a worker process has nobody to refuse a bad value to; the command line refuses it)."""
    level, fmt = (os.environ.get(LEVEL_ENV) or "info").lower(), (os.environ.get(FORMAT_ENV) or "text").lower()
    return level if level in LEVELS else "info", fmt if fmt in FORMATS else "text"


def setup_from_env() -> None:
    """`setup` as the environment says: what a worker process calls when it starts."""
    setup(*from_env())


def environ() -> dict[str, str]:
    """This process's choice where it is not the default, as environment variables for a process started
    elsewhere (a Ray actor's runtime_env); empty by default, so such a process starts as it always did."""
    chosen = dict(zip((LEVEL_ENV, FORMAT_ENV), from_env(), strict=True))
    return {name: value for name, value in chosen.items() if value not in ("info", "text")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--log-level and --log-format on a command, their defaults from the environment (read when the
    parser is built; a bad value there is refused as a bad flag would be)."""
    level, fmt = os.environ.get(LEVEL_ENV) or "info", os.environ.get(FORMAT_ENV) or "text"
    parser.add_argument("--log-level", type=_checked(level_of), default=level, metavar="{" + ",".join(LEVELS) + "}",
                        help=f"the least severe diagnostics shown (default info, or ${LEVEL_ENV})")
    parser.add_argument("--log-format", type=_checked(format_of), default=fmt, metavar="{" + ",".join(FORMATS) + "}",
                        help=f"text for a terminal, json for log collectors: one object per line (default text, or "
                             f"${FORMAT_ENV}; the operator sets json in the pods it makes)")


def _checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse `type`: the text in lower case once `check` accepts it."""

    def parse(text: str) -> str:
        try:
            check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text.lower()

    return parse


if not logging.getLogger(ROOT).handlers:  # the default until a command calls setup
    _install(*from_env())
