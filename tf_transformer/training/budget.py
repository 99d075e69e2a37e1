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
    """Sets a :class:`~tf_transformer.training.schedules.BudgetSchedule`'s horizon: ``train_steps`` at each
    start, or under ``max_minutes`` (counted from ``start``, a ``time.perf_counter()`` value) the estimate
    made at the end of the warmup, capped at ``train_steps``, kept once made; ``skip``: the updates left out
    of the measurement (default: a tenth of the warmup, at least ``MIN_WINDOW``, leaving ``MIN_WINDOW``).

    ``agree(value)``: with several workers, the least of their estimates on every worker (a worker without
    a budget offers ``train_steps``); every worker then estimates at the same update, budget or not.
    ``checkpoint`` (a :class:`~tf_transformer.training.callbacks.StepCheckpoint`) is saved at once after
    the estimate, so that no later stop or crash can lose it. ``clock``: for tests.
    """

    def __init__(
        self,
        schedule,
        train_steps: int,
        max_minutes: float | None = None,
        start: float | None = None,
        skip: int | None = None,
        agree: Callable[[float], float] | None = None,
        checkpoint=None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self.schedule = schedule
        self.train_steps = train_steps
        self.seconds = max_minutes * 60.0 if max_minutes else None
        self.start = start
        warmup = schedule.warmup_steps
        default = min(max(MIN_WINDOW, int(SKIP_FRACTION * warmup)), max(0, warmup - MIN_WINDOW))
        self.skip = skip if skip is not None else default
        self.estimate_at = max(warmup, self.skip + MIN_WINDOW)
        self.agree = agree
        self.checkpoint = checkpoint
        self.clock = clock
        self._since: tuple[int, float] | None = None  # (updates, time) where the measurement began

    @property
    def horizon(self) -> int:
        return int(self.schedule.horizon.numpy())

    @property
    def estimating(self) -> bool:
        """The horizon comes from an estimate: this process has a budget, or a worker may."""
        return self.seconds is not None or self.agree is not None

    def on_train_begin(self, logs=None):
        if self.start is None:
            self.start = self.clock()
        if self.train_steps <= self.schedule.warmup_steps:
            logging.warning(
                "--schedule budget: the run's %d updates end within the warmup of %d, so the rate never decays",
                self.train_steps,
                self.schedule.warmup_steps,
            )
        if self.estimating or self.horizon == self.train_steps:
            return
        if self.horizon:  # a resume with another --train_steps or --epochs: the curve changes from here
            logging.warning(
                "--schedule budget: the horizon moves from update %d to %d (the run's updates changed)",
                self.horizon,
                self.train_steps,
            )
        self.schedule.horizon.assign(self.train_steps)
        logging.info("Learning rate decays to zero at update %d (--schedule budget)", self.train_steps)

    def on_train_batch_end(self, batch, logs=None):
        if self.horizon or not self.estimating:
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
        estimate = self.train_steps
        if self.seconds is not None:
            left = max(0.0, self.seconds - (now - self.start))
            estimate = min(self.train_steps, updates + int(per_second * left))
        if self.agree is not None:
            estimate = round(self.agree(float(estimate)))
        horizon = max(updates + 1, estimate)
        self.schedule.horizon.assign(horizon)
        logging.info(
            "Learning rate decays to zero at update %d: %.2f updates/s over updates %d–%d (--schedule budget)",
            horizon,
            per_second,
            begun,
            updates,
        )
        if self.checkpoint is not None:
            self.checkpoint.save()
