"""A local Ray started by ensure_ray requires Ray's token: the GCS refuses calls without it."""

from __future__ import annotations

import os
import stat
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
