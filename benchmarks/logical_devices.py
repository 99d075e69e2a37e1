"""Runs ``tft-train`` with the CPU split into N logical devices (MirroredStrategy without GPUs).

    python -m benchmarks.logical_devices N --strategy=mirrored --data=… --model_dir=…

The split must happen before TensorFlow starts, so it cannot be a flag of the
command itself, whose imports start TensorFlow.
"""

import sys

import tensorflow as tf


def main() -> None:
    count = int(sys.argv[1])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    from tf_transformer.cli.train import run

    sys.argv = ["tft-train", *sys.argv[2:]]
    run()


if __name__ == "__main__":
    main()
