"""``tft-serve``'s server: TF Serving's REST API, request batching and model versions for an export.

TF Serving itself is the production server (docs/serving.md); this one serves the
same SavedModel with the same requests and answers where TF Serving cannot be
installed, and behaves as it does under load: concurrent requests merged into
batches (:mod:`.batching`), the newest version served and new ones picked up
without a restart (:mod:`.versions`), limits on what one request may take
(:mod:`.http_server`, :mod:`.servable`).
"""

from tf_transformer.serving.http_server import RestServer, make_server, serve_until_signalled

__all__ = ["RestServer", "make_server", "serve_until_signalled"]
