"""Tools the model may call: a typed Python function each, its JSON schema for the chat template's `tools`, and the
parsers that read the model's calls out of its text (PARSERS, by name)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    """{"type": "function", "function": {"name", "description", "parameters"}}, as chat templates take `tools`."""

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> Tool:
        """A tool from a function with type hints and a Google-style docstring (each argument described):
        transformers' get_json_schema, the schema chat templates are written for. ValueError naming what is
        missing otherwise."""
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(fn)
        except Exception as e:  # its own error types differ between versions; the message names the gap
            raise ValueError(f"tool {getattr(fn, '__name__', fn)!r}: {e}") from None
        return cls(schema["function"]["name"], fn, schema)

    def check(self, arguments: Any) -> str | None:
        """Why `arguments` cannot be this tool's (a message for the model), or None."""
        if not isinstance(arguments, dict):
            return f"the arguments of {self.name} must be a JSON object, got {type(arguments).__name__}"
        params = self.schema["function"].get("parameters", {})
        known = set(params.get("properties", {}))
        if missing := [p for p in params.get("required", []) if p not in arguments]:
            return f"{self.name} needs {', '.join(missing)}"
        if unknown := sorted(set(arguments) - known):
            return f"{self.name} takes no {', '.join(unknown)} (it takes {', '.join(sorted(known)) or 'nothing'})"
        return None


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
