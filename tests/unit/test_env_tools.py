"""Built-in tool calling (kuberl.envs.tools) and the calculator tool (kuberl.envs.calculator): calls parsed from
tags, fences and bare JSON, bad calls, unknown tools and raising tools as observations, tools of one's own."""

from __future__ import annotations

import json

import pytest

from kuberl.envs import (
    BadToolCall,
    CalculatorError,
    Environment,
    EnvStep,
    ToolCall,
    ToolEnvironment,
    ToolRegistry,
    calculator,
    parse_tool_calls,
    tool,
)
from kuberl.envs.tools import format_results


def calc(expression: str) -> ToolCall:
    return ToolCall("calculator", {"expression": expression})


def responses(observation: str) -> list[dict]:
    """The JSON bodies of an observation's <tool_response> blocks, in order."""
    blocks = observation.split("<tool_response>\n")[1:]
    return [json.loads(b.split("\n</tool_response>")[0]) for b in blocks]


@pytest.mark.parametrize("text, calls", [
    ('{"name": "calculator", "arguments": {"expression": "2+3"}}', [calc("2+3")]),
    ('I will compute it. {"name": "calculator", "arguments": {"expression": "2+3"}} Then answer.', [calc("2+3")]),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>', [calc("2+3")]),
    ('```json\n{"name": "calculator", "arguments": {"expression": "7*6"}}\n```', [calc("7*6")]),
    ('```\n[{"name": "calculator", "arguments": {"expression": "1"}}, {"name": "calculator", '
     '"arguments": {"expression": "2"}}]\n```', [calc("1"), calc("2")]),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call> and '
     '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}</tool_call>', [calc("1"), calc("2")]),
    ('<tool_call>{"name": "a", "arguments": {}}\n{"name": "b"}</tool_call>', [ToolCall("a", {}), ToolCall("b", {})]),
    ('{"name": "calculator", "arguments": "{\\"expression\\": \\"9/3\\"}"}', [calc("9/3")]),  # OpenAI's string
    ('{"name": "calculator", "parameters": {"expression": "4"}}', [calc("4")]),
    ('[see {"name": "calculator", "arguments": {"expression": "5"}}]', [calc("5")]),
])
def test_calls_are_parsed_from_bare_json_tags_and_fences_in_order(text: str, calls: list[ToolCall]) -> None:
    assert parse_tool_calls(text) == calls


@pytest.mark.parametrize("text", [
    "The answer is 42.",
    "A set {1, 2} and a dict {'a': 1} and a list [1, 2] are not calls.",
    '{"answer": 42}',  # JSON, but no name: an answer, not a call
    "```python\nprint({'x': 1})\n```",
    "",
])
def test_text_without_a_call_has_none(text: str) -> None:
    assert parse_tool_calls(text) == []


def test_tags_are_read_alone_when_a_turn_has_them() -> None:
    text = ('{"name": "calculator", "arguments": {"expression": "1"}} '
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}</tool_call>')
    assert parse_tool_calls(text) == [calc("2")]


@pytest.mark.parametrize("text, reason", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}</tool_call>', "bad JSON"),
    ('<tool_call>{"name": "calculator" "arguments": {}}</tool_call>', "bad JSON: Expecting ',' delimiter"),
    ('<tool_call>{"name": "calculator", "arguments": {"expr', "bad JSON"),  # cut at maxTokensPerTurn, no end tag
    ('<tool_call>not json</tool_call>', "bad JSON"),
    ('<tool_call></tool_call>', "empty tool call"),
    ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', '{"name": "<tool>", "arguments": {...}}'),
    ('<tool_call>{"name": "calculator", "arguments": [1, 2]}</tool_call>', '"arguments" must be a JSON object'),
    ('{"name": "calculator", "arguments": {"expression": "1"',  # bare, starts like a call, does not parse
     "bad JSON"),
    ('{"name": "calculator", "arguments": "{not json"}', "bad JSON in arguments"),
])
def test_a_bad_call_is_reported_not_dropped(text: str, reason: str) -> None:
    calls = parse_tool_calls(text)
    assert len(calls) == 1 and isinstance(calls[0], BadToolCall), calls
    assert reason in calls[0].reason or reason in calls[0].reason + calls[0].text, calls[0]


@pytest.mark.parametrize("expression, value", [
    ("2+3", "5"), ("2 + 3 * 4", "14"), ("(2 + 3) * 4 / 5", "4"), ("7 / 2", "3.5"), ("7 // 2", "3"),
    ("-7 % 3", "2"), ("2 ** 10", "1024"), ("2^10", "1024"), ("3 × 4 ÷ 6", "2"), ("-(-3)", "3"), ("+4", "4"),
    ("0.1 + 0.2", "0.3"), ("1.5e3 * 2", "3000"), ("1 / 3", "0.333333333333"), ("123456789 * 987654321",
                                                                                "121932631112635269"),
    ("2 ** -2", "0.25"), ("10 ** 20", "100000000000000000000"),
])
def test_the_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, words", [
    ("__import__('os').system('true')", "Call is not allowed"),
    ("x + 1", "Name is not allowed"),
    ("(1).__class__", "Attribute is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("'a' * 3", "Constant is not allowed"),
    ("True + 1", "Constant is not allowed"),
    ("1j * 2", "Constant is not allowed"),
    ("1 < 2", "Compare is not allowed"),
    ("6 & 3", "BitAnd is not allowed"),
    ("~1", "Invert is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("1 if 1 else 2", "IfExp is not allowed"),
    ("1; 2", "cannot parse"),
    ("import os", "cannot parse"),
    ("2 +", "cannot parse"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("9 ** 9 ** 9", "too large"),
    ("10 ** 10000", "too large"),
    ("2 ** 4000 * 2 ** 4000 * 2 ** 4000", "too large"),
    ("1e308 * 10", "too large"),
    ("(-8) ** 0.5", "not a real number"),
    ("1" * 600, "more than 500"),
])
def test_the_calculator_refuses_anything_but_bounded_arithmetic(expression: str, words: str) -> None:
    with pytest.raises(CalculatorError, match=words.replace("(", r"\(")):
        calculator(expression)


def test_the_calculator_never_runs_code(tmp_path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(CalculatorError):
        calculator(f"__import__('pathlib').Path({str(marker)!r}).touch()")
    assert not marker.exists()


def test_a_turn_of_calls_becomes_one_observation_and_the_episode_goes_on() -> None:
    env = ToolEnvironment()
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
                    '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
                    '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
                    '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
                    '<tool_call>{"name": "calculator" "arguments"}</tool_call>')
    assert isinstance(step, EnvStep) and not step.done and step.reward == 0.0
    assert step.info == {"tool_calls": 5, "tool_errors": 4}
    got = responses(step.observation)
    assert got[0] == {"name": "calculator", "result": "42"}
    assert got[1] == {"name": "calculator", "error": "CalculatorError: division by zero"}
    assert got[2] == {"name": "search", "error": "unknown tool 'search'; the tools are: calculator"}
    assert got[3]["name"] == "calculator" and got[3]["error"].startswith("arguments do not fit calculator(expression)")
    assert set(got[4]) == {"error"} and got[4]["error"].startswith("bad tool call: bad JSON")


def test_a_turn_without_a_call_ends_the_trajectory() -> None:
    step = ToolEnvironment().step("The answer is 42.")
    assert step == EnvStep("", 0.0, True, {"tool_calls": 0, "tool_errors": 0})


def test_reset_gives_the_tools_and_the_prompt_as_chat_messages() -> None:
    env = ToolEnvironment(prompt_key="question")
    system, user = env.reset({"question": "What is 6 * 7?", "answer": "42"})
    assert user == {"role": "user", "content": "What is 6 * 7?"}
    assert system["role"] == "system" and "<tool_call>" in system["content"]
    assert "- calculator(expression): Evaluate an arithmetic expression" in system["content"]
    assert isinstance(env, Environment)
    with pytest.raises(ValueError, match="no text prompt under 'prompt'"):
        ToolEnvironment().reset({"question": "x"})


class WeatherEnv(ToolEnvironment):
    """A user's environment with tools of its own: a marked method, and one registered by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []
        self.tools.register(lambda city: {"city": city, "celsius": 21}, name="forecast")

    @tool
    def weather(self, city: str) -> str:
        """Today's weather in a city."""
        self.asked.append(city)
        if city == "Atlantis":
            raise KeyError(city)
        return f"sunny in {city}"

    @tool(name="echo")
    def repeat(self, text: str) -> str:
        return text * 3000


def test_a_user_environment_registers_its_own_tools() -> None:
    env = WeatherEnv()
    assert env.tools.names() == ["calculator", "echo", "forecast", "weather"]
    step = env.step('{"name": "weather", "arguments": {"city": "Paris"}} '
                    '{"name": "forecast", "arguments": {"city": "Oslo"}} '
                    '{"name": "weather", "arguments": {"city": "Atlantis"}} '
                    '{"name": "echo", "arguments": {"text": "ab"}}')
    got = responses(step.observation)
    assert got[0] == {"name": "weather", "result": "sunny in Paris"} and env.asked == ["Paris", "Atlantis"]
    assert got[1] == {"name": "forecast", "result": '{"city": "Oslo", "celsius": 21}'}
    assert got[2] == {"name": "weather", "error": "KeyError: 'Atlantis'"}
    assert got[3]["result"].startswith("abab") and got[3]["result"].endswith("... (4000 more characters)")
    assert step.info == {"tool_calls": 4, "tool_errors": 1}
    assert "weather" not in ToolEnvironment().tools  # the subclass's tools stay its own


def test_a_registry_takes_tools_by_decorator_and_refuses_what_is_not_callable() -> None:
    registry = ToolRegistry()

    @registry.register
    def add(a: int, b: int) -> int:
        return a + b

    assert registry.call(ToolCall("add", {"a": 2, "b": 3})).content == "5"
    with pytest.raises(TypeError, match="must be callable"):
        registry.register(3, name="three")  # type: ignore[arg-type]
    assert format_results([registry.call(ToolCall("nope", {}))]) == (
        '<tool_response>\n{"name": "nope", "error": "unknown tool \'nope\'; the tools are: add"}\n</tool_response>')
