"""The calculator tool (``<calc>EXPR</calc>``) and its environment."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from hf_rollout.multiturn.environment import register_environment
from hf_rollout.multiturn.tools import Tool, ToolEnvironment, ToolError, register_tool

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


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


def calculate(expression: str) -> str:
    """The calculator tool: the value of ``expression`` as text (``"84"``, ``"2.5"``).

    Integral floats print as integers; a bad expression or a division by zero is a
    :class:`ToolError` the model sees.
    """
    try:
        value = evaluate_arithmetic(expression)
    except (ValueError, ZeroDivisionError) as error:
        raise ToolError(str(error)) from error
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


CALCULATOR = register_tool(
    Tool(
        name="calc",
        description="Evaluate an arithmetic expression: numbers, + - * / // %, parentheses.",
        run=calculate,
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 123 * 456"}},
            "required": ["expression"],
        },
    )
)


@register_environment("calculator")
class CalculatorEnvironment(ToolEnvironment):
    """Answers ``<calc>EXPR</calc>`` in a model turn with ``<result>VALUE</result>``.

    A turn without a call is the model's final answer: the episode is done. A call that
    does not evaluate is answered with ``<error>...</error>`` so the model can retry.
    """

    def __init__(self) -> None:
        super().__init__(tools=("calc",))
