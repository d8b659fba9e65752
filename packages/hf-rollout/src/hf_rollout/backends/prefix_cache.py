"""Prefix reuse for the native backend: keep the KV cache of finished sequences between calls.

A multi-turn episode sends prompt + conversation so far as each turn's prompt, so turn t+1's
prompt starts with the sequence turn t generated. :class:`PrefixCache` keeps, for each row a
``generate`` call finished, the keys and values of its tokens (prompt and response, all but
the last response token, which was sampled but never fed back). A later prompt that shares a
prefix with a kept sequence prefills only the rest on top of the stored keys and values
(:func:`prefill_layout`); the outputs are those of a full prefill up to float rounding.

Keys and values depend only on the tokens, their positions and the weights, so an entry is
valid for any sampling settings but only for the weights that made it: the engine clears
the cache on ``update_weights``, ``sleep`` and ``shutdown``. Positions are those of
``read_prompts`` (the i-th real token of a prompt at position i), so an entry's keys (rotary
embedding applied) fit any prompt that starts with its tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hf_protocol import position_ids_from_mask


@dataclass
class PastKV:
    """Keys and values of some cache rows, with the mask of which columns hold tokens.

    ``keys`` and ``values`` are ``(layers, B, kv_heads, S, head_dim)``; ``mask`` ``(B, S)`` is
    True on columns holding a token of the row (in sequence order) and False on padding.
    """

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor


@dataclass
class CachedSequence:
    """One kept sequence: its ``L`` tokens and their keys and values.

    ``tokens`` is ``(L,)`` long on the cache's device; ``keys`` and ``values`` are
    ``(layers, kv_heads, L, head_dim)``.
    """

    tokens: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values."""
        return self.keys.nbytes + self.values.nbytes


@dataclass
class PrefixPrefill:
    """The prefill of a batch some of whose rows extend kept sequences.

    ``input_ids``, ``position_ids`` ``(B, T)``: each row's new tokens, left-padded;
    ``attention_mask`` ``(B, H + T)`` covers the ``H`` reused columns then the new ones;
    ``past`` holds the reused keys and values, right-aligned in ``H`` columns;
    ``hits`` ``(B,)`` counts the reused tokens of each row (0 for a row without a hit).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    past: PastKV
    hits: list[int]


class PrefixCache:
    """The sequences of recent ``generate`` calls, at most ``max_rows`` of them (LRU).

    An entry that a later prompt extended is dropped once that call stored its own (longer)
    sequence: a conversation keeps one entry, its latest turn.
    """

    def __init__(self, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"PrefixCache needs max_rows >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.entries: OrderedDict[int, CachedSequence] = OrderedDict()
        self._next_key = 0
        self.hit_tokens = 0
        """Prompt tokens served from the cache since the engine started (a metric)."""
        self.prompt_tokens = 0
        """Prompt tokens seen by :meth:`lookup` since the engine started (a metric)."""

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        """Bytes of every kept entry's keys and values."""
        return sum(entry.nbytes for entry in self.entries.values())

    def clear(self) -> None:
        """Drop every entry (the weights changed, or memory is wanted back)."""
        self.entries.clear()

    def lookup(self, prompts: Sequence[list[int]]) -> list[tuple[int, int]]:
        """For each prompt, ``(entry key, reused tokens)`` of its longest shared prefix.

        The reuse stops one token short of the prompt (its last token must be fed to get the
        next-token logits); ``(-1, 0)`` means no entry shares a first token. The caller
        drops the hit entries (:meth:`discard`) once it has laid out its prefill.
        """
        found: list[tuple[int, int]] = []
        if not self.entries:
            self.prompt_tokens += sum(len(p) for p in prompts)
            return [(-1, 0)] * len(prompts)
        keys = list(self.entries)
        longest = max(len(entry.tokens) for entry in self.entries.values())
        device = next(iter(self.entries.values())).tokens.device
        table = torch.full((len(keys), longest), -1, dtype=torch.long, device=device)
        for index, entry in enumerate(self.entries.values()):
            table[index, : len(entry.tokens)] = entry.tokens
        for prompt in prompts:
            width = min(len(prompt) - 1, longest)
            row = torch.as_tensor(prompt[:width], dtype=torch.long, device=device)
            shared = (table[:, :width] == row).long().cumprod(dim=1).sum(dim=1)
            best = int(shared.argmax()) if width > 0 else 0
            reused = int(shared[best]) if width > 0 else 0
            found.append((keys[best], reused) if reused > 0 else (-1, 0))
            self.prompt_tokens += len(prompt)
            self.hit_tokens += reused
        return found

    def take(self, key: int) -> CachedSequence:
        """The entry of ``key`` (from :meth:`lookup`)."""
        return self.entries[key]

    def discard(self, keys: Sequence[int]) -> None:
        """Drop the entries of ``keys`` (missing ones are ignored)."""
        for key in keys:
            self.entries.pop(key, None)

    def add(self, tokens: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep ``tokens`` ``(L,)`` with their ``(layers, kv_heads, L, head_dim)`` keys and
        values, evicting the least recently added entries beyond ``max_rows``. A sequence
        already kept (greedy twins of one prompt) is not kept twice."""
        for entry in self.entries.values():
            if len(entry.tokens) == len(tokens) and torch.equal(entry.tokens, tokens):
                return
        self.entries[self._next_key] = CachedSequence(tokens, keys, values)
        self._next_key += 1
        while len(self.entries) > self.max_rows:
            self.entries.popitem(last=False)

    def add_rows(
        self,
        sequences: Sequence[list[int]],
        snapshot: PastKV,
    ) -> None:
        """Keep each row of ``snapshot`` as the sequence of the same index in ``sequences``.

        Row ``i``'s first ``len(sequences[i])`` masked columns hold those tokens' keys and
        values (later masked columns, e.g. tokens fed after a stop, are ignored).
        """
        for row, tokens in enumerate(sequences):
            if len(tokens) == 0:
                continue
            columns = snapshot.mask[row].nonzero().flatten()[: len(tokens)]
            if len(columns) < len(tokens):
                raise RuntimeError(
                    f"prefix cache: row {row} has {len(columns)} cached tokens, expected "
                    f"{len(tokens)}; please report this as a bug"
                )
            ids = torch.as_tensor(tokens, dtype=torch.long, device=snapshot.keys.device)
            self.add(
                ids,
                snapshot.keys[:, row][:, :, columns],
                snapshot.values[:, row][:, :, columns],
            )


def counts_from_zero(attention_mask: torch.Tensor, position_ids: torch.Tensor) -> bool:
    """Whether every row's real tokens sit at positions ``0, 1, 2, ...`` (``(B, P)`` each).

    Kept keys carry their positions' rotary embedding, so prompts placed otherwise (custom
    ``position_ids``) are prefilled whole and not kept.
    """
    real = attention_mask.bool()
    return torch.equal(position_ids[real], position_ids_from_mask(attention_mask)[real])


def prefill_layout(
    cache: PrefixCache,
    prompts: Sequence[list[int]],
    found: Sequence[tuple[int, int]],
    pad_token_id: int,
) -> PrefixPrefill:
    """Lay out the prefill of ``prompts`` reusing the entries ``found`` by ``cache.lookup``.

    Row ``i`` reuses ``h_i`` tokens and feeds the remaining ``s_i``: its reused keys and
    values fill the last ``h_i`` of ``H = max h`` past columns, its new tokens the last
    ``s_i`` of ``T = max s`` columns, at positions ``h_i .. h_i + s_i - 1``. The padding in
    between is masked out, so attention sees exactly the row's sequence.
    """
    first = next(cache.take(key) for key, reused in found if reused > 0)
    layers, kv_heads, _, head_dim = first.keys.shape
    rows, device = len(prompts), first.keys.device
    past_width = max(reused for _, reused in found)
    new_width = max(len(p) - reused for p, (_, reused) in zip(prompts, found, strict=True))
    shape = (layers, rows, kv_heads, past_width, head_dim)
    keys = first.keys.new_zeros(shape)
    values = first.values.new_zeros(shape)
    mask = torch.zeros((rows, past_width + new_width), dtype=torch.long, device=device)
    input_ids = torch.full((rows, new_width), pad_token_id, dtype=torch.long, device=device)
    position_ids = torch.zeros((rows, new_width), dtype=torch.long, device=device)
    for row, (prompt, (key, reused)) in enumerate(zip(prompts, found, strict=True)):
        if reused:
            entry = cache.take(key)
            keys[:, row, :, past_width - reused :] = entry.keys[:, :, :reused]
            values[:, row, :, past_width - reused :] = entry.values[:, :, :reused]
            mask[row, past_width - reused : past_width] = 1
        fresh = prompt[reused:]
        input_ids[row, new_width - len(fresh) :] = torch.as_tensor(fresh, dtype=torch.long)
        mask[row, past_width + new_width - len(fresh) :] = 1
        position_ids[row, new_width - len(fresh) :] = torch.arange(
            reused, reused + len(fresh), device=device
        )
    past = PastKV(keys, values, mask[:, :past_width].bool())
    hits = [reused for _, reused in found]
    return PrefixPrefill(input_ids, mask, position_ids, past, hits)
