"""The typed group Protocols of ``hf_algos.trainers.roles.protocols`` match the worker classes.

They are generated from them (tools/gen_group_protocols.py, whose committed output the
repository's tests/tools check); this test guards the package on its own.

A group gets its methods at run time from its worker class, so a Protocol that names a
parameter the worker method lacks, or lacks one it has (``export_hf``'s ``adapter_only``
once did), type-checks calls that fail or hides options. Parameters are compared by name,
kind and default (not the private ones Ray adds once a class became an actor); return types
differ by design (a group returns one result per rank, or the concatenated batch).
"""

from __future__ import annotations

import inspect

import pytest

from hf_algos.trainers.roles import protocols as groups
from hf_algos.trainers.roles import protocols_generated as group_protocols
from hf_algos.trainers.roles.sync_actor import SyncActorWorker
from hf_engines.workers import CriticWorker, ReferenceWorker, RewardModelWorker
from hf_rollout.weight_sync import link
from hf_rollout.workers import RolloutWorker

GROUP_METHODS_ONLY = {"world_size", "execute_all_async", "wait_results"}
"""Methods of the group object itself (``WorkerGroup``), not of its workers."""

PROTOCOL_MODULES = {group_protocols.__name__, link.__name__}
"""Where the group Protocols declare methods: the roles' (generated from the worker classes
by tools/gen_group_protocols.py) and the weight-sync methods (which ``ActorGroup`` and
``RolloutGroup`` extend) in ``hf_rollout.weight_sync.link``."""

PAIRS = [
    (groups.ActorGroup, SyncActorWorker),
    (groups.CriticGroup, CriticWorker),
    (groups.ReferenceGroup, ReferenceWorker),
    (groups.RewardModelGroup, RewardModelWorker),
    (groups.RolloutGroup, RolloutWorker),
]


def _parameters(function: object) -> list[tuple[str, object, object]]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [  # Ray adds private keyword parameters (_ray_trace_ctx) to an actor class's methods
        (p.name, p.kind, p.default)
        for p in signature.parameters.values()
        if p.name != "self" and not p.name.startswith("_")
    ]


def _protocol_methods(protocol: type) -> dict[str, object]:
    methods = {}
    for klass in reversed(protocol.__mro__):
        if klass.__module__ not in PROTOCOL_MODULES:
            continue  # typing.Protocol, object, and Checkpointable's own docs-only methods
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                methods[name] = value
    return methods


@pytest.mark.parametrize(("protocol", "worker"), PAIRS, ids=lambda x: x.__name__)
def test_every_protocol_method_has_the_workers_parameters(protocol: type, worker: type) -> None:
    methods = _protocol_methods(protocol)
    assert methods, protocol
    for name, method in methods.items():
        if name in GROUP_METHODS_ONLY:
            continue
        assert hasattr(worker, name), f"{protocol.__name__}.{name}: {worker.__name__} has none"
        assert _parameters(method) == _parameters(getattr(worker, name)), (
            f"{protocol.__name__}.{name} and {worker.__name__}.{name} take different "
            f"parameters: {_parameters(method)} vs {_parameters(getattr(worker, name))}"
        )
