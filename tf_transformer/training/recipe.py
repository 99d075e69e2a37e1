"""The paper's training recipe on a Keras model: label-smoothed loss, Adam and the learning-rate schedule."""

from __future__ import annotations

from configs import TransformerConfig
from tf_transformer.training.losses import LabelSmoothedCrossEntropy, TreeCrossEntropy
from tf_transformer.training.metrics import TargetTokens, TokenAccuracy, TokenPerplexity
from tf_transformer.training.schedules import paper_optimizer
from tf_transformer.training.update import GlobalLossScaleOptimizer


def compile_model(
    model,
    config: TransformerConfig,
    accumulate_steps: int = 1,
    jit_compile: bool = False,
    tree=None,
    tree_loss: str = "full",
    schedule: str = "paper",
):
    """Compiles with the paper's recipe: label smoothing (5.4), Adam 0.9/0.98/1e-9 and eq. 3 (5.3).

    ``accumulate_steps`` micro-batches make one update; the metrics beside the
    loss are token accuracy, per-subword perplexity and the target tokens counted.
    Under ``mixed_float16`` the loss is scaled, with one overflow verdict per
    update for every replica (:mod:`.update`). With a parser's ``tree``
    (:class:`~tf_transformer.decoding.tree_constraint.TreeConstraint`) the loss follows
    what it allows, as ``tree_loss`` says (:class:`~tf_transformer.training.losses.TreeCrossEntropy`).
    ``schedule``: after the warmup, eq. 3's decay (``paper``) or one to zero at the run's horizon
    (``budget``: :class:`~tf_transformer.training.schedules.BudgetSchedule`).
    """
    optimizer = paper_optimizer(
        config.d_model, config.warmup_steps, config.learning_rate_scale, accumulate_steps, schedule
    )
    if model.dtype_policy.name == "mixed_float16":
        optimizer = GlobalLossScaleOptimizer(optimizer, name="loss_scale_optimizer")
    if tree is not None and tree_loss != "full":
        loss = TreeCrossEntropy(tree, config.label_smoothing, accumulate_steps=accumulate_steps, over=tree_loss)
    else:
        loss = LabelSmoothedCrossEntropy(config.label_smoothing, accumulate_steps=accumulate_steps)
    over = loss.softmax_tokens()  # the metrics count what the loss's softmax is over
    model.compile(
        optimizer=optimizer,
        loss=loss,
        metrics=[TokenAccuracy(allowed=over), TokenPerplexity(allowed=over), TargetTokens()],
        jit_compile=jit_compile,
    )
    return model
