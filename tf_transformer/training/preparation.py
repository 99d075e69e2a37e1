"""One training run, prepared and finished the same way in every layout.

:func:`prepare` does everything but the loop, in the five steps a reader
names, each a function: the directory and options (:func:`directory_and_options`),
the vocabulary and data (:func:`vocabulary_and_data`, with ``config.json``), the
model and optimizer (:func:`model_and_optimizer`), the restore of a checkpoint or
``--init_from`` (:func:`restore`), and the callbacks that checkpoint, stop, log and
evaluate (:func:`run_callbacks`). :func:`finish` writes the summary. The drivers keep only
what truly differs: ``fit`` (one process, ``MirroredStrategy``:
:mod:`~tf_transformer.training.trainer`) against a loop of our own whose steps
carry the workers' agreement to stop (``MultiWorkerMirroredStrategy``:
:mod:`~tf_transformer.training.multi_worker`). ``fit`` and that loop must train
on the same batches with the same recipe, so each piece that decides them is
built here once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

import keras
import tensorflow as tf
from absl import logging

import pipelines
from configs import RunOptions, TransformerConfig
from tf_transformer import run_dir
from tf_transformer.decoding.tree_constraint import TreeConstraint, tree_constraint
from tf_transformer.files import save_json
from tf_transformer.model import build_transformer
from tf_transformer.tasks import Task, get_task
from tf_transformer.training import resume
from tf_transformer.training.best import STOPPED, BestCheckpoint, Metric, check_options
from tf_transformer.training.budget import BudgetHorizon
from tf_transformer.training.callbacks import DataPosition, StepCheckpoint, StopAtStep, StopRequests
from tf_transformer.training.cluster import Cluster, differing_options
from tf_transformer.training.dev_evaluation import DevEvaluation, attention_fn, translate_fn
from tf_transformer.training.options import OptionError, Resolved, config_differences
from tf_transformer.training.progress import ProgressLogger, ThroughputMonitor
from tf_transformer.training.recipe import compile_model
from tf_transformer.training.schedules import BudgetSchedule, horizon_of, last_update, schedule_of


@dataclasses.dataclass(frozen=True)
class RunPlace:
    """Step 1 of :func:`prepare`: where this process trains, with which options, and from what.

    ``options`` are resolved for the machine and, for a resumed run, keep what it
    decided before (:func:`~tf_transformer.training.resume.keep_run_defaults`); a
    parser's linearization is recorded as used. ``work_dir`` is where this process
    writes: ``model_dir``, or a worker's own directory under it.
    """

    options: RunOptions
    precision_reason: str
    task: Task
    metric: Metric | None  # --keep_best_by's, or None
    model_dir: str
    work_dir: str
    cluster: Cluster | None
    launch_token: int | None  # new to this launch, the same on every worker (a cluster's)
    resuming: bool  # the run directory holds checkpoints
    source_dir: str | None  # --init_from's run, for a new run only
    init_checkpoint: str | None

    @property
    def chief(self) -> bool:
        return self.cluster is None or self.cluster.is_chief

    def record(self, config: TransformerConfig, replicas: int) -> dict:
        """What ``config.json`` records of the run: its options, the replicas, why the precision is what it is
        and the vocabulary size ``config`` asks (the model config records the size the vocabulary has)."""
        return {
            **dataclasses.asdict(self.options),
            "num_replicas": replicas,
            "precision_reason": self.precision_reason,
            "vocab_size": config.vocab_size,
        }


@dataclasses.dataclass(frozen=True)
class RunData:
    """Step 2 of :func:`prepare`: the vocabulary and what the run trains and evaluates on.

    ``steps_per_epoch`` micro-batches make an epoch, ``total_micro`` the run;
    ``train_steps`` updates of ``accumulate_steps`` micro-batches each end it.
    """

    config: TransformerConfig  # with the vocabulary's size
    tokenizer: pipelines.Tokenizer
    data: pipelines.TrainingData
    validation: tf.data.Dataset | None
    dev_sources: list
    dev_references: list
    steps_per_epoch: int
    total_micro: int
    train_steps: int


@dataclasses.dataclass
class RunState:
    """Step 4 of :func:`prepare`: what a checkpoint saves and restores besides the model.

    ``manager`` saves this process's checkpoints; ``chief_manager`` lists the
    run's (the same in one process).
    """

    position: DataPosition
    best: BestCheckpoint | None  # --keep_best_by, --early_stopping
    manager: tf.train.CheckpointManager
    chief_manager: tf.train.CheckpointManager


@dataclasses.dataclass
class RunCallbacks:
    """Step 5 of :func:`prepare`: the callbacks that checkpoint, stop, log and evaluate, in their order."""

    checkpointer: StepCheckpoint
    stop_requests: StopRequests
    dev_evaluation: DevEvaluation
    all: list


@dataclasses.dataclass
class PreparedRun:
    """A run ready for its loop: what every layout trains with (:func:`prepare`'s steps, each whole)."""

    place: RunPlace
    inputs: RunData
    strategy: tf.distribute.Strategy
    model: keras.Model
    state: RunState
    callbacks: RunCallbacks

    @property
    def options(self) -> RunOptions:
        return self.place.options

    @property
    def accumulate(self) -> int:
        return max(1, self.options.accumulate_steps)

    @property
    def done_micro(self) -> int:
        return int(self.state.position.batches.numpy())

    @property
    def by_epochs(self) -> bool:
        """A run of ``epochs`` ends with its data; one of the config's ``train_steps`` ends at ``StopAtStep``."""
        return bool(self.options.epochs)

    def finished(self) -> bool:
        """Whether there is nothing left to train (a finished or early-stopped run run again)."""
        if self.state.best is not None and self.state.best.exhausted():
            return True
        updates = int(self.model.optimizer.iterations.numpy())
        if updates >= last_update(self.inputs.train_steps, horizon_of(self.model.optimizer)):  # or a budget's horizon
            return True
        return self.by_epochs and self.done_micro >= self.inputs.total_micro

    def stream(self) -> tf.data.Dataset:
        """The weighted global batches from the first micro-batch not yet trained on."""
        return weighted_stream(self.inputs.data, self.done_micro, self.accumulate)


def check_model_dir(model_dir: str, config: TransformerConfig) -> None:
    """Creates the directory, or checks a resumed run uses the same model config."""
    tf.io.gfile.makedirs(model_dir)
    if tf.io.gfile.exists(os.path.join(model_dir, run_dir.CONFIG_FILE)):
        stored, _ = run_dir.load_run(model_dir)
        differing = [name for name, _, _ in config_differences(stored, config)]
        if differing:
            raise resume.ResumeError(
                f"{model_dir} holds a run with a different model config (fields: {', '.join(differing)}); "
                "use a new --model_dir or the original --config"
            )


def prepare(
    config: TransformerConfig,
    resolved: Resolved,
    model_dir: str,
    strategy: tf.distribute.Strategy,
    cluster: Cluster | None = None,
    budget_start: float | None = None,
) -> PreparedRun:
    """Everything a run needs before its first step, in every layout (see the module), in five steps.

    ``cluster``: this worker's place under ``MultiWorkerMirroredStrategy``
    (the chief prepares the directory, the others follow it), else ``None``.
    ``budget_start``: the ``time.perf_counter()`` from which ``--max_minutes``
    counts (default: the first step).
    """
    place = directory_and_options(config, resolved, model_dir, strategy, cluster)
    inputs = vocabulary_and_data(config, place, strategy.num_replicas_in_sync)
    tree = place.task.tree if place.options.tree_loss != "full" else None
    model = model_and_optimizer(
        inputs.config, place.options, strategy, tree_constraint(inputs.tokenizer, tree, inputs.config.vocab_size)
    )
    state = restore(model, place)
    callbacks = run_callbacks(place, inputs, model, state, budget_start)
    return PreparedRun(place, inputs, strategy, model, state, callbacks)


def directory_and_options(
    config: TransformerConfig,
    resolved: Resolved,
    model_dir: str,
    strategy: tf.distribute.Strategy,
    cluster: Cluster | None = None,
) -> RunPlace:
    """Step 1: the options checked before anything is written, the directories made (the chief's checked
    against ``config``), and whether the run resumes or starts from another (``--init_from``)."""
    resolved = resume.keep_run_defaults(model_dir, resolved, strategy)  # resumed: auto precision is the run's own
    options = resolved.options
    task = get_task(options.task, options.linearization, options.closings)
    metric = check_options(options, task)  # before anything is written
    if task.name == "parsing":  # recorded as used, so a later change of the default cannot misread the run
        options = dataclasses.replace(
            options,
            linearization=task.linearization,
            closings=task.closings,
            tree_loss=options.tree_loss or task.tree_loss,
        )
    for name in ("closings", "tree_loss"):
        if task.name != "parsing" and getattr(options, name):
            raise OptionError(f"--{name} is for --task parsing, not --task {task.name}")
    chief = cluster is None or cluster.is_chief
    work_dir = cluster.work_dir(model_dir) if cluster else model_dir
    if chief:
        check_model_dir(model_dir, config)
    tf.io.gfile.makedirs(work_dir)
    token = cluster.launch_token() if cluster else None
    resuming = bool(run_dir.checkpoints(run_dir.checkpoint_dir(model_dir), repair=chief))  # a garbled list: the files
    source_dir = init_checkpoint = None
    if options.init_from and not resuming:
        source_dir, init_checkpoint = resume.source_run(options.init_from)
    return RunPlace(
        options,
        resolved.precision_reason,
        task,
        metric,
        model_dir,
        work_dir,
        cluster,
        token,
        resuming,
        source_dir,
        init_checkpoint,
    )


def vocabulary_and_data(config: TransformerConfig, place: RunPlace, replicas: int) -> RunData:
    """Step 2: the vocabulary (the chief trains or checks it and writes ``config.json``; a worker reads them
    once the chief has announced them), then the training stream, the dev data and the run's length."""
    options, task, model_dir = place.options, place.task, place.model_dir
    corpora = [task.corpus(source, options.train_split) for source in source_options(options)]
    if place.chief:
        config, tokenizer = _chief_vocabulary(config, place, corpora, replicas)
    else:
        config, tokenizer = _worker_vocabulary(config, place, replicas)
    data = training_data(corpora, tokenizer, config, options, replicas, model_dir)
    steps_per_epoch = options.steps_per_epoch or data.batches_per_epoch
    total_micro = total_micro_batches(config, options, steps_per_epoch)
    validation, dev_sources, dev_references = dev_data(task, tokenizer, config, options, replicas, model_dir)
    train_steps = update_count(total_micro, options.accumulate_steps)
    return RunData(
        config, tokenizer, data, validation, dev_sources, dev_references, steps_per_epoch, total_micro, train_steps
    )


def _chief_vocabulary(config: TransformerConfig, place: RunPlace, corpora: list, replicas: int):
    """The chief's ``(config, tokenizer)``: the run checked unchanged (resumed) or the source run's vocabulary
    taken (``--init_from``), the vocabulary made or read, ``config.json`` written, the workers told."""
    options, task, model_dir, cluster = place.options, place.task, place.model_dir, place.cluster
    run = place.record(config, replicas)  # the vocabulary size asked, before the made one's replaces it
    if place.resuming:
        resume.check_unchanged(model_dir, config, run, corpora)  # before config.json is rewritten
    elif place.source_dir:
        resume.take_vocabulary(model_dir, place.source_dir)
    symbols = list(dict.fromkeys(itertools.chain.from_iterable(task.symbols(c) for c in corpora)))
    tokenizer = run_dir.make_vocabulary(
        model_dir,
        corpora[0],
        config.vocab_size,
        options.vocab_model_type,
        options.seed,
        # Every source's text, in the order given: a vocabulary for all the mixture trains on.
        text=itertools.chain.from_iterable(task.vocabulary_text(corpus) for corpus in corpora),
        symbols=symbols,
        symbol_pattern=task.symbol_pattern,
    )
    _check_symbols(tokenizer, symbols, model_dir, place)
    config = config.replace(vocab_size=tokenizer.vocab_size)
    if place.source_dir:
        resume.check_architecture(config, run_dir.load_run(place.source_dir)[0], place.source_dir)
    run_dir.save_run(model_dir, config, run, corpora)
    if cluster:
        cluster.announce(model_dir, place.launch_token)
        cluster.agree_on_options([])
    return config, tokenizer


def _check_symbols(tokenizer, symbols: list[str], model_dir: str, place: RunPlace) -> None:
    """Refuses a vocabulary made before (``--init_from``'s, or one put in the run directory) that lacks a
    target symbol of this run's data, which would train on UNK in its place."""
    processor = tokenizer.python_processor(target=True)
    missing = [symbol for symbol in symbols if processor.piece_to_id(symbol) == processor.unk_id()]
    if missing:
        source = f"the run --init_from {place.options.init_from} starts from" if place.source_dir else "this run"
        raise resume.ResumeError(
            f"{run_dir.vocabulary_path(model_dir)} ({source}) has no piece for the target symbol(s) "
            f"{' '.join(missing[:8])}{' …' if len(missing) > 8 else ''}: its targets were written otherwise "
            "(another --linearization or --closings). Train with the options its vocabulary was made for, or "
            "remove it for a new vocabulary (without --init_from)"
        )


def _worker_vocabulary(config: TransformerConfig, place: RunPlace, replicas: int):
    """A worker's ``(config, tokenizer)``: the chief's, once announced, with every worker agreeing that its
    own options are the chief's (:func:`~tf_transformer.training.cluster.differing_options`)."""
    cluster, model_dir = place.cluster, place.model_dir
    stored, chief_run = cluster.follow_chief(model_dir, place.launch_token, place.options.worker_timeout)
    run = place.record(config, replicas)  # the vocabulary size asked, as the chief recorded its own
    config = config.replace(vocab_size=stored.vocab_size)
    cluster.agree_on_options(differing_options((stored, chief_run), (config, run)))
    return config, place.task.tokenizer(run_dir.vocabulary_path(model_dir))


def model_and_optimizer(
    config: TransformerConfig,
    options: RunOptions,
    strategy: tf.distribute.Strategy,
    tree: TreeConstraint | None = None,
):
    """Step 3: the model, compiled with the paper's recipe and its optimizer's variables built, in the
    strategy's scope (a checkpoint restores into them). ``tree``: a parser's loss follows what it allows
    (``--tree_loss allowed`` or ``unforced``)."""
    with strategy.scope():
        model = build_transformer(config)
        compile_model(
            model,
            config,
            max(1, options.accumulate_steps),
            options.jit_compile,
            tree=tree,
            tree_loss=options.tree_loss,
            schedule=options.schedule,
        )
        model.optimizer.build(model.trainable_variables)
    return model


def restore(model: keras.Model, place: RunPlace) -> RunState:
    """Step 4: the checkpoint's contents (model, optimizer, data position, best-so-far) and its managers,
    restored from the run's newest readable checkpoint (the chief's pick, on every worker), or the weights
    of ``--init_from``."""
    options, cluster = place.options, place.cluster
    position = DataPosition()
    best = _best(model, place.metric, options, place.model_dir, place.work_dir, cluster) if place.metric else None
    horizon = horizon_of(model.optimizer)  # --schedule budget
    checkpoint = resume.training_checkpoint(
        model, data_position=position.batches, best=best.state if best else None, horizon=horizon
    )
    chief_manager = tf.train.CheckpointManager(
        checkpoint, run_dir.checkpoint_dir(place.model_dir), max_to_keep=options.keep_checkpoints
    )
    manager = (
        chief_manager
        if place.chief
        else tf.train.CheckpointManager(checkpoint, os.path.join(place.work_dir, "checkpoints"), max_to_keep=1)
    )
    _restore(model, checkpoint, chief_manager, cluster, place.source_dir, place.init_checkpoint)
    if best is not None:
        best.restored()
    return RunState(position, best, manager, chief_manager)


def run_callbacks(
    place: RunPlace, inputs: RunData, model: keras.Model, state: RunState, budget_start: float | None = None
) -> RunCallbacks:
    """Step 5: the callbacks, in the order their work must happen at a step's or an epoch's end."""
    options, config, tokenizer = place.options, inputs.config, inputs.tokenizer
    dev_sources = inputs.dev_sources
    log_dir = os.path.join(place.work_dir, "logs")
    checkpointer = StepCheckpoint(state.manager, options.checkpoint_every, max(1, options.accumulate_steps))
    stop_requests = StopRequests(checkpointer, options.max_minutes, budget_start)
    tree = place.task.tree  # a parser's dev outputs are kept to well-formed trees, as after training
    dev_evaluation = DevEvaluation(
        log_dir,
        task=place.task,
        dev_sources=dev_sources,
        dev_references=inputs.dev_references,
        translate=translate_fn(model, tokenizer, config.max_extra_length, tree=tree) if dev_sources else None,
        # Images only where someone reads them: the chief's logs (the others' go to .worker-<i>).
        attention=attention_fn(model, tokenizer, config.max_extra_length, tree=tree)
        if dev_sources and place.chief
        else None,
        attention_images=options.attention_images,
    )
    best = state.best
    schedule = schedule_of(model.optimizer)
    budget = []
    if isinstance(schedule, BudgetSchedule):  # before StopAtStep, which stops at the horizon it sets
        agree = place.cluster.minimum if place.cluster is not None else None  # the workers' least estimate
        budget = [
            BudgetHorizon(
                schedule, inputs.train_steps, options.max_minutes, budget_start, agree=agree, checkpoint=checkpointer
            )
        ]
    callbacks = [
        state.position,  # first: a checkpoint written at the end of a batch counts it
        keras.callbacks.TerminateOnNaN(),
        *budget,  # before a signal's checkpoint, which then holds the estimate made at the same update
        stop_requests,  # at an epoch's end, before dev BLEU: a signal stops without it (with the epoch's checkpoint)
        StopAtStep(inputs.train_steps, horizon_of(model.optimizer)),
        ThroughputMonitor(log_dir, every_steps=options.log_every),
        dev_evaluation,  # before the progress line and TensorBoard, which show its val_bleu (val_f1)
        *([best] if best else []),  # compares val_loss or val_bleu (val_f1), so after the dev evaluation
        checkpointer,  # the epoch's checkpoint after the evaluation: it holds the best-so-far that followed
    ]
    if options.verbose and place.chief:
        precision = f"precision {options.precision}: {place.precision_reason}"
        callbacks.append(ProgressLogger(inputs.train_steps, options.max_minutes, budget_start, first_line=precision))
    # Epoch scalars (loss, validation loss, dev BLEU): the epoch's logs, whichever loop made them.
    callbacks.append(keras.callbacks.TensorBoard(log_dir, update_freq="epoch", write_graph=place.cluster is None))
    return RunCallbacks(checkpointer, stop_requests, dev_evaluation, callbacks)


def _best(model, metric, options: RunOptions, model_dir: str, work_dir: str, cluster: Cluster | None):
    """The :class:`~tf_transformer.training.best.BestCheckpoint` of the run: every worker saves the best
    weights (saving runs collectives), the chief into ``model_dir/best`` with ``best.json``, the others into
    their own directory; all take the chief's value of the metric, so they save and stop alike."""
    chief = cluster is None or cluster.is_chief
    directory = run_dir.best_dir(model_dir if chief else work_dir)
    run_dir.checkpoints(directory, repair=True)  # what a killed save left
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), directory, max_to_keep=1)
    agree = None
    if cluster:

        def agree(value: float) -> float:
            return float(cluster.sum([value if cluster.is_chief else 0.0])[0])

    return BestCheckpoint(
        metric,
        manager,
        patience=options.early_stopping,
        marker=os.path.join(model_dir, run_dir.BEST_FILE) if chief else None,
        agree=agree,
    )


def _restore(model, checkpoint, chief_manager, cluster, source_dir, init_checkpoint) -> None:
    """Resumes from the run's newest readable checkpoint (the chief's pick, on every worker), or ``--init_from``."""
    chief = cluster is None or cluster.is_chief
    resumed = (
        run_dir.restore_newest_readable(lambda path: resume.restorable(checkpoint, path), chief_manager)
        if chief
        else None
    )
    if cluster:  # every worker restores the checkpoint the chief picked
        number = cluster.from_chief(int(resumed.rsplit("-", 1)[1]) if resumed else 0)
        if number and not chief:
            resumed = os.path.join(chief_manager.directory, f"ckpt-{number}")
            resume.restorable(checkpoint, resumed).restore(resumed).assert_existing_objects_matched()
    if resumed:
        logging.info("%sResumed from %s", f"{cluster.name}: " if cluster else "", resumed)
    elif source_dir:
        initialize_from(model, source_dir, init_checkpoint)
        logging.info("Initialized the weights from %s; the optimizer and the schedule start at step 0", init_checkpoint)


def finish(prepared: PreparedRun, seconds: float, history: dict, stopped_by: str | None, **extra) -> dict:
    """The run's summary (also written to ``train_summary.json`` in this process's directory).

    ``stopped_by``: the signal that preempted the run; otherwise ``early_stopping`` where the patience ran out.
    """
    model, place, inputs = prepared.model, prepared.place, prepared.inputs
    best = prepared.state.best
    if stopped_by is None and best is not None and best.exhausted():
        stopped_by = STOPPED
    summary = {
        "model_dir": place.model_dir,
        "config": inputs.config.name,
        **extra,
        "precision": prepared.options.precision,
        "params": int(model.count_params()),
        "steps": int(model.optimizer.iterations.numpy()),
        "steps_per_epoch": inputs.steps_per_epoch,
        "train_seconds": round(seconds, 1),
        "stats": dataclasses.asdict(inputs.data.stats),
        "history": history,
        f"dev_{place.task.metric}": prepared.callbacks.dev_evaluation.last_score,
        "latest_checkpoint": prepared.state.chief_manager.latest_checkpoint,
        "best": best.summary() if best is not None else None,
        "stopped_by": stopped_by,
    }
    horizon = horizon_of(model.optimizer)
    if horizon is not None:  # --schedule budget: where its rate reached (or would reach) zero; None: not estimated
        summary["schedule_horizon"] = int(horizon.numpy()) or None
    save_json(os.path.join(place.work_dir, "train_summary.json"), summary)
    return summary


def _batching(config: TransformerConfig, options: RunOptions, replicas: int, model_dir: str) -> dict:
    """How training and validation data are batched alike: budget, length filter, replicas, shapes, cache."""
    return dict(
        tokens_per_batch=config.tokens_per_batch,
        max_train_length=config.max_train_length,
        num_replicas=replicas,
        pad_to_bucket_boundary=bool(options.jit_compile),
        cache_dir=run_dir.data_cache_dir(model_dir),
    )


def source_options(options: RunOptions) -> list[RunOptions]:
    """The options of each ``--data`` source alone (the first's splits are the dev set's)."""
    sources = [options.data] if isinstance(options.data, str) else list(options.data)
    return [dataclasses.replace(options, data=source, data_weights=None) for source in sources]


def training_data(
    corpora: list, tokenizer, config: TransformerConfig, options: RunOptions, replicas: int, model_dir: str
) -> pipelines.TrainingData:
    """The run's global batches: the same for 1, 2, 4 or 8 replicas where the budget allows (``make_buckets``).

    Several corpora (``--data`` repeated) are mixed by ``--data_weights`` (:mod:`pipelines.mixing`), by
    default in proportion to their batches per epoch, as if they were one corpus.
    """
    sources = [
        pipelines.training_dataset(
            corpus,
            tokenizer,
            seed=options.seed,
            deterministic=True,
            repeat=True,
            name=f"train ({', '.join(corpus.paths)})" if len(corpora) > 1 else "train",
            **_batching(config, options, replicas, model_dir),
        )
        for corpus in corpora
    ]
    if len(sources) == 1:
        return sources[0]
    weights = options.data_weights or [source.batches_per_epoch for source in sources]
    logging.info(
        "Mixing %d corpora, weights %s: %s batches per epoch",
        len(sources),
        ", ".join(f"{w / sum(weights):.3f}" for w in weights),
        " + ".join(str(source.batches_per_epoch) for source in sources),
    )
    return pipelines.mix(sources, weights, options.seed)


def dev_data(task: Task, tokenizer, config: TransformerConfig, options: RunOptions, replicas: int, model_dir: str):
    """``(validation batches or None, dev sources, dev references)`` for validation loss and the dev score."""
    if not options.dev_split:
        return None, [], []
    options = source_options(options)[0]  # several corpora: the first one's dev split
    dev = task.corpus(options, options.dev_split)
    validation = pipelines.training_dataset(
        dev, tokenizer, shuffle=False, name=options.dev_split, **_batching(config, options, replicas, model_dir)
    ).dataset
    if not options.dev_bleu_sentences:
        return validation, [], []
    sources, references = task.dev_set(options, options.dev_bleu_sentences)
    return validation, sources, references


def total_micro_batches(config: TransformerConfig, options: RunOptions, steps_per_epoch: int) -> int:
    """Micro-batches the run trains on: ``options.epochs`` epochs where given, else ``config.train_steps`` updates."""
    if options.epochs:
        return options.epochs * steps_per_epoch
    return config.train_steps * max(1, options.accumulate_steps)


def update_count(total_micro: int, accumulate_steps: int) -> int:
    return math.ceil(total_micro / max(1, accumulate_steps))


def initialize_from(model: keras.Model, source_dir: str, checkpoint: str) -> None:
    """Copies another run's weights (``--init_from``); the optimizer and schedule start at step 0.

    Through a model of its own: the compiled model's checkpoint would also restore the optimizer.
    """
    source, _ = run_dir.restore_model(source_dir, checkpoint)
    for weight, value in zip(model.weights, source.weights, strict=True):
        weight.assign(value)


def weighted_stream(data: pipelines.TrainingData, done_micro: int, accumulate_steps: int) -> tf.data.Dataset:
    """The stream from micro-batch ``done_micro`` on, each batch weighted by its update's tokens.

    The groups of ``accumulate_steps`` micro-batches whose tokens make one
    update's weights start at update boundaries, even when a run resumes
    within an accumulation (a time budget may stop it there).
    """
    accumulate = max(1, accumulate_steps)
    within = done_micro % accumulate
    stream = data.starting_at(done_micro - within).apply(pipelines.update_weights(accumulate))
    return stream.skip(within) if within else stream
