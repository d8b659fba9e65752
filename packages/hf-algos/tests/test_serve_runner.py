"""The per-model call queue of ``hybridflow serve``: training calls in ``seq_id`` order,
whatever order they arrive in; a repeated id refused; a missing one an error, not a hang."""

from __future__ import annotations

import threading

import pytest

from hf_algos.serve.errors import BadRequestError
from hf_algos.serve.runner import OrderedRunner


def test_calls_run_in_seq_id_order_whatever_the_arrival_order() -> None:
    runner = OrderedRunner("m")
    ran: list[int] = []
    futures = [runner.submit_in_order(seq, lambda seq=seq: ran.append(seq)) for seq in (3, 1, 2)]
    for future in futures:
        future.result(timeout=10)
    assert ran == [1, 2, 3]
    with pytest.raises(BadRequestError, match="already used"):
        runner.submit_in_order(2, lambda: None)
    runner.close()


def test_a_call_whose_predecessor_never_comes_fails_naming_it() -> None:
    runner = OrderedRunner("m", gap_timeout_s=0.2)
    ran: list[int] = []
    runner.submit_in_order(1, lambda: ran.append(1)).result(timeout=10)
    stuck = runner.submit_in_order(3, lambda: ran.append(3))  # 2 was rejected upstream
    with pytest.raises(BadRequestError, match=r"seq_id \[2\]"):
        stuck.result(timeout=10)
    runner.submit_in_order(4, lambda: ran.append(4)).result(timeout=10)  # the client goes on
    assert ran == [1, 4]
    runner.close()


def test_other_work_runs_in_arrival_order_on_one_thread() -> None:
    runner = OrderedRunner("m")
    threads: set[str] = set()
    order: list[int] = []
    for index in range(5):
        runner.submit(
            lambda i=index: (order.append(i), threads.add(threading.current_thread().name))
        )
    runner.submit(lambda: None).result(timeout=10)
    assert order == list(range(5)) and threads == {"serve-m"}
    runner.close()
