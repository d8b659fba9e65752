"""Results of ``bench_controller.py`` and the markdown it writes about them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
from bench_support import GB

LATENCY_TARGET = 1.3  # hf-controller no-op call time / raw Ray, at most
TRANSFER_TARGET = 1.5  # hf-controller DP_COMPUTE_PROTO round trip / raw Ray, at most

RAW = "raw Ray"
RAW_JOIN = "raw Ray + join on driver"
HF = "hf-controller"
VERL = "verl 0.9.1"


@dataclass
class LatencyResult:
    """Per-call times of one contender at one group size, in seconds."""

    workers: int
    label: str
    times: list[float]

    @property
    def median_ms(self) -> float:
        """Median call in milliseconds."""
        return statistics.median(self.times) * 1e3

    @property
    def p90_ms(self) -> float:
        """90th-percentile call in milliseconds."""
        return statistics.quantiles(self.times, n=10)[-1] * 1e3


@dataclass
class TransferResult:
    """Round trips of one case at one batch size, in seconds."""

    size_mib: int
    label: str
    nbytes: int
    times: list[float]

    @property
    def median_s(self) -> float:
        """Median round trip in seconds."""
        return statistics.median(self.times)

    @property
    def gb_per_s(self) -> float:
        """Batch bytes over the median round trip, decimal GB/s (each byte goes out and back)."""
        return self.nbytes / self.median_s / GB


@dataclass
class PhaseSplit:
    """Medians of hf-controller's own dispatch / execute / collect timings at one size, in s."""

    size_mib: int
    dispatch: float
    execute: float
    collect: float


def ratio_text(value: float | None) -> str:
    """``1.23x``, or ``-`` when there is nothing to compare with."""
    return f"{value:.2f}x" if value is not None else "-"


def latency_table(results: list[LatencyResult]) -> str:
    """One row per group size: median no-op call per contender, and time ratios to raw Ray."""
    by_size: dict[int, dict[str, LatencyResult]] = {}
    for result in results:
        by_size.setdefault(result.workers, {})[result.label] = result
    lines = [
        f"| workers | {RAW} (ms) | {HF} (ms) | {VERL} (ms) | {HF} / raw | {VERL} / raw |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for workers, row in sorted(by_size.items()):
        raw, hf, verl = row[RAW].median_ms, row[HF].median_ms, row.get(VERL)
        verl_ms = verl.median_ms if verl is not None else None
        lines.append(
            f"| {workers} | {raw:.2f} | {hf:.2f} | "
            f"{f'{verl_ms:.2f}' if verl_ms is not None else '-'} | {ratio_text(hf / raw)} | "
            f"{ratio_text(verl_ms / raw if verl_ms is not None else None)} |"
        )
    return "\n".join(lines)


def transfer_table(results: list[TransferResult], phases: list[PhaseSplit]) -> str:
    """One row per (size, case): median round trip, GB/s, time ratio to raw Ray, and for
    hf-controller the part of the round trip its collect (``DataProto.concat``) took."""
    raw = {r.size_mib: r.median_s for r in results if r.label == RAW}
    collect = {p.size_mib: p.collect for p in phases}
    lines = [
        "| size | case | round trip (ms) | GB/s | time vs raw Ray | of which collect (ms) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in results:
        collect_text = (
            f"{collect[r.size_mib] * 1e3:.1f}" if r.label == HF and r.size_mib in collect else ""
        )
        lines.append(
            f"| {r.size_mib} MiB | {r.label} | {r.median_s * 1e3:.1f} | {r.gb_per_s:.2f} | "
            f"{ratio_text(r.median_s / raw[r.size_mib])} | {collect_text} |"
        )
    return "\n".join(lines)


def median_ratio_interval(
    numerator: list[float], denominator: list[float], resamples: int = 2000
) -> tuple[float, float]:
    """Approximate 95% bootstrap interval of ``median(numerator) / median(denominator)``.

    Treats the calls as independent draws, which consecutive calls on a busy machine
    are not quite, so read it as a sense of the noise rather than a guarantee.
    """
    rng = np.random.default_rng(0)
    top = np.asarray(numerator)
    bottom = np.asarray(denominator)
    tops = np.median(rng.choice(top, (resamples, top.size)), axis=1)
    bottoms = np.median(rng.choice(bottom, (resamples, bottom.size)), axis=1)
    low, high = np.percentile(tops / bottoms, [2.5, 97.5])
    return float(low), float(high)


def latency_verdict(ours: LatencyResult, other: LatencyResult, target: float) -> str:
    """``"2: 1.05x (95% 1.01-1.09, meets)"``: the time ratio at one group size."""
    ratio = ours.median_ms / other.median_ms
    low, high = median_ratio_interval(ours.times, other.times)
    verdict = "meets" if ratio <= target else "MISSES"
    return f"{ours.workers}: {ratio:.2f}x (95% {low:.2f}-{high:.2f}, {verdict})"


def verdicts(latency: list[LatencyResult], transfer: list[TransferResult]) -> list[str]:
    """One line per target: the measured time ratios and whether each meets it."""
    found = {(r.workers, r.label): r for r in latency}
    sizes = sorted({r.workers for r in latency})
    vs_raw = [latency_verdict(found[(w, HF)], found[(w, RAW)], LATENCY_TARGET) for w in sizes]
    lines = [f"No-op call, hf-controller vs target {LATENCY_TARGET}x raw Ray: " + ", ".join(vs_raw)]
    vs_verl = [
        latency_verdict(found[(w, HF)], found[(w, VERL)], 1.0) for w in sizes if (w, VERL) in found
    ]
    if vs_verl:
        lines.append("No-op call, hf-controller vs target 1.00x verl: " + ", ".join(vs_verl))
    raw = {r.size_mib: r.median_s for r in transfer if r.label == RAW}
    vs_raw = []
    for r in transfer:
        if r.label == HF:
            ratio = r.median_s / raw[r.size_mib]
            verdict = "meets" if ratio <= TRANSFER_TARGET else "MISSES"
            vs_raw.append(f"{r.size_mib} MiB: {ratio:.2f}x ({verdict})")
    if vs_raw:
        lines.append(
            f"DP_COMPUTE_PROTO round trip, hf-controller vs target {TRANSFER_TARGET}x raw Ray: "
            + ", ".join(vs_raw)
        )
    return lines


def report_body(
    header: str,
    latency: list[LatencyResult],
    transfer: list[TransferResult],
    phases: list[PhaseSplit],
    notes: list[str],
) -> str:
    """The generated block: header line, both tables, the verdicts and any notes."""
    parts = [header, "", latency_table(latency), ""]
    if transfer:
        parts += [transfer_table(transfer, phases), ""]
    parts += [f"{line}." for line in verdicts(latency, transfer)]
    parts += [f"\n{note}." for note in notes]
    return "\n".join(parts)
