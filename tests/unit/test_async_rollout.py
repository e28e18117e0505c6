"""spec.rollout.async: the spec, token versions and staleness, the gate, staged weights, and the rollout worker's
partial modes (weights swapped between two decode steps, or after the generation in flight)."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import pytest
import torch

from kuberl.data.prompts import Prompts
from kuberl.rollout.versions import StagedWeights, StalenessGate, sample_staleness, token_versions
from kuberl.spec import SpecInvalid, enabled_roles, validate_manifest
from kuberl.workers.rollout import RolloutWorker


def job(roles: dict | None = None, **rollout):
    spec = {"data": {"task": "repeat-letter", "batchSize": 2}, "reward": {"function": "repeat-letter"},
            "algorithm": {"name": "grpo", "groupSize": 2}, "rollout": {"maxNewTokens": 6, **rollout},
            "trainer": {"miniBatchSize": 4, "microBatchSize": 4}, **({"roles": roles} if roles else {})}
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob",
                              "metadata": {"name": "x"}, "spec": spec}).spec


def errors(**rollout):
    with pytest.raises(SpecInvalid) as info:
        job(**rollout)
    return [str(e) for e in info.value.errors]


def test_async_runs_the_rollout_role_and_turns_tis_on():
    spec = job(**{"async": {"maxStaleness": 3, "partial": "continue"}})
    assert enabled_roles(spec) == ["actor", "ref", "reward", "rollout"]
    assert spec.rollout.async_.max_staleness == 3 and spec.rollout.async_.partial == "continue" and spec.tis_enabled
    plain = job()
    assert enabled_roles(plain) == ["actor", "ref", "reward"] and not plain.tis_enabled
    assert job(**{"async": {}}).rollout.async_.partial == "finish"


def test_async_refuses_the_one_step_off_mode_beside_it_with_one_line():
    (err,) = errors(asynchronous=True, **{"async": {"maxStaleness": 2}})
    assert err.startswith("spec.rollout.async: cannot be set together with rollout.asynchronous"), err
    assert "\n" not in err
    assert any("maxStaleness" in e for e in errors(**{"async": {"maxStaleness": 0}}))
    assert ("spec.rollout.async: needs engine hf (its rollout workers hold an hf engine) (fix: set "
            "spec.rollout.engine: hf, or remove spec.rollout.async)") in errors(engine="vllm", **{"async": {}})
    assert any("maxStaleness" in e for e in errors(**{"async": {"maxStaleness": 65}}))


@pytest.mark.parametrize(("field", "value"), [("replicas", 0), ("enabled", False)])
def test_async_refuses_a_rollout_role_turned_off(field: str, value) -> None:
    with pytest.raises(SpecInvalid) as info:
        job(roles={"rollout": {field: value}}, **{"async": {}})
    (err,) = [str(e) for e in info.value.errors]
    assert err.startswith(f"spec.roles.rollout.{field}: is ") and "rollout.async needs the rollout role" in err, err


def test_token_versions_carry_the_last_step_past_an_early_end():
    assert token_versions([0, 0, 1], 2, 5).tolist() == [[0, 0, 1, 1, 1]] * 2
    assert token_versions([], 1, 3).tolist() == [[0, 0, 0]]
    assert token_versions([2, 3, 4, 5], 1, 3).tolist() == [[2, 3, 4]]


def test_a_sample_is_as_stale_as_its_oldest_response_token():
    versions = torch.tensor([[1, 2, 3], [0, 3, 3], [2, 2, 2]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 0]])
    # row 1's version-0 token is past the mask; row 2 has no response token: its first counts
    assert sample_staleness(versions, mask, trained=4).tolist() == [3, 1, 2]


def test_the_gate_drops_batches_past_max_staleness_and_counts_each_steps_samples():
    gate = StalenessGate(max_staleness=2)
    mask = torch.ones(2, 3)
    assert not gate.admit(torch.tensor([[0, 1, 1], [1, 1, 1]]), mask, trained=3)  # row 0 lags 3
    gate.count_lost(4)
    assert gate.admit(torch.tensor([[1, 2, 3], [2, 2, 3]]), mask, trained=3)
    assert gate.step_stats() == {"staleness_mean": 1.5, "staleness_max": 2.0, "samples_dropped_stale": 2.0,
                                 "samples_lost_rollout": 4.0}
    assert gate.step_stats() == {"staleness_mean": 0.0, "staleness_max": 0.0, "samples_dropped_stale": 0.0,
                                 "samples_lost_rollout": 0.0}


def test_staged_weights_keep_the_newest_push_until_taken():
    staged = StagedWeights()
    a, b = {"w": torch.zeros(1)}, {"w": torch.ones(1)}
    staged.push(b, 2)
    staged.push(a, 1)  # older than the one staged: never applied
    assert staged.take() == (b, 2) and staged.take() is None and staged.version == 0


def rollout_worker(partial: str, push: bool = True) -> tuple[RolloutWorker, object]:
    spec = job(fixedLength=True, **{"async": {"partial": partial}})
    worker = RolloutWorker(spec.model_dump_json(by_alias=True), "rollout", 0, 1, "cpu")
    worker.setup()
    if push:  # what the driver does first (AsyncRollout.start): version 0, the model path's weights here
        worker.push_weights({k: v.clone() for k, v in worker.engine.model.state_dict().items()}, 0)
    return worker, Prompts(spec).next_batch()


def test_a_new_worker_generates_nothing_before_the_actors_weights_arrive():
    """A restarted worker holds the model path's weights: its tickets wait for the first push (the driver's, on
    the restart), so no token is drawn by weights the actor never had."""
    worker, prompts = rollout_worker("finish", push=False)
    worker.submit(prompts, 0, 1)
    time.sleep(0.5)
    assert worker.done == {}
    worker.push_weights({k: v.clone() for k, v in worker.engine.model.state_dict().items()}, 3)
    assert worker.collect(0)["token_versions"].eq(3).all()


def perturbed(worker: RolloutWorker) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {k: v + torch.randn(v.shape, generator=g) for k, v in worker.engine.model.state_dict().items()
            if v.is_floating_point()}


def push_at_token(worker: RolloutWorker, state: dict[str, torch.Tensor], at: int) -> None:
    """Push `state` (version 1) as decode step `at` of the next generation (1-based) has drawn its token."""
    generate = worker.engine.generate

    def pushing(*args, every_token, **kwargs):
        calls = []

        def hook():
            calls.append(1)
            if len(calls) == at:
                worker.staged.push(state, 1)
            every_token()

        return generate(*args, every_token=hook, **kwargs)

    worker.engine.generate = pushing


@pytest.mark.parametrize("partial", ["continue", "finish"])
def test_partial_rollout_records_the_version_of_every_token(partial):
    """Weights pushed after decode step 2 of 6: `continue` draws tokens 3.. with them (its first two tokens are
    those of a generation with no push), `finish` ends the generation under the old ones and the next one starts
    with the new ones; each token's version says which."""
    worker, prompts = rollout_worker(partial)
    worker.submit(prompts, 0, 7)
    plain = worker.collect(0)
    assert plain["token_versions"].eq(0).all()
    push_at_token(worker, perturbed(worker), at=2)
    worker.submit(prompts, 1, 7)
    swapped = worker.collect(1)
    if partial == "continue":
        assert swapped["token_versions"].tolist() == [[0, 0, 1, 1, 1, 1]] * len(prompts)
        assert swapped["responses"][:, :2].equal(plain["responses"][:, :2])
        assert not swapped["responses"][:, 2:].equal(plain["responses"][:, 2:])
    else:
        assert swapped["responses"].equal(plain["responses"]) and swapped["token_versions"].eq(0).all()
    worker.submit(prompts, 2, 7)
    assert worker.collect(2)["token_versions"].eq(1).all()
    assert worker.collect(1) is None  # collected once; a ticket this worker never got (a dead one's) is None


def test_the_rollout_returns_its_own_log_probs_for_every_token():
    """The engine's own log-probs (the loss's behaviour policy): one per response token, finite and negative
    (fixed length: every token is a response token)."""
    worker, prompts = rollout_worker("continue")
    worker.submit(prompts, 0, 3)
    out = worker.collect(0)
    assert out["rollout_logprobs"].shape == out["responses"].shape
    assert torch.isfinite(out["rollout_logprobs"]).all() and (out["rollout_logprobs"] < 0).all()


def refusal(**spec) -> str:
    """The one error of an async job with `spec` (a section each) over the repeat-letter task."""
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "repeat-letter"}, "rollout": {"async": {}}}
    with pytest.raises(SpecInvalid) as info:
        validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "x"},
                           "spec": {**base, **spec}})
    (err,) = [str(e) for e in info.value.errors]
    return err


def test_the_rollout_role_is_refused_gpus_it_would_share():
    err = refusal(roles={"actor": {"gpus": 1}, "rollout": {"gpus": 1, "colocateWith": "actor"}})
    assert err.startswith("spec.roles.rollout.colocateWith: puts the rollout role on the GPUs of actor, but the "
                          "rollout role generates all the time"), err
    assert err.endswith("(fix: remove spec.roles.rollout.colocateWith: give the rollout role GPUs of its own)"), err
    err = refusal(roles={"rollout": {"gpus": 1}, "ref": {"gpus": 1, "colocateWith": "rollout"}})
    assert err.startswith("spec.roles.ref.colocateWith: puts ref on the GPUs of rollout"), err


def test_async_refuses_tis_off_the_only_correction_for_its_stale_tokens():
    err = refusal(algorithm={"tis": "off"})
    assert err.startswith("spec.algorithm.tis: is off, but rollout.async needs it") and "\n" not in err, err
    assert err.endswith("(fix: set spec.algorithm.tis: auto or on, or remove spec.rollout.async)"), err
    assert job(**{"async": {}}).tis_enabled  # auto is on


def test_the_generating_thread_ends_with_its_worker():
    """In-process, a dropped worker's thread ends (it holds the worker only while it generates)."""
    before = set(threading.enumerate())
    worker, prompts = rollout_worker("finish")
    (thread,) = set(threading.enumerate()) - before
    worker.submit(prompts, 0, 1)
    assert worker.collect(0) is not None
    del worker
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_operator_gives_the_rollout_role_a_worker_group_of_its_own():
    from kuberl_operator.builders import BuildOptions, ray_cluster

    spec = {"data": {"task": "repeat-letter"}, "reward": {"function": "repeat-letter"}, "rollout": {"async": {}},
            "roles": {"rollout": {"replicas": 2, "resources": {"cpu": "1", "memory": "1Gi"}}}}
    job = validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "x"},
                             "spec": spec})
    groups = {g["groupName"]: g for g in ray_cluster(job, BuildOptions(image="x", namespace="ns"))["spec"][
        "workerGroupSpecs"]}
    assert groups["rollout"]["replicas"] == 2 and "kuberl_role_rollout" in groups["rollout"]["rayStartParams"][
        "resources"]
    plain = validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "x"},
                               "spec": {**spec, "rollout": {}}})
    assert "rollout" not in {g["groupName"] for g in ray_cluster(plain, BuildOptions(image="x", namespace="ns"))[
        "spec"]["workerGroupSpecs"]}


def test_the_job_policy_covers_the_rollout_role():
    """The operator's job policy (and the chart's admission policy, which lists the same built-in roles) looks at
    spec.roles.rollout like the other roles."""
    from kuberl_operator.job_policy import JobPolicy, violations

    spec = {"data": {"task": "repeat-letter"}, "reward": {"function": "repeat-letter"}, "rollout": {"async": {}},
            "roles": {"rollout": {"priorityClassName": "system-cluster-critical"}}}
    job = validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "x"},
                             "spec": spec})
    (line,) = violations(job, JobPolicy(allowedPriorityClasses=("batch",)))
    assert "priorityClassName must be one of batch" in line
    chart = (Path(__file__).resolve().parents[2] / "charts/kuberl/templates/job-policy.yaml").read_text()
    assert 'list "actor" "critic" "ref" "reward" "rollout"' in chart
