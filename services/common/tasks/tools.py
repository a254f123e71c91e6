"""Tools the model may call (task.episode.tools): a typed Python function each, and its JSON schema, which the
coordinator puts into the chat template's `tools` and the rollout worker checks the model's calls against."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.common.child import import_function


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


def hermes_tools_text(schemas: list[dict[str, Any]]) -> str:
    """The tools block Hermes-format chat templates (Qwen2.5's) put into the system turn: for a template that
    ignores `tools` (SmolLM2's), the prompt renderer adds it to the system prompt, so the model still sees the tools
    and the call format the `hermes` parser reads."""
    listed = "\n".join(json.dumps(s) for s in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )
