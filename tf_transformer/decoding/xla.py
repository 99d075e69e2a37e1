"""Whether a graph is being compiled by XLA: the decoding paths that write in place switch on it."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import control_flow_util


def in_xla() -> bool:
    """Whether the graph being built is compiled by XLA, which has no ``InplaceUpdate`` kernel."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
