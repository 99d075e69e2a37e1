"""Options that cannot work in a distributed layout are refused at the start, naming the option."""

import pytest
import tensorflow as tf

from configs import RunOptions
from tf_transformer.training.multi_worker import _check_options
from tf_transformer.training.setup import OptionError, check_jit_compile


def test_xla_over_logical_cpu_devices_is_refused_with_a_clear_message():
    if len(tf.config.list_logical_devices("CPU")) < 2 or tf.config.list_logical_devices("GPU"):
        pytest.skip("needs two logical CPU devices and no GPU")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(OptionError, match="--jit_compile with --strategy mirrored over 2 logical CPU devices"):
        check_jit_compile(mirrored, True)
    check_jit_compile(mirrored, False)
    check_jit_compile(tf.distribute.OneDeviceStrategy("/cpu:0"), True)  # one device: XLA works


@pytest.mark.parametrize(
    "change, option",
    [({"precision": "mixed_float16"}, "--precision mixed_float16"), ({"jit_compile": True}, "--jit_compile")],
)
def test_multi_worker_refuses_what_it_cannot_do_here(change, option):
    if change.get("jit_compile") and tf.config.list_logical_devices("GPU"):
        pytest.skip("XLA is allowed on GPU workers")
    with pytest.raises(OptionError, match=option):
        _check_options(RunOptions(data="corpus", strategy="multi_worker", **change))
