"""The leader election's rules (leader.py): who may take the Lease, and what is written; the real contest between
replicas is tests/cluster/test_operator_ha.py."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from kuberl_operator.cli import lease_seconds
from kuberl_operator.leader import VERSION_ANNOTATION, Elector, LeaseError, Observer, Terms, lease_body, micro_time

ME = Terms("kuberl-system", "kuberl", "pod-a_1", duration_s=15)
NOW = datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)


def lease(holder: str | None, renew: str = "2026-12-06T11:59:59.000000Z", rv: str = "7", transitions: int = 2) -> dict:
    return {"metadata": {"name": "kuberl", "namespace": "kuberl-system", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": 15,
                     "acquireTime": "2026-12-06T11:00:00.000000Z", "leaseTransitions": transitions}}


def test_timing_follows_the_duration() -> None:
    assert (ME.renew_every_s, ME.give_up_after_s, ME.retry_every_s) == (5, 10, 2)
    assert ME.give_up_after_s < ME.duration_s, "the leader stops acting before a peer may take over"
    assert Terms("n", "l", "i", duration_s=3).retry_every_s == 0.5


@pytest.mark.parametrize("seen", [None, lease(None), lease(""), lease(ME.identity)])
def test_an_absent_released_or_own_lease_is_taken_at_once(seen: dict | None) -> None:
    observer = Observer()
    observer.see(seen, now=100.0)
    assert observer.may_take(ME, now=100.0)


def test_a_peers_lease_is_taken_only_after_a_whole_duration_unchanged_on_our_clock() -> None:
    observer = Observer()
    observer.see(lease("pod-b_2"), now=100.0)
    assert not observer.may_take(ME, now=114.9)
    observer.see(lease("pod-b_2"), now=114.9)  # the same record: no news from the holder
    assert observer.may_take(ME, now=115.0)


def test_a_renewal_restarts_the_wait_whatever_the_peers_clock_says() -> None:
    observer = Observer()
    observer.see(lease("pod-b_2", renew="2020-01-01T00:00:00.000000Z"), now=100.0)  # a renewTime long past
    assert not observer.may_take(ME, now=101.0), "a peer's timestamp never counts: its clock may be skewed"
    observer.see(lease("pod-b_2", renew="2020-01-01T00:00:05.000000Z", rv="8"), now=110.0)
    assert not observer.may_take(ME, now=124.0)
    assert observer.may_take(ME, now=125.0)
    assert observer.holder == "pod-b_2"


def test_taking_a_peers_lease_moves_acquire_time_and_transitions_and_guards_the_write() -> None:
    body = lease_body(ME, lease("pod-b_2"), NOW, ME.identity)
    assert body["metadata"]["resourceVersion"] == "7", "a write over a changed Lease must fail (409)"
    assert body["metadata"]["annotations"][VERSION_ANNOTATION]
    assert body["spec"] == {"holderIdentity": ME.identity, "leaseDurationSeconds": 15, "acquireTime": micro_time(NOW),
                            "renewTime": "2026-12-06T12:00:00.123456Z", "leaseTransitions": 3}


def test_renewing_keeps_acquire_time_and_transitions() -> None:
    spec = lease_body(ME, lease(ME.identity), NOW, ME.identity)["spec"]
    assert (spec["acquireTime"], spec["leaseTransitions"], spec["renewTime"]) == (
        "2026-12-06T11:00:00.000000Z", 2, micro_time(NOW))


def test_creating_the_lease_starts_at_no_transitions() -> None:
    body = lease_body(ME, None, NOW, ME.identity)
    assert "resourceVersion" not in body["metadata"]
    assert body["spec"]["leaseTransitions"] == 0 and body["spec"]["holderIdentity"] == ME.identity


def test_releasing_clears_the_holder() -> None:
    spec = lease_body(ME, lease(ME.identity), NOW, None)["spec"]
    assert spec["holderIdentity"] is None and spec["leaseDurationSeconds"] == 1


@pytest.mark.parametrize("text,ok", [("6", True), ("300", True), ("5", False), ("301", False)])
def test_lease_seconds_are_bounded(text: str, ok: bool) -> None:
    import argparse

    if ok:
        assert lease_seconds(text) == int(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="6 to 300"):
            lease_seconds(text)


def test_a_longer_lease_than_ours_is_waited_out_whole() -> None:
    """A replica of a shorter --lease-seconds (mid-rollout) waits the Lease's own duration."""
    observer = Observer()
    observer.see({**lease("pod-b_2"), "spec": {**lease("pod-b_2")["spec"], "leaseDurationSeconds": 60}}, now=0.0)
    assert not observer.may_take(ME, now=59.0) and observer.may_take(ME, now=60.0)


class Renewals:
    """The renewer's view of the API server: each get answers as ``answer`` says (the Lease code paths against a
    real server are tests/cluster/test_operator_ha.py; here, the renewer's timing and its errors)."""

    def __init__(self, terms: Terms, answer: str) -> None:
        self.terms, self.answer, self.version = terms, answer, 0

    def get(self, timeout: float) -> tuple[int, dict | None]:
        if self.answer == "hang":  # a server that never answers: the request times out
            time.sleep(timeout)
            raise OSError("timed out")
        if self.answer == "broken":
            raise KeyError("metadata")  # not an OSError: a bug, a parse failure
        if self.answer == "forbidden":
            return 403, None
        holder = self.terms.identity if self.answer == "ours" else "pod-b_2"
        self.version += 1
        return 200, lease(holder, rv=str(self.version))

    def write(self, body: dict, exists: bool, timeout: float) -> int:
        return 200


def held(answer: str, duration_s: float = 1.5) -> tuple[Elector, threading.Event, float]:
    """An elector holding the Lease from now, its renewer running against ``answer``; (elector, lost, start)."""
    terms = Terms("ns", "kuberl", "pod-a_1", duration_s=duration_s)  # type: ignore[arg-type]
    lost = threading.Event()
    elector = Elector(terms, Renewals(terms, answer), on_lost=lost.set)
    start = time.monotonic()
    elector.thread = threading.Thread(target=elector._hold, args=(start,), daemon=True)
    elector.thread.start()
    return elector, lost, start


@pytest.mark.parametrize("answer", ["hang", "forbidden"])
def test_the_leader_gives_up_by_its_deadline_when_renewals_fail(answer: str) -> None:
    elector, lost, start = held(answer)
    assert lost.wait(5)
    took = time.monotonic() - start
    assert elector.terms.give_up_after_s - 0.05 <= took <= elector.terms.give_up_after_s + 0.3, took
    assert took < elector.terms.duration_s, "it stops before a peer may take the Lease"


def test_an_error_in_the_renewer_is_a_lost_lease() -> None:
    _, lost, start = held("broken")
    assert lost.wait(5) and time.monotonic() - start < 1.0, "the first renewal's error ends the leadership"


def test_a_peer_holding_the_lease_ends_the_leadership_at_the_next_renewal() -> None:
    elector, lost, start = held("theirs")
    assert lost.wait(5) and time.monotonic() - start <= elector.terms.renew_every_s + 0.3


def test_renewing_holds_on_and_a_release_ends_without_a_loss() -> None:
    elector, lost, _ = held("ours")
    assert not lost.wait(2.5), "renewals that succeed keep the leadership past the deadline"
    elector.release()
    assert not elector.thread.is_alive() and not lost.is_set()


def test_a_replica_the_lease_is_forbidden_to_exits_with_the_roles_name() -> None:
    terms = Terms("kuberl-system", "kuberl", "pod-a_1", duration_s=1)  # type: ignore[arg-type]
    with pytest.raises(SystemExit, match="403.*Role kuberl-leader in kuberl-system"):
        Elector(terms, Renewals(terms, "forbidden")).acquire(None)
    assert issubclass(LeaseError, OSError)
