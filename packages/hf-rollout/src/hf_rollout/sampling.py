"""Batched next-token sampling as pure tensor functions (no per-row Python loops).

Shapes: ``B`` rows, ``V`` vocabulary.
"""

from __future__ import annotations

import hashlib

import torch

from hf_protocol import DataProto, fields
from hf_rollout.config import SamplingConfig


def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Logits with everything below the ``top_k``-th largest of each row set to ``-inf``.

    Shape: ``(B, V)`` -> ``(B, V)``. ``top_k <= 0`` or ``>= V`` leaves the logits as they are.
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits outside each row's nucleus set to ``-inf``.

    The nucleus is the smallest set of most likely tokens whose probability reaches
    ``top_p``; the most likely token is always kept. Shape: ``(B, V)`` -> ``(B, V)``.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def draw_from_probs(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One index per row drawn with the row's probabilities (inverse CDF, batched).

    ``uniform`` holds one draw from ``[0, 1)`` per row, so the caller decides where the
    randomness comes from (a row keeps its random stream when other rows leave the batch).
    Shape: ``(B, V)``, ``(B,)`` -> ``(B,)`` long. Zero-probability entries are never drawn;
    rows need not be exactly normalised. Much cheaper on CPU than ``torch.multinomial``.
    """
    cdf = probs.cumsum(dim=-1)
    picks = torch.searchsorted(cdf, uniform[:, None] * cdf[:, -1:], right=True)
    return picks.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def sample_next_tokens(
    logits: torch.Tensor, sampling: SamplingConfig, uniform: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row (``uniform``: one ``[0, 1)`` draw per row) and its log-prob.

    The log-prob is that of the token under the temperature-scaled model distribution,
    ``log_softmax(logits / T)`` (``T = 1`` when greedy), before top-k / top-p truncation:
    exactly what a training engine computes at that temperature. Shape:
    ``(B, V)``, ``(B,)`` -> ``(B,)`` long tokens and ``(B,)`` float32 log-probs.
    """
    scaled = logits.float()
    if not sampling.is_greedy and sampling.temperature != 1.0:
        scaled = scaled / sampling.temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    if sampling.is_greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        if uniform is None:
            raise ValueError("sampling (not greedy) needs one uniform draw per row")
        filtered = filter_top_p(filter_top_k(scaled, sampling.top_k), sampling.top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens = draw_from_probs(probs, uniform)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def row_seed(seed: int, index: int) -> int:
    """The seed of the prompt row at ``index`` of a request sampled with ``seed``: a hash of
    both (below ``2**31``, which every backend accepts), so rows get unrelated streams."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (1 << 31)


def prompt_seeds(prompts: DataProto, seed: int, rows: int) -> list[int]:
    """One seed per prompt row of ``prompts`` (``rows`` of them): :func:`row_seed` of its
    :data:`~hf_protocol.fields.PROMPT_INDEX` when the request carries one, else of its
    position in ``prompts``. With the index the samples do not depend on how the request
    was split over rollout workers."""
    index = None
    if prompts.batch is not None and fields.PROMPT_INDEX in prompts.batch:
        index = prompts.batch[fields.PROMPT_INDEX].tolist()
        if len(index) != rows:
            raise ValueError(
                f"{fields.PROMPT_INDEX} has {len(index)} entries for {rows} prompt rows; "
                "send one index per prompt row"
            )
    return [row_seed(seed, i if index is None else int(index[i])) for i in range(rows)]


ROW_STREAM_CHUNK = 64
"""Decode steps a prompt row's generator draws for at once (one call per prompt row per
chunk, not per step). Fixed, so a row's numbers never depend on its batch's token budget."""


class RowStreams:
    """Uniform draws for ``B * n`` sampled rows, one generator per prompt row.

    Every :data:`ROW_STREAM_CHUNK` steps, prompt ``b``'s generator draws the next
    ``(ROW_STREAM_CHUNK, n)`` numbers; row ``b * n + j`` (sample ``j`` of prompt ``b``,
    consecutive as the rollout repeats them) takes column ``j`` at each step. Every row has
    its number at every step, so dropping finished rows keeps the streams.
    """

    def __init__(self, seeds: list[int], n: int, device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.n = n
        self.device = device
        self.table = torch.empty(0, len(seeds) * n, device=device)
        self.step = 0

    def uniform(self) -> torch.Tensor:
        """The next step's ``(B * n,)`` uniform numbers in ``[0, 1)``."""
        offset = self.step % ROW_STREAM_CHUNK
        if offset == 0:
            draws = [
                torch.rand(ROW_STREAM_CHUNK, self.n, generator=g, device=self.device)
                for g in self.generators
            ]
            # (chunk, B * n): each step's numbers in row order
            self.table = torch.stack(draws, dim=1).reshape(ROW_STREAM_CHUNK, -1)
        self.step += 1
        return self.table[offset]
