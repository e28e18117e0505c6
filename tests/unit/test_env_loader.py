"""The environment class of spec.environment loaded from a real module beside a manifest (kuberl.envs.loader), each
failure one line naming the field and the fix; what a user's reset and step return, checked (kuberl.envs.interface).
"""

from __future__ import annotations

import itertools
import os
import sys
import textwrap
from pathlib import Path

import pytest

from kuberl.envs import (
    Environment,
    EnvironmentImportError,
    EnvStep,
    EnvStepError,
    ToolEnvironment,
    coerce_reset,
    coerce_step,
    load_environment_class,
    make_environment,
)
from kuberl.spec.model import EnvironmentSpec

GOOD = """
    from kuberl.envs import EnvStep

    class Guess:
        '''Say the row's answer to win.'''

        def reset(self, row):
            self.answer = row["answer"]
            return row["prompt"]

        def step(self, action_text):
            done = self.answer in action_text
            return EnvStep("" if done else "no, again", float(done), done, {"tries": 1})

    class AsTuple(Guess):
        def step(self, action_text):
            return ("again", 0, False, None)

    def not_a_class():
        pass

    NOT_A_CLASS = 3
"""
_names = itertools.count()


def module(tmp_path: Path, body: str) -> str:
    """Write `body` as a module of a fresh name in tmp_path (the manifest's folder); its name."""
    name = f"kuberl_test_env_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return name


@pytest.fixture(autouse=True)
def _restore_path(monkeypatch):
    """add_import_dir changes sys.path and PYTHONPATH: give both back after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


def load_error(name: str, cls: str | None, folder: Path) -> str:
    with pytest.raises(EnvironmentImportError) as info:
        load_environment_class(name, cls, folder)
    text = str(info.value)
    assert "\n" not in text and "(fix: " in text, text
    return text


def test_a_class_beside_the_manifest_loads_and_plays(tmp_path: Path) -> None:
    name = module(tmp_path, GOOD)
    spec = EnvironmentSpec(module=name, class_="Guess")
    env = make_environment(spec, tmp_path)
    assert type(env).__name__ == "Guess" and isinstance(env, Environment)
    assert coerce_reset(env.reset({"prompt": "say 4", "answer": "4"})) == "say 4"
    assert coerce_step(env.step("3")) == EnvStep("no, again", 0.0, False, {"tries": 1})
    assert coerce_step(env.step("it is 4")) == EnvStep("", 1.0, True, {"tries": 1})
    loaded = make_environment(EnvironmentSpec(module=name, class_="AsTuple"), tmp_path)
    assert coerce_step(loaded.step("x"), f"{name}.AsTuple") == EnvStep("again", 0.0, False, {})


def test_tools_is_the_built_in_tool_environment() -> None:
    assert load_environment_class("tools", None) is ToolEnvironment
    env = make_environment(EnvironmentSpec(module="tools"), prompt_key="question")
    assert isinstance(env, ToolEnvironment) and env.prompt_key == "question"


def test_a_module_that_is_not_there_names_the_module_field(tmp_path: Path) -> None:
    text = load_error("kuberl_no_such_env", "Env", tmp_path)
    assert text.startswith("spec.environment.module: cannot import module 'kuberl_no_such_env'")
    assert "put kuberl_no_such_env.py next to the manifest" in text


def test_a_module_missing_a_dependency_names_the_dependency(tmp_path: Path) -> None:
    name = module(tmp_path, "import kuberl_not_installed_dep\nclass Env: pass\n")
    text = load_error(name, "Env", tmp_path)
    assert text.startswith(f"spec.environment.module: importing {name!r} raised ModuleNotFoundError")
    assert "install kuberl_not_installed_dep in the runtime image" in text


@pytest.mark.parametrize("body, words", [
    ("raise RuntimeError('no GPU here')\n", "raised RuntimeError: no GPU here at "),
    ("def broken(:\n    pass\n", "raised SyntaxError: "),
])
def test_a_module_that_raises_while_importing_names_the_module_field_and_the_line(tmp_path: Path, body: str,
                                                                                  words: str) -> None:
    name = module(tmp_path, body)
    text = load_error(name, "Env", tmp_path)
    assert text.startswith(f"spec.environment.module: importing {name!r} {words}"), text
    assert f"{name}.py:1" in text and f"python -c 'import {name}'" in text


@pytest.mark.parametrize("cls, words", [
    ("Gues", "has no 'Gues'; its classes: AsTuple, Guess (fix: set spec.environment.class"),
    ("not_a_class", "is a function, not a class (fix: name a class with reset(row) and step(action_text))"),
    ("NOT_A_CLASS", "is an int, not a class"),
    (None, "is required for module"),
])
def test_a_class_that_is_not_there_or_not_a_class_names_the_class_field(tmp_path: Path, cls: str | None,
                                                                        words: str) -> None:
    name = module(tmp_path, GOOD)
    text = load_error(name, cls, tmp_path)
    assert text.startswith("spec.environment.class: ") and words in text, text


@pytest.mark.parametrize("body, words", [
    ("class Env:\n    def step(self, action_text): pass\n", "has no reset method (fix: define reset(self, row)"),
    ("class Env:\n    def reset(self, row): pass\n", "has no step method (fix: define step(self, action_text)"),
    ("class Env:\n    step = 3\n    def reset(self, row): pass\n", "has step, but it is an int, not a method"),
    ("class Env:\n    def reset(self): pass\n    def step(self, a): pass\n",
     "has reset(self), which cannot be called with a row alone"),
    ("class Env:\n    def reset(self, row): pass\n    def step(self, a, b): pass\n",
     "has step(self, a, b), which cannot be called with the turn's text alone"),
])
def test_a_class_without_reset_and_step_is_refused_naming_the_class_field(tmp_path: Path, body: str,
                                                                          words: str) -> None:
    name = module(tmp_path, body)
    text = load_error(name, "Env", tmp_path)
    assert text.startswith(f"spec.environment.class: {name}.Env {words}"), text


def test_static_class_and_default_argument_methods_are_accepted(tmp_path: Path) -> None:
    name = module(tmp_path, """
        class Env:
            @staticmethod
            def reset(row):
                return "go"

            @classmethod
            def step(cls, action_text, hint=None):
                return ("", 1.0, True, {})
    """)
    assert load_environment_class(name, "Env", tmp_path).__name__ == "Env"


def test_a_constructor_that_fails_names_the_class_field_and_the_line(tmp_path: Path) -> None:
    name = module(tmp_path, """
        class Env:
            def __init__(self):
                raise FileNotFoundError("tasks.json")

            def reset(self, row):
                return ""

            def step(self, action_text):
                return ("", 0.0, True, {})

        class NeedsArgs(Env):
            def __init__(self, level):
                pass
    """)
    with pytest.raises(EnvironmentImportError) as info:
        make_environment(EnvironmentSpec(module=name, class_="Env"), tmp_path)
    text = str(info.value)
    assert text.startswith(f"spec.environment.class: {name}.Env() raised FileNotFoundError: tasks.json at ")
    assert f"{name}.py:4 (fix: make the class constructible with no arguments" in text and "\n" not in text
    with pytest.raises(EnvironmentImportError, match=r"NeedsArgs\(\) raised TypeError: .*missing 1 required"):
        make_environment(EnvironmentSpec(module=name, class_="NeedsArgs"), tmp_path)


@pytest.mark.parametrize("value, want", [
    (EnvStep("obs", 1.0, False, {"k": 1}), EnvStep("obs", 1.0, False, {"k": 1})),
    (("obs", 1, True, {"k": 1}), EnvStep("obs", 1.0, True, {"k": 1})),
    (["obs", 0.5, False, None], EnvStep("obs", 0.5, False, {})),
])
def test_a_step_result_is_coerced_to_an_env_step(value, want: EnvStep) -> None:
    got = coerce_step(value)
    assert got == want and isinstance(got.reward, float)


def test_numpy_rewards_and_dones_are_taken_as_python_values() -> None:
    np = pytest.importorskip("numpy")
    got = coerce_step(("o", np.float32(0.5), np.bool_(True), {}))
    assert got == EnvStep("o", 0.5, True, {}) and type(got.done) is bool and type(got.reward) is float


@pytest.mark.parametrize("value, words", [
    (None, "step() returned None, not an EnvStep or a 4-tuple"),
    (("obs", 1.0, True), "step() returned a tuple of 3, not an EnvStep or a 4-tuple"),
    (("obs", 1.0, True, {}, {}), "step() returned a tuple of 5"),  # gymnasium's (obs, r, terminated, truncated, info)
    ({"observation": "x"}, "step() returned a dict"),
    ((3, 1.0, True, {}), "step()'s observation is an int, not a str"),
    (("o", "1.0", True, {}), "step()'s reward is a str ('1.0'), not a finite number"),
    (("o", True, True, {}), "step()'s reward is a bool (True), not a finite number"),
    (("o", float("nan"), True, {}), "step()'s reward is a float (nan), not a finite number"),
    (("o", 1.0, "yes", {}), "step()'s done is a str ('yes'), not True or False"),
    (("o", 1.0, 1, {}), "step()'s done is an int (1), not True or False"),
    (("o", 1.0, True, ["x"]), "step()'s info is a list of 1, not a dict"),
])
def test_a_step_result_of_another_shape_is_one_line_naming_the_class_field(value, words: str) -> None:
    with pytest.raises(EnvStepError) as info:
        coerce_step(value, "my_env.Guess")
    text = str(info.value)
    assert text.startswith(f"spec.environment.class my_env.Guess: {words}"), text
    assert "(fix: return kuberl.envs.EnvStep(observation, reward, done, info)" in text and "\n" not in text


def test_a_reset_result_is_text_or_chat_messages() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    assert coerce_reset("2+2?") == "2+2?" and coerce_reset(messages) is messages
    for value, words in [(None, "reset() returned None"), ([], "reset() returned a list of 0"),
                         ([{"role": "user"}], "reset()'s message [0] is a dict without a str role and a str content"),
                         (["hi"], "reset()'s message [0] is a str")]:
        with pytest.raises(EnvStepError, match=r"^spec\.environment\.class: " + words.replace("[", r"\[")
                           .replace("(", r"\(").replace(")", r"\)")):
            coerce_reset(value)
