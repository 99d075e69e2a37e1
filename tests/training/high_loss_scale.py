"""``tft-train`` whose ``mixed_float16`` loss scale starts at 2**26 (a test harness, run as a worker).

    python -m tests.training.high_loss_scale tft-train flags…

At that scale float16 gradients overflow for the first updates, so a short run
skips some: the workers must agree on each verdict.
"""

import sys

import keras


def main() -> None:
    original = keras.optimizers.LossScaleOptimizer.__init__

    def start_high(self, inner_optimizer, initial_scale=2.0**15, **kwargs):
        original(self, inner_optimizer, initial_scale=2.0**26, **kwargs)

    keras.optimizers.LossScaleOptimizer.__init__ = start_high
    from tf_transformer.cli.train import run

    sys.argv = ["tft-train", *sys.argv[1:]]
    run()


if __name__ == "__main__":
    main()
