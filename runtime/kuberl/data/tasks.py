"""Prompt sources: built-in tasks generated locally, or jsonl/parquet files.

A `PromptLoader` yields batches of `{"prompt": str, "answer": str | None, "row": dict, "origin": str}`
(`row` is the whole source row, passed to reward functions that ask for it) in a seeded order, and
its position (`epoch`, `index`) is saved in checkpoints so a resumed run sees the same data.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.spec.model import DataSpec

LETTERS = "abcdef"


def repeat_letter_task(n: int = 512, seed: int = 1234) -> list[dict[str, str]]:
    """'say c:' -> the response should repeat the letter ('ccccc...'); reward = share of that letter."""
    rng = random.Random(seed)
    return [{"prompt": f"say {c}:", "answer": c} for c in (rng.choice(LETTERS) for _ in range(n))]


def gsm8k_toy_task(n: int = 512, seed: int = 1234) -> list[dict[str, str]]:
    """'3+4=' with answer '7': graded by the GSM8K-style `#### <answer>` matcher."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


BUILTIN_TASKS = {"repeat-letter": repeat_letter_task, "gsm8k-toy": gsm8k_toy_task}
HELDOUT_SEED = 4321
"""Seed of a built-in task's held-out split (`spec.data.eval` without files): other rows than training's."""


class DataError(ValueError):
    """A dataset problem, with the spec field to fix."""


def read_rows(path: str, field: str) -> list[tuple[str, dict[str, Any]]]:
    """(origin, row) for each row of a .jsonl or .parquet file; origin is 'file:line' or 'file row i'.
    DataError names `field` and the fix."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{field}: file {path!r} does not exist (fix: check the path, relative to the folder you run "
                        "kuberl in; in Kubernetes mount it into the pods)")
    if not p.is_file():
        raise DataError(f"{field}: {path!r} is not a file (fix: name a .jsonl or .parquet file)")
    try:
        with p.open("rb"):
            pass
    except OSError as exc:
        raise DataError(f"{field}: {path} cannot be read ({exc.strerror or exc}) (fix: check its permissions)"
                        ) from None
    return jsonl_rows(p, path, field) if p.suffix == ".jsonl" else parquet_rows(p, path, field)


def jsonl_rows(p: Path, path: str, field: str) -> list[tuple[str, dict[str, Any]]]:
    """(path:line, row) for each non-blank line of a JSON-lines file; DataError names `field` and the fix."""
    try:
        lines = p.read_text().splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{field}: {path} is not UTF-8 text (byte {exc.start}) "
                        "(fix: save it as UTF-8 JSON lines)") from None
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{field}: {path} line {i} is not JSON ({exc.msg}) "
                            "(fix: one JSON object per line)") from None
        if not isinstance(obj, dict):
            raise DataError(f"{field}: {path} line {i} is a JSON {type(obj).__name__}, not an object "
                            "(fix: one JSON object per line)")
        rows.append((f"{path}:{i}", obj))
    return rows


def parquet_rows(p: Path, path: str, field: str) -> list[tuple[str, dict[str, Any]]]:
    """(path row i, row) for each row of a parquet file; DataError names `field` and the fix."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{field}: {path} is not a readable parquet file ({first}) "
                        "(fix: rewrite it with pyarrow/pandas)") from None
    return [(f"{path} row {i}", row) for i, row in enumerate(table.to_pylist())]


def rows_of_files(files: list[str], prompt_key: str, answer_key: str, field: str = "spec.data",
                  need_answer: str = "") -> list[dict[str, Any]]:
    """Rows of `files` as {'prompt', 'answer', 'row' (the whole source row), 'origin'}. With `need_answer`
    (the reward that takes it), every row must hold `answer_key`."""
    rows: list[dict[str, Any]] = []
    for i, path in enumerate(files):
        for origin, row in read_rows(path, f"{field}.files[{i}]"):
            if prompt_key not in row:
                raise DataError(f"{field}.promptKey: {origin} has no field {prompt_key!r} (fields: {sorted(row)}) "
                                f"(fix: set {field}.promptKey to the field holding the prompt)")
            prompt = row[prompt_key]
            if not isinstance(prompt, str) or not prompt.strip():
                what = "is empty" if isinstance(prompt, str) else f"is {describe(prompt)}, not text"
                raise DataError(f"{field}.promptKey: {origin} has no prompt: its field {prompt_key!r} {what} "
                                f"(fix: give every row a non-empty text prompt in {prompt_key!r}, or set "
                                f"{field}.promptKey to the field holding it)")
            answer = row.get(answer_key)
            if need_answer and answer is None:
                raise DataError(f"{field}.answerKey: {origin} has no field {answer_key!r}, which the reward "
                                f"{need_answer} takes (fields: {sorted(row)}) (fix: set {field}.answerKey to the field "
                                "holding the reference answer, or give the reward's answer parameter a default)")
            rows.append({"prompt": prompt, "answer": None if answer is None else str(answer),
                         "row": row, "origin": origin})
    if not rows:
        raise DataError(f"{field}.files: the files hold no rows (fix: give non-empty files)")
    return rows


def describe(value: Any) -> str:
    """A JSON value's kind, for a message: null, a number, a list, an object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def batch_problem(data: DataSpec, rows: list[dict[str, Any]]) -> str | None:
    """Why the rows of `data.files` cannot fill one step's batch of `data.batchSize` distinct prompts, or None.
    (A built-in task is generated, not given: a larger batch repeats its prompts, as it always has.)"""
    if not data.files or len(rows) >= data.batch_size:
        return None
    return (f"spec.data.files: the data holds {len(rows)} prompts, fewer than one step's batch (spec.data.batchSize: "
            f"{data.batch_size}) (fix: add prompts, or set spec.data.batchSize to at most {len(rows)})")


def task_rows(task: str, seed: int = 1234) -> list[dict[str, Any]]:
    """A built-in task's rows in the same shape as `rows_of_files`."""
    return [{**r, "row": dict(r), "origin": f"{task}[{i}]"} for i, r in enumerate(BUILTIN_TASKS[task](seed=seed))]


def load_rows(data: DataSpec, need_answer: str = "") -> list[dict[str, Any]]:
    """All training rows of a data spec: {'prompt', 'answer', 'row', 'origin'} each."""
    if data.task:
        return task_rows(data.task)
    return rows_of_files(data.files, data.prompt_key, data.answer_key, "spec.data", need_answer)


def load_eval_rows(data: DataSpec, need_answer: str = "") -> list[dict[str, Any]]:
    """The held-out rows of `spec.data.eval` (its files, or the held-out split of a built-in task),
    at most `eval.maxPrompts` of them, in order; [] when there is no eval section."""
    ev = data.eval
    if ev is None:
        return []
    if ev.files:
        rows = rows_of_files(ev.files, data.prompt_key, data.answer_key, "spec.data.eval", need_answer)
    else:
        rows = task_rows(ev.task or data.task, seed=HELDOUT_SEED)
    return rows[: ev.max_prompts]


META_KEYS = ("prompt", "answer", "row", "origin")
"""Per-sample metadata a prompt batch carries to the reward role."""


def prompt_batch(rows: list[dict[str, Any]], tokenizer: Any, samples_per_prompt: int, max_prompt_length: int):
    """Rows -> a Batch of left-padded, left-truncated prompts, each repeated `samples_per_prompt` times:
    prompt_ids / prompt_mask [B, P], group_index [B] (B = len(rows) x samples), meta `META_KEYS`."""
    import torch

    from kuberl.data.batch import Batch

    rows = [r for r in rows for _ in range(samples_per_prompt)]
    enc = tokenizer([r["prompt"] for r in rows], padding=True, truncation=True, max_length=max_prompt_length,
                    return_tensors="pt")
    group = torch.arange(len(rows)) // samples_per_prompt
    return Batch({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"], "group_index": group},
                 {k: [r.get(k) for r in rows] for k in META_KEYS})


@dataclass
class PromptLoader:
    """Seeded, resumable iteration over prompt rows in batches of `batch_size`."""

    rows: list[dict[str, Any]]
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    epoch: int = 0
    index: int = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[dict[str, Any]]:
        out = []
        while len(out) < self.batch_size:
            order = self._order(self.epoch)
            if self.index >= len(order):
                self.epoch, self.index = self.epoch + 1, 0
                continue
            out.append(self.rows[order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
