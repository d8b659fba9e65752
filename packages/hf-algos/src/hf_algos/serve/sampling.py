"""Sample requests batched: clients send one request per sample (tinker-cookbook sends a
group's samples as separate calls), and generating them one at a time would leave the
rollout mostly idle. Requests that arrive within ``wait_s`` of each other and share their
sampling settings are generated in one ``generate_sequences`` call (the batch closes once
no new request came for ``wait_s``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from hf_algos.serve.models import SampleCall, ServedModel
from hf_algos.serve.wire import SampledSequence
from hf_rollout import SamplingConfig

MAX_WAITS = 10
"""A batch waits at most this many ``wait_s`` periods for more calls."""


class SampleBatcher:
    """Collects a model's sample calls and runs them in batches on the model's runner."""

    def __init__(self, model: ServedModel, wait_s: float) -> None:
        self.model = model
        self.wait_s = wait_s
        self._pending: list[tuple[SampleCall, Future[list[SampledSequence]]]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def add(self, call: SampleCall) -> Future[list[SampledSequence]]:
        """Queue ``call``; its future holds its ``num_samples`` sequences."""
        future: Future[list[SampledSequence]] = Future()
        with self._lock:
            self._pending.append((call, future))
            if not self._scheduled:
                self._scheduled = True
                self.model.runner.submit(self._drain)
        return future

    def _drain(self) -> None:
        """On the runner: wait until no call arrived for ``wait_s`` (at most
        ``MAX_WAITS`` times), then generate every pending one, one batch per distinct
        sampling config."""
        for _ in range(MAX_WAITS):
            with self._lock:
                seen = len(self._pending)
            time.sleep(self.wait_s)
            with self._lock:
                if len(self._pending) == seen:
                    break
        with self._lock:
            pending, self._pending = self._pending, []
            self._scheduled = False
        groups: dict[SamplingConfig, list[tuple[SampleCall, Future]]] = {}
        for call, future in pending:
            groups.setdefault(call.sampling, []).append((call, future))
        for items in groups.values():
            live = [
                (call, future) for call, future in items if future.set_running_or_notify_cancel()
            ]
            if not live:
                continue
            try:
                results = self.model.sample([call for call, _ in live])
            except BaseException as error:
                for _, future in live:
                    future.set_exception(error)
                continue
            for (_, future), sequences in zip(live, results, strict=True):
                future.set_result(sequences)
