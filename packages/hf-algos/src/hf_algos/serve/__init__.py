"""``hybridflow serve``: a self-hosted, Tinker-compatible training API (docs/serve.md).

The official ``tinker`` SDK drives it: each training client is an actor worker group with
its rollout group, and the SDK's ``forward_backward`` / ``optim_step`` / ``sample`` calls
are queued on them as futures. Modules: :mod:`~hf_algos.serve.config` (the config),
:mod:`~hf_algos.serve.app` (HTTP), :mod:`~hf_algos.serve.service` (sessions, clients,
samplers), :mod:`~hf_algos.serve.models` (one client's groups), :mod:`~hf_algos.serve.worker`
(the worker methods), :mod:`~hf_algos.serve.losses` (Tinker's losses),
:mod:`~hf_algos.serve.wire` (protobuf), :mod:`~hf_algos.serve.batch` (datums as batches).
"""
