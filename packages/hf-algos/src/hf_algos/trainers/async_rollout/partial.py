"""Partial rollout (``rollout.partial=true``): one prompt batch generated chunk by chunk.

The first chunk samples ``n`` responses per prompt with at most ``partial_chunk_tokens``
new tokens; every response that used its whole chunk without a stop token (and has budget
left) is continued by a next call whose prompt is the original prompt + the response so
far, with the weights the rollout holds *then* (a push may have come in between). Each
chunk is a span of tokens with one policy version; :func:`~hf_algos.trainers.async_rollout.versions.
join_spans` concatenates them. Only ``generate_sequences`` on prompt ids is used, so any
rollout backend works. This class is the driver's bookkeeping; it calls no worker.
"""

from __future__ import annotations

import torch

from hf_algos.trainers.async_rollout.versions import join_spans, unfinished_rows
from hf_protocol import DataProto, fields, left_pad
from hf_rollout.base import build_rollout_output

Span = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class PartialGeneration:
    """The spans of one prompt batch's responses, and what to ask for next.

    ``max_new_tokens``: the response budget; ``chunk_tokens``: new tokens per call;
    ``stop_ids``: tokens that end a response (eos); ``pad_id``: the pad of prompts and
    responses.
    """

    def __init__(
        self, max_new_tokens: int, chunk_tokens: int, stop_ids: tuple[int, ...], pad_id: int
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.chunk_tokens = chunk_tokens
        self.stop_ids = stop_ids
        self.pad_id = pad_id
        self.base: DataProto | None = None  # first chunk: prompts, non-tensor columns
        self.spans: list[list[Span]] = []
        self.open = torch.zeros(0, dtype=torch.bool)  # rows that continue
        self.asked = torch.zeros(0, dtype=torch.long)  # rows of the call in flight
        self.chunks = 0
        """Calls taken so far (a continuation's seed offset)."""

    @property
    def done(self) -> bool:
        """Every response is finished."""
        return self.base is not None and not bool(self.open.any())

    def add(self, chunk: DataProto, version: int) -> None:
        """Take a finished call's output: the first chunk (``B * n`` rows) or a continuation
        (one row per row of :meth:`next_request`), sampled by policy ``version`` (or by the
        version the rollout reported per row, ``rollout_policy_version``, when it did)."""
        assert chunk.batch is not None
        data = chunk.batch
        self.chunks += 1
        if self.base is None:
            self.base = chunk
            self.spans = [[] for _ in range(len(chunk))]
            self.open = torch.ones(len(chunk), dtype=torch.bool)
            self.asked = torch.arange(len(chunk))
        mask = data[fields.RESPONSE_MASK].bool()
        # the version the rollout reports it sampled with (the ground truth), if it does
        reported = data.get(fields.ROLLOUT_POLICY_VERSION, None)
        for out_row, row in enumerate(self.asked.tolist()):
            if reported is not None:
                version = int(reported[out_row, 0])
            keep = mask[out_row]
            ids = data[fields.RESPONSES][out_row][keep]
            log_probs = data[fields.ROLLOUT_LOG_PROBS][out_row][keep]
            self.spans[row].append((ids, log_probs, torch.tensor(version)))
        remaining = self.max_new_tokens - self._lengths(self.asked)
        # remaining counts this chunk already; unfinished_rows wants the budget before it
        before = remaining + data[fields.RESPONSE_MASK].sum(-1).long()
        more = unfinished_rows(chunk, self.chunk_tokens, before, self.stop_ids)
        self.open[self.asked] = more

    def _lengths(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.tensor([sum(len(s[0]) for s in self.spans[r]) for r in rows.tolist()])

    def next_request(self) -> tuple[DataProto, int]:
        """The continuation prompts (original prompt + response so far, left-padded to the
        prompt width + ``max_new_tokens`` so every rank's part has one width) and the new
        tokens to ask for."""
        assert self.base is not None and self.base.batch is not None
        self.asked = torch.nonzero(self.open).flatten()
        base = self.base.batch
        rows: list[list[int]] = []
        for row in self.asked.tolist():
            prompt = base[fields.PROMPTS][row][
                base[fields.ATTENTION_MASK][row][: base[fields.PROMPTS].shape[1]].bool()
            ]
            response = torch.cat([s[0] for s in self.spans[row]])
            rows.append(torch.cat([prompt, response]).tolist())
        width = base[fields.PROMPTS].shape[1] + self.max_new_tokens
        ids, attention, positions = left_pad(rows, self.pad_id, width)
        request = DataProto.from_dict(
            {
                fields.INPUT_IDS: ids,
                fields.ATTENTION_MASK: attention,
                fields.POSITION_IDS: positions,
            }
        )
        left = int((self.max_new_tokens - self._lengths(self.asked)).max())
        return request, min(self.chunk_tokens, left)

    def result(self) -> DataProto:
        """The joined samples: the first chunk's rows with every span concatenated into
        ``responses`` / ``response_mask`` / ``rollout_log_probs`` ``(B * n, max_new_tokens)``
        and the rollout's layout rebuilt from them (:func:`hf_rollout.base.
        build_rollout_output`), plus ``rollout_policy_version`` ``(B * n, max_new_tokens)``."""
        assert self.base is not None and self.base.batch is not None
        joined = [join_spans(s, self.max_new_tokens, self.pad_id) for s in self.spans]
        responses, mask, log_probs, versions = (torch.stack(t) for t in zip(*joined, strict=True))
        base = self.base.batch
        width = base[fields.PROMPTS].shape[1]
        prompt = (
            base[fields.PROMPTS],
            base[fields.ATTENTION_MASK][:, :width],
            base[fields.POSITION_IDS][:, :width],
        )
        output = build_rollout_output(
            self.base,
            prompt,
            responses,
            mask,
            log_probs,
            n=1,
            temperature=self.base.meta_info[fields.TEMPERATURE],
            pad_token_id=self.pad_id,
        )
        assert output.batch is not None
        output.batch[fields.ROLLOUT_POLICY_VERSION] = versions
        return output
