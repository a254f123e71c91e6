"""Built-in tools and environments (task.episode): a calculator tool, and `retry`, which tells the model its answer
was wrong and lets it try again. Each runs in the worker's tool or environment process."""

from __future__ import annotations

import ast
import operator

from services.common.rewards.builtin import full_marks, math_reward, reasoning_gym_reward

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_MAGNITUDE = 10**30
"""Larger operands or results are refused: a model's `9**9**9` must not hold the tool process."""


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponents above 64 are refused")
        value = _BINARY[type(node.op)](left, right)
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError(f"the result exceeds {MAX_MAGNITUDE:.0e}")
        return value
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. "(1234 + 5678) * 9".

    Args:
        expression: Numbers, + - * / // % ** and parentheses.
    """
    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


RETRY_MESSAGE = "That is not right. Try again."


def retry(messages: list[dict], task: dict) -> str | None:
    """RETRY_MESSAGE while the model's last answer is wrong (reasoning-gym's verifier for its rows, else math_reward
    against the task's answer); None (the episode ends) once it is right."""
    answer, metadata = str(task.get("answer", "")), dict(task.get("metadata") or {})
    completion = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
    score = reasoning_gym_reward if metadata.get("source_dataset") else math_reward
    right = full_marks(score(str(task.get("prompt", "")), completion, answer, metadata))
    return None if right else RETRY_MESSAGE
