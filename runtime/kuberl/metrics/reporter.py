"""`kuberl report-progress`: the driver pod's reporter sidecar, the one container there with an API token.

User code runs in the driver container (the reward module at preflight, custom estimators), so that container
mounts no ServiceAccount token: with one, that code could patch the job's progress ConfigMap at will, or worse
if the Role ever grew. The driver writes its progress document to a file in a folder the two containers share
(`progress.ProgressFiles`); this relay patches each new one into ConfigMap `<job>-progress` (`ProgressReporter`,
retried, the final report longest) and, after each, reads `data.replicas` back into the folder for the driver's
next step, and at least every `idle_s` while no step reports. What it sends is parsed and bounded first
(`ProgressDocument.parse`), so the worst a driver's code can do is misreport its own job's progress.

The kubelet stops this sidecar once the driver has exited (SIGTERM): it then sends the driver's last document,
the final one, before it exits.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kuberl import logs
from kuberl.metrics.progress import ProgressFiles, ProgressReporter
from kuberl.spec.contract import PROGRESS_FILE, REPLICAS_FILE, Env, ExitCode, ProgressDocument

log = logs.get("progress")


@dataclass
class Relay:
    files: ProgressFiles
    api: ProgressReporter
    idle_s: float = 30.0  # the replicas are read at least this often while no new document comes
    sent: str | None = None  # the last document patched
    read_at: float = field(default=-float("inf"))  # time.monotonic() of the last replicas read

    def once(self) -> bool:
        """Patch the driver's document if it is new, then read the replicas if it was or ``idle_s`` have passed.
        True once a final document (phase Succeeded or Failed) has gone through."""
        try:
            text = (self.files.folder / PROGRESS_FILE).read_text()
        except OSError:
            text = None
        final = False
        if text is not None and text != self.sent:
            doc = ProgressDocument.parse(text)
            if doc.refused:
                log.warning(f"the driver's progress report drops {', '.join(doc.refused)}")
            if doc.refused == ("progress",):  # not a document at all: the last good one stands
                self.sent = text
            elif self.api.report(doc):
                self.sent, final, self.read_at = text, doc.phase in ("Succeeded", "Failed"), -float("inf")
        if time.monotonic() - self.read_at >= self.idle_s:
            self.read_at = time.monotonic()
            replicas = self.api.desired_replicas()
            if replicas is not None:
                part = self.files.folder / f".{REPLICAS_FILE}.part"
                part.write_text(replicas.to_json())
                part.replace(self.files.folder / REPLICAS_FILE)
        return final

    def run(self, stop: threading.Event, poll_s: float = 0.5) -> None:
        """Relay until ``stop`` is set, then once more: the driver's last document goes out before the exit."""
        while not stop.wait(poll_s):
            self.once()
        self.once()


def cmd_report_progress(args: argparse.Namespace) -> int:
    api = ProgressReporter.from_env()
    if api is None:
        print(f"error: {Env.PROGRESS_CONFIGMAP} and the API server (in-cluster, or {Env.API_URL}) must be set: this "
              f"command runs as the driver pod's reporter sidecar", file=sys.stderr)
        return ExitCode.BAD_INPUT
    folder = Path(args.dir)
    if not folder.is_dir():
        print(f"error: --dir {folder}: no such folder (the volume the driver writes its progress to)",
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    Relay(ProgressFiles(folder), api).run(stop, args.poll)
    return ExitCode.OK


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report-progress", help="relay a driver's progress to its ConfigMap (the driver pod's "
                                               "reporter sidecar; needs the ServiceAccount token)")
    p.add_argument("--dir", required=True,
                   help=f"the folder the driver writes {PROGRESS_FILE} to (${Env.PROGRESS_DIR})")
    p.add_argument("--poll", type=float, default=0.5, help="seconds between two looks at the folder")
    p.set_defaults(func=cmd_report_progress)
