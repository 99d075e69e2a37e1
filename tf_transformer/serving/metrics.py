"""What operators scrape: tft-serve's Prometheus metrics, at TF Serving's path.

TF Serving answers ``GET /monitoring/prometheus/metrics`` with its counters in
Prometheus' text format; tft-serve does the same through ``prometheus_client``,
one registry per server (two servers in one process count apart). The names
and their TF Serving counterparts are in docs/serving.md#metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PATH = "/monitoring/prometheus/metrics"

# Seconds: from a lone greeting (a millisecond) to a batch of long sentences behind a full queue (a minute).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServingMetrics:
    """The server's counters; ``models`` (a :class:`~.models.ModelRegistry`) is read at each scrape.

    A request counts under its protocol (``rest`` or ``grpc``) and its status:
    the HTTP status over REST, the gRPC code's name over gRPC. A request that
    names no model served counts under the model it named.
    """

    def __init__(self, models):
        self.registry = CollectorRegistry()
        model = ["model"]
        self.requests = Counter(
            "tft_serving_requests",
            "Requests answered, by protocol (rest, grpc), API (predict, status, metadata, healthz, readyz, metrics, "
            "other), signature (predict only) and status (HTTP status, or gRPC code).",
            [*model, "protocol", "api", "signature", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tft_serving_request_latency_seconds",
            "From a request's headers read (REST) or its call received (gRPC) to its answer written.",
            [*model, "protocol", "api", "signature"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "tft_serving_batch_size",
            "Sentences per model call (a merged batch, or one request without batching).",
            model,
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "tft_serving_queue_wait_seconds",
            "How long a request waited in the batching queue before its batch ran.",
            model,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.connections = Gauge("tft_serving_open_connections", "HTTP connections open now.", registry=self.registry)
        self.refused = Counter(
            "tft_serving_refused_connections",
            "Connections answered 503 at once: over --max_connections.",
            registry=self.registry,
        )
        self.registry.register(_VersionsCollector(models))
        ProcessCollector(registry=self.registry)  # process_*: CPU seconds, resident memory, open files

    def answered(self, model: str, protocol: str, api: str, signature: str, status, seconds: float) -> None:
        self.requests.labels(model, protocol, api, signature, str(status)).inc()
        self.latency.labels(model, protocol, api, signature).observe(seconds)

    def batch(self, model: str, size: int, waits: list[float]) -> None:
        """One model call of ``size`` sentences, after its requests waited ``waits`` seconds each."""
        self.batch_size.labels(model).observe(size)
        queue_wait = self.queue_wait.labels(model)
        for seconds in waits:
            queue_wait.observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The text format's bytes and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _VersionsCollector:
    """Each model's known versions: their state (TF Serving's ModelVersionStatus), how long each load took, and
    how long its warmup requests took within it (:mod:`.warmup`)."""

    def __init__(self, models):
        self.models = models

    def describe(self):
        return []  # the families are known only at a scrape: no name clash to check at registration

    def collect(self):
        states = GaugeMetricFamily(
            "tft_serving_model_version_state",
            "1 for each model version in the state named (LOADING, AVAILABLE, END).",
            labels=["model", "version", "state"],
        )
        loads = GaugeMetricFamily(
            "tft_serving_model_load_seconds",
            "How long loading (and warming up) a model version took.",
            labels=["model", "version"],
        )
        warmups = GaugeMetricFamily(
            "tft_serving_model_warmup_seconds",
            "How long replaying a model version's warmup requests (assets.extra/tf_serving_warmup_requests) took, "
            "within its load (0: it has none).",
            labels=["model", "version"],
        )
        for versions in self.models:
            for status in versions.status()["model_version_status"]:
                states.add_metric([versions.name, status["version"], status["state"]], 1)
            for version, seconds in sorted(versions.load_seconds().items()):
                loads.add_metric([versions.name, str(version)], seconds)
            for version, seconds in sorted(versions.warmup_seconds().items()):
                warmups.add_metric([versions.name, str(version)], seconds)
        yield states
        yield loads
        yield warmups
