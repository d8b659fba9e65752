"""``hybridflow serve``: start the Tinker-compatible server for a config and run until
stopped (Ctrl-C / SIGTERM end every session and its worker groups)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from hf_algos.serve.config import ServeConfig, is_loopback
from hf_controller import ConfigurationError


def api_key(config: ServeConfig) -> str | None:
    """The API key from ``serve.api_key_env``; required on a non-loopback bind."""
    key = os.environ.get(config.serve.api_key_env) or None
    if key is None and not is_loopback(config.serve.host):
        raise ConfigurationError(
            f"serve.host={config.serve.host!r} accepts connections from other machines, so "
            f"every request needs an API key: set {config.serve.api_key_env}=tml-<secret> "
            "(clients send it as TINKER_API_KEY), or bind 127.0.0.1"
        )
    if key is not None and not key.startswith("tml-"):
        raise ConfigurationError(
            f"{config.serve.api_key_env} must start with 'tml-': the tinker SDK refuses any "
            "other key before sending it"
        )
    return key


def bind(config: ServeConfig) -> socket.socket:
    """The listening socket (``serve.port`` 0: any free port)."""
    family = socket.AF_INET6 if ":" in config.serve.host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio disables Nagle (TCP_NODELAY) only on connections of
    # a socket whose proto says TCP; with proto 0 every keep-alive response waited ~40 ms
    # for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.serve.host, config.serve.port))
    except OSError as error:
        sock.close()
        raise ConfigurationError(
            f"cannot listen on {config.serve.host}:{config.serve.port} ({error.strerror}); "
            "choose another serve.port (0: any free one)"
        ) from None
    sock.listen(128)
    return sock


def prepare(config: ServeConfig) -> tuple[uvicorn.Server, socket.socket, str]:
    """The server for ``config``, its bound socket and its base URL (the key checked and
    the tokenizer loaded first, so a bad config fails before anything listens)."""
    from hf_algos.data.tokenizer import load_tokenizer
    from hf_algos.serve.app import build_app
    from hf_algos.serve.service import TinkerService

    key = api_key(config)
    tokenizer = load_tokenizer(config.data, config.actor)
    tokenizer_id = str(Path(tokenizer.name_or_path).resolve())
    service = TinkerService(config, tokenizer, tokenizer_id)
    app = build_app(service, key)
    sock = bind(config)
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=75))
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(
        f"hybridflow serve: Tinker API on {url} (base model {config.base_model!r}; API key "
        f"{'required' if key else 'not required: loopback'}); point the SDK at it with "
        f"TINKER_BASE_URL={url}",
        flush=True,
    )
    return server, sock, url


def serve(config: ServeConfig) -> None:
    """Run the server for ``config`` until interrupted (Ray, when used, started here on
    the main thread, where its signal handling belongs, not by the first client)."""
    if config.trainer.backend == "ray":
        from hf_controller import ensure_ray

        ensure_ray(include_dashboard=config.trainer.ray_dashboard)
    server, sock, _ = prepare(config)
    server.run(sockets=[sock])


@contextlib.contextmanager
def running_server(config: ServeConfig) -> Iterator[str]:
    """Serve ``config`` on a background thread (tests, benchmarks, notebooks); yields the
    base URL once it accepts connections, and stops it (every session ended) on exit."""
    server, sock, url = prepare(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"hybridflow serve did not start on {url}")
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=120)
        sock.close()
        if config.trainer.backend == "local":  # the workers ran in this process: end their
            from hf_engines.workers.distributed import shutdown_distributed  # process group

            shutdown_distributed()
