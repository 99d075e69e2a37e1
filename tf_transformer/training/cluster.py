"""The workers of ``MultiWorkerMirroredStrategy`` agreeing before they train: one directory, one set of options.

One vocabulary and one run directory: the chief (worker 0) makes or takes
``sp.model`` and writes ``config.json`` in ``model_dir``, which every worker
must see (a shared filesystem, or a path ``tf.io.gfile`` reads such as
``gs://``); the others wait for a marker carrying this launch's token, sent to
them by a collective, so a stale or unshared directory is an error, not a
worker training with a vocabulary of its own. Each worker then compares its
options with the chief's (:func:`~tf_transformer.training.options.differences`)
and all stop before any step if one differs.

A worker that dies or stops answering is noticed by the heartbeats of
TensorFlow's coordination service (within seconds), which abort the others'
collectives (:data:`LOST`); the training loop turns that into a
:class:`ClusterError` saying how to resume.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time

import numpy as np
import tensorflow as tf

from configs import TransformerConfig
from tf_transformer import run_dir
from tf_transformer.files import first_line, save_json
from tf_transformer.training.options import OptionError, config_differences, differences, effective

MARKER = "cluster.json"
# How a lost worker shows in the survivors' collectives.
LOST = (
    tf.errors.DeadlineExceededError,
    tf.errors.UnavailableError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)
# Each worker's own: how long it waits for the chief's files and what it prints. (Its clock for
# --max_minutes is its own too: the workers agree, through the step's collective, to stop at the
# first budget to run out.)
OWN_OPTIONS = frozenset({"max_minutes", "worker_timeout", "verbose"})


class ClusterError(RuntimeError):
    """The workers cannot train together (a worker lost, a directory not shared); the message says what to do."""


class Cluster:
    """This worker's place in the cluster, and a sum over all workers (a collective)."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict() if resolver else {}
        self.task_type = resolver.task_type if spec else None
        self.task_id = int(resolver.task_id or 0) if spec else 0
        self.is_chief = self.task_type in (None, "chief") or (self.task_type == "worker" and self.task_id == 0)
        self.name = f"{self.task_type or 'worker'} {self.task_id}"
        self.workers = sum(len(tasks) for kind, tasks in spec.items() if kind in ("chief", "worker")) or 1
        # This worker's place among them, 0 for the chief (a "chief" task comes before the "worker" ones).
        self.position = 0 if self.task_type in (None, "chief") else self.task_id + ("chief" in spec)

        @tf.function
        def total(values):  # a cross-replica reduction is an all-reduce: every worker gets the sum
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(values,)), axis=None)

        self._total = total

    def sum(self, values) -> np.ndarray:
        """Elementwise sum over the workers' ``values`` (each worker's one replica counts once)."""
        local = len(self.strategy.extended.worker_devices)  # replicas on this worker each add the value
        return self._total(tf.constant(np.asarray(values, np.float64) / local)).numpy()

    def minimum(self, value: float) -> float:
        """The least of the workers' ``value`` on every worker (each sends its own in its place)."""
        values = np.zeros(self.workers)
        values[self.position] = value
        return float(self.sum(values).min())

    def from_chief(self, value: int) -> int:
        """The chief's ``value`` on every worker (a sum in which the others give 0)."""
        return int(round(float(self.sum([value if self.is_chief else 0])[0])))

    def work_dir(self, model_dir: str) -> str:
        """Where this worker saves: ``model_dir`` for the chief, ``model_dir/.worker-<i>`` (read by it only) else."""
        return model_dir if self.is_chief else os.path.join(model_dir, f".worker-{self.task_id}")

    def launch_token(self) -> int:
        """A number new to this launch, the same on every worker (the chief's)."""
        try:
            return self.from_chief(secrets.randbelow(2**48) + 1)
        except LOST as error:
            who = "another worker" if self.is_chief else "the chief (worker 0) or another worker"
            raise ClusterError(
                f"{self.name}: {who} stopped before the run was prepared ({first_line(error)}). The chief stops "
                "when it refuses --model_dir or an option: its log says why; run every worker's command again"
            ) from None

    def announce(self, model_dir: str, token: int) -> None:
        """The chief: ``model_dir`` holds this launch's vocabulary and config.json; tells the others so."""
        save_json(os.path.join(model_dir, MARKER), {"token": token, "workers": self.workers})
        self.from_chief(1)

    def follow_chief(self, model_dir: str, token: int, timeout: float) -> tuple[TransformerConfig, dict]:
        """A worker: waits until the chief has prepared ``model_dir``, then reads the run the chief wrote.

        The wait is a collective the chief joins once it has written the
        marker (however long its vocabulary takes): a chief that stops before
        (an error, a kill) is noticed by the coordination service's heartbeats
        within seconds. Only then is the marker looked for, for up to
        ``timeout`` seconds (a shared filesystem may show it late).
        """
        try:
            self.from_chief(0)
        except LOST as error:
            raise ClusterError(
                f"{self.name}: the chief (worker 0) stopped before it prepared {model_dir} ({first_line(error)}). "
                "Its log says why; run every worker's command again once it is fixed"
            ) from None
        wait_for_chief(model_dir, token, timeout, self.name)
        return run_dir.load_run(model_dir)  # this launch's: written before the marker

    def agree_on_options(self, differing: list[str]) -> None:
        """Every worker learns whether one was started otherwise than the chief: then all stop, before any step."""
        refused = int(round(float(self.sum([1 if differing else 0])[0])))
        if differing:
            raise OptionError(
                f"{self.name} was started with options other than the chief's (worker 0): {'; '.join(differing)}. "
                "Every worker must run the same tft-train command (only TF_CONFIG differs)"
            )
        if refused:
            raise ClusterError(
                f"{self.name}: {refused} other worker(s) were started with options other than the chief's and "
                "stopped (their errors name the options); run the same tft-train command on every worker"
            )


def local_cluster(count: int) -> dict:
    """A ``TF_CONFIG`` cluster of ``count`` workers on this machine (127.0.0.1, ports free now): several
    machines simulated by worker processes, as the multi-worker tests and benchmarks run them."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
    return {"worker": [f"127.0.0.1:{port}" for port in ports]}


def wait_for_chief(model_dir: str, token: int, seconds: float, name: str) -> None:
    """Waits until the marker of this launch, written by the chief, shows in ``model_dir`` (then its files do)."""
    marker = os.path.join(model_dir, MARKER)
    deadline = time.monotonic() + seconds
    seen = None
    while time.monotonic() < deadline:
        if tf.io.gfile.exists(marker):
            try:
                seen = json.loads(tf.io.gfile.GFile(marker).read()).get("token")
            except (ValueError, tf.errors.OpError):
                seen = None  # being written
            if seen == token:
                return
        time.sleep(0.5)
    found = "holds the marker of another launch" if seen is not None else f"has no {MARKER}"
    raise ClusterError(
        f"{name}: the chief (worker 0) has prepared {model_dir}, but after {seconds:g} s this worker's view of it "
        f"{found}. Every worker must see the chief's --model_dir: put it on a shared filesystem, or use a path "
        "tf.io.gfile reads on all machines (gs://…); a filesystem slow to show new files needs a higher "
        "--worker_timeout"
    )


def differing_options(chief: tuple[TransformerConfig, dict], worker: tuple[TransformerConfig, dict]) -> list[str]:
    """Each option and model-config field ``worker`` sets otherwise than ``chief``, with both values.

    Both are ``(model config, run options)`` as ``config.json`` holds them, the
    options resolved for the machine. Every worker must train as the chief
    does: another step count, schedule or checkpoint cadence would leave the
    workers' collectives unmatched, another model or dropout would train a
    model other than the one the chief saves. Options are compared as they
    take effect, the config's run settings among them by their flags' names
    (:func:`~tf_transformer.training.options.effective`); the model's
    vocabulary size is that of the chief's ``sp.model``.
    """
    (chief_config, chief_run), (config, run) = chief, worker
    differing = [
        f"--{name} {theirs} on the chief, {ours} here"
        for name, theirs, ours in differences(
            effective(chief_config, chief_run), effective(config, run), skip=OWN_OPTIONS | {"precision_reason"}
        )
    ]
    for name, theirs, ours in config_differences(chief_config, config):
        flag = "--config" if name == "name" else f"--set {name}"
        differing.append(f"{flag} {theirs} on the chief, {ours} here")
    return differing
