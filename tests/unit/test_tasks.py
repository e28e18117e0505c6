"""Prompt sources: built-in tasks, jsonl/parquet files, field-named DataErrors, resumable loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kuberl.data.tasks import LETTERS, DataError, PromptLoader, gsm8k_toy_task, load_rows, repeat_letter_task
from kuberl.spec.model import DataSpec


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def data_error(spec: DataSpec) -> str:
    with pytest.raises(DataError) as info:
        load_rows(spec)
    msg = str(info.value)
    assert "(fix: " in msg, msg
    return msg


# -- built-in tasks ---------------------------------------------------------------------------------


def test_builtin_tasks_are_deterministic() -> None:
    assert repeat_letter_task() == repeat_letter_task()
    assert gsm8k_toy_task() == gsm8k_toy_task()
    assert repeat_letter_task(seed=1) != repeat_letter_task(seed=2)
    plain = lambda rows: [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]  # noqa: E731
    assert plain(load_rows(DataSpec(task="repeat-letter"))) == repeat_letter_task()
    assert plain(load_rows(DataSpec(task="gsm8k-toy"))) == gsm8k_toy_task()
    assert load_rows(DataSpec(task="gsm8k-toy"))[3]["origin"] == "gsm8k-toy[3]"


def test_builtin_task_contents() -> None:
    rows = repeat_letter_task(64)
    assert len(rows) == 64
    assert all(r["prompt"] == f"say {r['answer']}:" and r["answer"] in LETTERS for r in rows)
    assert len({r["answer"] for r in rows}) > 1
    for r in gsm8k_toy_task(64):
        a, b = r["prompt"].rstrip("=").split("+")
        assert int(r["answer"]) == int(a) + int(b)


# -- files ------------------------------------------------------------------------------------------


def test_jsonl_loads_and_normalises(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "2+2=", "solution": 4}\n\n{"question": "no answer"}\n')
    rows = load_rows(DataSpec(files=[str(path)], prompt_key="question", answer_key="solution"))
    assert rows == [{"prompt": "2+2=", "answer": "4", "row": {"question": "2+2=", "solution": 4},
                     "origin": f"{path}:1"},
                    {"prompt": "no answer", "answer": None, "row": {"question": "no answer"}, "origin": f"{path}:3"}]


def test_parquet_loads(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "train.parquet", [{"prompt": "say a:", "answer": "a", "extra": 1},
                                                      {"prompt": "say b:", "answer": "b", "extra": 2}])
    rows = load_rows(DataSpec(files=[path]))
    assert [(r["prompt"], r["answer"], r["origin"]) for r in rows] == [("say a:", "a", f"{path} row 0"),
                                                                       ("say b:", "b", f"{path} row 1")]
    assert rows[1]["row"] == {"prompt": "say b:", "answer": "b", "extra": 2}  # every field reaches the reward


def test_several_files_concatenate_in_order(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "1"}])
    b = write_parquet(tmp_path / "b.parquet", [{"prompt": "2"}, {"prompt": "3"}])
    assert [r["prompt"] for r in load_rows(DataSpec(files=[a, b]))] == ["1", "2", "3"]


def test_missing_file_names_its_index(tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "x"}])
    msg = data_error(DataSpec(files=[str(tmp_path / "nope.jsonl")]))
    assert msg.startswith("spec.data.files[0]: ") and "does not exist" in msg
    msg = data_error(DataSpec(files=[good, str(tmp_path / "nope.parquet")]))
    assert msg.startswith("spec.data.files[1]: ")


def test_bad_json_line_names_field_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": oops}\n')
    msg = data_error(DataSpec(files=[str(path)]))
    assert msg.startswith("spec.data.files[0]: ") and "line 2 is not JSON" in msg


def test_corrupt_parquet_names_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"this is not parquet")
    msg = data_error(DataSpec(files=[str(path)]))
    assert msg.startswith("spec.data.files[0]: ") and "not a readable parquet file" in msg


def test_missing_prompt_key_names_prompt_key(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"question": "2+2=", "answer": "4"}])
    msg = data_error(DataSpec(files=[path]))
    assert msg.startswith("spec.data.promptKey: ") and "'prompt'" in msg and "question" in msg


def test_empty_files_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert data_error(DataSpec(files=[str(path)])).startswith("spec.data.files: ")


@pytest.mark.parametrize("line", ["42", "null", '["prompt"]', '"prompt text"'])
def test_non_object_json_line_is_a_data_error(tmp_path: Path, line: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    assert data_error(DataSpec(files=[str(path)])).startswith("spec.data.files[0]: ")


def test_answer_key_required_when_the_reward_takes_it(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": "x"}, {"prompt": "b"}])
    assert len(load_rows(DataSpec(files=[path]))) == 2  # no reward needs it: a missing answer is None
    with pytest.raises(DataError) as info:
        load_rows(DataSpec(files=[path]), need_answer="my.mod:score")
    assert str(info.value).startswith(
        f"spec.data.answerKey: {path}:2 has no field 'answer', which the reward my.mod:score takes")


def test_unreadable_and_non_utf8_files_are_data_errors(tmp_path: Path) -> None:
    import os

    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    assert "is not UTF-8 text" in data_error(DataSpec(files=[str(bad)]))
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    assert "is not a file" in data_error(DataSpec(files=[str(folder)]))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.jsonl"
        locked.write_text('{"prompt": "x"}\n')
        locked.chmod(0)
        assert "cannot be read" in data_error(DataSpec(files=[str(locked)]))


def test_eval_rows_held_out_split_and_files(tmp_path: Path) -> None:
    from kuberl.data.tasks import load_eval_rows
    from kuberl.spec.model import EvalSpec

    held = load_eval_rows(DataSpec(task="gsm8k-toy", eval=EvalSpec(max_prompts=5)))
    assert len(held) == 5 and held != load_rows(DataSpec(task="gsm8k-toy"))[:5]
    path = write_jsonl(tmp_path / "held.jsonl", [{"q": f"{i}+1=", "a": str(i + 1)} for i in range(3)])
    rows = load_eval_rows(DataSpec(task="gsm8k-toy", prompt_key="q", answer_key="a", eval=EvalSpec(files=[path])))
    assert [r["prompt"] for r in rows] == ["0+1=", "1+1=", "2+1="]
    assert load_eval_rows(DataSpec(task="gsm8k-toy")) == []


# -- PromptLoader -----------------------------------------------------------------------------------


def rows(n: int) -> list[dict]:
    return [{"prompt": str(i), "answer": None} for i in range(n)]


def prompts(batch: list[dict]) -> list[str]:
    return [r["prompt"] for r in batch]


def test_loader_epochs_are_permutations() -> None:
    loader = PromptLoader(rows(10), batch_size=5, seed=3)
    first = prompts(loader.next_batch()) + prompts(loader.next_batch())
    assert sorted(first, key=int) == [str(i) for i in range(10)]
    assert first != [str(i) for i in range(10)]
    second = prompts(loader.next_batch()) + prompts(loader.next_batch())
    assert sorted(second, key=int) == sorted(first, key=int) and second != first
    assert loader.epoch == 1 and loader.index == 10


def test_loader_without_shuffle_keeps_order_and_wraps() -> None:
    loader = PromptLoader(rows(5), batch_size=3, shuffle=False)
    assert [prompts(loader.next_batch()) for _ in range(3)] == [["0", "1", "2"], ["3", "4", "0"], ["1", "2", "3"]]


def test_loader_state_round_trip_resumes_same_sequence() -> None:
    a = PromptLoader(rows(7), batch_size=3, seed=11)
    for _ in range(4):  # crosses an epoch boundary mid-batch
        a.next_batch()
    state = a.state_dict()
    assert state == {"epoch": a.epoch, "index": a.index}
    expected = [prompts(a.next_batch()) for _ in range(5)]

    b = PromptLoader(rows(7), batch_size=3, seed=11)
    b.load_state_dict(json.loads(json.dumps(state)))  # checkpoints store it as JSON
    assert [prompts(b.next_batch()) for _ in range(5)] == expected

    other_seed = PromptLoader(rows(7), batch_size=3, seed=12)
    other_seed.load_state_dict(state)
    assert [prompts(other_seed.next_batch()) for _ in range(5)] != expected
