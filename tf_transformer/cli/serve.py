"""``tft-serve``: serve an export over TF Serving's REST API, with request batching and versions.

tft-serve --model saved_models/multi30k_en_de --port 8501
curl -d '{"instances": ["A dog runs on the beach."]}' localhost:8501/v1/models/multi30k_en_de:predict

Flags named as TF Serving's mean what they mean there (docs/serving.md).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from tf_transformer.cli import run_main
from tf_transformer.cli.flag_groups import apply_thread_flags, define_thread_flags

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "model",
    None,
    "Base directory of numbered versions (the highest is served, new ones picked up), or one version.",
    required=True,
)
flags.DEFINE_string("model_name", None, "Name in the URL (default: the base directory's name).")
flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
flags.DEFINE_integer("port", 8501, "Port (TF Serving's REST default is 8501).", lower_bound=0)
flags.DEFINE_integer(
    "max_batch_size",
    64,
    "Most sentences a request may carry, and a merged batch with --enable_batching.",
    lower_bound=1,
)
flags.DEFINE_bool("enable_batching", True, "Merge concurrent requests into one decoding batch (TF Serving's).")
flags.DEFINE_integer(
    "batch_timeout_micros", 1000, "Longest a batch waits for more requests after its first.", lower_bound=0
)
flags.DEFINE_integer(
    "num_batch_threads",
    2,
    "Batches decoded at once. Above 1, with --intra_op_threads 0, each op of a batch runs on cores / this many "
    "threads: a decoding step is hundreds of small ops, and two batches side by side keep the cores busier.",
    lower_bound=1,
)
flags.DEFINE_integer(
    "max_enqueued_batches", 16, "Batches' worth of sentences that may wait; more are refused (503).", lower_bound=1
)
flags.DEFINE_integer("max_request_bytes", 4 << 20, "Largest request body; larger ones get 413.", lower_bound=1)
flags.DEFINE_integer(
    "max_response_bytes",
    8 << 20,
    "Largest answer; a request whose answer would be larger gets 413 (translate_with_alignment answers a "
    "[target, source] array of floats per sentence).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "rest_api_timeout_in_ms",
    30000,
    "A connection idle this long is closed, a request must arrive within it of its first byte, and an answer "
    "not read within it is given up.",
    lower_bound=1,
)
flags.DEFINE_integer(
    "rest_api_num_threads",
    32,
    "Threads that parse requests, encode answers and decode without --enable_batching (the connections "
    "themselves share one event loop).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "max_connections",
    4096,
    "Open connections held at once, idle ones included; beyond, a new one is answered 503 and closed.",
    lower_bound=1,
)
flags.DEFINE_float(
    "file_system_poll_wait_seconds",
    1.0,
    "How often the base directory is checked for new versions (0: never).",
    lower_bound=0.0,
)
define_thread_flags()


OWN_FILES = 256  # besides connections: the model's files, the threads' pipes, the listening socket


def open_files_for(connections: int) -> int:
    """Raises the open-file limit to hold ``connections`` sockets, up to the hard limit (a soft limit of 1,024
    is common); the connections it allows, fewer than asked (with a warning) when the hard limit is lower."""
    import resource

    wanted = connections + OWN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target >= wanted:
        return connections
    allowed = max(1, target - OWN_FILES)
    logging.warning(
        "--max_connections %d needs %d open files and the hard limit is %d: holding %d, the rest answered 503",
        connections,
        wanted,
        hard,
        allowed,
    )
    return allowed


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    max_connections = open_files_for(FLAGS.max_connections)
    apply_thread_flags(FLAGS.num_batch_threads if FLAGS.enable_batching else 1)
    from tf_transformer.serving import make_server, serve_until_signalled

    try:
        server = make_server(
            FLAGS.model,
            FLAGS.host,
            FLAGS.port,
            model_name=FLAGS.model_name,
            max_batch_size=FLAGS.max_batch_size,
            enable_batching=FLAGS.enable_batching,
            batch_timeout_micros=FLAGS.batch_timeout_micros,
            num_batch_threads=FLAGS.num_batch_threads,
            max_enqueued_batches=FLAGS.max_enqueued_batches,
            max_request_bytes=FLAGS.max_request_bytes,
            max_response_bytes=FLAGS.max_response_bytes,
            timeout_seconds=FLAGS.rest_api_timeout_in_ms / 1000,
            num_threads=FLAGS.rest_api_num_threads,
            max_connections=max_connections,
            poll_seconds=FLAGS.file_system_poll_wait_seconds,
        )
    except FileNotFoundError as error:
        raise app.UsageError(str(error)) from None
    host, port = server.server_address[:2]
    name = server.versions.name

    def announce(version):  # the server answers (503) while loading; this line says it serves
        print(f"Serving {name} version {version} at http://{host}:{port}/v1/models/{name}", flush=True)

    try:
        serve_until_signalled(server, on_loaded=announce)
    except FileNotFoundError as error:  # no version could be loaded
        raise app.UsageError(str(error)) from None
    print("stopped", file=sys.stderr, flush=True)


def run():
    run_main(main)


if __name__ == "__main__":
    run()
