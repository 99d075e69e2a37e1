"""The learning-rate schedule of eq. 3 (section 5.3), and one that knows its budget."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from tf_transformer.training.optimizers import FusedAdam


@keras.saving.register_keras_serializable(package="tf_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale · d_model^−0.5 · min(step^−0.5, step · warmup_steps^−1.5).

    "This corresponds to increasing the learning rate linearly for the first
    warmup_steps training steps, and decreasing it thereafter proportionally to
    the inverse square root of the step number. We used warmup_steps = 4000."

    Args:
      d_model: model width.
      warmup_steps: linear warmup length, in optimizer updates.
      scale: multiplies the formula (1.0 in the paper).
      accumulate_steps: Keras passes the micro-batch counter when gradients are
        accumulated; the formula uses optimizer updates, ``counter // N + 1``.
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, scale: float = 1.0, accumulate_steps: int = 1):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.accumulate_steps = accumulate_steps

    def __call__(self, step):
        # Keras counts from 0 before the first update; the paper's step_num starts at 1.
        step = ops.cast(ops.floor_divide(ops.cast(step, "int64"), self.accumulate_steps) + 1, "float32")
        decay = ops.minimum(ops.rsqrt(step), step * float(self.warmup_steps) ** -1.5)
        return self.scale * float(self.d_model) ** -0.5 * decay

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "accumulate_steps": self.accumulate_steps,
        }


@keras.saving.register_keras_serializable(package="tf_transformer")
class BudgetSchedule(TransformerSchedule):
    """Eq. 3's warmup, then a linear decay from its peak to zero at the run's horizon, its last update.

    The paper's inverse square root never anneals: a run stopped by a budget
    stops with the rate still high. Li, Yumer and Ramanan (ICLR 2020, "Budgeted
    Training") found a schedule that reaches zero as the budget ends beats those
    made for unlimited training, for the same budget. After ``d`` updates the
    next one (``d`` ≥ ``warmup_steps``) takes the peak times
    ``(horizon − d) / (horizon − warmup_steps)``: the last, number ``horizon``,
    a ``1 / (horizon − warmup_steps)`` share, any later one zero (a run stops at
    its horizon: :class:`~tf_transformer.training.callbacks.StopAtStep`).

    ``horizon`` is a variable a run's checkpoint holds, so that a resumed run
    follows the same curve: the run's ``train_steps``, or under a time budget
    the updates it allows, estimated at the end of the warmup
    (:class:`~tf_transformer.training.budget.BudgetHorizon`). While it is 0 (not
    known yet) the rate stays at its peak after the warmup.
    """

    def __init__(
        self,
        d_model: int,
        warmup_steps: int = 4000,
        scale: float = 1.0,
        accumulate_steps: int = 1,
        horizon: int | tf.Variable = 0,
    ):
        super().__init__(d_model, warmup_steps, scale, accumulate_steps)
        if not isinstance(horizon, tf.Variable):
            horizon = tf.Variable(int(horizon), dtype=tf.int64, trainable=False, name="schedule_horizon")
        self.horizon = horizon

    def __call__(self, step):
        ramp = super().__call__(step)  # the warmup's line, and beyond it what eq. 3 would give
        done = ops.cast(ops.floor_divide(ops.cast(step, "int64"), self.accumulate_steps), "float32")  # updates made
        warmup = float(self.warmup_steps)
        peak = self.scale * float(self.d_model) ** -0.5 * warmup**-0.5
        horizon = ops.cast(ops.convert_to_tensor(self.horizon), "float32")
        left = ops.clip((horizon - done) / ops.maximum(horizon - warmup, 1.0), 0.0, 1.0)  # [0, 1] of the decay
        left = ops.where(horizon > 0, left, 1.0)
        return ops.where(done < warmup, ramp, peak * left)

    def get_config(self):
        return {**super().get_config(), "horizon": int(self.horizon.numpy())}


def learning_rate_schedule(
    name: str, d_model: int, warmup_steps: int, scale: float = 1.0, accumulate_steps: int = 1
) -> TransformerSchedule:
    """The schedule a run's ``--schedule`` names: ``paper`` (eq. 3) or ``budget`` (:class:`BudgetSchedule`)."""
    if name == "budget":
        return BudgetSchedule(d_model, warmup_steps, scale, accumulate_steps)
    if name != "paper":
        raise ValueError(f"Unknown schedule {name!r}: paper or budget")
    return TransformerSchedule(d_model, warmup_steps, scale, accumulate_steps)


def schedule_of(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.schedules.LearningRateSchedule | None:
    """The schedule ``optimizer`` (or the one a loss-scale optimizer wraps) follows, if any."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = getattr(inner, "_learning_rate", None)
    return schedule if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule) else None


def horizon_of(optimizer: keras.optimizers.Optimizer) -> tf.Variable | None:
    """The horizon variable of a :class:`BudgetSchedule` ``optimizer`` follows (``--schedule budget``), else
    ``None``."""
    return getattr(schedule_of(optimizer), "horizon", None)


def last_update(train_steps: int, horizon: tf.Variable | None) -> int:
    """The update a run ends at: its ``train_steps``, or sooner a budget schedule's ``horizon`` once known
    (0 until then), where the rate is zero."""
    known = int(horizon.numpy()) if horizon is not None else 0
    return min(known, train_steps) if known > 0 else train_steps


def paper_optimizer(
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    accumulate_steps: int = 1,
    schedule: str = "paper",
) -> FusedAdam:
    """Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 and the schedule above (section 5.3), or ``schedule``'s."""
    return FusedAdam(
        learning_rate=learning_rate_schedule(schedule, d_model, warmup_steps, scale, accumulate_steps),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        gradient_accumulation_steps=accumulate_steps if accumulate_steps > 1 else None,
    )
