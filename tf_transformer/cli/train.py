"""``tft-train``: train a Transformer with the paper's recipe, for translation or parsing.

    tft-train --config small --data ../shared/data/multi30k --src en --tgt de --model_dir runs/m30k
    tft-train --task parsing --config parsing_cpu --data ../shared/data/ptb_sample/mrg --model_dir runs/ptb
    tft-train --data corpus/news --data corpus/web --data_weights 0.7,0.3 --src en --tgt de --model_dir runs/mix

Flags can also come from a file: ``tft-train --flagfile=run.flags``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

from absl import app, flags, logging

from configs import (
    CLOSINGS,
    PRECISIONS,
    RUN_SETTINGS,
    SCHEDULES,
    STRATEGIES,
    TREE_LOSSES,
    RunOptions,
    parse_overrides,
    preset_names,
)
from tf_transformer.cli import run_main
from tf_transformer.tasks import TASK_NAMES

# Config fields with flags of their own, as users know them from other trainers: each sets the config's field
# as ``--set FIELD=VALUE`` does (the model config is the one home of these settings, configs/transformer.py).
CONFIG_FLAGS = (*RUN_SETTINGS, "vocab_size")

FLAGS = flags.FLAGS
flags.DEFINE_enum(
    "config",
    "small",
    preset_names(),
    "Preset: tiny, small, multi30k, base, big or a Table 3 row (with --init_from, by default: that run's model).",
)
flags.DEFINE_multi_string(
    "data",
    None,
    "Corpus directory ({split}.{src}/{split}.{tgt} or {split}.tsv), file prefix, or tfds:NAME "
    "(e.g. tfds:wmt14_translate/de-en, written once to text files under $TFT_TEXT_CACHE). Repeat to mix "
    "several corpora by --data_weights; the vocabulary is trained on all, the dev split is the first's.",
)
flags.DEFINE_list(
    "data_weights",
    None,
    "With several --data: the share of the batches each gives, in their order, e.g. 0.7,0.3 (normalized; "
    "default: in proportion to their sizes). An epoch is one pass's worth of batches of all (docs/training.md).",
)
flags.DEFINE_enum(
    "task",
    "translation",
    TASK_NAMES,
    "translation (section 6.1: parallel text) or parsing (section 6.3: --data is a directory of Penn Treebank "
    ".mrg files and the splits are file ranges; docs/parsing.md).",
)
flags.DEFINE_enum(
    "linearization",
    None,
    ["xx", "tags", "words"],
    "--task parsing: how a tree is written as target symbols: words (each preterminal written as its word; "
    "the default), xx (every POS tag as the placeholder XX, Vinyals et al. 2015) or tags (the POS tags kept, "
    "as tensor2tensor's WSJ problem); docs/parsing.md.",
)
flags.DEFINE_enum(
    "tree_loss",
    None,
    list(TREE_LOSSES),
    "--task parsing: allowed (the loss over the tokens constrained decoding allows at each position: none on "
    "forced ones), unforced (over every token, none where one is forced) or full (over every token); default: "
    "the task's (docs/parsing.md#training-as-it-decodes).",
)
flags.DEFINE_enum(
    "schedule",
    "paper",
    list(SCHEDULES),
    "The learning rate after the warmup: paper (eq. 3's inverse square root) or budget (a linear decay to zero "
    "at the run's last update: --epochs, else --train_steps (the preset's), or under --max_minutes the updates the "
    "budget allows, estimated at the end of the warmup; docs/training.md#the-learning-rate-schedule).",
)
flags.DEFINE_enum(
    "closings",
    None,
    list(CLOSINGS),
    "--task parsing: labeled (each closing bracket names its constituent, )NP; the default) or bare ()).",
)
flags.DEFINE_string("src", "en", "Source language code (file suffix).")
flags.DEFINE_string("tgt", "de", "Target language code (file suffix).")
flags.DEFINE_string(
    "train_split",
    None,
    "Training split: its name (default train), or for --task parsing a range of treebank files "
    "(default wsj_0001-wsj_0159).",
)
flags.DEFINE_string(
    "dev_split",
    None,
    "Development split for validation loss and the dev score (BLEU, or F1 for parsing): a name (default val) "
    "or a file range (default wsj_0160-wsj_0179); '' to skip.",
)
flags.DEFINE_string("model_dir", None, "Run directory: config, vocabulary, checkpoints, TensorBoard logs.")
flags.DEFINE_integer(
    "epochs", None, "Epochs (passes over the data) to train, instead of the config's train_steps.", lower_bound=1
)
flags.DEFINE_integer(
    "train_steps",
    None,
    "Stop after this many optimizer steps, as --set train_steps=N; not with --epochs (default: the preset's).",
    lower_bound=1,
)
flags.DEFINE_integer("steps_per_epoch", None, "Micro-batches per epoch (default: one pass over the data).")
flags.DEFINE_integer("checkpoint_every", 1000, "Also checkpoint every N optimizer steps (0: epoch ends only).")
flags.DEFINE_integer("keep_checkpoints", 10, "Checkpoints kept (the newest).", lower_bound=1)
flags.DEFINE_integer(
    "tokens_per_batch",
    None,
    "Global token budget per batch and side, as --set tokens_per_batch=N (default: the preset's).",
    lower_bound=8,
)
flags.DEFINE_integer(
    "max_train_length",
    None,
    "Drop pairs with a side longer than this many subwords, as --set max_train_length=N (default: the preset's).",
    lower_bound=2,
)
flags.DEFINE_enum(
    "precision",
    "auto",
    PRECISIONS,
    "Compute precision. auto: mixed_bfloat16 where the hardware computes in bfloat16 (CPUs with AVX512_BF16 "
    "or AMX, GPUs of compute capability 8.0 and above), mixed_float16 on older GPUs where the strategy "
    "supports it, float32 otherwise (docs/training.md).",
)
flags.DEFINE_enum("strategy", "auto", STRATEGIES, "Distribution strategy.")
flags.DEFINE_bool("jit_compile", None, "XLA-compile the train step (default: on when a GPU is present).")
flags.DEFINE_integer("accumulate_steps", 1, "Accumulate gradients over N micro-batches per update.", lower_bound=1)
flags.DEFINE_integer("seed", 1, "Random seed (data order and initialization).")
flags.DEFINE_integer(
    "vocab_size",
    None,
    "Shared SentencePiece vocabulary size asked of a new vocabulary, as --set vocab_size=N (default: the preset's).",
    lower_bound=1,
)
flags.DEFINE_enum("vocab_model_type", "bpe", ["bpe", "unigram"], "SentencePiece model type.")
flags.DEFINE_integer("dev_bleu_sentences", 100, "Dev sentences translated for BLEU each epoch (0: none).")
flags.DEFINE_integer(
    "attention_images",
    3,
    "Of those, the first N get their attention drawn as TensorBoard images each epoch (0: none).",
    lower_bound=0,
)
flags.DEFINE_float("max_minutes", None, "Stop after this many minutes of training (a time budget).")
flags.DEFINE_enum(
    "keep_best_by",
    None,
    ["loss", "bleu", "f1", "score"],
    "Keep the checkpoint of the best dev evaluation (each epoch's end) in MODEL_DIR/best, named by best.json: "
    "by loss, or by the task's dev score: bleu (translation), f1 (--task parsing), or score (either). "
    "tft-export --checkpoint best exports it.",
)
flags.DEFINE_integer(
    "early_stopping",
    None,
    "Stop after this many dev evaluations in a row without a better --keep_best_by (default loss).",
    lower_bound=1,
)
flags.DEFINE_string(
    "init_from",
    None,
    "Start a new run from the weights of another run (its directory, or a checkpoint in it), with a new "
    "optimizer and schedule, e.g. fine-tuning on new data (an imported model's too: tft-import); its model and "
    "vocabulary are used.",
)
flags.DEFINE_float(
    "worker_timeout",
    600.0,
    "--strategy multi_worker: seconds a worker waits to see the files the chief has prepared in --model_dir "
    "(its vocabulary and config.json; a shared filesystem may show them late) before stopping with an error. "
    "Waiting for the chief itself has no limit while it runs: a chief or worker that dies is noticed by "
    "TensorFlow's coordination-service heartbeats within seconds, whatever this value (docs/distributed.md).",
    lower_bound=1.0,
)
flags.DEFINE_multi_string("set", [], "Override a config field, e.g. --set dropout=0.2 (repeatable).")


def _overrides() -> dict:
    """The config fields ``--set`` and the :data:`CONFIG_FLAGS` set; a field set both ways, or a run length
    given both by ``--epochs`` and ``train_steps``, is a ``UsageError`` naming both."""
    try:
        overrides = parse_overrides(FLAGS.set)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    for name in CONFIG_FLAGS:
        value = FLAGS[name].value
        if value is None:
            continue
        if name in overrides:
            raise app.UsageError(f"--{name} {value} and --set {name}={overrides[name]} set the same field: give one")
        overrides[name] = value
    if FLAGS.epochs and "train_steps" in overrides:
        given = "--train_steps" if FLAGS.train_steps is not None else "--set train_steps"
        raise app.UsageError(f"--epochs and {given} both say how long to train: give one")
    return overrides


def _weights(values: list[str] | None) -> tuple[float, ...] | None:
    """``--data_weights`` as numbers (how many, and their signs, are :class:`~configs.RunOptions`' to check)."""
    if values is None:
        return None
    try:
        return tuple(float(value) for value in values)
    except ValueError:
        raise app.UsageError(f"--data_weights {','.join(values)}: give numbers, e.g. 0.7,0.3") from None


def run_options(task) -> RunOptions:
    """The :class:`~configs.RunOptions` of the flags: each option from the flag of its name, but those whose
    flag says it differently (several ``--data``, a task's default splits, 0 or '' for none). A
    ``UsageError`` names a flag whose value the options refuse."""
    special = {
        "data": FLAGS.data[0] if len(FLAGS.data) == 1 else tuple(FLAGS.data),
        "data_weights": _weights(FLAGS.data_weights),
        "task": task.name,
        "train_split": task.splits.train if FLAGS.train_split is None else FLAGS.train_split,
        "dev_split": (task.splits.dev if FLAGS.dev_split is None else FLAGS.dev_split) or None,
        "checkpoint_every": FLAGS.checkpoint_every or None,
        "verbose": "auto" if os.isatty(1) else 2,
    }
    fields = [field.name for field in dataclasses.fields(RunOptions) if field.name not in special]
    try:
        return RunOptions(**special, **{name: FLAGS[name].value for name in fields if name in FLAGS})
    except ValueError as error:
        raise app.UsageError(str(error)) from None


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.data:
        raise app.UsageError("--data is required: a corpus directory or file prefix")
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required: where the run is written")
    overrides = _overrides()
    from tf_transformer.tasks import get_task

    task = get_task(FLAGS.task)
    options = run_options(task)
    for name in ("linearization", "closings", "tree_loss"):
        if task.name != "parsing" and FLAGS[name].value:
            raise app.UsageError(f"--{name} is for --task parsing, not --task {task.name}")
    for data in FLAGS.data:
        if task.name == "parsing" and not os.path.isdir(data):
            raise app.UsageError(f"--data {data!r}: --task parsing reads a directory of treebank files")
        local = not data.startswith("tfds:")
        if local and not os.path.exists(data) and not os.path.exists(f"{data}{options.train_split}.{FLAGS.src}"):
            raise app.UsageError(f"--data {data!r}: no such directory or file prefix")
    from configs import get_config
    from pipelines import DataError
    from tf_transformer.files import ReadError, WriteError
    from tf_transformer.formats import FormatError
    from tf_transformer.training.cluster import ClusterError
    from tf_transformer.training.options import OptionError
    from tf_transformer.training.resume import ResumeError
    from tf_transformer.training.trainer import train

    logging.set_verbosity(logging.INFO)
    if FLAGS.init_from and not FLAGS["config"].present:  # fine-tuning: the model of the run it starts from
        from tf_transformer.run_dir import load_run
        from tf_transformer.training.resume import source_run

        try:
            config = load_run(source_run(FLAGS.init_from)[0])[0].replace(**overrides)
        except (ResumeError, FileNotFoundError, ValueError) as error:
            raise app.UsageError(f"--init_from {FLAGS.init_from}: {error}") from None
    else:
        try:
            config = get_config(FLAGS.config, **overrides)
        except ValueError as error:  # a value the config refuses
            raise app.UsageError(str(error)) from None
    # The task's decoding settings (parsing: section 6.3's beam 21, α 0.3, input + 300), unless --set.
    config = config.replace(**{name: value for name, value in task.decoding.items() if name not in overrides})
    print(f"TensorBoard: tensorboard --logdir {os.path.join(FLAGS.model_dir, 'logs')}", flush=True)
    try:
        summary = train(config, options, FLAGS.model_dir)
    except (DataError, ResumeError, OptionError, FormatError) as error:
        raise app.UsageError(str(error)) from None
    except ClusterError as error:  # a worker lost, or a model_dir the workers do not share
        sys.exit(f"tft-train: {error}")
    except WriteError as error:  # a full disk: nothing half-written is left, the message says what is intact
        sys.exit(f"tft-train: {error}")
    except ReadError as error:  # storage that did not answer: nothing was changed, the message says what to do
        sys.exit(f"tft-train: {error}")
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
    if summary.get("stopped_by") in signal.Signals.__members__:  # preempted, with a checkpoint: the status of the
        sys.exit(128 + signal.Signals[summary["stopped_by"]].value)  # signal, as if it had killed (not early_stopping)


def run():
    run_main(main)


if __name__ == "__main__":
    run()
