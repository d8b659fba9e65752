"""Weight sync in the ``separate`` placement: the weight channel vs a bare broadcast vs the
old path through the driver.

What is measured: two Ray actors on one node, a *sender* holding a random fp32
Qwen2-shaped model (built from a config) and a *receiver* holding the same architecture.
One sync moves every ``state_dict()`` tensor from the sender into the receiver's model
(``hf_rollout.backends.native.copy_named_tensors``, what the native rollout engine's
``update_weights`` does). The driver issues the calls and waits, as the trainer does; the
time is the driver's wall time from issuing to both results. Three ways:

* ``channel``: ``hf_rollout.WeightChannel`` (gloo on CPU), ``weight_sync.sender.send`` streaming
  ``state_dict().items()`` in buckets of ``--bucket-mb`` (tensors of at least
  ``hf_rollout.weight_sync.wire.DIRECT_BYTES`` unpacked), each bucket checksummed; the
  receiver stages the whole push (verified) and then copies it into the model (an atomic
  commit); the driver gets ``None``s.
* ``bare broadcast``: one ``torch.distributed.broadcast`` of all the bytes as one flat
  uint8 tensor, already packed on the sender, nothing unpacked on the receiver: the floor
  the channel is held against (target: channel <= 1.5x).
* ``via driver``: the path the channel replaced: the sender returns ``{name: tensor}`` to
  the driver (``ray.get``), the driver ``ray.put``s it once, the receiver loads it.

Driver RSS growth: peak resident memory of the driver during one sync minus before it
(``VmHWM`` reset through ``/proc/self/clear_refs``; target for the channel: < 50 MB at
125M parameters). Medians of ``--repeats`` syncs after one warm-up each, the three ways
taking turns (round-robin), so load on a shared machine reaches each alike.

Run from the repository root::

    .venv/bin/python tools/bench/bench_weight_sync.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_support import MIB, keep_ray_local, machine_line, start_ray, write_section

SIZES: dict[str, dict[str, int]] = {
    "1M": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "vocab": 2048},
    "25M": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6, "vocab": 8192},
    "125M": {
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "vocab": 24576,
    },
}
"""Qwen2-shaped models of about 1M, 25M and 125M parameters (untied embeddings)."""


class SyncPeer:
    """One side of the sync (a Ray actor): a random model and the three transports."""

    def __init__(self, size: dict[str, int], threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, Qwen2Config

        torch.set_num_threads(threads)
        torch.manual_seed(0)
        config = Qwen2Config(
            hidden_size=size["hidden_size"],
            intermediate_size=size["intermediate_size"],
            num_hidden_layers=size["num_hidden_layers"],
            num_attention_heads=size["hidden_size"] // 64,
            num_key_value_heads=size["hidden_size"] // 64,
            vocab_size=size["vocab"],
            tie_word_embeddings=False,
        )
        self.model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        self.channel: Any = None
        self.flat: Any = None

    def stats(self) -> tuple[int, int]:
        """Parameters and bytes of the state dict."""
        state = self.model.state_dict()
        return sum(t.numel() for t in state.values()), sum(t.nbytes for t in state.values())

    def join(self, host: str, port: int, bare_port: int, rank: int) -> None:
        """Join the weight channel and, for the bare broadcast, a default process group."""
        import torch
        import torch.distributed as dist

        from hf_rollout import WeightChannel

        self.channel = WeightChannel.join(host, port, rank, 2)
        dist.init_process_group(
            "gloo", init_method=f"tcp://{host}:{bare_port}", rank=rank, world_size=2
        )
        nbytes = self.stats()[1]
        self.flat = torch.empty(nbytes, dtype=torch.uint8)
        if rank == 0:  # packed once, outside the timing: the floor excludes packing
            offset = 0
            for tensor in self.model.state_dict().values():
                raw = tensor.contiguous().reshape(-1).view(torch.uint8)
                self.flat[offset : offset + raw.numel()].copy_(raw)
                offset += raw.numel()

    def channel_send(self, bucket_bytes: int) -> None:
        """Stream the state dict into the channel."""
        from hf_rollout.weight_sync.sender import send

        send(self.channel, iter(self.model.state_dict().items()), bucket_bytes)

    def channel_receive(self) -> None:
        """Load one push from the channel into the model, as ``RolloutWorker`` does for the
        native engine: staged whole and verified, then copied into the model."""
        from hf_rollout.backends.native import copy_named_tensors
        from hf_rollout.weight_sync.receiver import receive

        copy_named_tensors(self.model, receive(self.channel))

    def bare_broadcast(self) -> None:
        """One broadcast of all the bytes as one flat tensor."""
        import torch.distributed as dist

        dist.broadcast(self.flat, src=0)

    def full_state_dict(self) -> dict[str, Any]:
        """The old sender: a cloned ``{name: tensor}`` returned to the driver."""
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}

    def load(self, state: dict[str, Any]) -> None:
        """The old receiver: copy a state dict into the model."""
        from hf_rollout.backends.native import copy_named_tensors

        copy_named_tensors(self.model, state.items())


def driver_sync(ray: Any, sender: Any, receiver: Any) -> None:
    """The path the channel replaced: through the driver and the object store."""
    state = ray.get(sender.full_state_dict.remote())
    ref = ray.put(state)
    ray.get(receiver.load.remote(ref))
    del state, ref


def peak_rss_growth(run: Callable[[], None]) -> tuple[float, float]:
    """Wall seconds of ``run()`` and the driver's peak RSS growth during it, in MB."""
    before = _vm_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    return elapsed, (_vm_kib("VmHWM") - before) * 1024 / 1e6


def _vm_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def bench_size(ray: Any, label: str, args: argparse.Namespace) -> dict[str, Any]:
    """Medians of the three ways for one model size."""
    from hf_controller.worker import master_address

    peer = ray.remote(num_cpus=1)(SyncPeer)
    sender = peer.remote(SIZES[label], args.threads)
    receiver = peer.remote(SIZES[label], args.threads)
    params, nbytes = ray.get(sender.stats.remote())
    host, port = master_address()
    _, bare_port = master_address()
    ray.get([p.join.remote(host, port, bare_port, r) for r, p in enumerate((sender, receiver))])
    bucket = args.bucket_mb * MIB
    ways: dict[str, Callable[[], None]] = {
        "channel": lambda: ray.get(
            [sender.channel_send.remote(bucket), receiver.channel_receive.remote()]
        ),
        "bare broadcast": lambda: ray.get(
            [sender.bare_broadcast.remote(), receiver.bare_broadcast.remote()]
        ),
        "via driver": lambda: driver_sync(ray, sender, receiver),
    }
    row: dict[str, Any] = {"label": label, "params": params, "bytes": nbytes}
    for run in ways.values():
        run()  # warm-up
    # Round-robin over the ways, so a change in the machine's load reaches each alike.
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, run in ways.items():
            samples[name].append(peak_rss_growth(run))
    for name, measured in samples.items():
        row[name] = statistics.median(s[0] for s in measured)
        row[name + " rss"] = statistics.median(s[1] for s in measured)
    for actor in (sender, receiver):
        ray.kill(actor)
    print(row, flush=True)
    return row


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The markdown block for docs/benchmarks.md."""
    load = os.getloadavg()[0]
    lines = [
        f"Machine: {machine_line(['torch', 'ray'])}; torch threads per process: "
        f"{args.threads}; load average at the end: {load:.1f}.",
        f"Bucket: {args.bucket_mb} MiB. Median of {args.repeats} syncs after one warm-up, wall "
        "seconds seen by the driver. RSS: the driver's peak resident-memory growth during a sync.",
        "",
        "| model | params | MB | channel s | bare broadcast s | channel / bare | via driver s "
        "| driver / channel | driver RSS, channel (MB) | driver RSS, via driver (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['params'] / 1e6:.1f}M | {row['bytes'] / 1e6:.0f} | "
            f"{row['channel']:.3f} | {row['bare broadcast']:.3f} | "
            f"{row['channel'] / row['bare broadcast']:.2f}x | {row['via driver']:.3f} | "
            f"{row['via driver'] / row['channel']:.2f}x | {row['channel rss']:.1f} | "
            f"{row['via driver rss']:.1f} |"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    """Command-line options (defaults are what docs/benchmarks.md shows)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,25M,125M", help=f"of {sorted(SIZES)}")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--object-store-gb", type=float, default=2.0)
    parser.add_argument("--output", type=Path, help="markdown file to write the results into")
    return parser.parse_args()


def main() -> None:
    """Run every size, print (and write) the table."""
    args = parse_args()
    keep_ray_local()
    ray = start_ray(args.object_store_gb, num_cpus=2)
    rows = [bench_size(ray, label, args) for label in args.sizes.split(",")]
    ray.shutdown()
    body = report(rows, args)
    print(body)
    if args.output is not None:
        title = "## Weight sync (separate placement): weight channel vs bare broadcast vs driver"
        write_section(args.output, "weight_sync", title, body)


if __name__ == "__main__":
    main()
