"""Built-in tool calling (spec.environment.module: tools): JSON function calls parsed from the policy's text, run
from a registry of Python callables, their results given back as the next observation.

A call is a JSON object ``{"name": "calculator", "arguments": {"expression": "2+3"}}`` ("arguments" may also be a
JSON string of that object, as OpenAI's API writes it, or be called "parameters"). A turn may hold several: inside
``<tool_call>...</tool_call>`` tags (Qwen's and Hermes' format), in a fenced ```json block, or as bare JSON in the
text (one object, several, or a list of them). Where a turn has tags, only they are read.

A turn with no call ends the trajectory (the policy has answered). A bad call (JSON that does not parse, no name),
an unknown tool, arguments that do not fit the tool, or a tool that raises becomes an observation that says so, and
the trajectory goes on: the policy may correct itself. The tool environment gives reward 0: the job's reward
(spec.reward) scores the trajectory.

Tools of one's own: subclass `ToolEnvironment` and mark methods with `@tool`, or call `self.tools.register(fn)`:

    class WeatherEnv(ToolEnvironment):
        @tool
        def weather(self, city: str) -> str:
            \"\"\"Today's weather in a city.\"\"\"
            return LOOKUP[city]
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .calculator import calculator
from .interface import EnvStep, Messages

Tool = Callable[..., Any]
TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
NAMED_OBJECT = re.compile(r"\{\s*\"name\"\s*:")  # where bare JSON that does not parse was still meant as a call
MAX_RESULT_CHARS = 2000
_MARK = "__kuberl_tool__"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class BadToolCall:
    """Text that was meant as a call but is not one: why, and the text (shortened)."""

    reason: str
    text: str


@dataclass(frozen=True)
class ToolResult:
    """What one call gave: the tool's result as text, or (`ok` False) what went wrong."""

    name: str
    ok: bool
    content: str


def parse_tool_calls(text: str) -> list[ToolCall | BadToolCall]:
    """The calls in a policy turn, in the order they appear: from its <tool_call> tags where it has any (everything
    inside a tag is meant as a call), else from the JSON objects in its text, fenced or bare (prose with braces is
    not a call, unless it starts like one). An empty list: the turn calls no tool."""
    tagged = TAGGED.findall(text)
    if tagged:
        return [call for body in tagged for call in _calls_in_block(body)]
    return _bare_calls(text)


def _calls_in_block(body: str) -> list[ToolCall | BadToolCall]:
    """Every call in a tagged or fenced block: one JSON object, several one after another, or a list of them."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(body) and body[at] in " \t\r\n,;":
            at += 1
        if at >= len(body):
            break
        try:
            value, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError as exc:
            out.append(BadToolCall(f"bad JSON: {exc.msg} at character {exc.pos - at + 1}", _short(body[at:])))
            break
        out += [_as_call(v) for v in value] if isinstance(value, list) else [_as_call(value)]
    if not out:
        out.append(BadToolCall("empty tool call", ""))
    return out


def _bare_calls(text: str) -> list[ToolCall | BadToolCall]:
    """Calls written as bare JSON in the text: each object (or list of objects) with a "name"; prose with braces in
    it is not a call, unless it starts like one ({"name": ...) and does not parse."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while (start := _next_json(text, at)) >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            if NAMED_OBJECT.match(text, start):
                out.append(BadToolCall(f"bad JSON: {exc.msg} at character {exc.pos - start + 1}",
                                       _short(text[start:])))
            at = start + 1
            continue
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, dict) and "name" in v for v in items):
            out += [_as_call(v) for v in items]
        at = end if end > start else start + 1
    return out


def _next_json(text: str, at: int) -> int:
    """Where the next JSON object or list may start at or after `at`, or -1."""
    starts = [i for i in (text.find("{", at), text.find("[", at)) if i >= 0]
    return min(starts) if starts else -1


def _as_call(value: Any) -> ToolCall | BadToolCall:
    """A decoded JSON value as a call: {"name": str, "arguments": {...}} (or "parameters", or a JSON string)."""
    shown = _short(json.dumps(value, ensure_ascii=False))
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return BadToolCall('a tool call is {"name": "<tool>", "arguments": {...}}', shown)
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return BadToolCall(f"bad JSON in arguments: {exc.msg}", shown)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return BadToolCall('"arguments" must be a JSON object of the tool\'s parameters', shown)
    return ToolCall(value["name"], arguments)


def _short(text: str, limit: int = 120) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tool(fn: Tool | None = None, *, name: str | None = None) -> Any:
    """Mark a method of a ToolEnvironment subclass as a tool (named after the method, or `name`)."""

    def mark(f: Tool) -> Tool:
        setattr(f, _MARK, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


class ToolRegistry:
    """Tools by name: Python callables taking keyword arguments (JSON values) and returning a result (text, or a
    JSON-serialisable value)."""

    def __init__(self, tools: Mapping[str, Tool] | None = None, max_result_chars: int = MAX_RESULT_CHARS):
        self._tools: dict[str, Tool] = {}
        self.max_result_chars = max_result_chars
        for tool_name, fn in (tools or {}).items():
            self.register(fn, name=tool_name)

    def register(self, fn: Tool | None = None, *, name: str | None = None) -> Any:
        """Add a tool (a decorator too: ``@registry.register`` or ``@registry.register(name="calc")``)."""

        def add(f: Tool) -> Tool:
            if not callable(f):
                raise TypeError(f"a tool must be callable, not {type(f).__name__}")
            self._tools[name or f.__name__] = f
            return f

        return add(fn) if fn is not None else add

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, tool_name: object) -> bool:
        return tool_name in self._tools

    def describe(self) -> str:
        """One line per tool: its name, parameters and the first line of its docstring."""
        lines = []
        for tool_name in self.names():
            fn = self._tools[tool_name]
            doc = (inspect.getdoc(fn) or "").strip().splitlines()
            lines.append(f"- {tool_name}{_parameters(fn)}: {doc[0] if doc else ''}".rstrip(": "))
        return "\n".join(lines)

    def call(self, call: ToolCall | BadToolCall) -> ToolResult:
        """Run one call; whatever goes wrong (a bad call, an unknown tool, arguments that do not fit, the tool
        raising) is a ToolResult with ok False that says what."""
        if isinstance(call, BadToolCall):
            return ToolResult("", False, f"bad tool call: {call.reason}: {call.text}".rstrip(": "))
        fn = self._tools.get(call.name)
        if fn is None:
            return ToolResult(call.name, False, f"unknown tool {call.name!r}; the tools are: "
                                                f"{', '.join(self.names()) or 'none'}")
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as exc:
            return ToolResult(call.name, False, f"arguments do not fit {call.name}{_parameters(fn)}: {exc}")
        except ValueError:  # a callable without a signature: let the call say
            pass
        try:
            result = fn(**call.arguments)
        except Exception as exc:  # the tool's own failure is the policy's observation, not the job's
            return ToolResult(call.name, False, self._cut(f"{type(exc).__name__}: {exc}"))
        return ToolResult(call.name, True, self._cut(_as_text(result)))

    def _cut(self, text: str) -> str:
        limit = self.max_result_chars
        return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def _parameters(fn: Tool) -> str:
    try:
        return "(" + ", ".join(inspect.signature(fn).parameters) + ")"
    except (TypeError, ValueError):
        return "(...)"


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


def format_results(results: list[ToolResult]) -> str:
    """The observation after a turn's calls: one <tool_response> block per call, in order, each a JSON object
    {"name": ..., "result": ...} or {"name": ..., "error": ...}."""
    blocks = []
    for r in results:
        body = {"name": r.name} if r.name else {}
        body["result" if r.ok else "error"] = r.content
        blocks.append(f"<tool_response>\n{json.dumps(body, ensure_ascii=False)}\n</tool_response>")
    return "\n".join(blocks)


class ToolEnvironment:
    """The built-in tool-calling environment: `reset` gives the tools' instructions and the row's prompt as chat
    messages; each `step` runs the turn's calls and gives their results, or ends the trajectory when the turn calls
    no tool. Reward 0 on every step (spec.reward scores the trajectory). info: tool_calls, tool_errors."""

    builtin_tools: ClassVar[dict[str, Tool]] = {"calculator": calculator}

    def __init__(self, prompt_key: str = "prompt", max_result_chars: int = MAX_RESULT_CHARS):
        self.prompt_key = prompt_key
        self.tools = ToolRegistry(self.builtin_tools, max_result_chars)
        for cls in reversed(type(self).__mro__):
            for attr, value in vars(cls).items():
                if callable(value) and hasattr(value, _MARK):
                    self.tools.register(getattr(self, attr), name=getattr(value, _MARK))

    def instructions(self) -> str:
        """The system message: the tools, and how to call them."""
        return ("You can call tools. To call one, write a JSON object inside <tool_call></tool_call> tags: "
                '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>. The results come back inside '
                "<tool_response></tool_response> tags. Answer without a tool call when you are done.\n"
                f"Tools:\n{self.tools.describe()}")

    def reset(self, row: dict[str, Any]) -> Messages:
        prompt = row.get(self.prompt_key)
        if not isinstance(prompt, str):
            raise ValueError(f"the row has no text prompt under {self.prompt_key!r} (spec.data.promptKey)")
        return [{"role": "system", "content": self.instructions()}, {"role": "user", "content": prompt}]

    def step(self, action_text: str) -> EnvStep:
        calls = parse_tool_calls(action_text)
        if not calls:
            return EnvStep("", 0.0, True, {"tool_calls": 0, "tool_errors": 0})
        results = [self.tools.call(c) for c in calls]
        errors = sum(not r.ok for r in results)
        return EnvStep(format_results(results), 0.0, False, {"tool_calls": len(results), "tool_errors": errors})
