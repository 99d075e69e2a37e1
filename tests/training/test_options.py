"""Run options resolved in one place: ``--precision auto``, the device's ``jit_compile``, one comparison."""

import dataclasses

import pytest
import tensorflow as tf

from configs import RunOptions, get_config
from tf_transformer import cpu
from tf_transformer.training import options as run_options
from tf_transformer.training.progress import ProgressLogger


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"fpu", "avx2", "avx512f", "avx512_bf16"}, "mixed_bfloat16"),  # AMD Zen 4/5, Intel Cooper Lake
        ({"fpu", "avx2", "amx_bf16", "amx_tile"}, "mixed_bfloat16"),  # Intel Sapphire Rapids
        ({"fpu", "avx2", "avx512f"}, "float32"),  # AVX-512 without bfloat16: emulated, slower
        ({"fpu", "avx2", "fma"}, "float32"),
    ],
)
def test_auto_precision_follows_the_cpus_bfloat16_unit(monkeypatch, flags, expected):
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("GPUs decide the precision where there are some")
    monkeypatch.setattr(cpu, "cpu_info", lambda: ("Test CPU", frozenset(flags)))
    precision, reason = run_options.choose_precision()
    assert precision == expected and "Test CPU" in reason
    resolved = run_options.resolve(RunOptions(data="corpus"), tf.distribute.get_strategy())
    assert resolved.options.precision == expected and resolved.precision_reason == reason


def test_auto_precision_on_gpus_follows_their_compute_capability(monkeypatch):
    devices = {"gpu:0": (8, 6), "gpu:1": (7, 5)}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: list(devices) if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda gpu: {"compute_capability": devices[gpu]})
    assert run_options.choose_precision()[0] == "mixed_float16"  # the oldest GPU decides
    devices["gpu:1"] = (9, 0)
    assert run_options.choose_precision()[0] == "mixed_bfloat16"


def test_an_explicit_precision_and_jit_compile_are_kept():
    given = RunOptions(data="corpus", precision="mixed_bfloat16", jit_compile=True)
    resolved = run_options.resolve(given, tf.distribute.get_strategy())
    assert resolved.options == given and resolved.precision_reason == "given by --precision"


def test_jit_compile_none_is_the_devices_default_in_every_layout(monkeypatch):
    for strategy in ("one_device", "mirrored", "multi_worker"):
        options = RunOptions(data="corpus", strategy=strategy, precision="float32")
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
        assert run_options.resolve(options, tf.distribute.get_strategy()).options.jit_compile is False
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["gpu:0"] if kind == "GPU" else [])
        assert run_options.default_jit_compile() is True


def test_the_first_progress_line_says_what_was_chosen_and_why():
    printed = []
    line = "precision float32: the CPU has no bfloat16 unit"
    logger = ProgressLogger(10, first_line=line, print_fn=lambda text, flush: printed.append(text))
    logger.on_train_begin()
    assert printed == [line]


def test_options_are_compared_as_they_take_effect():
    """The config's run settings are compared as options, under their flags' names, beside the vocabulary size
    the run asked: a resume may change train_steps, not the batches; the model configs' comparison leaves the
    run settings and the vocabulary size (sp.model's) to that one."""
    config = get_config("tiny")
    old = {**dataclasses.asdict(RunOptions(data="corpus", seed=1)), "num_replicas": 1, "vocab_size": 120}
    new = {**old, "seed": 2, "vocab_size": 100}
    other = config.replace(train_steps=9, tokens_per_batch=1024)
    assert run_options.effective(config, old)["max_train_length"] == config.max_train_length
    found = run_options.differences(
        run_options.effective(config, old), run_options.effective(other, new), run_options.STREAM_OPTIONS
    )
    assert found == [("tokens_per_batch", 2048, 1024), ("seed", 1, 2), ("vocab_size", 120, 100)]
    changed = other.replace(d_ff=128, vocab_size=7, max_train_length=32)
    assert run_options.config_differences(config, changed) == [("d_ff", 64, 128)]
