"""Tools the model calls inside its turns, and the environment that runs them.

A tool call is written ``<NAME>ARGUMENTS</NAME>`` (``<calc>12 * 7</calc>``): a format a tiny
model can learn, and one a chat model is told about through :func:`tool_schemas` (the
OpenAI / transformers ``tools=`` layout, for ``apply_chat_template``). :class:`ToolEnvironment`
answers each call with ``<result>VALUE</result>``, or ``<error>WHY</error>`` when the call is
malformed or the tool refuses its arguments, so the model can retry; a turn with no call is
the final answer and ends the episode.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hf_rollout.multiturn.environment import StepResult, register_environment

__all__ = [
    "TOOLS",
    "Tool",
    "ToolEnvironment",
    "ToolError",
    "register_tool",
    "tool_schemas",
]


class ToolError(ValueError):
    """A tool refused its arguments; the model sees the message as an ``<error>`` reply."""


@dataclass(frozen=True)
class Tool:
    """A named function the model can call with one string argument."""

    name: str
    """The tag the model writes: ``<name>arguments</name>``."""
    description: str
    """What the tool does, for the model's prompt (the schema's ``description``)."""
    run: Callable[[str], str]
    """The tool: arguments text -> result text; raises :class:`ToolError` on bad input."""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
        }
    )
    """JSON schema of the arguments (one string by default)."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI / transformers function-tool schema of this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


TOOLS: dict[str, Tool] = {}
"""Registered tools by name (``rollout.multi_turn.tools``)."""


def register_tool(tool: Tool) -> Tool:
    """Register ``tool`` under its name; a name taken by another tool is refused."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tool.name):
        raise ValueError(f"tool name {tool.name!r} must be an identifier (it is used as a tag)")
    if tool.name in TOOLS and TOOLS[tool.name] is not tool:
        raise ValueError(f"tool {tool.name!r} is already registered; pick another name")
    TOOLS[tool.name] = tool
    return tool


def _tools(names: Sequence[str]) -> list[Tool]:
    unknown = [name for name in names if name not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tools {unknown}: registered ones are {sorted(TOOLS)}")
    if not names:
        raise ValueError("a tool environment needs at least one tool name")
    return [TOOLS[name] for name in names]


def tool_schemas(names: Sequence[str]) -> list[dict[str, Any]]:
    """The function-tool schemas of the named tools, in order (for ``apply_chat_template``)."""
    return [tool.schema() for tool in _tools(names)]


@register_environment("tools")
class ToolEnvironment:
    """Runs the named tools on the calls in each model turn; a turn without one ends it.

    Only the last call of a turn is run (one observation per turn). A call whose tag is
    opened but not closed is answered with an ``<error>`` reply, as is a call the tool
    refuses; both count as tool calls.
    """

    def __init__(self, tools: Sequence[str] = ("calc",)) -> None:
        self.tools = {tool.name: tool for tool in _tools(list(tools))}
        names = "|".join(re.escape(name) for name in self.tools)
        self._call = re.compile(rf"<({names})>(.*?)</\1>", re.DOTALL)
        self._opened = re.compile(rf"<({names})>")
        self.prompt = ""
        self.info: Mapping[str, Any] = {}

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        """Start an episode for ``prompt``."""
        self.prompt, self.info = prompt, info

    def step(self, model_text: str) -> StepResult:
        """Run the turn's last tool call; no call (and no unclosed one) ends the episode."""
        calls = self._call.findall(model_text)
        if not calls:
            opened = self._opened.findall(model_text)
            if not opened:
                return StepResult(done=True)
            tag = opened[-1]
            why = f"unclosed <{tag}> call: end it with </{tag}>"
            return StepResult(observation=f"<error>{why}</error>", tool_calls=1)
        name, arguments = calls[-1]
        try:
            return StepResult(
                observation=f"<result>{self.tools[name].run(arguments)}</result>", tool_calls=1
            )
        except ToolError as error:
            return StepResult(observation=f"<error>{error}</error>", tool_calls=1)
