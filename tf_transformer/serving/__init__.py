"""``tft-serve``'s server: TF Serving's gRPC and REST APIs, request batching, models and versions for exports.

TF Serving itself is the production server (docs/serving.md); this one serves the
same SavedModels with the same requests and answers where TF Serving cannot be
installed, and behaves as it does under load: the same two APIs
(:mod:`.grpc_server`, :mod:`.http_server`) over one core (:mod:`.core`),
concurrent requests merged into batches (:mod:`.batching`), several models from a
config file (:mod:`.models`, :mod:`.model_config`), the versions a policy names
served and new ones picked up without a restart (:mod:`.versions`), limits on
what one request may take (:mod:`.http_server`, :mod:`.servable`).
"""

from tf_transformer.serving.model_server import ModelServer, make_server, serve_until_signalled

__all__ = ["ModelServer", "make_server", "serve_until_signalled"]
