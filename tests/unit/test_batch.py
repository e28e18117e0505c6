"""`Batch`: split/concat, minibatches, select, index — tensors and per-sample metadata stay aligned."""

from __future__ import annotations

import pytest
import torch

from kuberl.data.batch import Batch


def make(n: int = 6) -> Batch:
    """Row i holds x = [3i, 3i+1, 3i+2], y = i, meta tag = 'r<i>' (so alignment is checkable)."""
    return Batch({"x": torch.arange(3 * n).reshape(n, 3), "y": torch.arange(n).float()},
                 {"tag": [f"r{i}" for i in range(n)], "answer": [str(i) for i in range(n)]})


def assert_aligned(b: Batch) -> None:
    for row, y, tag in zip(b["x"].tolist(), b["y"].tolist(), b.meta["tag"]):
        i = int(y)
        assert row == [3 * i, 3 * i + 1, 3 * i + 2] and tag == f"r{i}"


def assert_equal(a: Batch, b: Batch) -> None:
    assert a.tensors.keys() == b.tensors.keys() and a.meta == b.meta
    for k in a.tensors:
        assert torch.equal(a[k], b[k])


def test_len_from_tensors_meta_or_empty() -> None:
    assert len(make(5)) == 5
    assert len(Batch(meta={"m": [1, 2, 3]})) == 3
    assert len(Batch()) == 0


def test_split_concat_round_trip() -> None:
    b = make(6)
    parts = b.split(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert parts[1].meta["tag"] == ["r2", "r3"] and parts[1]["y"].tolist() == [2.0, 3.0]
    for p in parts:
        assert_aligned(p)
    assert_equal(Batch.concat(parts), b)
    assert_equal(Batch.concat(b.split(1)), b)
    assert len(Batch.concat([])) == 0


def test_uneven_split_names_sizes() -> None:
    with pytest.raises(ValueError, match="batch of 6 cannot be split evenly across 4 ranks"):
        make(6).split(4)


@pytest.mark.parametrize("n,size", [(8, 2), (7, 3), (6, 6), (5, 10)])
def test_seeded_minibatches_cover_every_row_once(n: int, size: int) -> None:
    b = make(n)
    mbs = list(b.minibatches(size, generator=torch.Generator().manual_seed(0)))
    assert [len(m) for m in mbs] == [min(size, n - s) for s in range(0, n, size)]
    for m in mbs:
        assert_aligned(m)
    seen = sorted(int(y) for m in mbs for y in m["y"].tolist())
    assert seen == list(range(n))
    again = list(b.minibatches(size, generator=torch.Generator().manual_seed(0)))
    assert [m.meta["tag"] for m in again] == [m.meta["tag"] for m in mbs]


def test_seeded_minibatches_shuffle_and_unseeded_keep_order() -> None:
    b = make(16)
    ordered = [m.meta["tag"] for m in b.minibatches(4)]
    assert ordered == [[f"r{i}" for i in range(s, s + 4)] for s in range(0, 16, 4)]
    shuffled = [t for m in b.minibatches(4, generator=torch.Generator().manual_seed(1)) for t in m.meta["tag"]]
    assert shuffled != [t for m in ordered for t in m]
    other = [t for m in b.minibatches(4, generator=torch.Generator().manual_seed(2)) for t in m.meta["tag"]]
    assert other != shuffled


def test_select_keeps_only_named_keys() -> None:
    s = make(4).select("x", "tag", "absent")
    assert set(s.tensors) == {"x"} and set(s.meta) == {"tag"}
    assert len(s) == 4


def test_index_with_tensor_and_slice() -> None:
    b = make(6)
    picked = b.index(torch.tensor([4, 0, 2]))
    assert picked["y"].tolist() == [4.0, 0.0, 2.0]
    assert picked.meta["tag"] == ["r4", "r0", "r2"] and picked.meta["answer"] == ["4", "0", "2"]
    assert_aligned(picked)
    sl = b.index(slice(1, 6, 2))
    assert sl.meta["tag"] == ["r1", "r3", "r5"] and sl["y"].tolist() == [1.0, 3.0, 5.0]


def test_update_and_to_keep_meta() -> None:
    b = make(3).select("x", "tag")
    b.update(Batch({"z": torch.zeros(3)}, {"answer": ["a", "b", "c"]}))
    assert set(b.tensors) == {"x", "z"} and b.meta["answer"] == ["a", "b", "c"]
    moved = b.to("cpu")
    assert moved.meta == b.meta and torch.equal(moved["x"], b["x"])
