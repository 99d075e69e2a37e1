"""``tft-serve``: serve exports over TF Serving's gRPC and REST APIs, with request batching and versions.

tft-serve --model saved_models/multi30k_en_de --port 8500 --rest_api_port 8501
tft-serve --model_config_file models.config      # several models (TF Serving's ModelServerConfig)
curl -d '{"instances": ["A dog runs on the beach."]}' localhost:8501/v1/models/multi30k_en_de:predict

Flags named as TF Serving's mean what they mean there (docs/serving.md). Each serving flag is a field
of ServingOptions (configs/serving.py), which holds its default, bound and help.
"""

from __future__ import annotations

import dataclasses
import sys

from absl import app, flags, logging

from configs.serving import ServingOptions
from tf_transformer.cli import run_main
from tf_transformer.cli.flag_groups import apply_thread_flags, define_thread_flags

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "model",
    None,
    "Base directory of numbered versions (the highest is served, new ones picked up), or one version.",
)
flags.DEFINE_string("model_name", None, "Name in requests (default: the base directory's name).")
flags.DEFINE_string(
    "model_config_file",
    None,
    "Several models: a ModelServerConfig in text format (TF Serving's; docs/serving.md), instead of --model.",
)


def define_serving_flags() -> None:
    """One flag per field of :class:`~configs.serving.ServingOptions`, with its name, default, bound and help."""
    define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string}
    for field in dataclasses.fields(ServingOptions):
        kind = type(field.default)
        bound = {} if field.metadata["minimum"] is None else {"lower_bound": field.metadata["minimum"]}
        define[kind](field.name, field.default, field.metadata["help"], **bound)


def serving_options() -> ServingOptions:
    """The options the flags set."""
    return ServingOptions(**{field.name: getattr(FLAGS, field.name) for field in dataclasses.fields(ServingOptions)})


define_serving_flags()
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
    if (FLAGS.model is None) == (FLAGS.model_config_file is None):
        raise app.UsageError("Pass --model (one model) or --model_config_file (several), not both nor neither")
    if FLAGS.model_config_file is not None and FLAGS.model_name is not None:
        raise app.UsageError("--model_name names --model's model; a model config file names its own")
    if FLAGS["port"].present and not FLAGS["rest_api_port"].present:
        # --port meant REST before tft-serve spoke gRPC: say where REST went rather than move it silently.
        logging.warning(
            "--port %d is the gRPC port, as TF Serving's --port; REST listens on --rest_api_port (%d)",
            FLAGS.port,
            FLAGS.rest_api_port,
        )
    options = serving_options()
    options = dataclasses.replace(options, max_connections=open_files_for(options.max_connections))
    apply_thread_flags(options.num_batch_threads if options.enable_batching else 1)
    from tf_transformer.serving import make_server, serve_until_signalled
    from tf_transformer.serving.model_config import ModelConfigError

    try:
        server = make_server(FLAGS.model, options, FLAGS.model_name, FLAGS.model_config_file)
    except (FileNotFoundError, ModelConfigError) as error:
        raise app.UsageError(str(error)) from None
    except OSError as error:  # a port taken
        raise app.UsageError(f"Cannot listen: {error}") from None
    host, rest_port = server.server_address[:2]
    grpc_port = server.grpc_address[1]
    print(f"gRPC at {host}:{grpc_port}, REST at http://{host}:{rest_port}", flush=True)

    def announce(versions):  # the server answers (unavailable) while loading; this line says a model serves
        served = ", ".join(str(servable.version) for servable in versions.served())
        print(f"Serving {versions.name} version {served} at http://{host}:{rest_port}/v1/models/{versions.name}")
        sys.stdout.flush()

    try:
        serve_until_signalled(server, on_loaded=announce)
    except FileNotFoundError as error:  # no version could be loaded
        raise app.UsageError(str(error)) from None
    print("stopped", file=sys.stderr, flush=True)


def run():
    run_main(main)


if __name__ == "__main__":
    run()
