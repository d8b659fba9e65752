"""Multi-turn rollout: the model talks to an environment (tools) until done.

``run_agent_loop`` generates, hands each model turn's text to an :class:`Environment`,
appends its observation and continues until the environment is done or a turn / token limit
is hit; ``response_mask`` marks model tokens 1 and environment tokens 0. Environments and
tools are registered by name (``environment.py``, ``tools.py``); the calculator and a
sandboxed Python-expression executor (``python_tool.py``) are built in. Environment calls of
one turn run concurrently, and a failing environment ends only its own episode. The rollout
worker runs the loop through :class:`AgentRollout` (``agent.py``), with a tokenizer as its codec
(:class:`TokenizerCodec`).
"""

from hf_rollout.multiturn.agent import AgentRollout, TokenizerCodec
from hf_rollout.multiturn.calculator import CalculatorEnvironment, calculate, evaluate_arithmetic
from hf_rollout.multiturn.environment import (
    ENVIRONMENTS,
    Environment,
    EnvironmentSpecError,
    StepResult,
    environment_factory,
    register_environment,
)
from hf_rollout.multiturn.loop import AgentLoopConfig, TextCodec, episode_info, run_agent_loop
from hf_rollout.multiturn.metrics import multi_turn_metrics
from hf_rollout.multiturn.python_tool import (
    PYTHON_TOOL,
    PythonEnvironment,
    PythonSandbox,
    default_python_sandbox,
)
from hf_rollout.multiturn.tools import (
    TOOLS,
    Tool,
    ToolEnvironment,
    ToolError,
    register_tool,
    tool_schemas,
)

__all__ = [
    "ENVIRONMENTS",
    "PYTHON_TOOL",
    "TOOLS",
    "AgentLoopConfig",
    "AgentRollout",
    "CalculatorEnvironment",
    "Environment",
    "EnvironmentSpecError",
    "PythonEnvironment",
    "PythonSandbox",
    "StepResult",
    "TextCodec",
    "TokenizerCodec",
    "Tool",
    "ToolEnvironment",
    "ToolError",
    "calculate",
    "default_python_sandbox",
    "environment_factory",
    "episode_info",
    "evaluate_arithmetic",
    "multi_turn_metrics",
    "register_environment",
    "register_tool",
    "run_agent_loop",
    "tool_schemas",
]
