"""``tft-serve``: serve an exported model over TF Serving's REST predict API.

tft-serve --model saved_models/multi30k_en_de/1 --port 8501
curl -d '{"instances": ["A dog runs on the beach."]}' localhost:8501/v1/models/multi30k_en_de:predict
"""

from __future__ import annotations

import sys

from absl import app, flags

from tf_transformer.cli import apply_thread_flags, define_thread_flags, run_main

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "SavedModel version directory (or its base directory of versions).", required=True)
flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
flags.DEFINE_integer("port", 8501, "Port (TF Serving's REST default is 8501).")
flags.DEFINE_integer("max_batch_size", 64, "Largest batch a request may carry.", lower_bound=1)
define_thread_flags()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    apply_thread_flags()
    from tf_transformer.inference.serving import serve

    def ready(httpd, model):
        host, port = httpd.server_address[:2]
        print(
            f"Serving {model.name} version {model.version} at http://{host}:{port}/v1/models/{model.name}", flush=True
        )

    try:
        serve(FLAGS.model, FLAGS.host, FLAGS.port, FLAGS.max_batch_size, ready)
    except FileNotFoundError as error:
        raise app.UsageError(str(error)) from None
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)


def run():
    run_main(main)


if __name__ == "__main__":
    run()
