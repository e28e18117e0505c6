"""Hang timeouts and the one-line diagnosis of a hung role (kuberl.resilience.hangs), from real stacks."""

from __future__ import annotations

import threading
import time

import pytest

from kuberl.resilience import hangs


def test_hang_timeout_is_ten_times_the_slowest_call_within_floor_and_ceiling():
    assert hangs.hang_timeout(None, 600) == 600  # a method not seen yet: the ceiling only
    assert hangs.hang_timeout(0.5, 600) == hangs.HANG_FLOOR_S == 30
    assert hangs.hang_timeout(12.0, 600) == pytest.approx(120.0)
    assert hangs.hang_timeout(100.0, 600) == 600
    assert hangs.hang_timeout(0.5, 5) == 5  # a ceiling below the floor wins
    assert hangs.collective_timeout(600) == 300 < 600


def _stuck(event: threading.Event) -> None:
    event.wait()


def test_capture_stacks_dumps_every_thread_and_the_calls_frames():
    event = threading.Event()
    worker = threading.Thread(target=_stuck, args=(event,), name="stuck-call")
    worker.start()
    try:
        time.sleep(0.05)
        dump = hangs.capture_stacks(worker.ident)
    finally:
        event.set()
        worker.join()
    assert "thread stuck-call (the driver's call):" in dump["text"] and "thread MainThread:" in dump["text"]
    assert dump["call"][-1][2] == "wait" and any(f[2] == "_stuck" for f in dump["call"])
    assert hangs.capture_stacks(None)["call"] == []


USER = [("kuberl/workers/base.py", 150, "execute"), ("myreward.py", 12, "score")]
COLLECTIVE = [("kuberl/workers/base.py", 150, "execute"), ("kuberl/workers/critic.py", 40, "compute_values"),
              ("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 200, "foreach_all_gather"),
              ("torch/distributed/distributed_c10d.py", 3800, "all_gather_into_tensor"),
              ("torch/distributed/c10d_logger.py", 80, "wrapper")]


def test_where_tells_a_collective_from_user_code():
    assert hangs.where(USER) == ("user code", "score at myreward.py:12")
    api = "all_gather_into_tensor at torch/distributed/distributed_c10d.py:3800"
    assert hangs.where(COLLECTIVE) == ("collective", api)
    assert hangs.where([]) == ("idle", "")
    dtensor = [*USER[:1], ("torch/distributed/tensor/_sharding_prop.py", 550, "_propagate_tensor_meta_non_cached")]
    assert hangs.where(dtensor)[0] == "user code"  # DTensor's CPU work is no collective
    fsdp_wait = [*USER[:1], ("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 300, "wait_for_unshard")]
    assert hangs.where(fsdp_wait) == ("collective", "wait_for_unshard at "
                                                    "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:300")


def test_summary_names_the_rank_in_user_code_first_and_its_waiting_peers():
    assert hangs.summarize("critic", {0: COLLECTIVE, 1: USER}) == (
        "role critic rank 1 hung in user code: score at myreward.py:12; rank(s) 0 waiting in a collective")
    assert hangs.summarize("critic", {0: COLLECTIVE, 1: COLLECTIVE}).startswith(
        "role critic rank 0 hung in collective: all_gather_into_tensor at torch/distributed/distributed_c10d.py")
    assert hangs.summarize("reward", {0: [], 1: []}) == "role reward: no rank is still in the call"
    assert hangs.summarize("ref", {0: None}) == "role ref rank 0 hung (no stack: the rank did not answer the dump)"


def test_short_path_drops_the_install_prefix():
    assert hangs.short_path("/venv/lib/python3.11/site-packages/torch/distributed/x.py") == "torch/distributed/x.py"
    assert hangs.short_path("/work/repo/runtime/kuberl/workers/base.py") == "kuberl/workers/base.py"


def test_a_collectives_failure_is_not_the_roles_bug():
    import torch.distributed as dist

    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                        "2000ms for recv operation to complete")
    assert hangs.collective_failed(gloo) and hangs.collective_failed(dist.DistBackendError("NCCL watchdog"))
    assert not hangs.collective_failed(ZeroDivisionError("division by zero"))
    assert not hangs.collective_failed(RuntimeError("Timed out waiting for the reward service"))


def test_process_state_reads_the_kernels_view_of_a_stopped_a_running_and_a_gone_process():
    import os
    import signal
    import subprocess
    import sys

    # the child says when it sleeps: while it starts, it may be in D, reading its files from a busy disk
    child = subprocess.Popen([sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "asleep\n"
        assert hangs.process_state(child.pid)[:1] in ("S", "R")
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while hangs.process_state(child.pid)[:1] != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hangs.process_state(child.pid) == "T (stopped)"
    finally:
        child.kill()
        child.wait()
    assert hangs.process_state(child.pid) == "gone"


def test_a_silent_rank_is_named_by_what_its_node_saw():
    assert hangs.absent_cause(None, 7, 15)[0] == "unreachable"
    assert hangs.absent_cause("T (stopped)", 7, 15)[0] == "stopped"
    assert hangs.absent_cause("gone", 7, 15)[0] == "gone"
    assert hangs.absent_cause("D (disk sleep)", 7, 15) == (
        "unanswered", "does not answer while its node does (process 7 in state D (disk sleep))")
    assert hangs.absent_cause("R (running)", 7, 15)[0] == "unanswered"  # a thread holds the GIL
    # waiting, so its control thread could answer: the link is what is broken (a cut healed on one side only)
    assert hangs.absent_cause("S (sleeping)", 7, 15) == (
        "unreachable", "unreachable: its process 7 waits on its node (state S (sleeping)) and does not answer: the "
                       "driver's link to it is broken")
    cut = hangs.absent_cause(None, 7, 15)
    assert hangs.summarize("critic", {0: None}, {0: cut}) == (
        "role critic rank 0 unreachable: neither the rank nor its node answered within 15s (a network partition, "
        "or a lost node)")
    # a stopped rank is the culprit, not its peer waiting for it in a collective
    stopped = hangs.absent_cause("T (stopped)", 9, 15)
    assert hangs.summarize("actor", {0: COLLECTIVE, 1: None}, {1: stopped}) == (
        "role actor rank 1 stopped: its process 9 is in state T (stopped) (SIGSTOP, or a debugger), so it cannot "
        "dump its stacks; rank(s) 0 waiting in a collective")


def test_rays_verdict_on_a_node_that_missed_its_health_checks_is_unreachable():
    died = ("The actor died because its node has died. Node Id: 3f2a\n\tthe actor's node was terminated "
            "unexpectedly: health check failed due to missing too many heartbeats")
    assert hangs.node_unreachable(died)
    assert not hangs.node_unreachable("The actor died unexpectedly before finishing this task.\n\tpid: 12")
