"""Run options as they take effect: defaults resolved for the machine once, checked, and compared.

Every layout (one device, ``MirroredStrategy``, ``MultiWorkerMirroredStrategy``)
reads the resolved options only, so an option means the same in each:
``jit_compile=None`` is the device's default (XLA on GPUs), ``precision="auto"``
the fastest precision the hardware computes in (:func:`choose_precision`).
One function, :func:`differences`, compares two runs' options: a resumed run
against its ``config.json``, a worker against the chief.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from configs import RUN_SETTINGS, RunOptions, TransformerConfig
from tf_transformer.cpu import choose_cpu_precision


class OptionError(ValueError):
    """Run options that cannot work together (or not here); the message names them and says what to do."""


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The options a run trains with, and why ``precision`` is what it is (for config.json and the log).

    ``defaulted``: the options the machine decided (``precision`` given as
    ``auto``, ``jit_compile`` not given); a resumed run keeps its own instead
    (:func:`tf_transformer.training.resume.keep_run_defaults`).
    """

    options: RunOptions
    precision_reason: str
    defaulted: tuple[str, ...] = ()


def choose_precision() -> tuple[str, str]:
    """``(precision, reason)`` for ``--precision auto`` on this machine.

    GPUs: ``mixed_bfloat16`` from compute capability 8.0 (bfloat16 tensor
    cores), else ``mixed_float16`` (its loss scaling decides once for every
    replica and worker: :mod:`.update`). CPUs: ``mixed_bfloat16`` where
    the CPU has a bfloat16 unit (:data:`tf_transformer.cpu.BFLOAT16_CPU_FLAGS`), else ``float32``:
    emulated bfloat16 is slower than float32 (docs/benchmarks.md).
    """
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability") for gpu in gpus]
        lowest = min((c for c in capabilities if c), default=None)
        if lowest and lowest >= (8, 0):
            return "mixed_bfloat16", f"GPUs of compute capability {lowest[0]}.{lowest[1]} compute in bfloat16"
        found = f"{lowest[0]}.{lowest[1]}" if lowest else "unknown"
        return "mixed_float16", f"GPUs of compute capability {found} (below 8.0) compute in float16, not bfloat16"
    return choose_cpu_precision("mixed_bfloat16")


def default_jit_compile() -> bool:
    """XLA by default only where it pays: on GPUs (on CPU it recompiles per batch shape)."""
    return bool(tf.config.list_physical_devices("GPU"))


def resolve(options: RunOptions, strategy: tf.distribute.Strategy) -> Resolved:
    """``options`` with the machine's defaults filled in, after :func:`check`."""
    reason = "given by --precision"
    precision = options.precision
    if precision == "auto":
        precision, reason = choose_precision()
    jit_compile = default_jit_compile() if options.jit_compile is None else options.jit_compile
    resolved = dataclasses.replace(options, precision=precision, jit_compile=jit_compile)
    check(resolved, strategy)
    defaulted = (("precision",) if options.precision == "auto" else ()) + (
        ("jit_compile",) if options.jit_compile is None else ()
    )
    return Resolved(resolved, reason, defaulted)


def check(options: RunOptions, strategy: tf.distribute.Strategy) -> None:
    """Refuses, with what to do instead, the combinations that fail (or are wrong) in TensorFlow or Keras."""
    gpus = tf.config.list_logical_devices("GPU")
    if options.strategy == "multi_worker":
        if options.jit_compile and not gpus:
            raise OptionError(
                "--jit_compile with --strategy multi_worker is supported on GPU workers only (XLA on CPUs "
                "recompiles for every batch shape and is untested with collectives here); drop --jit_compile "
                "(off by default on CPUs)"
            )
        return
    cpu_replicas = strategy.num_replicas_in_sync > 1 and not gpus
    if options.jit_compile and cpu_replicas and isinstance(strategy, tf.distribute.MirroredStrategy):
        raise OptionError(
            f"--jit_compile with --strategy mirrored over {strategy.num_replicas_in_sync} logical CPU devices: "
            "TensorFlow's XLA cannot compile a step mirrored over CPU devices. On CPUs use --nojit_compile "
            "(the default there); on GPUs --jit_compile is the recommended setting"
        )


# Run options that decide which batch comes at which step, the learning rate of a step (``schedule``) or what
# the loss is over (a parser's ``closings`` and ``tree_loss``): a resumed run must keep them. ``jit_compile``
# pads batches to bucket boundaries. Named as :func:`effective` has them: the config's run settings and the
# vocabulary size asked among them. (``train_steps``, ``epochs``, the checkpoint and logging cadence and the dev
# split may change; the precision may change where the checkpoint keeps its shape: :func:`loss_scaled`.)
STREAM_OPTIONS = (
    "task",
    "linearization",
    "closings",
    "tree_loss",
    "schedule",
    "data",
    "data_weights",
    "src",
    "tgt",
    "train_split",
    "tokens_per_batch",
    "max_train_length",
    "seed",
    "accumulate_steps",
    "num_replicas",
    "vocab_size",
    "vocab_model_type",
    "init_from",
    "jit_compile",
)


def loss_scaled(precision: str | None) -> bool:
    """Whether training in ``precision`` wraps the optimizer in Keras's ``LossScaleOptimizer``
    (``mixed_float16``), whose checkpoint holds other objects than the plain optimizer's: a run cannot
    move between such a precision and one without (``float32`` and ``mixed_bfloat16`` share one)."""
    return precision == "mixed_float16"


def effective(config: TransformerConfig, run: dict) -> dict:
    """A run's options as they take effect, by their flags' names: the run record with the config's
    :data:`~configs.RUN_SETTINGS`, data as a real path.

    ``run`` is a ``config.json``'s ``run`` (``run_dir.load_run``) or the record a run makes of itself
    (``preparation.RunPlace.record``: its options, ``num_replicas`` and the ``vocab_size`` asked).
    """
    values = {**run, **{name: getattr(config, name) for name in RUN_SETTINGS}}
    data = values.get("data")
    if data:  # one corpus (a string), or several (a list in config.json, a tuple in RunOptions)
        real = [source if source.startswith("tfds:") else os.path.realpath(source) for source in _listed(data)]
        values["data"] = real[0] if isinstance(data, str) else real
    if values.get("data_weights") is not None:
        values["data_weights"] = [float(weight) for weight in values["data_weights"]]
    return values


def _listed(data) -> list[str]:
    return [data] if isinstance(data, str) else [str(source) for source in data]


def differences(old: dict, new: dict, names=None, skip=()) -> list[tuple[str, object, object]]:
    """``(name, old value, new value)`` for each of ``names`` (default: every name either side has) that differs,
    except those in ``skip``; a name one side lacks counts as ``None`` there."""
    if names is None:
        names = [*old, *(name for name in new if name not in old)]
    return [
        (name, old.get(name), new.get(name)) for name in names if name not in skip and old.get(name) != new.get(name)
    ]


def config_differences(old: TransformerConfig, new: TransformerConfig, skip=("vocab_size", *RUN_SETTINGS)):
    """:func:`differences` of two model configs' fields; by default not the vocabulary size (``sp.model``'s)
    nor the run settings, which :func:`effective` compares as options, by their flags' names."""
    return differences(old.to_dict(), new.to_dict(), skip=skip)
