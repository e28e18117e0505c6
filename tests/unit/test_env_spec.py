"""spec.environment (agentic RL): an accepted example, each refusal one line naming its field and the fix, the CRD's
schema of it, `kuberl validate` loading the class beside the manifest, and `kuberl run` refusing a job that sets it
while no rollout runs environments."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from kuberl.cli import main
from kuberl.spec import SpecInvalid, generate_crd, validate_manifest
from kuberl.spec.model import MAX_SECONDS, MAX_TOKENS, MAX_TURNS

ENV = {"module": "my_env", "class": "CalculatorEnv", "maxTurns": 3, "maxTokensPerTurn": 32, "timeoutSeconds": 10.0,
       "concurrency": 8}


def manifest(environment: dict | None = None, max_new_tokens: int = 128, **spec) -> dict:
    base = {"data": {"task": "repeat-letter", "batchSize": 4}, "reward": {"function": "repeat-letter"},
            "rollout": {"maxNewTokens": max_new_tokens}, "trainer": {"steps": 2, "miniBatchSize": 4,
                                                                    "microBatchSize": 4}}
    if environment is not None:
        base["environment"] = environment
    base.update(spec)
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "agent"}, "spec": base}


def one_error(obj: dict, field: str) -> str:
    with pytest.raises(SpecInvalid) as info:
        validate_manifest(obj)
    lines = [str(e) for e in info.value.errors]
    assert len(lines) == 1 and lines[0].startswith(f"{field}: "), lines
    assert "\n" not in lines[0] and "(fix: " in lines[0], lines
    return lines[0]


def test_an_environment_is_accepted_and_read_back_under_its_yaml_names() -> None:
    env = validate_manifest(manifest(ENV)).spec.environment
    assert (env.module, env.class_, env.max_turns, env.max_tokens_per_turn) == ("my_env", "CalculatorEnv", 3, 32)
    assert (env.timeout_seconds, env.concurrency, env.builtin) == (10.0, 8, False)
    dumped = validate_manifest(manifest(ENV)).spec.model_dump(by_alias=True, mode="json")
    assert dumped["environment"] == ENV


def test_it_is_off_by_default_and_tools_needs_no_class() -> None:
    assert validate_manifest(manifest()).spec.environment is None
    env = validate_manifest(manifest({"module": "tools"}, max_new_tokens=256)).spec.environment
    assert env.builtin and env.class_ is None and (env.max_turns, env.max_tokens_per_turn) == (4, 64)
    assert (env.timeout_seconds, env.concurrency) == (30.0, 16)
    exact = validate_manifest(manifest({**ENV, "maxTurns": 4})).spec.environment  # 4 x 32 = maxNewTokens, fits
    assert exact.max_turns * exact.max_tokens_per_turn == 128


@pytest.mark.parametrize("change, field, words", [
    ({"module": None}, "spec.environment.module", "is required"),
    ({"module": "my_env.py"}, "spec.environment.module", "is not an importable module name (drop .py"),
    ({"module": "my_env:CalculatorEnv"}, "spec.environment.module", "(put the class name in spec.environment.class)"),
    ({"module": "my-env"}, "spec.environment.module", "is not an importable module name"),
    ({"module": ""}, "spec.environment.module", "at least 1 character"),
    ({"class": None}, "spec.environment.class", "is required: module my_env is a module of your own"),
    ({"class": "my_env.CalculatorEnv"}, "spec.environment.class", "is not a Python class name"),
    ({"module": "tools"}, "spec.environment.class", "is set, but module tools is the built-in tools environment"),
    ({"maxTurns": 0}, "spec.environment.maxTurns", "must be >= 1"),
    ({"maxTurns": MAX_TURNS + 1}, "spec.environment.maxTurns", f"must be <= {MAX_TURNS}"),
    ({"maxTurns": 2.0}, "spec.environment.maxTurns", "must be an integer"),
    ({"maxTokensPerTurn": 0}, "spec.environment.maxTokensPerTurn", "must be >= 1"),
    ({"maxTokensPerTurn": MAX_TOKENS + 1}, "spec.environment.maxTokensPerTurn", f"must be <= {MAX_TOKENS}"),
    ({"maxTokensPerTurn": 64}, "spec.environment.maxTokensPerTurn",
     "maxTurns x maxTokensPerTurn = 3 x 64 = 192 tokens, more than rollout.maxNewTokens (128)"),
    ({"maxTurns": 200, "maxTokensPerTurn": 1}, "spec.environment.maxTokensPerTurn",
     "fix: set spec.rollout.maxNewTokens to at least 200 plus room for the observations, or set "
     "spec.environment.maxTurns to at most 128"),
    ({"timeoutSeconds": 0}, "spec.environment.timeoutSeconds", "must be > 0"),
    ({"timeoutSeconds": MAX_SECONDS * 2}, "spec.environment.timeoutSeconds", "must be <="),
    ({"timeoutSeconds": "10"}, "spec.environment.timeoutSeconds", "must be a number"),
    ({"concurrency": 0}, "spec.environment.concurrency", "must be >= 1"),
    ({"concurrency": 10**6}, "spec.environment.concurrency", "must be <= 4096"),
    ({"concurrency": True}, "spec.environment.concurrency", "not a boolean"),
    ({"klass": "X"}, "spec.environment.klass", "is not a known field (did you mean class?)"),
    ({"class_": "X"}, "spec.environment.class_", "is not a known field (did you mean class?)"),
])
def test_each_refusal_names_its_field_and_the_fix(change: dict, field: str, words: str) -> None:
    env = {k: v for k, v in {**ENV, **change}.items() if v is not None}  # None: the key left out
    line = one_error(manifest(env), field)
    assert words in line, line


def test_the_budget_fix_names_the_largest_turn_that_fits() -> None:
    line = one_error(manifest({**ENV, "maxTokensPerTurn": 50}), "spec.environment.maxTokensPerTurn")
    assert "or set spec.environment.maxTokensPerTurn to at most 42" in line  # 128 // 3


def test_the_crd_holds_the_environment_under_its_yaml_names() -> None:
    spec = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    env = spec["properties"]["environment"]
    assert env["nullable"] is True and env["required"] == ["module"] and "environment" not in spec.get("required", [])
    assert set(env["properties"]) == {"module", "class", "maxTurns", "maxTokensPerTurn", "timeoutSeconds",
                                      "concurrency"}
    assert env["properties"]["class"]["pattern"] == r"^[A-Za-z_]\w*$"
    assert env["properties"]["maxTurns"] == {**env["properties"]["maxTurns"], "minimum": 1, "maximum": MAX_TURNS}
    assert env["properties"]["timeoutSeconds"]["exclusiveMinimum"] is True
    assert all(p.get("description") for p in env["properties"].values())


ENV_MODULE = """
from kuberl.envs import EnvStep


class CalculatorEnv:
    def reset(self, row):
        self.answer = row["answer"]
        return row["prompt"]

    def step(self, action_text):
        done = self.answer in action_text
        return EnvStep("", float(done), done, {})
"""


@pytest.fixture
def agent_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A manifest with my_env.py beside it (a module name of this test's own, so no other test's is imported)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    name = f"kuberl_test_agent_env_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(ENV_MODULE)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest({**ENV, "module": name})))
    return job


def test_validate_loads_the_class_beside_the_manifest(agent_job: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", str(agent_job)]) == 0, capsys.readouterr().err
    assert "valid RLTrainingJob 'agent'" in capsys.readouterr().out


def test_validate_refuses_a_class_the_module_does_not_have(agent_job: Path, capsys: pytest.CaptureFixture) -> None:
    agent_job.write_text(agent_job.read_text().replace("CalculatorEnv", "CalcEnv"))
    assert main(["validate", str(agent_job)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: spec.environment.class: module ") and \
        "has no 'CalcEnv'; its classes: CalculatorEnv" in lines[0], lines
