"""What tft-serve's two APIs share: the models, one batching queue, the metrics, and how a request runs.

TF Serving answers REST and gRPC from one server core, so a prediction is the
same whichever API carried it, and requests of both are merged into the same
batches. Here too: :class:`~.http_server.RestServer` and
:class:`~.grpc_server.GrpcServer` parse their own wire formats into a checked
:class:`~.rest_api.PredictRequest` and hand it to :meth:`ServingCore.submit`.
"""

from __future__ import annotations

import concurrent.futures

from configs.serving import ServingOptions
from tf_transformer.serving import metrics as metrics_lib
from tf_transformer.serving.batching import BatchScheduler
from tf_transformer.serving.models import ModelRegistry
from tf_transformer.serving.rest_api import PredictRequest, Unavailable
from tf_transformer.serving.servable import Servable


class ServingCore:
    """The models served, the batching queue and the metrics, shared by both APIs.

    Args:
      models: the served models (:class:`~.models.ModelRegistry`).
      options: batching and limits; requests are merged when ``options.enable_batching``.
    """

    def __init__(self, models: ModelRegistry, options: ServingOptions):
        self.models = models
        self.options = options
        self.metrics = metrics_lib.ServingMetrics(models)
        self.scheduler = BatchScheduler(options, self.metrics.batch) if options.enable_batching else None
        # Decoding without batching, and REST's large bodies (parsed and encoded off the event loop).
        self.pool = concurrent.futures.ThreadPoolExecutor(options.rest_api_num_threads, thread_name_prefix="serve")
        self.stopping = False
        self._released = False

    def submit(self, model: str, servable: Servable, request: PredictRequest) -> concurrent.futures.Future:
        """Runs a checked ``request`` on ``servable`` (a version of ``model``); the future gives its outputs.

        Merged with other requests for the same version and signature when
        batching; a request with its own settings runs alone (its own key: never
        merged), queued with the rest. Refused as unavailable while stopping, or
        when the queue is full.
        """
        if self.stopping:  # a request read after the stop began: retry on another replica, or later
            raise Unavailable("The server is stopping; retry")
        signature = request.signature
        if request.columns or request.scalars:
            run = lambda rows: servable.run(signature, rows, request.columns, request.scalars)  # noqa: E731
            key, fit = (servable, signature, object()), None
        else:
            run = lambda rows: servable.run(signature, rows)  # noqa: E731
            key, fit = (servable, signature), lambda outputs: servable.fit(signature, request.rows, outputs)
        if self.scheduler is None:
            self.metrics.batch(model, len(request.rows), [0.0])
            return self.pool.submit(run, request.rows)
        return self.scheduler.submit(key, run, request.rows, fit, model=model)

    def release(self) -> None:
        """Ends the threads (running what is queued) and the models' loading; once."""
        if self._released:
            return
        self._released = True
        self.pool.shutdown(wait=True)
        if self.scheduler is not None:
            self.scheduler.stop()
        self.models.stop()


def refused_by_graph(error: Exception) -> bool:
    """Whether the graph refused a request's input (``InvalidArgumentError``): the client's mistake, not ours."""
    import tensorflow as tf

    return isinstance(error, tf.errors.InvalidArgumentError)
