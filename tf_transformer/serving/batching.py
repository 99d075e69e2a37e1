"""Request batching as TF Serving's batching does it: concurrent requests merged into one model call.

A beam search decodes a batch of 16 sentences in little more time than one
sentence on a CPU (a step is hundreds of small ops whatever the batch), so
merging concurrent requests multiplies a server's throughput. The parameters
are TF Serving's (``--batching_parameters_file``), fields of
:class:`~configs.serving.ServingOptions`: a merged batch holds at most
``max_batch_size`` sentences, a batch waits at most ``batch_timeout_micros``
after its first request for more, ``num_batch_threads`` batches run at once and
at most ``max_enqueued_batches`` batches' worth of sentences wait; beyond that a
request is refused as unavailable rather than queued without bound.

A merged batch pads its outputs to its longest sentence; each request's share
is cut back to what a call with that request alone returns (``fit``), so that
an answer does not depend on who shared its batch. Merging changes the rows a
matrix product sees, so a merged translation can still differ from a lone
call's where two hypotheses score equal up to float rounding.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable

from absl import logging

from configs.serving import ServingOptions
from tf_transformer.serving.rest_api import QueueFull, Unavailable


@dataclasses.dataclass
class _Task:
    key: object  # requests with equal keys (a model version and signature) may be merged
    run: Callable[[list], dict]
    rows: list
    fit: Callable[[dict], dict] | None  # this request's share of a batch's outputs → a lone call's
    future: concurrent.futures.Future
    arrived: float
    model: str = ""  # the model's name, for the metrics


class BatchScheduler:
    """Merges the rows of concurrent :meth:`submit` calls with the same key into batches of ``run`` calls."""

    def __init__(self, options: ServingOptions, observe: Callable[[str, int, list[float]], None] | None = None):
        """Batches as ``options`` says (its batching fields); ``observe(model, sentences, waits)`` is told of each
        batch as it starts: its model's name (given to :meth:`submit`), its size and each request's wait."""
        self.max_batch_size = options.max_batch_size
        self.timeout = options.batch_timeout_micros / 1e6
        self.max_queued_rows = options.max_queued_rows
        self.observe = observe
        self._queue: collections.deque[_Task] = collections.deque()
        self._queued_rows = 0
        self._stopping = False
        self._changed = threading.Condition()
        self._threads = [
            threading.Thread(target=self._work, name=f"batch-{i}", daemon=True)
            for i in range(options.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self,
        key,
        run: Callable[[list], dict],
        rows: list,
        fit: Callable[[dict], dict] | None = None,
        model: str = "",
    ) -> concurrent.futures.Future:
        """Queues ``rows``; the future gives ``run``'s outputs for exactly these rows (first axis).

        ``fit`` takes these rows' share of a merged batch's outputs (first axis
        sliced) and returns what ``run(rows)`` alone would: it cuts the axes the
        batch padded to its longest request. Without it the share is returned as is.
        """
        if len(rows) > self.max_batch_size:
            raise ValueError(f"{len(rows)} rows exceed max_batch_size {self.max_batch_size}")
        future = concurrent.futures.Future()
        with self._changed:
            if self._stopping:
                raise Unavailable("The server is stopping; retry")
            if self._queued_rows + len(rows) > self.max_queued_rows:
                raise QueueFull(f"The batching queue is full ({self._queued_rows} sentences waiting); retry later")
            self._queue.append(_Task(key, run, rows, fit, future, time.monotonic(), model))
            self._queued_rows += len(rows)
            self._changed.notify_all()
        return future

    def stop(self) -> None:
        """Runs what is queued, then ends the batch threads."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()

    def _next_batch(self) -> list[_Task] | None:
        """The tasks of the next batch, once it is full or its first task has waited ``timeout``."""
        with self._changed:
            while not self._queue:
                if self._stopping:
                    return None
                self._changed.wait()
            first = self._queue[0]
            while not self._stopping:
                rows = sum(len(task.rows) for task in self._queue if task.key == first.key)
                left = first.arrived + self.timeout - time.monotonic()
                if rows >= self.max_batch_size or left <= 0:
                    break
                self._changed.wait(left)
                if not self._queue or self._queue[0] is not first:  # another thread took it
                    return []
            batch, size = [], 0
            for task in list(self._queue):
                if task.key == first.key and size + len(task.rows) <= self.max_batch_size:
                    batch.append(task)
                    size += len(task.rows)
                    self._queue.remove(task)
            self._queued_rows -= size
            self._changed.notify_all()  # another batch thread may take what is left
            return batch

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            live = [task for task in batch if task.future.set_running_or_notify_cancel()]
            if live and self.observe is not None:
                now = time.monotonic()
                try:  # never let counting stop the batch thread: its callers would wait for ever
                    waits = [now - task.arrived for task in live]
                    self.observe(live[0].model, sum(len(task.rows) for task in live), waits)
                except Exception:
                    logging.exception("observing a batch failed")
            if live:
                self._run(live, retry_alone=len(live) > 1)

    def _run(self, tasks: list[_Task], retry_alone: bool) -> None:
        """Runs ``tasks`` as one batch and answers each; never raises (a dead batch thread would hang callers)."""
        try:
            outputs = tasks[0].run([row for task in tasks for row in task.rows])
            start, results = 0, []
            for task in tasks:
                end = start + len(task.rows)
                share = {key: value[start:end] for key, value in outputs.items()}
                results.append(share if task.fit is None or len(tasks) == 1 else task.fit(share))
                start = end
        except Exception as error:
            if retry_alone:  # one request's input may have failed the batch: only that one should fail
                for task in tasks:
                    self._run([task], retry_alone=False)
                return
            for task in tasks:
                task.future.set_exception(error)
            return
        for task, result in zip(tasks, results, strict=True):
            task.future.set_result(result)
