"""BatchScheduler: concurrent requests merged, answered in order, bounded, drained on stop."""

import threading
import time

import numpy as np
import pytest

from configs.serving import ServingOptions
from tf_transformer.serving.batching import BatchScheduler
from tf_transformer.serving.rest_api import Unavailable


class Model:
    """Doubles each row; records the batches it ran. ``gate`` holds each call until set."""

    def __init__(self, gate=None):
        self.batches = []
        self.gate = gate
        self.started = threading.Event()

    def __call__(self, rows):
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append(list(rows))
        ids = np.zeros([len(rows), max(len(row) for row in rows)], np.int32)  # padded to the batch's longest row
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return {"doubled": np.array([2 * sum(row) for row in rows], np.float32), "ids": ids}

    @staticmethod
    def fit(rows):
        """``rows``' share of a batch's outputs → a call with ``rows`` alone's: ids as wide as their longest row."""
        return lambda share: {**share, "ids": share["ids"][:, : max(len(row) for row in rows)]}


def test_concurrent_requests_are_merged_and_each_gets_its_own_rows():
    gate = threading.Event()
    model = Model(gate)
    scheduler = BatchScheduler(ServingOptions(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1))
    try:
        first = scheduler.submit("k", model, [[1]])
        assert model.started.wait(5)  # the first batch runs alone and holds the thread
        requests = [[[i], [i, i]] for i in range(2, 5)] + [[[5]]]  # 7 rows: one batch
        futures = [scheduler.submit("k", model, rows, Model.fit(rows)) for rows in requests[:-1]]
        unfitted = scheduler.submit("k", model, requests[-1])
        gate.set()
        assert first.result(5)["doubled"].tolist() == [2]
        for i, future in zip(range(2, 5), futures, strict=True):
            outputs = future.result(5)
            assert outputs["doubled"].tolist() == [2 * i, 4 * i]
            assert outputs["ids"].tolist() == [[i, 0], [i, i]]
        assert unfitted.result(5)["ids"].tolist() == [[5, 0]]  # without fit: its share of the batch as is
        assert [len(batch) for batch in model.batches] == [1, 7]
    finally:
        scheduler.stop()


def test_a_batch_never_exceeds_max_batch_size_and_keys_are_not_mixed():
    gate = threading.Event()
    model = Model(gate)
    scheduler = BatchScheduler(ServingOptions(max_batch_size=3, batch_timeout_micros=0, num_batch_threads=1))
    try:
        blocker = scheduler.submit("a", model, [[0]])
        assert model.started.wait(5)
        futures = [scheduler.submit(key, model, [[1], [1]]) for key in ("a", "b", "a", "b")]
        gate.set()
        blocker.result(5)
        for future in futures:
            assert future.result(5)["doubled"].tolist() == [2, 2]
        assert all(len(batch) <= 3 for batch in model.batches)
        assert len(model.batches) == 5  # two rows each: never two requests of 2 in a batch of 3
        with pytest.raises(ValueError, match="exceed max_batch_size"):
            scheduler.submit("a", model, [[1]] * 4)
    finally:
        scheduler.stop()


def test_a_lone_request_waits_at_most_the_timeout():
    model = Model()
    scheduler = BatchScheduler(ServingOptions(max_batch_size=64, batch_timeout_micros=200_000, num_batch_threads=1))
    try:
        start = time.monotonic()
        assert scheduler.submit("k", model, [[3]]).result(5)["doubled"].tolist() == [6]
        waited = time.monotonic() - start
        assert 0.2 <= waited < 3.0
    finally:
        scheduler.stop()


def test_a_full_queue_refuses_and_stop_drains_what_is_queued():
    gate = threading.Event()
    model = Model(gate)
    scheduler = BatchScheduler(
        ServingOptions(max_batch_size=2, batch_timeout_micros=0, max_enqueued_batches=2, num_batch_threads=1)
    )
    running = scheduler.submit("k", model, [[1]])
    assert model.started.wait(5)
    queued = [scheduler.submit("k", model, [[1], [2]]), scheduler.submit("k", model, [[3], [4]])]
    with pytest.raises(Unavailable, match="queue is full"):
        scheduler.submit("k", model, [[5]])
    stopper = threading.Thread(target=scheduler.stop)
    stopper.start()
    deadline = time.monotonic() + 10
    while not scheduler._stopping:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(Unavailable, match="stopping"):
        scheduler.submit("k", model, [[6]])
    gate.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert running.result(0)["doubled"].tolist() == [2]
    assert [f.result(0)["doubled"].tolist() for f in queued] == [[2, 4], [6, 8]]


def test_a_failing_batch_fails_each_of_its_requests():
    def broken(rows):
        raise RuntimeError("model fault")

    scheduler = BatchScheduler(ServingOptions(max_batch_size=4, batch_timeout_micros=50_000, num_batch_threads=1))
    try:
        futures = [scheduler.submit("k", broken, [[1]]) for _ in range(3)]
        for future in futures:
            with pytest.raises(RuntimeError, match="model fault"):
                future.result(5)
        assert scheduler.submit("k", Model(), [[1]]).result(5)["doubled"].tolist() == [2]  # still working
    finally:
        scheduler.stop()


def test_one_bad_request_fails_alone_in_a_merged_batch():
    calls = []

    def picky(rows):
        calls.append(len(rows))
        if [13] in rows:
            raise ValueError("input 13 refused")
        return {"doubled": np.array([2 * sum(row) for row in rows], np.float32)}

    gate = threading.Event()
    blocker = Model(gate)
    scheduler = BatchScheduler(ServingOptions(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1))
    try:
        first = scheduler.submit("k", blocker, [[1]])
        assert blocker.started.wait(5)
        futures = [scheduler.submit("k", picky, [[i]]) for i in (2, 13, 4)]
        gate.set()
        first.result(5)
        assert futures[0].result(5)["doubled"].tolist() == [4]
        with pytest.raises(ValueError, match="input 13"):
            futures[1].result(5)
        assert futures[2].result(5)["doubled"].tolist() == [8]
        assert calls == [3, 1, 1, 1]  # merged, failed, then each alone
    finally:
        scheduler.stop()
