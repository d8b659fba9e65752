"""Recording a mixture-of-experts model's routing while the native rollout decodes.

:class:`RoutingStepper` wraps a :class:`~hf_rollout.backends.steppers.Stepper` and keeps
the experts each token went to (``hf_protocol.routing``): the prompt's at prefill, then
each fed token's at its step, following the stepper's row repeats and compactions. The
last sampled token of a row is never fed, so it has no routing (-1), like padding.
"""

from __future__ import annotations

import torch

from hf_protocol.routing import RoutingRecorder
from hf_rollout.backends.steppers import PastKV, Stepper


class RoutingStepper:
    """A stepper that records routing; see the module docstring."""

    def __init__(self, stepper: Stepper, model: torch.nn.Module) -> None:
        self.inner = stepper
        self.recorder = RoutingRecorder(model)
        self.prompt: torch.Tensor | None = None  # (B, P', L, k)
        self.rows = torch.zeros(0, dtype=torch.long)  # output row of each cache row
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows, (n, L, k))

    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: PastKV | None = None,
    ) -> torch.Tensor:
        """See :class:`Stepper`; keeps the prompt tokens' routing."""
        if past is not None:
            raise ValueError("routing is not recorded for prompts continuing a prefix cache")
        logits = self.inner.prefill(input_ids, attention_mask, position_ids, past)
        routed = self.recorder.pop()
        self.prompt = routed.reshape(*input_ids.shape, *routed.shape[1:]).cpu()
        self.rows = torch.arange(input_ids.shape[0])
        return logits

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """See :class:`Stepper`; keeps the fed tokens' routing."""
        logits = self.inner.step(tokens, positions)
        self.steps.append((self.rows.clone(), self.recorder.pop().cpu()))
        return logits

    def keep_rows(self, rows: torch.Tensor) -> None:
        """See :class:`Stepper`."""
        self.inner.keep_rows(rows)
        self.rows = self.rows[rows.cpu()]

    def repeat_rows(self, times: int) -> None:
        """See :class:`Stepper`."""
        self.inner.repeat_rows(times)
        assert self.prompt is not None
        self.prompt = self.prompt.repeat_interleave(times, dim=0)
        self.rows = torch.arange(self.prompt.shape[0])

    def snapshot(self, rows: torch.Tensor) -> PastKV:
        """See :class:`Stepper`."""
        return self.inner.snapshot(rows)

    def routing(self, response_length: int, prompt_width: int) -> torch.Tensor:
        """``(rows, prompt_width + response_length, L, k)`` int16: the prompt's routing
        right-aligned in its columns, then each response token's; -1 where none."""
        self.recorder.close()
        assert self.prompt is not None, "routing() before prefill()"
        rows, width, layers, k = self.prompt.shape
        out = torch.full((rows, prompt_width + response_length, layers, k), -1, dtype=torch.int16)
        out[:, prompt_width - width : prompt_width] = self.prompt
        for column, (step_rows, routed) in enumerate(self.steps):
            out[step_rows, prompt_width + column] = routed
        return out
