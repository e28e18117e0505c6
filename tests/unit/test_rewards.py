"""Rule rewards: built-in values, the GSM8K `#### <answer>` matcher, and loading by import path."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest

from kuberl.rewards import RewardImportError, load_reward_fn
from kuberl.rewards.builtin import gsm8k, gsm8k_answer, repeat_letter

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)


@pytest.mark.parametrize("response,answer,want", [
    ("cccc", "c", 1.0),
    ("ccab", "c", 0.5),
    ("aaab", "a", 0.75),
    ("bbbb", "c", 0.0),
    ("", "c", 0.0),
    ("cccc", None, 0.0),
    ("cccc", "", 0.0),
])
def test_repeat_letter(response: str, answer, want: float) -> None:
    assert repeat_letter("say c:", response, answer) == pytest.approx(want)


@pytest.mark.parametrize("text,want", [
    ("so the total is #### 1,234", "1234"),
    ("#### -5", "-5"),
    ("####3.75", "3.75"),
    ("#### -1,000.5 dollars", "-1000.5"),
    ("first #### 3 then #### 4", "4"),
    ("the answer is 72", None),
    ("#### ", None),
    (GSM8K_SOLUTION, "72"),
])
def test_gsm8k_answer_extraction(text: str, want) -> None:
    assert gsm8k_answer(text) == want


@pytest.mark.parametrize("response,answer,want", [
    ("48/2=24, 48+24=72 #### 72", GSM8K_SOLUTION, 1.0),   # reference is a full GSM8K solution
    ("#### 71", GSM8K_SOLUTION, 0.0),
    ("#### 1,000", "1000", 1.0),                       # commas in the response
    ("#### 1000", "1,000", 1.0),                       # commas in a bare reference
    ("#### -3", "-3", 1.0),
    ("#### 3", "-3", 0.0),
    ("#### 2.50", "2.5", 1.0),                         # numeric, not string, comparison
    ("#### 0.5", "#### .5", 1.0),
    ("72", "72", 0.0),                                 # no marker in the response
    ("the answer is 72.", GSM8K_SOLUTION, 0.0),
    ("#### 72", None, 0.0),
    ("#### 7", " 7 ", 1.0),
])
def test_gsm8k_reward(response: str, answer, want: float) -> None:
    assert gsm8k("q", response, answer) == want


def test_load_reward_fn_good_path() -> None:
    call = load_reward_fn("kuberl.rewards.builtin:gsm8k")
    assert call.fn is gsm8k and call.keywords == ("prompt", "response", "answer") and call.needs_answer
    assert load_reward_fn("kuberl.rewards.builtin:repeat_letter")("p", "aa", "a", {}) == 1.0


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write modules into tmp_path (on sys.path for this test); they are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def load_error(path: str) -> str:
    with pytest.raises(RewardImportError) as info:
        load_reward_fn(path)
    msg = str(info.value)
    assert msg.startswith("spec.reward.function: ") and "(fix: " in msg, msg
    assert isinstance(info.value, ValueError)
    return msg


def test_user_module_on_sys_path_loads(user_modules) -> None:
    user_modules("kuberl_test_reward_ok",
                 "def score(prompt, response, answer):\n    return float(response == answer)\n")
    fn = load_reward_fn("kuberl_test_reward_ok:score")
    assert fn("p", "x", "x", {}) == 1.0 and fn("p", "x", "y", {}) == 0.0


def test_missing_module_names_field_and_fix() -> None:
    msg = load_error("kuberl_no_such_package.rewards:score")
    assert "cannot import module 'kuberl_no_such_package.rewards'" in msg
    assert "install the package" in msg


def test_missing_attribute_names_field_and_fix(user_modules) -> None:
    user_modules("kuberl_test_reward_attr", "def score(p, r, a):\n    return 0.0\n")
    msg = load_error("kuberl_test_reward_attr:scroe")
    assert "has no attribute 'scroe'" in msg and "check the function name" in msg


def test_not_callable_names_field_and_fix(user_modules) -> None:
    user_modules("kuberl_test_reward_value", "score = 0.5\n")
    msg = load_error("kuberl_test_reward_value:score")
    assert "is not callable" in msg


def test_module_that_raises_on_import(user_modules) -> None:
    user_modules("kuberl_test_reward_boom", "raise RuntimeError('no GPU for the judge')\n")
    msg = load_error("kuberl_test_reward_boom:score")
    assert "raised RuntimeError: no GPU for the judge" in msg and "make the module importable" in msg


def test_module_with_syntax_error(user_modules) -> None:
    user_modules("kuberl_test_reward_syntax", "def score(:\n")
    msg = load_error("kuberl_test_reward_syntax:score")
    assert "raised SyntaxError" in msg


@pytest.mark.parametrize("source, keywords, needs_answer", [
    ("def score(p, r, a):\n    return float(r == a)\n", None, True),                 # positional, any names
    ("def score(p, r, a=None):\n    return 1.0\n", None, False),
    ("def score(prompt, response, answer):\n    return 1.0\n", ("prompt", "response", "answer"), True),
    ("def score(response, row):\n    return float(row['level'] == 2)\n", ("response", "row"), False),
    ("def score(response, *, answer=None, row):\n    return 1.0\n", ("response", "answer", "row"), False),
    ("def score(**kw):\n    return float(kw['row']['level'])\n", ("prompt", "response", "answer", "row"), False),
    ("def score(*args):\n    return 1.0\n", None, False),
])
def test_signatures_that_work(user_modules, source: str, keywords, needs_answer: bool) -> None:
    name = user_modules(f"kuberl_test_sig_{abs(hash(source))}", source)
    call = load_reward_fn(f"{name}:score")
    assert (call.keywords, call.needs_answer) == (keywords, needs_answer)
    assert isinstance(call("say a:", "a", "a", {"level": 2}), float)


@pytest.mark.parametrize("source", ["def score(p, r):\n    return 1.0\n", "def score(text, weight):\n    return 1.0\n",
                                    "def score(a, b, c, d):\n    return 1.0\n"])
def test_unusable_signature_names_field_and_fix(user_modules, source: str) -> None:
    name = user_modules(f"kuberl_test_badsig_{abs(hash(source))}", source)
    msg = load_error(f"{name}:score")
    assert "cannot be called as a reward" in msg and "fn(prompt, response, answer)" in msg


def test_reward_exception_reports_user_file_line_and_sample(user_modules, tmp_path: Path) -> None:
    from kuberl.rewards import RewardFunctionError

    name = user_modules("kuberl_test_reward_raises", "import math\n\ndef score(response, row):\n"
                                                     "    return math.sqrt(-row['level'])\n")
    call = load_reward_fn(f"{name}:score")
    with pytest.raises(RewardFunctionError) as info:
        call.score("say a:", "aaa", None, {"level": 3}, "train.jsonl:7")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"spec.reward.function {name}:score raised ValueError: math domain error")
    assert f"at {tmp_path / (name + '.py')}:4 (in score)" in msg
    assert "on sample train.jsonl:7" in msg and "'say a:'" in msg
    # What goes into the job's status: where, but no sample text and not the exception's own message.
    public = pickle.loads(pickle.dumps(info.value)).public  # as Ray carries it from the reward role
    assert public.startswith(f"spec.reward.function {name}:score raised ValueError at {tmp_path / (name + '.py')}:4")
    assert "on sample train.jsonl:7" in public and "say a" not in public and "aaa" not in public
    assert "math domain" not in public
    with pytest.raises(RewardFunctionError, match="raised TypeError"):  # a non-number return
        load_reward_fn(user_modules("kuberl_test_reward_str", "def score(p, r, a):\n    return None\n") + ":score"
                       ).score("p", "r", None, {}, "x:1")


def test_manifest_folder_becomes_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kuberl.rewards import add_import_dir

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    (tmp_path / "kuberl_test_nextdoor.py").write_text("def score(p, r, a):\n    return 0.25\n")
    add_import_dir(tmp_path)
    try:
        assert load_reward_fn("kuberl_test_nextdoor:score")("p", "r", None, {}) == 0.25
        assert os.environ["PYTHONPATH"] == f"/elsewhere{os.pathsep}{tmp_path.resolve()}"  # for Ray's workers
    finally:
        sys.modules.pop("kuberl_test_nextdoor", None)
