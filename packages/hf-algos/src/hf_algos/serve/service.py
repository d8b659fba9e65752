"""The Tinker API's state and calls, without HTTP: sessions, training clients, samplers.

Every slow call (building a model, forward/backward, a step, a save, sampling) is queued on
its model's runner and returns a request id at once; :class:`FutureStore` answers the
polls. Names follow Tinker's: a training client is ``<session>:train:<n>``, its paths are
``tinker://<model_id>/weights/<name>`` (state) and ``tinker://<model_id>/sampler_weights/
<name>`` (weights for sampling).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_algos.serve.config import ServeConfig
from hf_algos.serve.errors import BadRequestError, NotFoundError
from hf_algos.serve.futures import FutureStore, Reply
from hf_algos.serve.models import SampleCall, ServedModel, saved_lora_rank
from hf_algos.serve.runner import OrderedRunner
from hf_algos.serve.sampling import SampleBatcher
from hf_algos.serve.wire import ForwardBackwardCall, encode_forward_backward, encode_sample
from hf_engines import OptimHyper

logger = logging.getLogger(__name__)

SCHEME = "tinker://"


@dataclass
class Session:
    """A client's session: its heartbeat and the training clients it created."""

    session_id: str
    last_seen: float = field(default_factory=time.monotonic)
    models: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sampler:
    """A sampling session: the model whose rollout it samples, at which weight version."""

    sampler_id: str
    model_id: str
    version: int
    path: str | None


class TinkerService:
    """Sessions, training clients and samplers of one server (one event loop)."""

    def __init__(self, config: ServeConfig, tokenizer: Any, tokenizer_id: str) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.tokenizer_id = tokenizer_id
        self.futures = FutureStore(config.serve.future_ttl_s, config.serve.poll_wait_s)
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, ServedModel] = {}
        self.batchers: dict[str, SampleBatcher] = {}
        self.samplers: dict[str, Sampler] = {}
        self.sampler_paths: dict[str, Sampler] = {}
        self._sampler_ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- futures ---------------------------------------------------------------------------

    def _track(self, future: Future[Reply]) -> dict[str, Any]:
        request_id = self.futures.track(future, asyncio.get_running_loop())
        return {"request_id": request_id}

    # -- sessions --------------------------------------------------------------------------

    def create_session(self) -> dict[str, Any]:
        """A new session id."""
        session_id = f"sess-{uuid.uuid4().hex[:10]}"
        self.sessions[session_id] = Session(session_id)
        return {"session_id": session_id, "type": "create_session"}

    def session(self, session_id: str) -> Session:
        """The live session ``session_id`` (:class:`NotFoundError` otherwise)."""
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"no session {session_id!r} (ended, or expired without heartbeats)")
        return session

    def heartbeat(self, session_id: str) -> None:
        """Keep ``session_id`` alive."""
        self.session(session_id).last_seen = time.monotonic()

    def end_session(self, session_id: str) -> None:
        """End ``session_id`` and free its training clients' worker groups."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        for model_id in session.models:
            self._close_model(model_id)

    def expire(self) -> None:
        """Drop expired futures; end sessions without a heartbeat for ``session_ttl_s``."""
        self.futures.expire()
        limit = self.config.serve.session_ttl_s
        now = time.monotonic()
        for session_id, session in list(self.sessions.items()):
            if now - session.last_seen > limit:
                logger.warning("session %s sent no heartbeat for %.0f s: ended", session_id, limit)
                self.end_session(session_id)

    def _close_model(self, model_id: str) -> None:
        model = self.models.pop(model_id, None)
        self.batchers.pop(model_id, None)
        if model is not None:
            threading.Thread(target=model.close, name=f"close-{model_id}", daemon=True).start()

    def close(self) -> None:
        """End every session and stop every training client's worker groups, waiting for
        them (server shutdown)."""
        self.sessions.clear()
        models = list(self.models.values())
        self.models.clear()
        self.batchers.clear()
        for model in models:
            model.close()

    # -- training clients ------------------------------------------------------------------

    def check_base_model(self, base_model: str) -> None:
        """Refuse a base model this server does not serve, naming the one it does."""
        if base_model != self.config.base_model:
            raise BadRequestError(
                f"base_model {base_model!r} is not served here; this server serves "
                f"{self.config.base_model!r} (serve.base_model)"
            )

    def create_model(self, session_id: str, model_seq_id: int, base_model: str, rank: int) -> dict:
        """Queue the start of a training client (LoRA ``rank``; 0: full fine-tuning)."""
        model = self._new_model(session_id, model_seq_id, base_model, rank)
        reply = {"model_id": model.model_id, "type": "create_model"}
        return self._start(model, lambda: None, reply)

    def create_from_state(
        self, session_id: str, model_seq_id: int, path: str, optimizer: bool
    ) -> dict[str, Any]:
        """Queue the start of a training client from a ``save_state`` path (its LoRA rank
        is the saver's), loaded with or without the optimizer's state (SDK:
        ``create_training_client_from_state[_with_optimizer]``)."""
        directory = self._weights_dir(path)
        rank = saved_lora_rank(directory)
        model = self._new_model(session_id, model_seq_id, self.config.base_model, rank)
        reply = {"path": path, "model_id": model.model_id, "type": "load_weights"}
        return self._start(model, lambda: model.load_state(directory, optimizer), reply)

    def _new_model(self, session_id: str, model_seq_id: int, base_model: str, rank: int) -> Any:
        """A registered, not yet started training client (the checks first)."""
        session = self.session(session_id)
        self.check_base_model(base_model)
        if len(self.models) >= self.config.serve.max_models:
            raise BadRequestError(
                f"{len(self.models)} training client(s) already alive, the most this server "
                f"holds (serve.max_models={self.config.serve.max_models}); end a session or "
                "raise serve.max_models"
            )
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            raise BadRequestError(
                f"model {model_id!r} exists: model_seq_id {model_seq_id} was used"
            )
        model = ServedModel(model_id, self.config, self.tokenizer, rank)
        self.models[model_id] = model
        self.batchers[model_id] = SampleBatcher(model, self.config.serve.sample_batch_wait_s)
        session.models.append(model_id)
        return model

    def _start(self, model: ServedModel, then: Callable[[], None], reply: dict) -> dict:
        """Queue building ``model``'s worker groups, then ``then``; a client that fails to
        start is the future's error and holds no slot."""

        def build() -> Reply:
            try:
                model.build()
                then()
            except BaseException:
                self._close_model(model.model_id)
                raise
            return Reply(reply)

        return {**self._track(model.runner.submit(build)), "model_id": model.model_id}

    def model(self, model_id: str) -> ServedModel:
        """The training client ``model_id`` (:class:`NotFoundError` otherwise)."""
        model = self.models.get(model_id)
        if model is None:
            raise NotFoundError(
                f"no training client {model_id!r} (never created, or its session ended)"
            )
        return model

    def get_info(self, model_id: str) -> dict[str, Any]:
        """Tinker's ``GetInfoResponse`` for ``model_id``."""
        model = self.model(model_id)
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_name": self.config.base_model,
            "is_lora": model.lora_rank > 0,
            "lora_rank": model.lora_rank or None,
            "model_data": {
                "arch": type(self.tokenizer).__name__,
                "model_name": self.config.base_model,
                "tokenizer_id": self.tokenizer_id,
            },
        }

    def _in_order(self, model_id: str, seq_id: int | None, work: Callable[[], Reply]) -> dict:
        model = self.model(model_id)
        runner: OrderedRunner = model.runner
        future = runner.submit(work) if seq_id is None else runner.submit_in_order(seq_id, work)
        return {**self._track(future), "model_id": model_id}

    def forward_backward(self, call: ForwardBackwardCall) -> dict[str, Any]:
        """Queue a forward(-backward) call; its result is a protobuf ``ForwardBackwardOutput``."""
        model = self.model(call.model_id)

        def work() -> Reply:
            log_probs, metrics = model.forward_backward(call)
            return Reply(encode_forward_backward(log_probs, metrics))

        return self._in_order(call.model_id, call.seq_id, work)

    def optim_step(self, model_id: str, seq_id: int | None, hyper: OptimHyper) -> dict[str, Any]:
        """Queue an optimizer step with ``hyper``."""
        model = self.model(model_id)
        return self._in_order(
            model_id,
            seq_id,
            lambda: Reply({"metrics": model.optim_step(hyper), "type": "optim_step"}),
        )

    def _state_dir(self, model_id: str, name: str) -> Path:
        return Path(self.config.serve.state_dir) / model_id.replace(":", "_") / name

    def save_state(self, model_id: str, seq_id: int | None, name: str | None) -> dict:
        """Queue a checkpoint of weights and optimizer; its path is ``tinker://.../weights/``."""
        model = self.model(model_id)
        name = check_name(name or f"state-{uuid.uuid4().hex[:8]}")
        path = f"{SCHEME}{model_id}/weights/{name}"

        def work() -> Reply:
            model.save_state(self._state_dir(model_id, name))
            return Reply({"path": path, "type": "save_weights"})

        return self._in_order(model_id, seq_id, work)

    def _weights_dir(self, path: str) -> Path:
        """The directory of a ``tinker://<model>/weights/<name>`` path of this server."""
        owner, kind, name = parse_path(path)
        if kind != "weights":
            raise BadRequestError(
                f"path {path!r}: give a tinker://<model>/weights/<name> path (save_state's)"
            )
        return self._state_dir(owner, name)

    def load_state(
        self, model_id: str, seq_id: int | None, path: str, optimizer: bool
    ) -> dict[str, Any]:
        """Queue restoring a ``save_state`` checkpoint of this server into ``model_id``
        (the optimizer's state too with ``optimizer``)."""
        model = self.model(model_id)
        directory = self._weights_dir(path)

        def work() -> Reply:
            model.load_state(directory, optimizer)
            return Reply({"path": path, "model_id": model_id, "type": "load_weights"})

        return self._in_order(model_id, seq_id, work)

    def save_for_sampler(self, model_id: str, seq_id: int | None, name: str | None) -> dict:
        """Queue a weight push to the model's rollout; the result names a sampling session
        (and, with ``name``, the path a sampling client can be created from)."""
        model = self.model(model_id)
        sampler_id = f"samp-{next(self._sampler_ids)}"
        path = None if name is None else f"{SCHEME}{model_id}/sampler_weights/{check_name(name)}"

        def work() -> Reply:
            version = model.save_for_sampler(sampler_id)
            sampler = Sampler(sampler_id, model_id, version, path)
            self.samplers[sampler_id] = sampler
            if path is not None:
                self.sampler_paths[path] = sampler
            return Reply(
                {
                    "path": path,
                    "sampling_session_id": sampler_id,
                    "type": "save_weights_for_sampler",
                }
            )

        return self._in_order(model_id, seq_id, work)

    # -- samplers --------------------------------------------------------------------------

    def create_sampler(self, model_path: str | None, base_model: str | None) -> dict[str, Any]:
        """A sampling session on saved sampler weights (``model_path``)."""
        if model_path is None:
            if base_model is not None:
                self.check_base_model(base_model)
            raise BadRequestError(
                "sampling the base model without a training client is not supported by this "
                "server; create a training client and save_weights_and_get_sampling_client()"
            )
        saved = self.sampler_paths.get(model_path)
        if saved is None:
            raise NotFoundError(
                f"no sampler weights at {model_path!r} (save_weights_for_sampler first)"
            )
        sampler_id = f"samp-{next(self._sampler_ids)}"
        self.samplers[sampler_id] = Sampler(sampler_id, saved.model_id, saved.version, model_path)
        return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}

    def sampler(self, sampler_id: str) -> Sampler:
        """The sampling session ``sampler_id`` (:class:`NotFoundError` otherwise)."""
        sampler = self.samplers.get(sampler_id)
        if sampler is None:
            raise NotFoundError(f"no sampling session {sampler_id!r}")
        return sampler

    def sample(self, sampler_id: str, call: SampleCall) -> dict[str, Any]:
        """Queue ``call`` on the sampler's rollout; the result is a protobuf ``SampleResponse``."""
        sampler = self.sampler(sampler_id)
        model = self.model(sampler.model_id)
        if model.version != sampler.version:
            raise BadRequestError(
                f"sampling session {sampler_id!r} samples weight version {sampler.version}, but "
                f"its training client's rollout now holds version {model.version} (weights "
                "saved since); create a sampling client from the newer weights"
            )
        future = self.batchers[sampler.model_id].add(call)
        prompt_logprobs = (
            (lambda: model.prompt_logprobs(sampler_id, call.prompt))
            if call.prompt_logprobs
            else None
        )
        reply: Future[Reply] = Future()

        def finish(done: Future[list]) -> None:
            try:
                sequences = done.result()
                extra = prompt_logprobs() if prompt_logprobs is not None else None
                reply.set_result(Reply(encode_sample(sequences, extra)))
            except BaseException as error:
                reply.set_exception(error)

        future.add_done_callback(lambda done: model.runner.submit(lambda: finish(done)))
        ids = [f"{sampler_id}-{uuid.uuid4().hex[:8]}" for _ in range(call.num_samples)]
        return {**self._track(reply), "sample_sequence_ids": ids}


def check_name(name: str) -> str:
    """A checkpoint name usable in a ``tinker://`` path (no ``/``)."""
    if not name or "/" in name or name in (".", ".."):
        raise BadRequestError(f"checkpoint name {name!r} must be non-empty and contain no '/'")
    return name


def parse_path(path: str) -> tuple[str, str, str]:
    """``tinker://<model_id>/<kind>/<name>`` -> ``(model_id, kind, name)``."""
    parts = path.removeprefix(SCHEME).split("/") if path.startswith(SCHEME) else []
    if len(parts) != 3 or not all(parts):
        raise BadRequestError(
            f"path {path!r} is not tinker://<model_id>/<weights|sampler_weights>/<name>"
        )
    return parts[0], parts[1], parts[2]
