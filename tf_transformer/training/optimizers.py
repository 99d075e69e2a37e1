"""Adam through TensorFlow's fused kernel (the optimizer of section 5.3)."""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_transformer.training.update import GlobalUpdate


@keras.saving.register_keras_serializable(package="tf_transformer")
class FusedAdam(GlobalUpdate, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose update runs as one ``ResourceApplyAdam`` kernel per variable.

    The same update as Keras's Adam (and Kingma & Ba's, as used in section 5.3):
    ``m ← m + (g − m)(1 − β1)``, ``v ← v + (g² − v)(1 − β2)`` and
    ``θ ← θ − α·m / (√v + ε)`` with ``α = lr·√(1 − β2ᵗ) / (1 − β1ᵗ)``. Keras writes it as
    about twelve element-wise ops per variable, each reading and writing a temporary the
    size of the variable; TensorFlow's kernel updates ``m``, ``v`` and the variable in place.
    On a CPU those temporaries are most of the optimizer's time (docs/design/training.md).

    Falls back to Keras's update for AMSGrad and for other Keras backends. Takes the same
    arguments as ``keras.optimizers.Adam``, and its slots and checkpoints are Keras's own.
    ``apply`` makes one update per global batch (replicas and accumulated micro-batches
    summed first: :mod:`.update`).
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or keras.backend.backend() != "tensorflow":
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)

        def constant(value):
            return tf.cast(value, dtype)

        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].handle,
            v=self._velocities[index].handle,
            beta1_power=tf.pow(constant(self.beta_1), step),
            beta2_power=tf.pow(constant(self.beta_2), step),
            lr=constant(learning_rate),
            beta1=constant(self.beta_1),
            beta2=constant(self.beta_2),
            epsilon=constant(self.epsilon),
            grad=constant(tf.convert_to_tensor(gradient)),  # IndexedSlices (untied embeddings) → dense, as Keras
        )


def base_optimizer(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that applies the updates: under ``mixed_float16`` Keras wraps it in a
    ``LossScaleOptimizer``, whose own step counter never moves."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def micro_batches_done(optimizer: keras.optimizers.Optimizer) -> int:
    """Micro-batches trained on: the optimizer updates times ``gradient_accumulation_steps``, and
    the micro-batches of an unfinished accumulation (what a resumed run skips in its data)."""
    return int(base_optimizer(optimizer)._iterations.numpy())


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The learning rate of the next update (eq. 3 at the optimizer's own step)."""
    return float(base_optimizer(optimizer)._get_current_learning_rate())
