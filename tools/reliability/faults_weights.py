"""Weight-push faults: a push between actor rank 0 and two rollout ranks over real gloo, with
one fault injected (``hf_rollout.weight_sync.faults.WeightFaults``).

Each case runs :func:`hf_rollout.weight_sync.drill.run` (a push of version 1 that succeeds,
then the faulty push of version 2) and checks that the error is named within seconds and
that every surviving receiver still holds exactly version 1. See :mod:`faults`.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from faults import FaultCase, FaultResult, first_line

from hf_controller.worker import master_address
from hf_rollout.weight_sync import WeightChannel, WeightChannelError, WeightFaults
from hf_rollout.weight_sync.drill import DEADLINE_S, Plans, expected, run

KEPT = "nothing: the receivers keep version 1 whole"


def _said(message: str) -> str:
    """The message without the channel's description (the table shows what follows)."""
    return message.split("rollout ranks): ", 1)[-1]


def _check_kept(outcomes: list[Any], push: int) -> None:
    """The receiver's outcome of ``push`` is an error and it holds version 1 exactly."""
    kind, message, _, version, held = outcomes[push]
    assert kind != "ok" and version == 1 and held == expected(1), (kind, message, version)


@functools.lru_cache(maxsize=1)
def _integrity() -> dict[int, Any]:
    """One run: push 2 has a corrupted bucket, push 3 a dropped one, push 4 is clean."""
    plan: list[WeightFaults | None] = [
        None,
        WeightFaults(push=2, corrupt_bucket=1),
        WeightFaults(push=3, drop_bucket=2),
        None,
    ]
    return run(3, {0: (plan, False), 1: ([None] * 4, False), 2: ([None] * 4, False)})


def _integrity_case(push: int) -> FaultResult:
    out = _integrity()
    kind, message, seconds = out[0][push]
    assert kind == "WeightIntegrityError", message
    for rank in (1, 2):
        _check_kept(out[rank], push)
        assert out[rank][3][0] == "ok"  # the channel carries the next push
    return FaultResult("named error", seconds, KEPT, first_line(_said(message)))


def corrupted_bucket(scratch: Path) -> FaultResult:
    """A byte of one bucket flipped after the sender's checksum."""
    return _integrity_case(1)


def dropped_bucket(scratch: Path) -> FaultResult:
    """One bucket never broadcast."""
    return _integrity_case(2)


def sender_killed(scratch: Path) -> FaultResult:
    """The sender's process exits after two buckets of five."""
    plan = [None, WeightFaults(push=2, exit_after_buckets=2)]
    out = run(3, {0: (plan, False), 1: ([None] * 2, False), 2: ([None] * 2, False)}, killed=0)
    for rank in (1, 2):
        _check_kept(out[rank], 1)
    kind, message, seconds, *_ = out[1][1]
    assert kind == "WeightPushError", message
    return FaultResult("named error", seconds, KEPT, first_line(_said(message)))


def receiver_killed(scratch: Path) -> FaultResult:
    """Rollout rank 2's process exits after one bucket of five."""
    dying = [None, WeightFaults(push=2, exit_after_buckets=1)]
    plans: Plans = {0: ([None, None], False), 1: ([None, None], False), 2: (dying, False)}
    out = run(3, plans, killed=2)
    _check_kept(out[1], 1)
    kind, message, seconds = out[0][1]
    assert kind == "WeightPushError" and "2]" in message, message
    return FaultResult("named error", seconds, KEPT, first_line(_said(message)))


def never_ready(scratch: Path) -> FaultResult:
    """Rollout rank 2 joined the channel but never calls receive_weights."""
    out = run(3, {0: ([None], False), 1: ([None], False), 2: ([None], True)})
    kind, message, seconds = out[0][0]
    assert kind == "WeightPushError" and "[2] not ready" in message, message
    assert out[1][0][3] == 0 and out[1][0][4] == expected(0)
    return FaultResult(
        "named error", seconds, "nothing: no tensor sent", first_line(_said(message))
    )


def never_joins(scratch: Path) -> FaultResult:
    """The only receiver never joins; the sender's join gives up after 3 s."""
    _, port = master_address()
    start = time.monotonic()
    try:
        WeightChannel.join("127.0.0.1", port, 0, 2, timeout_s=3.0, deadline_s=DEADLINE_S)
    except WeightChannelError as error:
        assert "rank(s) [1] did not join" in str(error), error
        detail = str(error).split("rollout ranks): ", 1)[-1]
        return FaultResult("named error", time.monotonic() - start, "nothing", first_line(detail))
    raise AssertionError("the sender joined a channel without its receiver")


FAULTS = [
    FaultCase("weight push: bucket corrupted (gloo, 2 receivers)", corrupted_bucket),
    FaultCase("weight push: bucket dropped", dropped_bucket),
    FaultCase(f"weight push: sender killed mid-push ({DEADLINE_S:.0f} s deadline)", sender_killed),
    FaultCase("weight push: receiver killed mid-push", receiver_killed),
    FaultCase("weight push: receiver never comes to receive", never_ready),
    FaultCase("weight channel: receiver never joins (3 s timeout)", never_joins),
]
