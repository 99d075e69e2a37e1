"""--schedule budget: the warmup of eq. 3, then a linear decay to zero at the horizon, known or estimated once."""

import types

import pytest
import tensorflow as tf

from tf_transformer.training.budget import BudgetHorizon
from tf_transformer.training.callbacks import StopAtStep
from tf_transformer.training.progress import ProgressLogger
from tf_transformer.training.schedules import BudgetSchedule, TransformerSchedule, horizon_of, paper_optimizer


def test_the_rate_follows_the_warmup_then_reaches_zero_at_the_horizon():
    paper = TransformerSchedule(256, warmup_steps=100)
    budget = BudgetSchedule(256, warmup_steps=100, horizon=300)
    peak = 256**-0.5 * 100**-0.5
    for step in (0, 50, 99):  # Keras's counter: updates made before this one
        assert float(budget(step)) == float(paper(step))  # the warmup is eq. 3's
    assert float(budget(99)) == pytest.approx(peak, rel=1e-6)  # update 100: the peak
    assert float(budget(100)) == pytest.approx(peak, rel=1e-6)
    assert float(budget(200)) == pytest.approx(peak / 2, rel=1e-6)  # halfway down
    assert float(budget(299)) == pytest.approx(peak / 200, rel=1e-5)  # the last update, number 300
    assert float(budget(300)) == 0.0 and float(budget(1000)) == 0.0  # at and past the horizon
    accumulated = BudgetSchedule(256, warmup_steps=100, accumulate_steps=4, horizon=300)
    assert float(accumulated(4 * 200 + 3)) == pytest.approx(peak / 2, rel=1e-6)  # micro-batches counted
    budget.horizon.assign(0)  # not known yet: the peak is held
    assert float(budget(250)) == pytest.approx(peak, rel=1e-6)
    assert BudgetSchedule.from_config(budget.get_config()).get_config() == budget.get_config()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _driven(callback, updates_per_second, until, clock, pauses=None):
    """Runs ``callback`` as training would, ``updates_per_second``, up to update ``until`` or its stop;
    ``pauses``: seconds spent after an update (an epoch's validation and dev BLEU)."""
    optimizer = types.SimpleNamespace(iterations=tf.Variable(0, dtype=tf.int64))
    model = types.SimpleNamespace(optimizer=optimizer, stop_training=False)
    stop = StopAtStep(10_000, callback.schedule.horizon)
    for each in (callback, stop):
        each.set_model(model)
    callback.on_train_begin()
    for update in range(1, until + 1):
        clock.now += 1.0 / updates_per_second + (pauses or {}).get(update - 1, 0.0)
        optimizer.iterations.assign(update)
        callback.on_train_batch_end(update)
        stop.on_train_batch_end(update)
        if model.stop_training:
            return update
    return until


def test_a_known_number_of_updates_is_the_horizon():
    schedule = BudgetSchedule(64, warmup_steps=10)
    callback = BudgetHorizon(schedule, train_steps=77)
    assert _driven(callback, 10.0, 200, Clock()) == 77 and int(schedule.horizon.numpy()) == 77


def test_a_time_budget_is_estimated_once_after_the_warmup_and_the_run_stops_at_it():
    """10 updates/s and 60 s: the estimate, made at the end of a warmup of 100 from updates 20 to 100, is 600
    updates, and the run stops there (its rate is zero): so would a budget that outlasts its estimate."""
    clock = Clock()
    schedule = BudgetSchedule(64, warmup_steps=100)
    callback = BudgetHorizon(schedule, train_steps=10_000, max_minutes=1.0, start=0.0, skip=20, clock=clock)
    assert _driven(callback, 10.0, 2000, clock) == 600 and int(schedule.horizon.numpy()) == 600
    capped = BudgetSchedule(64, warmup_steps=100)
    callback = BudgetHorizon(capped, train_steps=300, max_minutes=1.0, start=0.0, skip=20, clock=Clock())
    assert _driven(callback, 10.0, 2000, callback.clock) == 300  # --train_steps comes first
    agreed = BudgetSchedule(64, warmup_steps=100)
    callback = BudgetHorizon(agreed, 10_000, 1.0, 0.0, skip=20, agree=lambda value: 450.0, clock=Clock())
    assert _driven(callback, 10.0, 2000, callback.clock) == 450  # the chief's estimate, on every worker


def test_the_estimate_counts_what_an_epoch_end_costs_within_the_warmup():
    """A 4 s validation after update 60: updates 20 to 100 took 12 s, not 8, and 14 s of the 60 are gone at the
    estimate, so the horizon is 100 + 80/12 × 46 updates."""
    clock = Clock()
    schedule = BudgetSchedule(64, warmup_steps=100)
    callback = BudgetHorizon(schedule, train_steps=10_000, max_minutes=1.0, start=0.0, skip=20, clock=clock)
    _driven(callback, 10.0, 101, clock, pauses={60: 4.0})
    assert int(schedule.horizon.numpy()) == 100 + int(80 / 12 * 46)


def test_a_restored_horizon_is_kept():
    schedule = BudgetSchedule(64, warmup_steps=10, horizon=40)  # as a checkpoint restores it
    callback = BudgetHorizon(schedule, 10_000, max_minutes=1.0, start=0.0, skip=5, clock=Clock())
    assert _driven(callback, 0.01, 100, callback.clock) == 40  # slow enough to estimate 10 updates: not asked


def test_a_known_horizon_follows_a_changed_number_of_updates():
    """Resumed with another --train_steps (no budget): the horizon moves there, not left where it was."""
    schedule = BudgetSchedule(64, warmup_steps=10, horizon=77)
    assert _driven(BudgetHorizon(schedule, train_steps=120), 10.0, 500, Clock()) == 120


def test_a_worker_without_a_budget_joins_the_estimate_and_the_estimate_is_saved_at_once():
    """Under several workers every one estimates at the same update (its collective must meet the others'),
    one without a budget offering its --train_steps; the least wins, and a checkpoint is written then."""
    saved = []
    checkpoint = types.SimpleNamespace(save=lambda: saved.append(True))
    schedule = BudgetSchedule(64, warmup_steps=100)
    offered = []

    def least(value):
        offered.append(value)
        return min(value, 450.0)  # another worker's estimate

    callback = BudgetHorizon(schedule, 10_000, skip=20, agree=least, checkpoint=checkpoint, clock=Clock())
    assert _driven(callback, 10.0, 2000, callback.clock) == 450
    assert offered == [10_000.0] and saved == [True]


def test_the_progress_line_counts_toward_the_horizon_once_known():
    printed = []
    optimizer = paper_optimizer(16, warmup_steps=4, schedule="budget")
    logger = ProgressLogger(100, print_fn=lambda text, flush: printed.append(text))
    logger.set_model(types.SimpleNamespace(optimizer=optimizer))
    logger.on_train_begin()
    logger.on_epoch_end(0)
    horizon_of(optimizer).assign(30)  # estimated: the run stops at update 30, not 100
    logger.on_epoch_end(1)
    assert printed[0].startswith("epoch 1 · step 0/100 ") and printed[1].startswith("epoch 2 · step 0/30 ")
