"""GRPO through the Tinker API: the ``tinker`` column of ``bench_real_grpo.py``.

The same loop as the other columns, written against the official ``tinker`` SDK and run
on ``hybridflow serve --config-name serve_smollm2`` (started here, in a subprocess, with
the settings' model, precision and the column's threads). Each step takes the next
``prompts_per_step`` rows; samples ``group_size`` answers per prompt (one ``sample`` call
per prompt, all in flight at once, at the training temperature); scores them with
HybridFlow's reasoning-gym scorer; takes GRPO advantages ``(r - mean) / (std + 1e-6)`` per
group; sends one ``forward_backward`` with Tinker's ``ppo`` loss (clip thresholds
``1 - clip_low`` / ``1 + clip_high``; the advantages divided by the step's response tokens,
so that Tinker's summed loss is the token mean the other columns take) and the sampler's
log-probs as the old ones; one ``optim_step`` with the settings' AdamW values and clip; and
``save_weights_and_get_sampling_client`` for the next step's samples. Step time counts all
of it. Validation (greedy, and ``val_samples`` sampled answers per prompt) samples through
the API and is kept off the training clock. ``--noop-calls N`` also times ``N`` round trips
of a one-token ``forward`` (the API's cost per call, with the model's smallest forward).

Usage (dev venv with hf-algos[serve]; the driver writes the files):

    python tools/bench/real_grpo_tinker.py --settings S.json --train T.jsonl --val V.jsonl \
        --result tinker.json --steps 24 --eval-every 8 --seed 0
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tinker
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_grpo_task as task

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def ints(values: list[int]) -> types.TensorData:
    """An int64 loss input."""
    return types.TensorData(data=values, dtype="int64", shape=[len(values)])


def floats(values: list[float]) -> types.TensorData:
    """A float32 loss input."""
    return types.TensorData(data=values, dtype="float32", shape=[len(values)])


def start_server(settings: task.RealSettings, threads: int, workdir: Path) -> tuple[Any, str]:
    """``hybridflow serve`` with the settings' model and precision; (process, base URL)."""
    precision = "bfloat16" if settings.precision == "bfloat16" else "float32"
    command = [
        sys.executable, "-m", "hf_algos", "serve", "--config-name", "serve_smollm2",
        "serve.port=0", f"actor.engine.model.path={settings.model}",
        f"actor.engine.fsdp.param_dtype={precision}", f"rollout.dtype={precision}",
        f"serve.state_dir={workdir / 'serve_state'}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log = (workdir / "tinker_server.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    deadline = time.monotonic() + 600
    while not (found := re.search(r"TINKER_BASE_URL=(\S+)", Path(log.name).read_text())):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(
                f"hybridflow serve did not start: {Path(log.name).read_text()[-2000:]}"
            )
        time.sleep(0.5)
    return process, found.group(1)


def group_advantages(rewards: list[float], group_size: int) -> list[float]:
    """GRPO advantages per contiguous group: ``(r - mean) / (unbiased std + 1e-6)``."""
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean, std = statistics.fmean(group), statistics.stdev(group) if len(group) > 1 else 0.0
        out += [(r - mean) / (std + 1e-6) for r in group]
    return out


def sample_all(sampler: Any, prompts: list[list[int]], n: int, params: Any) -> list[Any]:
    """Every prompt's ``n`` sequences (all requests in flight at once)."""
    futures: list[Future] = [
        sampler.sample(types.ModelInput.from_ints(ids), n, params) for ids in prompts
    ]
    return [future.result().sequences for future in futures]


def grpo_step(
    trainer: Any, sampler: Any, tokenizer: Any, rows: list[dict], s: task.RealSettings, phases: dict
) -> float:
    """One GRPO step through the API; the step's mean reward (each phase's seconds added to
    ``phases``: sample, forward_backward, optim_step)."""
    start = time.perf_counter()
    prompts = [task.prompt_ids(tokenizer, row["prompt"]) for row in rows]
    params = types.SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature)
    groups = sample_all(sampler, prompts, s.group_size, params)
    rewards, data = [], []
    for row, prompt, sequences in zip(rows, prompts, groups, strict=True):
        for sequence in sequences:
            text = tokenizer.decode(sequence.tokens, skip_special_tokens=True)
            rewards.append(task.score(text, row))
            data.append((prompt, list(sequence.tokens), list(sequence.logprobs)))
    phases.setdefault("sample", []).append(time.perf_counter() - start)
    advantages = group_advantages(rewards, s.group_size)
    tokens = sum(len(response) for _, response, _ in data)
    datums = [
        types.Datum(
            model_input=types.ModelInput.from_ints((prompt + response)[:-1]),
            loss_fn_inputs={
                "target_tokens": ints((prompt + response)[1:]),
                "logprobs": floats([0.0] * (len(prompt) - 1) + logprobs),
                "advantages": floats(
                    [0.0] * (len(prompt) - 1) + [advantage / tokens] * len(response)
                ),
            },
        )
        for (prompt, response, logprobs), advantage in zip(data, advantages, strict=True)
    ]
    config = {"clip_low_threshold": 1 - s.clip_low, "clip_high_threshold": 1 + s.clip_high}
    start = time.perf_counter()
    trainer.forward_backward(datums, "ppo", config).result()
    phases.setdefault("forward_backward", []).append(time.perf_counter() - start)
    start = time.perf_counter()
    adam = types.AdamParams(
        learning_rate=s.lr, beta1=s.betas[0], beta2=s.betas[1], eps=s.adam_eps,
        weight_decay=s.weight_decay, grad_clip_norm=s.grad_clip,
    )  # fmt: skip
    trainer.optim_step(adam).result()
    phases.setdefault("optim_step", []).append(time.perf_counter() - start)
    return statistics.fmean(rewards)


def evaluate(
    sampler: Any, tokenizer: Any, rows: list[dict], s: task.RealSettings, seed: int
) -> dict:
    """Greedy and sampled accuracy on ``rows`` through the API (as ``task.evaluate``)."""
    prompts = [task.prompt_ids(tokenizer, row["prompt"]) for row in rows]
    greedy = types.SamplingParams(max_tokens=s.max_new_tokens, temperature=0.0)
    answers = sample_all(sampler, prompts, 1, greedy)
    right = [
        task.score(tokenizer.decode(seqs[0].tokens, skip_special_tokens=True), row) >= 1.0
        for seqs, row in zip(answers, rows, strict=True)
    ]
    result = {"greedy": sum(right) / len(rows)}
    if s.val_samples:
        sampled = types.SamplingParams(
            max_tokens=s.max_new_tokens, temperature=s.temperature, seed=seed
        )
        groups = sample_all(sampler, prompts, s.val_samples, sampled)
        scores = [
            task.score(tokenizer.decode(seq.tokens, skip_special_tokens=True), row) >= 1.0
            for seqs, row in zip(groups, rows, strict=True)
            for seq in seqs
        ]
        result["sampled"] = sum(scores) / len(scores)
    return result


def noop_round_trips(trainer: Any, calls: int) -> list[float]:
    """Seconds of ``calls`` one-token ``forward`` round trips, one after another."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1]),
        loss_fn_inputs={"target_tokens": ints([2]), "weights": floats([1.0])},
    )
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        trainer.forward([datum], "cross_entropy").result()
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Command line: start the server, run GRPO through the SDK, write the run record."""
    raw = list(sys.argv[1:] if argv is None else argv)
    noop_calls = 0
    if "--noop-calls" in raw:
        index = raw.index("--noop-calls")
        noop_calls = int(raw[index + 1])
        del raw[index : index + 2]
    args = task.column_args(__doc__ or "", raw)
    settings = task.RealSettings.read(args.settings)
    process, url = start_server(settings, args.threads, args.result.parent)
    record = task.RealRunRecord(
        name="Tinker API (hybridflow serve)", notes=f"threads {args.threads}, {settings.precision}"
    )
    try:
        service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        trainer = service.create_lora_training_client(base_model=BASE_MODEL, rank=0).result()
        tokenizer = trainer.get_tokenizer()
        train, val = task.read_rows(args.train), task.read_rows(args.val)
        sampler = trainer.save_weights_and_get_sampling_client().result()

        def validate(step: int, seconds: float) -> None:
            accuracy = evaluate(sampler, tokenizer, val, settings, seed=args.seed * 1000 + step)
            record.evals.append({"step": step, "train_seconds": seconds, **accuracy})
            print(f"step {step:3d}  {seconds:7.1f}s  {accuracy}", flush=True)

        validate(0, 0.0)
        per_step = settings.prompts_per_step
        phases: dict[str, list[float]] = {}
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            rows = train[(step - 1) * per_step : step * per_step]
            record.rewards.append(grpo_step(trainer, sampler, tokenizer, rows, settings, phases))
            saved = time.perf_counter()
            sampler = trainer.save_weights_and_get_sampling_client().result()
            phases.setdefault("save_for_sampler", []).append(time.perf_counter() - saved)
            record.step_seconds.append(time.perf_counter() - start)
            print(
                f"step {step:3d}  {record.step_seconds[-1]:.1f}s  reward {record.rewards[-1]:.3f}",
                flush=True,
            )
            if step % args.eval_every == 0 or step == args.steps:
                validate(step, sum(record.step_seconds))
        result = asdict(record)
        result["phase_seconds"] = {k: statistics.median(v) for k, v in phases.items()}
        result["calls_per_step"] = settings.prompts_per_step + 3  # samples, fwd/bwd, step, save
        if noop_calls:
            result["noop_call_seconds"] = noop_round_trips(trainer, noop_calls)
        args.result.write_text(json.dumps(result, indent=1))
        service.close("success").result()
    finally:
        process.terminate()
        process.wait(timeout=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
