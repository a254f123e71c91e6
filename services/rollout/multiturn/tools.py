"""Tools the model may call: a typed Python function each, its JSON schema for the chat template's `tools`, the
parsers that read the model's calls out of its text (PARSERS, by name), and ToolRunner, which runs the calls in a
killable child process with a timeout."""

from __future__ import annotations

import json
import multiprocessing.connection
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.common.child import Child, ChildLost, child_setup, import_function, serve


@dataclass(frozen=True)
class Tool:
    name: str
    path: str
    """Import path `pkg.module:function`: the tool process imports it from there."""
    schema: dict[str, Any]
    """{"type": "function", "function": {"name", "description", "parameters"}}, as chat templates take `tools`."""

    @classmethod
    def from_path(cls, path: str) -> Tool:
        """A tool from a function with type hints and a Google-style docstring (each argument described):
        transformers' get_json_schema, the schema chat templates are written for. ValueError naming what is
        missing otherwise."""
        from transformers.utils import get_json_schema

        fn = import_function(path, "tool")
        try:
            schema = get_json_schema(fn)
        except Exception as e:  # its own error types differ between versions; the message names the gap
            raise ValueError(f"tool {path!r}: {e}") from None
        return cls(schema["function"]["name"], path, schema)

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


@dataclass(frozen=True)
class ToolResult:
    content: str
    """What the model gets back as the tool message: the result, or the error in one line."""
    error: str = ""
    """Why the call gave no result (unreadable, unknown tool, bad arguments, raised, timed out); empty if it ran."""


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _tool_main(conn: multiprocessing.connection.Connection, sys_path: list[str], paths: dict[str, str]) -> None:
    """Child loop: receive (name, arguments), call the tool, send (text, error)."""
    child_setup(sys_path)
    fns: dict[str, Callable[..., Any] | str] = {}
    for name, path in paths.items():
        try:
            fns[name] = import_function(path, "tool")
        except BaseException as e:
            fns[name] = f"{type(e).__name__}: {e}"
    conn.send("ready")

    def handle(message: tuple) -> None:
        name, arguments = message
        try:
            fn = fns[name]
            if isinstance(fn, str):
                raise RuntimeError(f"cannot load in the tool process: {fn}")
            conn.send((_as_text(fn(**arguments)), ""))
        except BaseException as e:
            conn.send(("", f"{type(e).__name__}: {e}"))

    serve(conn, handle)


class ToolRunner:
    """Runs the model's tool calls in one long-lived child process, each with a timeout: a tool that raises, hangs
    or kills its process gives an error result (the child is replaced), never an exception to the caller."""

    def __init__(self, tools: list[Tool], timeout_s: float, startup_timeout_s: float = 120.0):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.tools = {t.name: t for t in tools}
        self._timeout_s = timeout_s
        self._child = Child(_tool_main, ({t.name: t.path for t in tools},), "tool", startup_timeout_s)
        self._lock = threading.Lock()

    def run(self, call: ToolCall) -> ToolResult:
        tool, problem = resolve(call, self.tools)
        if tool is None:
            return ToolResult(f"error: {problem}", problem)
        with self._lock:
            try:
                self._child.conn().send((tool.name, call.arguments))
                text, error = self._child.receive(self._timeout_s, f"{tool.name} ran past {self._timeout_s}s")
            except (ChildLost, OSError, EOFError) as e:
                self._child.stop()
                text, error = "", str(e)
        return ToolResult(f"error: {error}", error) if error else ToolResult(text)

    def close(self) -> None:
        with self._lock:
            self._child.close()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
