"""The HTTP surface: the Tinker API's routes under ``/api/v1`` (FastAPI), its checks
(API key, body size) and its error shape.

Every error is JSON ``{"error": ..., "category": ..., "detail": ...}`` with a 4xx status
naming what is wrong (5xx only for a server fault, without a traceback); a route the
server does not implement answers 404 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tinker import types

from hf_algos.serve.errors import (
    BadRequestError,
    NotFoundError,
    ServeError,
    TooLargeError,
    UnauthorizedError,
)
from hf_algos.serve.futures import failure
from hf_algos.serve.requests import optim_hyper, parse, sample_call
from hf_algos.serve.service import TinkerService
from hf_algos.serve.wire import decode_forward_backward

logger = logging.getLogger(__name__)

API = "/api/v1"
SWEEP_S = 30.0


def error_response(error: ServeError) -> JSONResponse:
    """The JSON error of ``error`` with its status."""
    body = {"error": str(error), "category": error.category, "detail": str(error)}
    return JSONResponse(body, status_code=error.status)


class GuardMiddleware:
    """ASGI middleware: the API key (when set) on every request, and the body size cap
    (counted as the body streams in, so a chunked upload cannot exceed it either)."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_bytes: int) -> None:
        self.app = app
        self.api_key = api_key
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value for key, value in scope["headers"]}
        if self.api_key is not None:
            given = headers.get("x-api-key", b"")
            if not hmac.compare_digest(given, self.api_key.encode()):
                missing = "missing" if not given else "wrong"
                error = UnauthorizedError(f"{missing} API key: send it in the X-API-Key header")
                await error_response(error)(scope, receive, send)
                return
        declared = int(headers.get("content-length", b"0") or 0)
        if declared > self.max_bytes:
            await error_response(self._too_large(declared))(scope, receive, send)
            return
        await self.app(scope, self._capped(receive), send)

    def _too_large(self, size: int) -> TooLargeError:
        return TooLargeError(
            f"request body of {size} bytes is over the {self.max_bytes}-byte cap "
            "(serve.max_request_mb); send fewer datums per call"
        )

    def _capped(self, receive: Receive) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise self._too_large(seen)
            return message

        return wrapped


async def json_body(request: Request) -> Any:
    """The request's JSON body; :class:`BadRequestError` when it is not JSON."""
    raw = await request.body()
    try:
        return json.loads(raw or b"{}")
    except ValueError as error:
        raise BadRequestError(f"the body is not valid JSON ({error})") from None


def build_app(service: TinkerService, api_key: str | None) -> FastAPI:
    """The FastAPI app serving ``service``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def sweep() -> None:
            while True:
                await asyncio.sleep(SWEEP_S)
                service.expire()

        task = asyncio.create_task(sweep())
        yield
        task.cancel()
        service.close()

    app = FastAPI(title="hybridflow serve (Tinker API)", lifespan=lifespan, docs_url=None)
    app.add_middleware(
        GuardMiddleware,
        api_key=api_key,
        max_bytes=int(service.config.serve.max_request_mb * (1 << 20)),
    )

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, error: ServeError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        body = {"error": f"{type(error).__name__}: {error}", "category": "server"}
        return JSONResponse(body, status_code=500)

    _session_routes(app, service)
    _training_routes(app, service)
    _sampling_routes(app, service)
    _future_routes(app, service)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unsupported(path: str, request: Request) -> JSONResponse:
        return error_response(
            NotFoundError(
                f"{request.method} /{path} is not implemented by hybridflow serve "
                "(docs/serve.md lists what is)"
            )
        )

    return app


Handler = Callable[..., Awaitable[Any]]


def _session_routes(app: FastAPI, service: TinkerService) -> None:
    @app.post(f"{API}/client/config")
    async def client_config() -> dict:
        return {}

    @app.post(f"{API}/client/dynamic_config")
    async def dynamic_config() -> dict:
        return {}

    @app.get(f"{API}/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get(f"{API}/get_server_capabilities")
    async def capabilities() -> dict:
        model = {"model_name": service.config.base_model, "trainable": True, "sampleable": True}
        return {"supported_models": [model]}

    @app.post(f"{API}/create_session")
    async def create_session(request: Request) -> dict:
        parse(types.CreateSessionRequest, await json_body(request))
        return service.create_session()

    @app.post(f"{API}/session_heartbeat")
    async def heartbeat(request: Request) -> dict:
        body = parse(types.SessionHeartbeatRequest, await json_body(request))
        service.heartbeat(body.session_id)
        return {"type": "session_heartbeat"}

    @app.post(f"{API}/sessions/{{session_id}}/finish")
    async def finish(session_id: str) -> dict:
        service.end_session(session_id)
        return {}

    @app.post(f"{API}/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}


def _training_routes(app: FastAPI, service: TinkerService) -> None:
    @app.post(f"{API}/create_model")
    async def create_model(request: Request) -> dict:
        body = parse(types.CreateModelRequest, await json_body(request))
        rank = body.lora_config.rank if body.lora_config is not None else 0
        return service.create_model(body.session_id, body.model_seq_id, body.base_model, rank)

    @app.post(f"{API}/get_info")
    async def get_info(request: Request) -> dict:
        body = parse(types.GetInfoRequest, await json_body(request))
        return service.get_info(body.model_id)

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request) -> dict:
        return service.forward_backward(decode_forward_backward(await request.body()))

    @app.post(f"{API}/optim_step")
    async def optim_step(request: Request) -> dict:
        body = parse(types.OptimStepRequest, await json_body(request))
        return service.optim_step(body.model_id, body.seq_id, optim_hyper(body))

    @app.post(f"{API}/save_weights")
    async def save_weights(request: Request) -> dict:
        body = parse(types.SaveWeightsRequest, await json_body(request))
        return service.save_state(body.model_id, body.seq_id, body.path)

    @app.post(f"{API}/load_weights")
    async def load_weights(request: Request) -> dict:
        body = parse(types.LoadWeightsRequest, await json_body(request))
        if body.model_id is not None:
            return service.load_state(body.model_id, body.seq_id, body.path, body.optimizer)
        if body.session_id is None or body.model_seq_id is None:
            raise BadRequestError(
                "load_weights needs model_id (load into a client) or session_id and "
                "model_seq_id (a new client from the state)"
            )
        if body.base_model is not None:
            service.check_base_model(body.base_model)
        return service.create_from_state(
            body.session_id, body.model_seq_id, body.path, body.optimizer
        )

    @app.post(f"{API}/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict:
        body = parse(types.SaveWeightsForSamplerRequest, await json_body(request))
        return service.save_for_sampler(body.model_id, body.seq_id, body.path)


def _sampling_routes(app: FastAPI, service: TinkerService) -> None:
    @app.post(f"{API}/create_sampling_session")
    async def create_sampler(request: Request) -> dict:
        body = parse(types.CreateSamplingSessionRequest, await json_body(request))
        service.session(body.session_id)
        return service.create_sampler(body.model_path, body.base_model)

    @app.get(f"{API}/samplers/{{sampler_id}}")
    async def get_sampler(sampler_id: str) -> dict:
        sampler = service.sampler(sampler_id)
        return {
            "sampler_id": sampler_id,
            "base_model": service.config.base_model,
            "model_path": sampler.path,
        }

    @app.post(f"{API}/asample")
    async def sample(request: Request) -> dict:
        body = parse(types.SampleRequest, await json_body(request))
        if body.sampling_session_id is None:
            raise BadRequestError(
                "sample without sampling_session_id is not supported; create a sampling client"
            )
        return service.sample(body.sampling_session_id, sample_call(body, service.tokenizer))


def _future_routes(app: FastAPI, service: TinkerService) -> None:
    @app.post(f"{API}/retrieve_future")
    async def retrieve(request: Request) -> Response:
        body = parse(types.FutureRetrieveRequest, await json_body(request))
        try:
            reply = await service.futures.retrieve(body.request_id)
        except ServeError as error:
            if error.status == 404:
                raise
            return JSONResponse(failure(error))
        except Exception as error:  # the call failed: Tinker's RequestFailedResponse
            logger.warning("request %s failed: %s", body.request_id, error)
            return JSONResponse(failure(error))
        if reply is None:  # 408 with try_again: the SDK polls again at once, without a warning
            pending = {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
            return JSONResponse(pending, status_code=408)
        if isinstance(reply.body, bytes):
            return Response(reply.body, media_type=reply.media_type)
        return JSONResponse(reply.body)
