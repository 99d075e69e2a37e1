"""Reading a run's checkpoints in tests: the newest step, and every tensor of one checkpoint compared."""

import numpy as np
import tensorflow as tf


def latest_step(run) -> int:
    """The step of the newest checkpoint listed in ``run/checkpoints`` (0 if none)."""
    latest = tf.train.latest_checkpoint(str(run / "checkpoints"))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def tensors(run, step: int) -> dict:
    """Every tensor of ``run/checkpoints/ckpt-<step>`` but the save counter and the object graph."""
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith(("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH"))
    }


def assert_identical(run, reference, step: int) -> None:
    """``ckpt-<step>`` of ``run`` equals ``reference``'s, tensor for tensor, the dropout seeds among them."""
    got, expected = tensors(run, step), tensors(reference, step)
    assert sorted(got) == sorted(expected)
    assert any("seed" in name for name in got), "the dropout random state is not in the checkpoint"
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
