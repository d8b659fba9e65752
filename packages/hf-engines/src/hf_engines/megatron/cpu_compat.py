"""The one place where megatron-core's CUDA-only calls are redirected to the CPU.

megatron-core 0.16 runs forward and backward on the CPU over gloo, except for two kinds of
CUDA-only calls in its code paths:

* ``torch.cuda.current_device()`` is used as the ``device=`` of freshly allocated tensors
  (gathers in the tensor-parallel mappings, rotary frequencies, pipeline shape exchange).
  On a CPU-only build it raises "Torch not compiled with CUDA enabled"; here it answers
  the CPU device instead.
* The model-parallel RNG tracker (``tensor_parallel.get_cuda_rng_tracker()``) snapshots and
  swaps *CUDA* generator states around dropout in tensor-parallel regions. Here the tracker
  is replaced by :class:`CpuRNGStatesTracker`, which keeps the same named states (the same
  seeds as ``model_parallel_cuda_manual_seed``) as CPU generator states.

Both redirections are applied by :func:`enable_cpu_execution` only when CUDA is not
available, so they never change a GPU run; megatron's own files are never edited. Nothing
else in this package touches megatron internals.

One more CUDA call sits in model construction: with pipeline parallelism and tied
embeddings, ``GPTModel`` moves the shared embedding with ``weight.data.cuda()`` before
all-reducing the first and last stages' copies. :func:`tensor_cuda_stays_on_cpu` makes
``Tensor.cuda`` return the tensor itself for the duration of that build only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import random as mp_random

_ENABLED = False


def _cpu_current_device() -> torch.device:
    """Stand-in for ``torch.cuda.current_device`` on a CPU-only process."""
    return torch.device("cpu")


class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
    """megatron's named RNG-state tracker, holding CPU generator states instead of CUDA ones.

    ``fork(name)`` runs its block with the default CPU generator set to the named state and
    stores the advanced state back, exactly as the CUDA tracker does with the GPU generator.
    """

    def add(self, name: str, seed: int) -> None:
        """Track a new named state seeded with ``seed`` (names and seeds must be unique)."""
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"RNG seed {seed} is already tracked")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} is already tracked")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        """Run the block under the named CPU RNG state, then restore the caller's state."""
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} is not tracked; seed it first")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


@contextlib.contextmanager
def tensor_cuda_stays_on_cpu() -> Iterator[None]:
    """Within the block, ``tensor.cuda()`` returns ``tensor`` when CUDA is not available.

    For building a pipeline-parallel ``GPTModel`` with tied embeddings on the CPU (megatron
    calls ``.cuda()`` on the shared embedding there). Does nothing when CUDA is available.
    """
    if torch.cuda.is_available():
        yield
        return
    original = torch.Tensor.cuda

    def stay(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self

    torch.Tensor.cuda = stay  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]


def enable_cpu_execution() -> None:
    """Redirect megatron's CUDA-only device and RNG calls to the CPU (idempotent).

    Does nothing when CUDA is available. Call before building a megatron model.
    """
    global _ENABLED
    if _ENABLED or torch.cuda.is_available():
        return
    torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]
    mp_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    _ENABLED = True


def seed_model_parallel_rng(seed: int) -> None:
    """Seed megatron's tracked RNG states as ``model_parallel_cuda_manual_seed`` does.

    On CUDA this is megatron's own function; on the CPU the same three named states (data
    parallel, tensor-model parallel, expert parallel) with the same seeds go into the CPU
    tracker installed by :func:`enable_cpu_execution`.
    """
    if torch.cuda.is_available():
        mp_random.model_parallel_cuda_manual_seed(seed)
        return
    enable_cpu_execution()
    tracker = mp_random.get_cuda_rng_tracker()
    tracker.reset()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    tracker.add(mp_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mp_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)
