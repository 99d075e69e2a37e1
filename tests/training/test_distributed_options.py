"""Options that cannot work in a distributed layout are refused at the start, naming the option."""

import dataclasses

import pytest
import tensorflow as tf

from configs import RunOptions, get_config
from tf_transformer.training.cluster import differing_options
from tf_transformer.training.options import OptionError, check


def test_xla_over_logical_cpu_devices_is_refused_with_a_clear_message():
    if len(tf.config.list_logical_devices("CPU")) < 2 or tf.config.list_logical_devices("GPU"):
        pytest.skip("needs two logical CPU devices and no GPU")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(OptionError, match="--jit_compile with --strategy mirrored over 2 logical CPU devices"):
        check(RunOptions(data="corpus", strategy="mirrored", jit_compile=True), mirrored)
    check(RunOptions(data="corpus", strategy="mirrored", jit_compile=False), mirrored)
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    check(RunOptions(data="corpus", strategy="one_device", jit_compile=True), one_device)  # one device: XLA works


def test_multi_worker_refuses_xla_on_cpu_workers_and_takes_mixed_float16():
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("XLA is allowed on GPU workers")
    with pytest.raises(OptionError, match="--jit_compile"):
        check(RunOptions(data="corpus", strategy="multi_worker", jit_compile=True), tf.distribute.get_strategy())
    # One overflow verdict for every worker (training/update.py): loss scaling works across workers.
    check(RunOptions(data="corpus", strategy="multi_worker", precision="mixed_float16"), tf.distribute.get_strategy())


def test_a_worker_is_compared_with_the_chief_on_every_option_and_config_field():
    config = get_config("tiny", dropout=0.0, train_steps=30, vocab_size=120)  # the model: sp.model's size
    # As config.json holds them: resolved for the machine (training.options.resolve), the vocabulary size asked.
    options = RunOptions(data="corpus", strategy="multi_worker", precision="float32", jit_compile=False)
    run = {**dataclasses.asdict(options), "num_replicas": 2, "precision_reason": "the CPU has no bfloat16 unit"}
    run["vocab_size"] = 128
    chief = (config, run)
    # What each worker sets for itself is no difference.
    same = {**run, "verbose": 0, "max_minutes": 3.0, "worker_timeout": 60.0}  # the first to run out stops all
    assert differing_options(chief, (config, same)) == []

    changes = {"checkpoint_every": 5, "accumulate_steps": 2, "precision": "mixed_bfloat16"}
    changes |= {"epochs": 3, "steps_per_epoch": 7, "vocab_size": 256}
    settings = {"train_steps": 31, "tokens_per_batch": 1024}  # the config's run settings, by their flags
    worker = (config.replace(dropout=0.1, **settings), {**run, **changes})
    differing = differing_options(chief, worker)
    for name, value in changes.items():
        assert f"--{name} {run[name]} on the chief, {value} here" in differing
    for name, value in settings.items():
        assert f"--{name} {getattr(config, name)} on the chief, {value} here" in differing
    assert "--set dropout 0.0 on the chief, 0.1 here" in differing
    assert len(differing) == len(changes) + len(settings) + 1  # each named once: not also as --set train_steps
    preset = differing_options(chief, (get_config("small").replace(vocab_size=120), run))
    assert "--config tiny on the chief, small here" in preset and "--set d_model 32 on the chief, 256 here" in preset
