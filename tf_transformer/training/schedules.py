"""The learning-rate schedule of eq. 3 (section 5.3)."""

from __future__ import annotations

import keras
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


def paper_optimizer(d_model: int, warmup_steps: int = 4000, scale: float = 1.0, accumulate_steps: int = 1) -> FusedAdam:
    """Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 and the schedule above (section 5.3)."""
    return FusedAdam(
        learning_rate=TransformerSchedule(d_model, warmup_steps, scale, accumulate_steps),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        gradient_accumulation_steps=accumulate_steps if accumulate_steps > 1 else None,
    )
