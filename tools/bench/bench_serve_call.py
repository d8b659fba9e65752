"""The Tinker API's own cost per call: one-token ``forward`` round trips through the
official ``tinker`` SDK against ``hybridflow serve`` on a tiny model, where the model's
forward is about a millisecond, so the time is the API's (HTTP, futures, the dispatch to
the worker group). Runs the server in process (``running_server``) with the local backend
and with Ray.

Usage (dev venv with hf-algos[serve]):

    python tools/bench/bench_serve_call.py [--calls 20] [--backends local,ray]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def round_trips(model: Path, backend: str, calls: int, state: Path) -> list[float]:
    """Seconds of ``calls`` one-token ``forward`` round trips on a server of ``backend``."""
    import tinker
    from tinker import types

    from hf_algos.config import load_config
    from hf_algos.serve.config import ServeConfig
    from hf_algos.serve.server import running_server

    config = load_config(
        ServeConfig,
        overrides=[
            f"actor.engine.model.path={model}",
            f"trainer.backend={backend}",
            "serve.port=0",
            f"serve.state_dir={state}",
        ],
    )
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=[2], dtype="int64", shape=[1]),
            "weights": types.TensorData(data=[1.0], dtype="float32", shape=[1]),
        },
    )
    with running_server(config) as url:
        service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        trainer = service.create_lora_training_client(base_model=str(model), rank=0).result()
        trainer.forward([datum], "cross_entropy").result()  # warm-up
        seconds = []
        for _ in range(calls):
            start = time.perf_counter()
            trainer.forward([datum], "cross_entropy").result()
            seconds.append(time.perf_counter() - start)
        service.close("success").result()
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Command line: time the round trips per backend and print the medians."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--backends", default="local,ray")
    args = parser.parse_args(argv)

    from hf_algos.data import build_char_tokenizer
    from hf_engines.testing import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "llama", "llama")
        build_char_tokenizer(model, chat_template=None)
        for backend in args.backends.split(","):
            seconds = round_trips(model, backend, args.calls, Path(tmp) / "state")
            print(
                f"{backend}: one-token forward round trip {1000 * statistics.median(seconds):.0f} "
                f"ms median of {len(seconds)} (min {1000 * min(seconds):.0f}, "
                f"max {1000 * max(seconds):.0f})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
