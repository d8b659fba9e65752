"""An example environment: a calculator tool the model calls with ``<calc>EXPR</calc>``."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, ``+ - * / // %``, parentheses.

    Parsed with :mod:`ast` and evaluated node by node, never with ``eval``; anything else
    (names, calls, powers) is a ``ValueError`` naming what was found.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from error
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise ValueError(f"unsupported operator {type(node.op).__name__} in arithmetic")
        value: int | float = _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        result: int | float = _UNARY[type(node.op)](_evaluate(node.operand))
        return result
    raise ValueError(f"unsupported element {type(node).__name__} in arithmetic expression")


class CalculatorEnvironment:
    """Answers ``<calc>EXPR</calc>`` in a model turn with ``<result>VALUE</result>``.

    A turn without a call is the model's final answer: the episode is done. A call that
    does not evaluate is answered with ``<error>...</error>`` so the model can retry.
    """

    def __init__(self) -> None:
        self.prompt_text = ""
        self.calls = 0

    def reset(self, prompt_text: str) -> None:
        """Start an episode for ``prompt_text``."""
        self.prompt_text = prompt_text
        self.calls = 0

    def step(self, model_text: str) -> tuple[str, bool]:
        """The reply to one model turn, and whether the episode is done."""
        calls = _CALL.findall(model_text)
        if not calls:
            return "", True
        self.calls += 1
        try:
            value = evaluate_arithmetic(calls[-1])
        except (ValueError, ZeroDivisionError) as error:
            return f"<error>{error}</error>", False
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return f"<result>{value}</result>", False
