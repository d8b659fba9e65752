"""Multi-turn rollout: the model talks to an environment (a tool) until done.

``run_agent_loop`` generates, hands each model turn's text to an :class:`Environment`,
appends its reply and continues until the environment is done or a turn / token limit is
hit; ``response_mask`` marks model tokens 1 and environment tokens 0.
"""

from hf_rollout.multiturn.calculator import CalculatorEnvironment, evaluate_arithmetic
from hf_rollout.multiturn.loop import AgentLoopConfig, Environment, TextCodec, run_agent_loop

__all__ = [
    "AgentLoopConfig",
    "CalculatorEnvironment",
    "Environment",
    "TextCodec",
    "evaluate_arithmetic",
    "run_agent_loop",
]
