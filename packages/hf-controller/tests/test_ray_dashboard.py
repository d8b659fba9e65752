"""The Ray dashboard is opt-in for a local Ray: started, with its URL, when its packages are
installed; refused naming the extra to install when they are not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(180)

# A fresh process: the test session's own Ray is already initialised (ensure_ray keeps it).
SCRIPT = textwrap.dedent(
    """
    import json, urllib.request
    from hf_controller import ConfigurationError, dashboard_url, ensure_ray
    try:
        ensure_ray(include_dashboard=True, num_cpus=1, log_to_driver=False)
    except ConfigurationError as error:
        print(json.dumps({"error": str(error)}))
    else:
        url = dashboard_url()
        status = urllib.request.urlopen(url, timeout=60).status
        print(json.dumps({"url": url, "status": status}))
    """
)


def _dashboard_installed() -> bool:
    from ray._private.utils import get_dashboard_dependency_error

    return get_dashboard_dependency_error() is None


def _run() -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=150
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(_dashboard_installed(), reason="ray[default] is installed: see the next test")
def test_dashboard_without_its_packages_names_the_extra() -> None:
    error = str(_run()["error"])
    assert "pip install 'hf-controller[dashboard]'" in error and "ray[default]" in error


@pytest.mark.skipif(
    not _dashboard_installed(), reason="needs ray[default] (hf-controller[dashboard])"
)
def test_local_dashboard_opt_in_serves_its_url() -> None:
    result = _run()
    assert str(result["url"]).startswith("http://127.0.0.1:"), result
    assert result["status"] == 200
