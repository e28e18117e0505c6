"""Resizing the frozen roles on a real local Ray: ref and reward grow and shrink between two steps; the other
roles' Ray actors stay the same, the data-parallel split follows, and a bad request changes nothing."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from kuberl.controller.driver import Driver
from kuberl.metrics import read_jsonl
from kuberl.metrics.progress import progress_of
from kuberl.resilience import checkpoint
from kuberl.resilience.resize import take_requests, write_request
from kuberl.spec.contract import ReplicasDocument, RoleProgress
from kuberl.workers.groups import RayWorkerGroup

from .probes import PROBED, Probes
from .test_faults import identities, run_observed, spec_for
from .test_userpath import kuberl


def test_ref_and_reward_are_resized_between_steps_and_nothing_else_moves(ray_session, tmp_path: Path, capsys) -> None:
    spec = spec_for(**{"trainer.steps": 5})
    seen: dict[int, dict] = {}
    sizes: dict[int, dict[str, int]] = {}

    def on_step(rec) -> None:
        seen[rec.step] = identities(driver)
        sizes[rec.step] = {r: g.world_size for r, g in driver.groups.items()}
        if rec.step == 1:
            write_request(tmp_path, "ref", 2)  # grow
            write_request(tmp_path, "judge", 2)  # a role the job does not run: refused
        if rec.step == 3:
            write_request(tmp_path, "ref", 1)  # shrink
            write_request(tmp_path, "reward", 2)  # grow another
        if rec.step == 4:
            write_request(tmp_path, "reward", 3)  # 3 ranks do not split the 32 samples of a step: refused

    driver = Driver(spec, "resize", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=120), progress=False,
                    on_step=on_step)
    start, _, _ = run_observed(driver)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert [sizes[s]["ref"] for s in range(1, 6)] == [1, 2, 2, 1, 1]
    assert [sizes[s]["reward"] for s in range(1, 6)] == [1, 1, 1, 2, 2]
    assert all(sizes[s]["actor"] == sizes[s]["critic"] == 1 for s in sizes)
    # The actor and critic kept the very same Ray actors (and processes) the whole run.
    for role in ("actor", "critic"):
        assert all(seen[s][role] == start[role] for s in seen), role
    assert seen[2]["reward"] == start["reward"] and seen[4]["ref"] != seen[2]["ref"]  # only the resized role moved
    assert len(set(seen[2]["ref"]) | set(start["ref"])) == 3  # two fresh ranks replaced the one
    assert driver.spec.roles.ref.replicas == 1 and driver.spec.roles.reward.replicas == 2
    out = capsys.readouterr().out
    assert "[resize] scaled ref from 1 to 2 ranks after step 1; other roles untouched" in out
    assert "[resize] scale refused: role judge cannot be resized live" in out
    assert "[resize] scale refused: spec.roles.reward.replicas: spec.roles.reward.replicas (3) must divide" in out
    assert take_requests(tmp_path).roles == {}  # every request was taken


def test_kuberl_scale_names_what_it_cannot_do(tmp_path: Path) -> None:
    refused = kuberl("scale", "j", "judge", "2", "--out", str(tmp_path))
    assert refused.returncode == 1 and refused.stderr.startswith("error: role judge cannot be resized live")
    missing = kuberl("scale", "nosuchjob", "ref", "2", cwd=tmp_path)
    assert missing.returncode == 1 and "no run of job nosuchjob in runs/nosuchjob" in missing.stderr
    ok = kuberl("scale", "j", "ref", "3", "--out", str(tmp_path))
    assert ok.returncode == 0 and "requested ref at 3 replicas" in ok.stdout
    assert take_requests(tmp_path).roles == {"ref": 3}


def test_the_operators_document_resizes_the_reward_between_steps(ray_session, tmp_path: Path, capsys) -> None:
    """The driver's half of a resize on Kubernetes: it reads the operator's `ReplicasDocument` (here handed
    over as the ConfigMap's GET would give it) before each step, applies a change once, reports the size it
    runs and its ranks' hosts (what the operator needs to give up pods on a shrink), and says a refused
    standing request once."""
    spec = spec_for(**{"trainer.steps": 5})
    operator_doc = {"roles": {"ref": 1, "reward": 1}}
    sizes: dict[int, int] = {}
    reported: dict[int, RoleProgress] = {}
    seen: dict[int, dict] = {}

    def on_step(rec) -> None:
        seen[rec.step] = identities(driver)
        sizes[rec.step] = driver.groups["reward"].world_size
        reported[rec.step] = progress_of(rec, 5).roles["reward"]
        if rec.step == 1:
            operator_doc["roles"]["reward"] = 2  # kubectl patch ... reward replicas 2
        if rec.step == 3:
            operator_doc["roles"]["reward"] = 1  # and back to 1
            operator_doc["roles"]["ref"] = 3  # 3 does not split a step's samples: refused, said once

    driver = Driver(spec, "resize", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=120), progress=False,
                    on_step=on_step, replicas_source=lambda: ReplicasDocument.parse(json.dumps(operator_doc)))
    start, _, _ = run_observed(driver)
    assert [sizes[s] for s in range(1, 6)] == [1, 2, 2, 1, 1]
    assert [reported[s].replicas for s in range(1, 6)] == [1, 2, 2, 1, 1]
    assert all(len(reported[s].hosts) == sizes[s] for s in sizes) and reported[1].hosts == [socket.gethostname()]
    for role in ("actor", "critic", "ref"):  # the refused ref and the resized reward moved nothing else
        assert all(seen[s][role] == start[role] for s in seen), role
    assert seen[3]["reward"] == seen[2]["reward"] != start["reward"]  # a standing document is applied once
    out = capsys.readouterr().out
    assert out.count("scaled reward from") == 2 and out.count("scale refused: spec.roles.ref.replicas") == 1


class ProbingDriver(Driver):
    """Records the critic's weights right after each resize, before the next step trains them."""

    def apply_resize_requests(self) -> None:
        before = self.groups["critic"].world_size
        super().apply_resize_requests()
        if self.groups["critic"].world_size != before:
            self.after_resize = self.groups["critic"].call(Probes.weights_digest)
            self.checkpoint_at_resize = checkpoint.latest(self.ckpt_root)


@pytest.mark.parametrize("standby", [False, True])
def test_the_critic_restarts_alone_at_a_new_world_size_from_its_last_step(ray_session, tmp_path: Path, capsys,
                                                                          standby: bool) -> None:
    """`kuberl scale JOB critic 2` after step 3 (no periodic checkpoint there): the step is checkpointed, only
    the critic restarts, at 2 ranks, holding exactly step 3's weights, and training goes on with no step lost.
    With warm standbys, the critic's standby is remade at the new size too."""
    spec = spec_for(**{"trainer.steps": 5, "trainer.checkpoint.interval": 2, "trainer.microBatchSize": 8,
                       "resilience.standby": standby})
    digests: dict[int, float] = {}
    sizes: dict[int, int] = {}
    seen: dict[int, dict] = {}
    standby_sizes: dict[int, int] = {}

    def on_step(rec) -> None:
        digests[rec.step] = driver.groups["critic"].call(Probes.weights_digest)
        sizes[rec.step] = driver.groups["critic"].world_size
        if standby:
            standby_sizes[rec.step] = driver.groups["critic"].standby.group.world_size
        seen[rec.step] = identities(driver)
        if rec.step == 3:
            write_request(tmp_path, "critic", 2)

    def group(role: str) -> RayWorkerGroup:
        return RayWorkerGroup(role, spec, timeout_s=120, worker_cls=PROBED.get(role))

    driver = ProbingDriver(spec, "resize", tmp_path, group, progress=False, on_step=on_step)
    start, records, _ = run_observed(driver)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]  # no step lost
    assert [sizes[s] for s in range(1, 6)] == [1, 1, 1, 2, 2]
    assert driver.after_resize == pytest.approx(digests[3], rel=1e-12)  # the state of its last completed step
    assert digests[4] != digests[3]  # and it trains on from there
    for role in ("actor", "ref", "reward"):
        assert all(seen[s][role] == start[role] for s in seen), role
    assert seen[4]["critic"] != seen[3]["critic"] and len(seen[4]["critic"]) == 2
    assert driver.checkpoint_at_resize == 3  # committed before the critic went (no periodic one at step 3)
    assert all(r.flat()["restarts_critic"] == 0 for r in records)  # a resize is no failure
    assert "[resize] scaled critic from 1 to 2 ranks after step 3; other roles untouched" in capsys.readouterr().out
    if standby:  # the standby behind the critic's ranks, at each step's end
        assert [standby_sizes[s] for s in range(1, 6)] == [1, 1, 1, 2, 2]
