"""A push that fails, between real gloo processes: each fault injected by
``WeightFaults`` (the sender killed mid-push, a receiver killed mid-push, a bucket corrupted,
a bucket dropped, a rank that never comes) ends in seconds with a named error, and every
surviving receiver still holds exactly the last complete version."""

from __future__ import annotations

import pickle

import pytest

from hf_rollout.weight_sync import WeightFaults, WeightIntegrityError, WeightPushError
from hf_rollout.weight_sync.drill import DEADLINE_S, expected, run

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------ the tests


def test_a_corrupted_or_dropped_bucket_is_rejected_and_nothing_is_loaded() -> None:
    plan = [
        None,
        WeightFaults(push=2, corrupt_bucket=1),  # bucket [c]
        WeightFaults(push=3, drop_bucket=2),  # bucket [d]
        None,
    ]
    out = run(3, {0: (plan, False), 1: ([None] * 4, False), 2: ([None] * 4, False)})
    (ok1, _, _), corrupt, dropped, (ok4, _, _) = out[0]
    assert ok1 == ok4 == "ok"
    assert corrupt[0] == dropped[0] == WeightIntegrityError.__name__
    assert "version 2" in corrupt[1] and "checksum mismatch of c" in corrupt[1], corrupt[1]
    assert "rank 1" in corrupt[1] and "rank 2" in corrupt[1]
    assert "version 3" in dropped[1] and "tensors d lost" in dropped[1], dropped[1]
    for rank in (1, 2):
        first, bad, missing, last = out[rank]
        assert first[0] == "ok" and first[3] == 1 and first[4] == expected(1)
        assert bad[0] == WeightIntegrityError.__name__ and "checksum mismatch of c" in bad[1]
        assert "version 2" in bad[1] and bad[3] == 1 and bad[4] == expected(1)
        assert (
            missing[0] == WeightIntegrityError.__name__
            and "bucket(s) [2] never arrived" in missing[1]
        )
        assert "version 3" in missing[1] and missing[3] == 1 and missing[4] == expected(1)
        assert last[0] == "ok" and last[3] == 4 and last[4] == expected(4)  # channel still fine
        assert max(bad[2], missing[2]) < DEADLINE_S


def test_the_sender_killed_mid_push_leaves_the_receivers_on_the_last_version() -> None:
    plan = [None, WeightFaults(push=2, exit_after_buckets=2)]
    out = run(3, {0: (plan, False), 1: ([None] * 2, False), 2: ([None] * 2, False)}, killed=0)
    for rank in (1, 2):
        first, cut = out[rank]
        assert first[0] == "ok" and first[4] == expected(1)
        kind, message, seconds, version, held = cut
        assert kind == WeightPushError.__name__, message
        assert "version 2 cut off" in message and "keeps version 1" in message, message
        assert version == 1 and held == expected(1)  # exactly the last complete version
        assert seconds < DEADLINE_S + 2


def test_a_receiver_killed_mid_push_is_named_by_the_sender_within_the_deadline() -> None:
    plan = [None, None]
    dying = [None, WeightFaults(push=2, exit_after_buckets=1)]
    out = run(3, {0: (plan, False), 1: (plan, False), 2: (dying, False)}, killed=2)
    first, failed = out[0]
    assert first[0] == "ok"
    kind, message, seconds = failed
    assert kind == WeightPushError.__name__ and "version 2" in message, message
    # only the dead rank is named; the live one heard the sender's abort and said so
    assert "rank(s) [2] did not finish it" in message, message
    assert "rank(s) [1] stopped with it" in message, message
    assert seconds < DEADLINE_S + 2
    ok, cut = out[1]
    assert ok[0] == "ok" and ok[4] == expected(1)
    assert cut[0] == WeightPushError.__name__ and cut[3] == 1 and cut[4] == expected(1), cut[1]
    assert "the sender abandoned the push" in cut[1], cut[1]
    assert cut[2] < DEADLINE_S  # stopped at the abort, not at the push's deadline


def test_a_rank_that_never_comes_to_receive_is_named_before_any_broadcast() -> None:
    # The sender comes late: rank 1 has waited half its timeout already, and must still not
    # be taken for missing (it waits on once the sender opened the push).
    late = WeightFaults(push=1, late_s=DEADLINE_S / 2)
    out = run(3, {0: ([late], False), 1: ([None], False), 2: ([None], True)})
    kind, message, seconds = out[0][0]
    assert kind == WeightPushError.__name__, message
    assert "rank(s) [2] not ready" in message and "no tensor was sent" in message, message
    assert seconds < DEADLINE_S + 2
    kind, message, _, version, held = out[1][0]
    assert kind == WeightPushError.__name__ and "did not start" in message, message
    assert version == 0 and held == expected(0)


def test_the_push_errors_survive_pickling_with_their_fields() -> None:
    """Ray pickles a worker's exception for the driver; without ``__reduce__`` these two
    came out as Ray's bare ``UnserializableException`` (their ``__init__`` takes more than
    the message)."""
    push = WeightPushError("push 3 cut off", 3, [2])
    integrity = WeightIntegrityError("checksum mismatch of c", 2, ["c"])
    again_push = pickle.loads(pickle.dumps(push))
    again_integrity = pickle.loads(pickle.dumps(integrity))
    assert (str(again_push), again_push.version, again_push.ranks) == ("push 3 cut off", 3, [2])
    assert (str(again_integrity), again_integrity.version, again_integrity.names) == (
        "checksum mismatch of c",
        2,
        ["c"],
    )
