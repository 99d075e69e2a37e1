"""How and where a run trains: the run options of ``tft-train``.

A :class:`RunOptions` says what to train on (data, task, splits), on what (strategy, precision, XLA),
with which checkpoints, logs and stops, and ``epochs`` where an epoch count, not ``train_steps``, sets the
run's length. The model and the training recipe's numbers, ``train_steps``, ``tokens_per_batch``,
``max_train_length`` and ``vocab_size`` among them, are a :class:`~configs.TransformerConfig`'s.
"""

from __future__ import annotations

import dataclasses

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
# A parser's loss: over the tokens the tree constraint allows at each position, over the whole vocabulary
# but none where a token is forced, or over the whole vocabulary everywhere (training.losses.TreeCrossEntropy).
TREE_LOSSES = ("allowed", "unforced", "full")
# A parser's closing brackets: labelled as their opening, ``)NP`` (Vinyals et al.), or bare, ``)``.
CLOSINGS = ("labeled", "bare")
# The learning rate after the warmup: the paper's inverse square root (eq. 3), or a linear decay that reaches
# zero at the run's horizon, its last update (training.schedules.BudgetSchedule).
SCHEDULES = ("paper", "budget")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How and where to train (the model and the recipe's numbers are a :class:`configs.TransformerConfig`).

    ``epochs``, where given, sets the run's length instead of the config's
    ``train_steps``; ``steps_per_epoch`` counts micro-batches (one data pass by
    default). ``data`` is one corpus, or a tuple of several mixed by
    ``data_weights`` (:mod:`pipelines.mixing`; ``None``: in proportion to their
    sizes). ``keep_best_by`` keeps the checkpoint of the best dev evaluation and
    ``early_stopping`` stops after that many evaluations without a better one
    (:mod:`tf_transformer.training.best`). ``precision`` and ``jit_compile`` are resolved for the
    machine by :func:`tf_transformer.training.options.resolve` (``auto``, ``None``).
    """

    data: str | tuple[str, ...]
    task: str = "translation"  # tf_transformer.tasks: translation (6.1) or parsing (6.3)
    linearization: str | None = None  # parsing: how a tree is written as symbols ("xx" or "tags")
    tree_loss: str | None = None  # parsing: one of TREE_LOSSES (None: the task's)
    closings: str | None = None  # parsing: one of CLOSINGS (None: the task's)
    schedule: str = "paper"  # one of SCHEDULES
    src: str = "en"
    tgt: str = "de"
    train_split: str = "train"
    dev_split: str | None = "val"
    epochs: int | None = None
    steps_per_epoch: int | None = None
    checkpoint_every: int | None = 1000
    keep_checkpoints: int = 10
    precision: str = "auto"
    strategy: str = "auto"
    jit_compile: bool | None = None
    accumulate_steps: int = 1
    seed: int = 1
    vocab_model_type: str = "bpe"
    dev_bleu_sentences: int = 100
    attention_images: int = 3  # of the dev BLEU sentences: their attention drawn in TensorBoard each epoch
    log_every: int = 50
    max_minutes: float | None = None
    keep_best_by: str | None = None  # "loss", "bleu", "f1" or "score" (the task's dev score)
    early_stopping: int | None = None  # evaluations without a better keep_best_by before training stops
    data_weights: tuple[float, ...] | None = None  # one per source of data
    init_from: str | None = None  # a run directory or checkpoint whose weights start a new run (fine-tuning)
    worker_timeout: float = 600.0  # multi_worker: seconds a worker waits to see the chief's sp.model, config.json
    verbose: int | str = "auto"  # 0: no progress lines; anything else: one per epoch (and a minute)

    def __post_init__(self):
        for name, choices in (("tree_loss", TREE_LOSSES), ("closings", CLOSINGS), ("schedule", SCHEDULES)):
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise ValueError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")
        weights = self.data_weights
        if weights is None:
            return
        sources = 1 if isinstance(self.data, str) else len(self.data)
        if len(weights) != sources:
            raise ValueError(
                f"--data_weights gives {len(weights)} weight(s) for {sources} --data source(s): give one per "
                "source, in the order of the --data flags"
            )
        if not all(isinstance(weight, int | float) and 0 < weight < float("inf") for weight in weights):
            raise ValueError(f"--data_weights {','.join(map(str, weights))}: each weight must be a positive number")
