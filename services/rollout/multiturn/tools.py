"""The model's tool calls: the parsers that read them out of its text (PARSERS, by name), and ToolRunner, which runs
them in a killable child process with a timeout. A tool itself (a typed function and its schema) is
services.common.tasks.tools.Tool: the coordinator puts the schemas into the prompt."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.common.child import Functions
from services.common.tasks.tools import Tool


@dataclass(frozen=True)
class ToolCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    """Why the call could not be read (malformed JSON, no name): sent back to the model as the tool's answer."""


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """Hermes / Qwen calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of them; the
    arguments may also come as a JSON string of an object. A call that cannot be read is a ToolCall with `error`;
    an opened tag never closed is one too."""
    calls = [_hermes_call(body) for body in _HERMES.findall(text)]
    if text.count("<tool_call>") > len(calls):
        calls.append(ToolCall(error="a <tool_call> was opened and never closed with </tool_call>"))
    return calls


def _hermes_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(error=f"the tool call is not JSON ({e.msg} at character {e.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return ToolCall(error='a tool call is a JSON object with a "name" and its "arguments"')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(call["name"], error=f"the arguments of {call['name']} are not JSON")
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], error=f"the arguments of {call['name']} must be a JSON object")
    return ToolCall(call["name"], arguments)


PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {
    "hermes": parse_hermes,
}
"""Tool-call formats by name (the config names one): each reads every call out of a model turn's text."""


def parser(name: str) -> Callable[[str], list[ToolCall]]:
    if name not in PARSERS:
        raise ValueError(f"no tool-call parser {name!r}; there are: {', '.join(sorted(PARSERS))}")
    return PARSERS[name]


def resolve(call: ToolCall, tools: dict[str, Tool]) -> tuple[Tool | None, str]:
    """The tool a call names, or None and the message the model gets back instead of a result."""
    if call.error:
        return None, call.error
    tool = tools.get(call.name)
    if tool is None:
        return None, f"there is no tool {call.name!r}; there are: {', '.join(sorted(tools)) or 'none'}"
    problem = tool.check(call.arguments)
    return (None, problem) if problem else (tool, "")


@dataclass(frozen=True)
class ToolResult:
    content: str
    """What the model gets back as the tool message: the result, or the error in one line."""
    error: str = ""
    """Why the call gave no result (unreadable, unknown tool, bad arguments, raised, timed out); empty if it ran."""


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


class ToolRunner:
    """Runs the model's tool calls in one long-lived child process, each with a timeout: a tool that raises, hangs
    or kills its process gives an error result (the child is replaced), never an exception to the caller."""

    def __init__(self, tools: list[Tool], timeout_s: float, startup_timeout_s: float = 120.0):
        self.tools = {t.name: t for t in tools}
        self._functions = Functions({t.name: t.path for t in tools}, timeout_s, "tool", startup_timeout_s)

    def run(self, call: ToolCall) -> ToolResult:
        tool, problem = resolve(call, self.tools)
        if tool is None:
            return ToolResult(f"error: {problem}", problem)
        value, error = self._functions.call(tool.name, call.arguments)
        return ToolResult(f"error: {error}", error) if error else ToolResult(_as_text(value))

    def close(self) -> None:
        self._functions.close()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
