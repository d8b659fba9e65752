"""``hybridflow serve``'s HTTP guards, with raw requests: the API key, the body cap, bad
requests answered 4xx naming the field, unknown routes, a client that drops mid-call and
futures that expire."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("tinker", reason="needs the serve extra (the tinker SDK)")

from hf_algos.serve.config import ServeConfig
from hf_algos.serve.server import api_key, running_server
from hf_controller import ConfigurationError

from .serve_helpers import serve_config

pytestmark = pytest.mark.timeout(300)

KEY = "tml-secret-for-tests"
KEY_ENV = "HYBRIDFLOW_TEST_SERVE_KEY"


def config(model: Path, root: Path, *extra: str) -> ServeConfig:
    """The guarded server: a key, a 10 KiB body cap, 2 s future TTL, 1 s polls."""
    return serve_config(
        model,
        root,
        "serve.poll_wait_s=1",
        "serve.future_ttl_s=2",
        "serve.max_request_mb=0.01",
        f"serve.api_key_env={KEY_ENV}",
        *extra,
    )


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)
        with running_server(config(tiny_model_dir, tmp_path_factory.mktemp("state"))) as base:
            yield base


def post(url: str, path: str, body: object, key: str | None = KEY, **kw: object) -> httpx.Response:
    headers = {} if key is None else {"X-API-Key": key}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/api/v1/{path}", content=data, headers=headers, timeout=30, **kw)


def test_a_non_loopback_bind_needs_a_key(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigurationError, match=KEY_ENV):
        api_key(config(tiny_model_dir, tmp_path, "serve.host=0.0.0.0"))
    monkeypatch.setenv(KEY_ENV, "sk-not-tinker")
    with pytest.raises(ConfigurationError, match="tml-"):
        api_key(config(tiny_model_dir, tmp_path, "serve.host=0.0.0.0"))
    monkeypatch.setenv(KEY_ENV, KEY)
    assert api_key(config(tiny_model_dir, tmp_path, "serve.host=0.0.0.0")) == KEY
    monkeypatch.delenv(KEY_ENV)
    assert api_key(config(tiny_model_dir, tmp_path)) is None  # loopback: no key needed


def test_every_request_needs_the_key_and_it_is_never_logged(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    missing = post(url, "create_session", {}, key=None)
    wrong = post(url, "create_session", {}, key="tml-wrong")
    assert missing.status_code == wrong.status_code == 401
    assert "X-API-Key" in missing.json()["error"] and KEY not in wrong.text
    assert httpx.get(f"{url}/api/v1/healthz").status_code == 401
    assert httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": KEY}).json() == {"status": "ok"}
    assert KEY not in caplog.text


def test_bad_requests_are_4xx_naming_the_field(url: str) -> None:
    not_json = post(url, "create_session", b"{not json")
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]
    bad_field = post(
        url, "create_model", {"session_id": "s", "model_seq_id": "x", "base_model": "m"}
    )
    assert bad_field.status_code == 400 and "model_seq_id" in bad_field.json()["error"]
    not_proto = post(url, "forward_backward", b"\xff\xff\xff garbage")
    assert not_proto.status_code == 400 and "ForwardBackwardRequest" in not_proto.json()["error"]
    unknown = post(url, "no_such_call", {})
    assert unknown.status_code == 404 and "no_such_call" in unknown.json()["error"]
    session = post(url, "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "t"})
    other = post(
        url,
        "create_model",
        {"session_id": session.json()["session_id"], "model_seq_id": 0, "base_model": "nope"},
    )
    assert other.status_code == 400 and "is not served here" in other.json()["error"]
    for response in (not_json, bad_field, not_proto, unknown, other):
        assert "Traceback" not in response.text


def test_a_body_over_the_cap_is_refused(url: str) -> None:
    big = post(url, "create_session", {"tags": ["x" * 20_000], "sdk_version": "t"})
    assert big.status_code == 413 and "serve.max_request_mb" in big.json()["error"]


def test_a_dropped_client_leaves_the_server_serving_and_futures_expire(
    url: str, tiny_model_dir: Path
) -> None:
    session = post(url, "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "t"})
    session_id = session.json()["session_id"]
    created = post(
        url,
        "create_model",
        {"session_id": session_id, "model_seq_id": 0, "base_model": str(tiny_model_dir)},
    )
    request_id = created.json()["request_id"]
    # a client that asks for the result and hangs up before the answer
    host, port = url.removeprefix("http://").split(":")
    poll = json.dumps({"request_id": request_id}).encode()
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(
            b"POST /api/v1/retrieve_future HTTP/1.1\r\nHost: x\r\nX-API-Key: "
            + KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(poll)).encode()
            + b"\r\n\r\n"
            + poll
        )
    deadline = time.monotonic() + 120
    while True:  # another connection gets the result
        answer = post(url, "retrieve_future", {"request_id": request_id}).json()
        if answer.get("type") != "try_again" or time.monotonic() > deadline:
            break
    assert answer["model_id"] == f"{session_id}:train:0"
    time.sleep(3)  # serve.future_ttl_s=2
    expired = post(url, "retrieve_future", {"request_id": request_id})
    assert expired.status_code == 404 and "expired" in expired.json()["error"]
    assert post(url, f"sessions/{session_id}/finish", {}).status_code == 200


def test_a_client_that_fails_to_start_is_an_error_and_frees_its_slot(
    url: str, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hf_algos.serve.models import ServedModel

    def broken(self: ServedModel) -> None:
        raise RuntimeError("the worker group could not start (test)")

    session = post(url, "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "t"})
    session_id = session.json()["session_id"]
    body = {"session_id": session_id, "model_seq_id": 0, "base_model": str(tiny_model_dir)}
    with monkeypatch.context() as patch:
        patch.setattr(ServedModel, "build", broken)
        request_id = post(url, "create_model", body).json()["request_id"]
        answer = wait_for(url, request_id)
    assert answer["category"] == "server" and "could not start (test)" in answer["error"]
    retry = post(url, "create_model", {**body, "model_seq_id": 1})  # serve.max_models=1
    assert retry.status_code == 200, retry.text
    assert wait_for(url, retry.json()["request_id"])["model_id"] == f"{session_id}:train:1"
    post(url, f"sessions/{session_id}/finish", {})


def wait_for(url: str, request_id: str) -> dict:
    """The future's answer once it is not ``try_again`` (at most 120 s)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = post(url, "retrieve_future", {"request_id": request_id}).json()
        if answer.get("type") != "try_again":
            return answer
    raise AssertionError(f"{request_id} still pending after 120 s")


def test_the_listening_socket_is_tcp_so_asyncio_disables_nagle(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """asyncio sets TCP_NODELAY only on connections of a socket whose proto is TCP; with
    proto 0 each keep-alive response waited ~40 ms for the client's delayed ACK."""
    from hf_algos.serve.server import bind

    sock = bind(config(tiny_model_dir, tmp_path))
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
