"""A budget-aware schedule's horizon: the run's last update, known at the start or estimated once.

:class:`~tf_transformer.training.schedules.BudgetSchedule` decays to zero at its
horizon. With a number of updates (``--train_steps``, ``--epochs`` or the
preset's), that number is the horizon. Under a time budget (``--max_minutes``) a
schedule driven by the clock would make two runs differ and a resumed run leave
the curve; instead the horizon is estimated once, at the end of the warmup, as
the updates the rest of the budget allows at the speed measured over the
warmup's updates (its first tenth left out: they include tracing; the rest
includes what an epoch's end costs, validation and dev BLEU, where the warmup
spans one), and then held in the checkpoint: a resumed run follows the same
curve, bit for bit. A run resumed before its estimate measures anew.

Past the estimate, both ways of being wrong end cleanly: a budget that outlasts
the horizon stops the run at its horizon (the rate is zero there), and one that
ends first stops it as any time budget does, the rate not yet at zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import keras
from absl import logging

SKIP_FRACTION = 0.1  # of the warmup: updates left out of the measurement (tracing, the first batches)
MIN_WINDOW = 20  # updates measured at least


class BudgetHorizon(keras.callbacks.Callback):
    """Sets a :class:`~tf_transformer.training.schedules.BudgetSchedule`'s horizon: ``train_steps`` at the
    start, or under ``max_minutes`` (counted from ``start``, a ``time.perf_counter()`` value) the estimate
    made at the end of the warmup, capped at ``train_steps``; ``skip``: the updates left out of the
    measurement (default: a tenth of the warmup, at least ``MIN_WINDOW``).

    ``agree(value)``: with several workers, every worker's horizon is the chief's (a collective each
    worker runs at the same update); ``clock``: for tests.
    """

    def __init__(
        self,
        schedule,
        train_steps: int,
        max_minutes: float | None = None,
        start: float | None = None,
        skip: int | None = None,
        agree: Callable[[float], float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self.schedule = schedule
        self.train_steps = train_steps
        self.seconds = max_minutes * 60.0 if max_minutes else None
        self.start = start
        self.skip = skip if skip is not None else max(MIN_WINDOW, int(SKIP_FRACTION * schedule.warmup_steps))
        self.estimate_at = max(schedule.warmup_steps, self.skip + MIN_WINDOW)
        self.agree = agree
        self.clock = clock
        self._since: tuple[int, float] | None = None  # (updates, time) where the measurement began

    @property
    def horizon(self) -> int:
        return int(self.schedule.horizon.numpy())

    def on_train_begin(self, logs=None):
        if self.start is None:
            self.start = self.clock()
        if self.horizon == 0 and self.seconds is None:
            self.schedule.horizon.assign(self.train_steps)
            logging.info("Learning rate decays to zero at update %d (--schedule budget)", self.train_steps)

    def on_train_batch_end(self, batch, logs=None):
        if self.horizon or self.seconds is None:
            return
        updates = int(self.model.optimizer.iterations.numpy())
        if updates < self.skip:
            return
        now = self.clock()
        if self._since is None:  # the measurement begins (or, resumed before the estimate, begins again)
            self._since = (updates, now)
            return
        begun, began = self._since
        if updates < self.estimate_at or updates - begun < MIN_WINDOW:
            return
        per_second = (updates - begun) / max(now - began, 1e-9)
        left = max(0.0, self.seconds - (now - self.start))
        estimate = min(self.train_steps, updates + int(per_second * left))
        if self.agree is not None:
            estimate = int(self.agree(float(estimate)))
        horizon = max(updates + 1, estimate)
        self.schedule.horizon.assign(horizon)
        logging.info(
            "Learning rate decays to zero at update %d: %.2f updates/s over updates %d–%d, %.1f minutes left "
            "(--schedule budget)",
            horizon,
            per_second,
            begun,
            updates,
            left / 60,
        )
