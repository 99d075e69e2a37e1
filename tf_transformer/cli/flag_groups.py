"""The flags several ``tft-*`` commands share, each defined once: which model, how to decode, how to batch.

A command defines the groups it takes (``define_model_flags``,
``define_decoding_flags``, ``define_batch_flags``) and reads them back whole:
:func:`check_model_flags` checks the model trio, :func:`decode_request` turns
the decoding flags into one :class:`~tf_transformer.decoding.request.DecodeRequest`
(each flag's default, bounds and help from :data:`configs.decoding.SETTINGS`).
Flags defined here belong to the command module that calls the helper, so
its ``--help`` lists them (:func:`tf_transformer.cli.run_main`).
"""

from __future__ import annotations

import os

from absl import app, flags

from configs.decoding import DRAW_SETTINGS, EARLY_STOPS, MODEL_SETTINGS, SAMPLING_SETTINGS, SEARCH_SETTINGS, SETTINGS

FLAGS = flags.FLAGS
flags.disclaim_key_flags()  # the flags below belong to the command that defines them


def define_model_flags(model: str, model_dir: str, checkpoint: bool = True) -> None:
    """``--model`` (an export), ``--model_dir`` (a training run) and, with ``checkpoint``, ``--checkpoint``;
    ``model`` and ``model_dir`` are their help texts, which say what the command does with each."""
    flags.DEFINE_string("model", None, model)
    flags.DEFINE_string("model_dir", None, model_dir)
    if checkpoint:
        flags.DEFINE_string(
            "checkpoint",
            None,
            "--model_dir only: a checkpoint prefix, or 'best' for the run's best checkpoint (--keep_best_by); "
            "default: MODEL_DIR/averaged/ckpt while current, else the newest.",
        )


def check_model_flags() -> None:
    """Exactly one of ``--model`` (an export's version directory) and ``--model_dir`` (a run), and it is one;
    ``--checkpoint`` only with ``--model_dir``. Paths are read with ``tf.io.gfile``, as run directories are
    (``gs://`` included)."""
    import tensorflow as tf

    from tf_transformer.run_dir import CONFIG_FILE

    model, model_dir = FLAGS.model, FLAGS.model_dir
    if "checkpoint" in FLAGS and model and FLAGS.checkpoint:
        raise app.UsageError("--checkpoint needs --model_dir: an export holds the weights of one checkpoint")
    if bool(model) == bool(model_dir):
        raise app.UsageError("Give exactly one of --model (an export) or --model_dir (a training run)")
    if model and not tf.io.gfile.exists(os.path.join(model, "saved_model.pb")):
        raise app.UsageError(f"--model {model}: no saved_model.pb there (give an export's version directory)")
    if model_dir and not tf.io.gfile.exists(os.path.join(model_dir, CONFIG_FILE)):
        raise app.UsageError(f"--model_dir {model_dir}: no config.json there (give a tft-train run directory)")


def define_decoding_flags(names=SEARCH_SETTINGS, note: str = "", sampling: bool = False) -> None:
    """A flag for each decoding setting of ``names`` (:data:`configs.decoding.SETTINGS`: its bounds and help);
    ``note`` is added to each help (say where a flag applies). With ``sampling``, ``--sampling`` and the
    draws' settings too. Settings whose default is the model's own default to ``None`` (not given)."""
    for name in names:
        _define_setting(name, None if name in MODEL_SETTINGS else SETTINGS[name].default, note)
    if sampling:
        flags.DEFINE_bool(
            "sampling",
            False,
            "Draw each next token from the model's distribution (--temperature, --top_k, --top_p, --seed) instead "
            "of a beam search: one output per line, scored by its log-probability (docs/inference.md#sampling).",
        )
        for name in SAMPLING_SETTINGS:
            if name not in names:
                _define_setting(name, SETTINGS[name].default, " (--sampling)")


def _define_setting(name: str, default, note: str) -> None:
    setting = SETTINGS[name]
    define = flags.DEFINE_integer if setting.is_integer else flags.DEFINE_float
    default_text = " Default: the model's own." if default is None else ""
    bounds = {}
    if setting.minimum is not None and not setting.open_minimum:
        bounds["lower_bound"] = setting.minimum
    if setting.maximum is not None or setting.ceiling is not None:
        bounds["upper_bound"] = setting.maximum if setting.maximum is not None else setting.ceiling
    define(name, default, setting.help.rstrip(".") + note + "." + default_text, **bounds)


def decode_request(allow_with_model=SEARCH_SETTINGS, prefix: bool = False):
    """The :class:`~tf_transformer.decoding.request.DecodeRequest` the decoding flags make, or a
    ``UsageError`` naming the flag at fault. ``allow_with_model``: the settings an export takes per request
    with this command (the others are fixed at export: given with ``--model``, refused). ``prefix``: the
    inputs come with target prefixes (``--target_prefix``)."""
    from tf_transformer.decoding.request import DecodeRequest, RequestError, Sampling

    given = {name: FLAGS[name].value for name in SEARCH_SETTINGS if name in FLAGS and FLAGS[name].present}
    sampling = None
    try:
        if "sampling" in FLAGS and FLAGS.sampling:
            sampling = Sampling(**{name: FLAGS[name].value for name in DRAW_SETTINGS})
        elif "sampling" in FLAGS and any(FLAGS[name].present for name in DRAW_SETTINGS):
            raise app.UsageError("--temperature, --top_k, --top_p and --seed need --sampling")
        if (
            "model" in FLAGS
            and FLAGS.model
            and (fixed := [f"--{name}" for name in given if name not in allow_with_model])
        ):
            raise app.UsageError(f"{', '.join(fixed)}: fixed when exporting; use --model_dir to choose")
        return DecodeRequest(**given, prefix=prefix, sampling=sampling)
    except RequestError as error:
        if sampling is not None and error.setting in (*SEARCH_SETTINGS, "prefix"):
            raise app.UsageError(
                "--sampling draws one output per line: it takes no --nbest, --target_prefix, --beam_size, --alpha "
                "or --min_length"
            ) from None
        raise app.UsageError(f"--{error.setting}: {error}") from None


def define_early_stop_flag(note: str = "") -> None:
    """``--early_stop``: when a sentence's beam search ends (``DecodeOptions.early_stop``); ``None`` when not given."""
    flags.DEFINE_enum(
        "early_stop",
        None,
        list(EARLY_STOPS),
        "When a sentence's beam search ends before its longest output. finished (the default): once beam_size "
        "hypotheses have ended among the beam_size best continuations of their steps, as fairseq and CTranslate2 "
        "stop; exact: once no live hypothesis can beat the finished ones at any length (more steps); best: once "
        "the best continuation of a step ended, as OpenNMT-py stops (fewest steps; "
        "docs/inference.md#when-a-search-stops). Not tft-train's --early_stopping, which stops training." + note,
    )


def define_constrained_flag(note: str = "") -> None:
    """``--constrained``: a parser decodes only well-formed trees (``DecodeOptions.tree``); see :func:`constrained`."""
    flags.DEFINE_bool(
        "constrained",
        True,
        "A parser's search writes only well-formed trees over the input words (docs/parsing.md#constrained-"
        "decoding); --noconstrained decodes freely and repairs the outputs into trees." + note,
    )


def constrained(task) -> bool:
    """``--constrained`` for a run directory of ``task``: refused with ``--model`` (fixed in the export) and for a
    task that writes no trees."""
    if not FLAGS["constrained"].present:
        return True
    if "model" in FLAGS and FLAGS.model:
        raise app.UsageError("--constrained is fixed when exporting (tft-export); use --model_dir to choose it")
    if task.tree is None:
        raise app.UsageError(f"--constrained is a parser's: this model's task is {task.name}")
    return FLAGS.constrained


def define_batch_flags(batch_size: int = 64, what: str = "Sentences") -> None:
    """``--batch_size``: ``what`` per batch, ``batch_size`` by default."""
    flags.DEFINE_integer("batch_size", batch_size, f"{what} per batch.", lower_bound=1)


def define_thread_flags() -> None:
    """``--intra_op_threads`` / ``--inter_op_threads`` for the commands that decode (see :func:`apply_thread_flags`)."""
    flags.DEFINE_integer(
        "intra_op_threads",
        0,
        "Threads one TensorFlow op may split its work across (0: TensorFlow's default, all cores). "
        "1 for an export with --batch_parts (tft-export).",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "inter_op_threads",
        0,
        "TensorFlow ops run side by side (0: TensorFlow's default). For an export with --batch_parts N, N.",
        lower_bound=0,
    )


def apply_thread_flags(workers: int = 1) -> None:
    """Sets TensorFlow's thread pools from the flags; call before TensorFlow runs its first op.

    ``workers``: searches running at once (batches decoded side by side, times
    each batch's parts). Above 1, with ``--intra_op_threads`` left at 0,
    TensorFlow's intra-op pool (one for the process) gets ``cores / workers``
    threads, at least one: with one, every op runs whole on the thread of the
    search that runs it, instead of each op being split across all cores.
    ``--inter_op_threads`` left at 0 becomes at least ``workers``.
    """
    import tensorflow as tf

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    intra, inter = FLAGS.intra_op_threads, FLAGS.inter_op_threads
    if workers > 1:
        intra = intra or max(1, cores // workers)
        inter = inter or max(workers, cores)
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)
