"""Turn the GPU run's ``results.json`` files into the markdown of docs/benchmarks.md.

Usage: ``python tools/gpu/report.py RESULTS.json [RESULTS.json ...]`` (one per device call;
later files win for a stage run twice). Prints one table of stages, then one section per
stage that measured something. Nothing is written: paste what it prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PHASES = (
    "gen",
    "reward",
    "old_log_prob",
    "adv",
    "update_actor",
    "sync_weights",
    "sleep",
    "wake_up",
    "step",
)


def merged(paths: list[str]) -> dict[str, Any]:
    """The stages of every file, later ones replacing earlier."""
    results: dict[str, Any] = {}
    for path in paths:
        results.update(json.loads(Path(path).read_text()))
    return results


def stage_table(results: dict[str, Any]) -> list[str]:
    """One row per stage: status and seconds."""
    rows = ["| stage | status | seconds |", "| --- | --- | ---: |"]
    for name, value in results.items():
        if isinstance(value, dict) and "status" in value:
            rows.append(f"| {name} | {value['status']} | {value['seconds']} |")
    return rows


def gib(value: float | None) -> str:
    """A memory figure, or ``-`` where none was recorded (a CPU run)."""
    return "-" if value is None else f"{value:.2f}"


def grpo_section(summary: dict[str, Any]) -> list[str]:
    """Per-phase median seconds and peak memory of the GRPO run, and its validation."""
    seconds, peak = summary.get("seconds", {}), summary.get("memory_peak_gib", {})
    device = summary.get("memory_device_gib", {})
    rows = [
        "| phase | median s | peak GiB (trainer process) | device used GiB (all) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for phase in [p for p in PHASES if p in seconds] + sorted(set(seconds) - set(PHASES)):
        memory = f"{gib(peak.get(phase))} | {gib(device.get(phase))}"
        rows.append(f"| {phase} | {seconds[phase]:.3f} | {memory} |")
    rows.append("")
    rows.append(f"{summary.get('steps')} steps; first step {summary.get('first_step_seconds')} s.")
    for val in summary.get("validation", []):
        shown = {k: round(v, 3) for k, v in val.items() if "accuracy" in k or "pass@" in k}
        rows.append(f"- validation: {shown}")
    return rows


def mfu_section(mfu: Any) -> list[str]:
    """The FSDP2 benchmark's contenders: seconds per step, tokens/s, MFU, peak memory, and
    the step against the plain autocast loop."""
    rows = mfu.get("results", []) if isinstance(mfu, dict) else []
    plain = next(
        (r["step_s"] for r in rows if r["name"].startswith("plain transformers, fp32")), None
    )
    lines = [
        "| contender | s / step | vs plain autocast | tokens/s | MFU (6N) | peak GiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratio = f"{row['step_s'] / plain:.2f}x" if plain else "-"
        mfu_6n = row.get("mfu_6n")
        shown = "-" if mfu_6n is None else f"{100 * mfu_6n:.1f}%"
        peak = row.get("peak_memory_gib")
        lines.append(
            f"| {row['name']} | {row['step_s']:.3f} | {ratio} | "
            f"{row['tokens_per_s']:,.0f} | {shown} | "
            f"{'-' if peak is None else f'{peak:.1f}'} |"
        )
    return lines


def main(paths: list[str]) -> None:
    """Print the markdown."""
    results = merged(paths)
    print("\n".join(stage_table(results)))
    smoke = results.get("vllm_smoke", {}).get("smoke.json")
    if smoke:
        print(f"\nvLLM smoke: {json.dumps(smoke)}")
    record = results.get("vllm_actor", {}).get("record.jsonl")
    if record:
        print("\nvLLM + FSDP2 actor:")
        for line in record:
            print(f"- {json.dumps(line)}")
    mfu = results.get("fsdp_mfu", {}).get("mfu.json")
    if mfu:
        print("\nFSDP2 step vs plain loops:\n" + "\n".join(mfu_section(mfu)))
    megatron = results.get("megatron_mfu", {}).get("mfu.json")
    if megatron:
        print("\nMegatronEngine (TP=1, bf16) beside FSDP2:\n" + "\n".join(mfu_section(megatron)))
    sp_path = results.get("sp_path", {}).get("sp.json")
    if sp_path:
        print(f"\nUlysses path at one rank vs the plain forward: {json.dumps(sp_path)}")
    summary = results.get("grpo_real", {}).get("summary.json")
    if summary:
        print(
            "\nGRPO, SmolLM2-135M-Instruct, hybrid placement:\n" + "\n".join(grpo_section(summary))
        )


if __name__ == "__main__":
    main(sys.argv[1:])
