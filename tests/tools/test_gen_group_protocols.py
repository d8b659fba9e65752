"""Tests for tools/gen_group_protocols.py against the real worker classes."""

from __future__ import annotations

import gen_group_protocols as gen

from hf_algos.trainers.roles import protocols as groups
from hf_controller.decorator import Dispatch, MethodSpec, method_spec
from hf_engines.workers import CriticWorker


def test_committed_protocols_are_up_to_date() -> None:
    assert gen.OUTPUT.read_text(encoding="utf-8") == gen.render(), (
        "hf_algos/trainers/roles/protocols_generated.py is stale: a worker's @register-ed methods "
        "changed; run `python tools/gen_group_protocols.py` and commit it"
    )


def test_every_registered_public_method_of_a_role_is_in_its_protocol() -> None:
    declared = gen.protocol_methods(groups.CriticGroup)
    registered = {name for name, _, _ in gen.registered_methods(CriticWorker)}
    assert registered and registered <= declared
    assert "_query_dispatch_info" not in declared  # private: not a driver call


def _spec(mode: Dispatch | dict[str, object], blocking: bool = True) -> MethodSpec:
    spec = method_spec(CriticWorker.init_model)
    assert spec is not None
    return MethodSpec(mode, spec.execute_mode, blocking, False, False)  # type: ignore[arg-type]


def test_the_dispatch_mode_gives_the_group_calls_return_type() -> None:
    assert gen.return_type("DataProto", _spec(Dispatch.DP_COMPUTE_PROTO)) == "DataProto"
    assert gen.return_type("int", _spec(Dispatch.ONE_TO_ALL)) == "list[int]"
    assert gen.return_type("tuple[str, int]", _spec(Dispatch.RANK_ZERO)) == "tuple[str, int]"
    assert gen.return_type("None", _spec(Dispatch.ONE_TO_ALL, blocking=False)) == "list[Any]"
    custom = {"dispatch_fn": print, "collect_fn": print}
    assert gen.return_type("DataProto", _spec(custom)) == "DataProto"
    assert gen.return_type("int", _spec(custom)) == "list[int]"
