"""The serving settings of ``tft-serve``: each one's default and lower bound, defined once.

Where TF Serving has the same setting, the field has its flag's name and
meaning (``--rest_api_timeout_in_ms``, ``--max_batch_size``, …). Every place that
takes one of these settings reads it here: ``tft-serve``'s flags (their names,
defaults, bounds and help), :class:`~tf_transformer.serving.http_server.RestServer`
and :class:`~tf_transformer.serving.batching.BatchScheduler`, which take the
options whole, and the table of docs/serving.md, which a test compares with it.
Plain Python: read without TensorFlow.
"""

from __future__ import annotations

import dataclasses


def _option(default, help: str, minimum=None):
    """A field with its ``--help`` text and smallest allowed value (``None``: any)."""
    return dataclasses.field(default=default, metadata={"help": help, "minimum": minimum})


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """How ``tft-serve`` listens, batches and bounds what one client may take (docs/serving.md)."""

    host: str = _option("127.0.0.1", "Address to listen on.")
    port: int = _option(8500, "gRPC port (TF Serving's --port; 0: any free one).", 0)
    rest_api_port: int = _option(8501, "REST port (TF Serving's; 0: any free one, where TF Serving turns REST off).", 0)
    grpc_max_threads: int = _option(
        64, "Threads answering gRPC calls; a call waiting for its batch holds one (TF Serving's).", 1
    )
    model_config_file_poll_wait_seconds: float = _option(
        0.0, "How often --model_config_file is read again for added, removed or changed models (0: never).", 0.0
    )
    enable_batching: bool = _option(True, "Merge concurrent requests into one decoding batch (TF Serving's).")
    max_batch_size: int = _option(
        64, "Most sentences a request may carry, and a merged batch with --enable_batching.", 1
    )
    batch_timeout_micros: int = _option(1000, "Longest a batch waits for more requests after its first.", 0)
    num_batch_threads: int = _option(
        2,
        "Batches decoded at once. Above 1, with --intra_op_threads 0, each op of a batch runs on cores / this many "
        "threads: a decoding step is hundreds of small ops, and two batches side by side keep the cores busier.",
        1,
    )
    max_enqueued_batches: int = _option(16, "Batches' worth of sentences that may wait; more are refused (503).", 1)
    max_request_bytes: int = _option(4 << 20, "Largest request body; larger ones get 413.", 1)
    max_response_bytes: int = _option(
        8 << 20,
        "Largest answer; a request whose answer would be larger gets 413 (translate_with_alignment answers a "
        "[target, source] array of floats per sentence).",
        1,
    )
    rest_api_timeout_in_ms: int = _option(
        30_000,
        "A connection idle this long is closed, a request's body must arrive and its answer be read within it, "
        "and a stop waits this long for the requests in flight.",
        1,
    )
    rest_api_num_threads: int = _option(
        32,
        "Threads that parse large requests, encode large answers and decode without --enable_batching (the "
        "connections themselves share one event loop).",
        1,
    )
    max_connections: int = _option(
        4096, "Open connections held at once, idle ones included; beyond, a new one is answered 503 and closed.", 1
    )
    file_system_poll_wait_seconds: float = _option(
        1.0, "How often the base directory is checked for new versions (0: never).", 0.0
    )

    def __post_init__(self):
        for field in dataclasses.fields(self):
            minimum, value = field.metadata["minimum"], getattr(self, field.name)
            if minimum is not None and value < minimum:
                raise ValueError(f"Serving option {field.name} must be at least {minimum}, got {value}")

    @property
    def timeout_seconds(self) -> float:
        return self.rest_api_timeout_in_ms / 1000

    @property
    def max_queued_rows(self) -> int:
        """Sentences that may wait for a batch: ``max_enqueued_batches`` batches' worth."""
        return self.max_enqueued_batches * self.max_batch_size
