"""A local Ray started by ensure_ray requires Ray's token: the GCS refuses calls without it,
and a driver joining such a cluster without the token is told how to send it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest


def _get_cluster_id(address: str, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    """The status of a bare gRPC GetClusterId call to the GCS, sent with ``metadata``."""
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), metadata=metadata, timeout=10)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def test_local_ray_requires_the_token(ray_session: Any) -> None:
    from ray._raylet import AuthenticationTokenLoader

    assert os.environ.get("RAY_AUTH_MODE") == "token"
    address = ray_session.get_runtime_context().gcs_address
    assert address.startswith("127.0.0.1:")  # loopback, and a token on top
    token_header = tuple(AuthenticationTokenLoader.instance().get_token_for_http_header().items())
    assert token_header, "ensure_ray started Ray without a token"
    assert _get_cluster_id(address, ()) == grpc.StatusCode.UNAUTHENTICATED
    wrong = tuple((name, "Bearer " + "0" * 32) for name, _ in token_header)
    assert _get_cluster_id(address, wrong) == grpc.StatusCode.UNAUTHENTICATED
    assert _get_cluster_id(address, token_header) == grpc.StatusCode.OK
    # workers got the token the way Ray passes it on: calls into them succeed
    mode = ray_session.remote(lambda: os.environ.get("RAY_AUTH_MODE")).remote()
    assert ray_session.get(mode, timeout=60) == "token"


def test_token_file_is_private(ray_session: Any) -> None:
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN"):
        pytest.skip("the token comes from RAY_AUTH_TOKEN, not a file")
    assert path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO) == 0


JOIN = "from hf_controller import ensure_ray; ensure_ray(); print('joined')"


def _join(address: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A fresh driver joining ``address`` through ``RAY_ADDRESS`` (``env`` on top; an empty
    value removes the variable). Ray's wait for an unreachable GCS is cut to 2 tries."""
    child = {**os.environ, "RAY_ADDRESS": address, "RAY_NUM_REDIS_GET_RETRIES": "2", **env}
    child = {name: value for name, value in child.items() if value}
    return subprocess.run(
        [sys.executable, "-c", JOIN], env=child, capture_output=True, text=True, timeout=120
    )


def test_joining_a_token_cluster_without_the_token_says_how(ray_session: Any) -> None:
    address = ray_session.get_runtime_context().gcs_address
    refused = _join(address, RAY_AUTH_MODE="")
    assert refused.returncode != 0
    assert "joined" not in refused.stdout
    assert f"could not join the Ray cluster at {address!r}" in refused.stderr
    assert "export RAY_AUTH_MODE=token" in refused.stderr
    accepted = _join(address, RAY_AUTH_MODE="token")
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert accepted.stdout.strip().endswith("joined")
