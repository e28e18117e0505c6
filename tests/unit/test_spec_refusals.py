"""Input that validation used to let through (issue 28): a misspelt metadata key, a boolean or a float where an
integer is wanted, more tokens than the model's context, a data file without prompts, and `kuberl validate` of a
manifest whose modules resolve from the repository root. Each is refused with one line naming the field and the fix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from kuberl.cli import main
from kuberl.spec import SpecInvalid, parse_yaml, validate_manifest

REPO = Path(__file__).resolve().parents[2]


def manifest(metadata: dict | None = None, **spec) -> dict:
    base = {"data": {"task": "repeat-letter", "batchSize": 4}, "reward": {"function": "repeat-letter"},
            "trainer": {"steps": 8, "miniBatchSize": 4, "microBatchSize": 4}}
    base.update(spec)
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": metadata or {"name": "t"},
            "spec": base}


def errors_of(obj: dict) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        validate_manifest(obj)
    lines = [str(e) for e in info.value.errors]
    assert all("\n" not in line and "(fix: " in line for line in lines), lines
    return lines


def one_error(obj: dict, field: str) -> str:
    lines = errors_of(obj)
    assert len(lines) == 1 and lines[0].startswith(f"{field}: "), lines
    return lines[0]


# -- metadata ----------------------------------------------------------------------------------------


def test_a_misspelt_metadata_key_is_refused_not_defaulted() -> None:
    line = one_error(manifest({"nmae": "my-job"}), "metadata.nmae")
    assert "did you mean name?" in line
    text = "apiVersion: kuberl.io/v1alpha1\nkind: RLTrainingJob\nmetadata:\n  nmae: my-job\nspec:\n" \
           "  data: {task: repeat-letter}\n  reward: {function: repeat-letter}\n"
    assert errors_of(parse_yaml(text)) == [line]


def test_metadata_of_a_live_object_is_accepted() -> None:
    """What the API server adds to an object the operator reads (kubectl get -o yaml shows the same)."""
    meta = {"name": "j", "namespace": "team-a", "uid": "0b6f1c2e-1111-2222-3333-444455556666",
            "resourceVersion": "81723", "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app.kubernetes.io/name": "kuberl"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": '{"kind": "RLTrainingJob"}'},
            "finalizers": ["kuberl.io/cleanup"], "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o",
                                                                      "uid": "u"}],
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {}}}],
            "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 0, "generateName": "j-"}
    job = validate_manifest(manifest(meta))
    assert job.metadata.name == "j" and job.metadata.namespace == "team-a" and job.metadata.generation == 3


@pytest.mark.parametrize("meta, field", [
    ({"name": "t", "generation": "3"}, "metadata.generation"),
    ({"name": "t", "labels": {"team": 7}}, "metadata.labels.team"),
    ({"name": "t", "labels": {"bad key!": "x"}}, "metadata.labels"),
    ({"name": "t", "annotations": {"-x": "y"}}, "metadata.annotations"),
    ({"name": "t", "resource_version": "1"}, "metadata.resource_version"),
    ({"name": True}, "metadata.name"),
])
def test_metadata_fields_are_typed(meta: dict, field: str) -> None:
    one_error(manifest(meta), field)


# -- strict types ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, words", [
    (True, "must be an integer, not a boolean (got true)"),
    (8.0, "must be an integer (got 8.0, a float)"),
    ("8", "must be an integer (got the text '8')"),
])
def test_steps_takes_an_integer_only(value, words: str) -> None:
    line = one_error(manifest(trainer={"steps": value, "miniBatchSize": 4, "microBatchSize": 4}),
                     "spec.trainer.steps")
    assert words in line, line


def test_yaml_true_for_steps_is_refused() -> None:
    text = yaml.safe_dump(manifest()).replace("steps: 8", "steps: true")
    assert "steps: true" in text
    assert one_error(parse_yaml(text), "spec.trainer.steps")


@pytest.mark.parametrize("section, field, value, fix", [
    ("trainer", "actorLr", "1e-3", "write spec.trainer.actorLr as 0.001"),  # quoted: text
    ("trainer", "actorLr", True, "give spec.trainer.actorLr a number value"),
    ("rollout", "fixedLength", "yes", "write spec.rollout.fixedLength as true or false"),
    ("rollout", "fixedLength", 1, "write spec.rollout.fixedLength as true or false"),
    ("model", "builtin", 5, "set spec.model.builtin to one of"),
    ("data", "promptKey", 5, 'quote the value of spec.data.promptKey: "5"'),
])
def test_no_coercion_between_types(section: str, field: str, value, fix: str) -> None:
    spec = {section: {field: value}}
    if section == "data":
        spec["data"] = {"task": "repeat-letter", "batchSize": 4, field: value}
    line = one_error(manifest(**spec), f"spec.{section}.{field}")
    assert f"(fix: {fix}" in line, line


def test_exponents_without_a_dot_are_numbers_as_kubectl_reads_them() -> None:
    """`actorLr: 1e-6` is a float and `cpu: 1e3` the integer 1000 (YAML 1.2; PyYAML alone reads both as text)."""
    text = yaml.safe_dump(manifest()).replace("steps: 8", "steps: 8\n    actorLr: 1e-6")
    job = validate_manifest(parse_yaml(text))
    assert job.spec.trainer.actor_lr == 1e-6
    job = validate_manifest(manifest(roles={"actor": {"resources": {"cpu": 1e3, "memory": "2Gi"}}}))
    assert job.spec.roles.actor.resources.cpu == "1000"
    one_error(manifest(roles={"actor": {"resources": {"cpu": 0.5}}}), "spec.roles.actor.resources.cpu")


def test_numbers_and_quantities_keep_their_own_forms() -> None:
    """A float field takes an integer (JSON and YAML write 1.0 as 1); cpu and memory take an integer or a string,
    as Kubernetes' int-or-string does."""
    job = validate_manifest(manifest(trainer={"steps": 8, "miniBatchSize": 4, "microBatchSize": 4, "actorLr": 1},
                                     roles={"actor": {"resources": {"cpu": 2, "memory": "2Gi"}},
                                            "ref": {"resources": {"cpu": "500m", "memory": 1073741824}}}))
    assert job.spec.trainer.actor_lr == 1.0 and job.spec.roles.actor.resources.cpu == "2"
    one_error(manifest(roles={"actor": {"resources": {"cpu": True}}}), "spec.roles.actor.resources.cpu")


# -- bounds ------------------------------------------------------------------------------------------


def test_max_new_tokens_of_1e12_is_refused_however_yaml_reads_it() -> None:
    base = yaml.safe_dump(manifest(rollout={"maxNewTokens": 16}))
    for written in ("1.0e+12", "1e12", "1000000000000"):
        obj = parse_yaml(base.replace("maxNewTokens: 16", f"maxNewTokens: {written}"))
        line = one_error(obj, "spec.rollout.maxNewTokens")
        assert ("must be an integer" in line) if written != "1000000000000" else ("must be <= 1048576" in line)


def test_prompt_and_response_must_fit_a_builtin_models_context() -> None:
    line = one_error(manifest(rollout={"maxNewTokens": 4090}), "spec.rollout.maxNewTokens")
    assert "4122 tokens, more than the 4096 positions of spec.model.builtin (tiny)" in line
    assert "set spec.rollout.maxNewTokens to at most 4064" in line
    line = one_error(manifest(data={"task": "repeat-letter", "batchSize": 4, "maxPromptLength": 5000}),
                     "spec.data.maxPromptLength")
    assert "4096 positions" in line
    assert validate_manifest(manifest(rollout={"maxNewTokens": 4064})).spec.rollout.max_new_tokens == 4064


def test_prompt_and_response_must_fit_a_local_models_context(tmp_path: Path) -> None:
    from kuberl.preflight import context_lines

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 40}))
    spec = validate_manifest(manifest(model={"path": str(tmp_path)})).spec
    (line,) = context_lines(spec)
    assert line.startswith("spec.rollout.maxNewTokens: is 16: with spec.data.maxPromptLength (32) that is 48 tokens")
    assert f"40 positions of spec.model.path ({tmp_path})" in line and "(fix: " in line
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 48}))
    assert context_lines(spec) == []
    (tmp_path / "config.json").write_text("{}")  # no such key: nothing known, nothing refused
    assert context_lines(spec) == []


@pytest.mark.parametrize("section, field, value", [
    ("trainer", "steps", 10**9), ("data", "batchSize", 10**6), ("rollout", "n", 4096),
    ("trainer", "seed", 2**40), ("resilience", "callTimeoutSeconds", 1e9),
])
def test_counts_have_upper_bounds(section: str, field: str, value) -> None:
    spec = {section: {field: value}}
    if section == "data":
        spec["data"] = {"task": "repeat-letter", field: value}
    if section == "trainer":
        spec["trainer"] = {"steps": 8, "miniBatchSize": 4, "microBatchSize": 4, field: value}
    assert "must be <= " in one_error(manifest(**spec), f"spec.{section}.{field}")


# -- data content ------------------------------------------------------------------------------------


def write_job(folder: Path, rows: list[dict], batch: int = 4) -> Path:
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    obj = manifest(data={"files": [str(folder / "train.jsonl")], "batchSize": batch})
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump(obj))
    return job


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_job makes folders importable (sys.path, PYTHONPATH): keep that from the rest of the session."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")


@pytest.mark.parametrize("rows, field, words", [
    ([{"prompt": "", "answer": "a"}] * 8, "spec.data.promptKey", "its field 'prompt' is empty"),
    ([{"prompt": None, "answer": "a"}] * 8, "spec.data.promptKey", "its field 'prompt' is null, not text"),
    ([{"prompt": "   "}] * 8, "spec.data.promptKey", "is empty"),
    ([{"prompt": ["a"]}] * 8, "spec.data.promptKey", "is a list, not text"),
    ([{"prompt": "say a:", "answer": "a"}] * 3, "spec.data.files", "holds 3 prompts, fewer than one step's batch"),
])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_data_without_prompts_is_refused_by_validate_and_run(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             isolated_imports: None, rows: list[dict], field: str,
                                                             words: str, command: str) -> None:
    job = write_job(tmp_path, rows)
    extra = ["--out", str(tmp_path / "out")] if command == "run" else []
    assert main([command, str(job), *extra]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: ") and words in lines[0], lines
    assert "(fix: " in lines[0] and not (tmp_path / "out").exists()


def test_one_batch_of_prompts_is_enough(tmp_path: Path, capsys: pytest.CaptureFixture,
                                        isolated_imports: None) -> None:
    assert main(["validate", str(write_job(tmp_path, [{"prompt": "say a:", "answer": "a"}] * 4))]) == 0
    assert "checked manifest, data, reward and model" in capsys.readouterr().out


# -- import paths ------------------------------------------------------------------------------------


def test_validate_of_remax_from_the_repository_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                                    isolated_imports: None) -> None:
    """examples/remax.yaml names examples.rule_engine:RuleEngineWorker, importable from the repository root as
    `python -m examples.remax` has it: `kuberl validate` (and `kuberl run`) resolve it from there too."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != REPO])
    monkeypatch.delitem(sys.modules, "examples", raising=False)
    monkeypatch.delitem(sys.modules, "examples.rule_engine", raising=False)
    assert main(["validate", "examples/remax.yaml"]) == 0, capsys.readouterr().err
    assert "valid RLTrainingJob 'remax'" in capsys.readouterr().out


# -- packing -----------------------------------------------------------------------------------------


def test_a_token_budget_below_one_sequence_is_refused_and_one_that_fits_packs() -> None:
    trainer = {"steps": 8, "miniBatchSize": 4, "microBatchSize": 4}
    line = one_error(manifest(trainer={**trainer, "maxTokensPerMicroBatch": 40}), "spec.trainer.maxTokensPerMicroBatch")
    assert "data.maxPromptLength + rollout.maxNewTokens = 48" in line and "at least 48" in line
    job = validate_manifest(manifest(trainer={**trainer, "maxTokensPerMicroBatch": 48}))
    assert job.spec.trainer.packed and job.spec.trainer.max_tokens_per_micro_batch == 48
    assert not validate_manifest(manifest()).spec.trainer.packed
    assert validate_manifest(manifest(trainer={**trainer, "packing": True})).spec.trainer.packed
