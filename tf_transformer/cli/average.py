"""``tft-average``: average the last checkpoints of a run.

tft-average --model_dir runs/m30k --last 5
"""

from __future__ import annotations

import json

from absl import app, flags

from tf_transformer.cli import run_main

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Model directory written by tft-train.", required=True)
flags.DEFINE_integer("last", 5, "How many of the newest checkpoints to average (paper: 5 base, 20 big).", lower_bound=1)
flags.DEFINE_string("output", None, "Output directory (default: MODEL_DIR/averaged).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from tf_transformer.training.averaging import average_checkpoints, last_checkpoints

    try:
        sources = last_checkpoints(FLAGS.model_dir, FLAGS.last)
        path = average_checkpoints(FLAGS.model_dir, FLAGS.last, FLAGS.output)
    except (FileNotFoundError, ValueError, OSError) as error:  # OSError: WriteError, a full disk
        raise app.UsageError(str(error)) from None
    print(json.dumps({"averaged": path, "checkpoints": sources}))


def run():
    run_main(main)


if __name__ == "__main__":
    run()
