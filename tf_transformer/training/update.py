"""One update per global batch in every layout: replicas' gradients summed, accumulated, checked as one, applied once.

Section 5.1 trains on batches of about 25,000 source and 25,000 target tokens
on 8 GPUs. Fewer devices reach the same batch by accumulating micro-batches
(``--accumulate_steps``), and ``mixed_float16`` scales the loss so small
gradients survive float16, skipping an update whose gradients overflow. Keras
3.15 does each on its own, and they break together:

* its accumulation calls the optimizer's all-reduce inside a ``Cond``, which
  ``MirroredStrategy`` refuses (``merge_call`` in a control-flow branch);
* its accumulators hold each replica's own partial sum, so a checkpoint written
  mid-accumulation (an epoch's end) keeps replica 0's copy only;
* its ``LossScaleOptimizer`` decides "finite or not" from each replica's
  unsummed gradients and follows replica 0's verdict, so an overflow on another
  replica reaches Adam (NaN weights);
* a skipped micro-batch does not count, so the update completes with the next
  group's first micro-batch and straddles two global batches.

:func:`apply_update` replaces that path, for the optimizer (``FusedAdam``,
through :class:`GlobalUpdate`) and its loss scaling
(:class:`GlobalLossScaleOptimizer`) alike:

1. every micro-batch's gradients are summed over the replicas at once, outside
   any condition, so every replica holds the same sum (the all-reduce an update
   without accumulation makes anyway; with accumulation, one per micro-batch);
2. the accumulators add those sums: every replica's copy is the same, and a
   checkpoint written between two micro-batches resumes exactly;
3. the last micro-batch of a group decides, from the group's summed gradients,
   whether they are finite: one verdict on every replica (a non-finite value
   stays non-finite when added to, so an overflow in any micro-batch of the
   group shows);
4. the update is applied (or, if not finite, skipped and the loss scale halved)
   once per group of ``accumulate_steps`` micro-batches, always at the group's
   end: a skip drops the whole group, so every applied update is one global
   batch's token mean. The condition sits inside each variable's per-device
   update, where no replica synchronizes.

The optimizer's counter (``_iterations``, Keras's micro-batch counter) moves by
one per micro-batch and falls back over a skipped group, so it stays
``accumulate_steps`` × the applied updates at every group's end: the schedule
(eq. 3) and Adam's bias correction count applied updates only, as Keras's loss
scaling does without accumulation. The checkpoint's variables are Keras's
own (the accumulators, the loss scale and its counter).
"""

from __future__ import annotations

import keras
import tensorflow as tf


def apply_update(optimizer, loss_scale, gradients, variables=None) -> None:
    """Adds one micro-batch's gradients (of the loss times the loss scale) and updates at a group's end.

    ``optimizer``: the optimizer that applies updates (its ``update_step``);
    ``gradient_accumulation_steps`` micro-batches make one update.
    ``loss_scale``: the ``LossScaleOptimizer`` whose ``dynamic_scale`` scaled
    the loss, or ``None`` (no scaling: updates are applied whatever their
    values, and a non-finite loss ends training elsewhere). Call in a replica
    context (``strategy.run``, or no strategy), once per micro-batch.
    """
    if variables is None:
        variables = optimizer._trainable_variables
    else:
        variables = list(variables)
        if not optimizer.built:
            optimizer.build(variables)
        optimizer._check_variables_are_known(variables)
    _check_supported(optimizer)
    pairs = [(g, v) for g, v in zip(gradients, variables, strict=True) if g is not None]
    sums = [tf.convert_to_tensor(g) for g, _ in pairs]  # IndexedSlices → dense, as the accumulators are
    variables = [v for _, v in pairs]
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        sums = context.all_reduce(tf.distribute.ReduceOp.SUM, sums)

    steps = optimizer.gradient_accumulation_steps or 1
    accumulators = []
    if steps > 1:
        accumulators = [optimizer._accumulated_gradients[optimizer._get_variable_index(v)] for v in variables]
        sums = [g + tf.cast(a, g.dtype) for g, a in zip(sums, accumulators, strict=True)]
        last = tf.equal((optimizer._iterations + 1) % steps, 0)
    else:
        last = tf.constant(True)
    if loss_scale is not None:
        scale = tf.convert_to_tensor(loss_scale.dynamic_scale)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in sums])
    else:
        scale, finite = tf.constant(1.0), tf.constant(True)
    learning_rate = optimizer.learning_rate
    apply = tf.logical_and(last, finite)

    always = steps == 1 and loss_scale is None  # every call updates: no condition in the graph

    def distributed_update(distribution, sums, apply, last, scale, learning_rate):
        def update_variable(variable, total, apply, scale, learning_rate):
            def step():
                mean = total if always else total / (tf.cast(steps, total.dtype) * scale)  # unscaled, averaged
                optimizer.update_step(mean, variable, learning_rate)

            if always:
                step()
            else:
                tf.cond(apply, step, lambda: None)

        def update_accumulator(accumulator, total, last):
            def reset():
                accumulator.assign(tf.zeros_like(accumulator))

            def add():
                accumulator.assign(tf.cast(total, accumulator.dtype))

            tf.cond(last, reset, add)

        for total, variable in zip(sums, variables, strict=True):
            distribution.extended.update(
                _tf_variable(variable), update_variable, args=(total, apply, scale, learning_rate), group=False
            )
        if steps > 1:
            for total, accumulator in zip(sums, accumulators, strict=True):
                distribution.extended.update(
                    _tf_variable(accumulator), update_accumulator, args=(total, last), group=False
                )

    tf.__internal__.distribute.interim.maybe_merge_call(
        distributed_update, optimizer._distribution_strategy, sums, apply, last, scale, learning_rate
    )
    if loss_scale is not None:
        _update_loss_scale(loss_scale, last, finite)
    # One per micro-batch; a skipped group gives back its micro-batches (1 − steps at its end).
    skipped = tf.logical_and(last, tf.logical_not(finite))
    optimizer._iterations.assign_add(tf.where(skipped, tf.constant(1 - steps, tf.int64), tf.constant(1, tf.int64)))


def _update_loss_scale(loss_scale, last, finite) -> None:
    """Keras's dynamic loss scaling, once per group: halve on overflow, double after ``dynamic_growth_steps``."""
    counter = tf.convert_to_tensor(loss_scale.step_counter)
    scale = tf.convert_to_tensor(loss_scale.dynamic_scale)
    grow = tf.logical_and(finite, tf.equal(counter, loss_scale.dynamic_growth_steps - 1))
    new_counter = tf.where(tf.logical_and(finite, tf.logical_not(grow)), counter + 1, tf.zeros_like(counter))
    new_scale = tf.where(grow, scale * 2.0, tf.where(finite, scale, scale * 0.5))
    new_counter = tf.where(last, new_counter, counter)
    new_scale = tf.where(last, new_scale, scale)

    def assign(distribution, new_counter, new_scale):
        for variable, value in ((loss_scale.step_counter, new_counter), (loss_scale.dynamic_scale, new_scale)):
            distribution.extended.update(
                _tf_variable(variable), lambda v, value: v.assign(value), args=(value,), group=False
            )

    tf.__internal__.distribute.interim.maybe_merge_call(
        assign, loss_scale._distribution_strategy, new_counter, new_scale
    )


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def _check_supported(optimizer) -> None:
    """The Keras optimizer features this update does not implement are refused, not ignored."""
    unsupported = {
        "weight_decay": optimizer.weight_decay,
        "clipnorm": optimizer.clipnorm,
        "global_clipnorm": optimizer.global_clipnorm,
        "clipvalue": optimizer.clipvalue,
        "use_ema": optimizer.use_ema or None,
        "loss_scale_factor": optimizer.loss_scale_factor,
    }
    used = [name for name, value in unsupported.items() if value is not None]
    if used:
        raise ValueError(f"the global update does not implement the optimizer's {', '.join(used)}")


class GlobalUpdate:
    """Mixin for a Keras optimizer: ``apply`` makes the global update of :func:`apply_update` (no loss scaling)."""

    def apply(self, grads, trainable_variables=None):
        apply_update(self, None, grads, trainable_variables)


@keras.saving.register_keras_serializable(package="tf_transformer")
class GlobalLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras's ``LossScaleOptimizer`` (same variables, same checkpoints) whose overflow check is global.

    ``compile`` under ``mixed_float16`` leaves an optimizer of this class as it
    is; :func:`apply_update` decides from the replicas' summed gradients, once
    per update (see the module).
    """

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            self.build(trainable_variables)
            self.built = True
        apply_update(self.inner_optimizer, self, grads, trainable_variables)
