"""The versions of one model: those its policy names served, new ones picked up while serving, as TF Serving does.

TF Serving's layout is a base directory of numbered version directories
(``saved_models/<name>/<version>/``). A version policy says which are served
(:class:`VersionPolicy`: by default the highest alone); the base directory is
polled (``--file_system_poll_wait_seconds``), a new version is loaded beside
those being served and replaces one only once it has loaded, and a version that
fails to load leaves the served ones in place. A request names a version by
number, by label (``version_labels`` of a model config), or neither: the
highest served. Given one version's directory instead, that version alone is
served.

Loading takes seconds to minutes, so a server starts answering before it ends
(:meth:`ModelVersions.start` with ``wait=False``): meanwhile the version's state
is ``LOADING`` and predictions are refused as unavailable.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable, Iterable

from absl import logging

from tf_transformer.serving.rest_api import NotFound, Unavailable
from tf_transformer.serving.servable import Servable

_VERSION = re.compile(r"[0-9]{1,18}")  # a version directory's name: its number (int64, as TF Serving's)

# TF Serving's ModelVersionStatus states.
LOADING, AVAILABLE, END = "LOADING", "AVAILABLE", "END"


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's ``ServableVersionPolicy``: the ``latest`` ``count`` versions, ``all``, or ``specific`` ones."""

    kind: str = "latest"
    count: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(f"Unknown version policy {self.kind!r}: latest, all or specific")
        if self.kind == "latest" and self.count < 1:
            raise ValueError(f"The latest policy serves at least 1 version, got num_versions {self.count}")
        if self.kind == "specific" and not self.versions:
            raise ValueError("The specific policy names at least one version")

    def choose(self, available: Iterable[int]) -> set[int]:
        """The versions to serve among ``available`` (those on disk not known to fail)."""
        available = sorted(available, reverse=True)
        if self.kind == "latest":
            return set(available[: self.count])
        if self.kind == "all":
            return set(available)
        return set(available) & set(self.versions)

    def __str__(self) -> str:
        return {"latest": f"latest {self.count}", "all": "all"}.get(self.kind, f"specific {list(self.versions)}")


class ModelVersions:
    """Loads and tracks the versions of the model at ``path`` (a base directory or one version's).

    ``policy`` says which versions are served; ``labels`` maps a label to a
    version number (TF Serving's ``version_labels``), requests name either.
    ``must_exist``: a missing ``path`` is a ``FileNotFoundError`` here; else
    (a model config's model) it is the model's :meth:`failure`, polled again.
    """

    def __init__(
        self,
        path: str,
        name: str | None = None,
        load: Callable[[str, int], Servable] = Servable,
        policy: VersionPolicy = VersionPolicy(),
        labels: dict[str, int] | None = None,
        must_exist: bool = True,
    ):
        path = os.path.abspath(path)
        self.fixed = os.path.exists(os.path.join(path, "saved_model.pb"))
        self.base = os.path.dirname(path) if self.fixed else path
        if self.fixed and not _VERSION.fullmatch(os.path.basename(path)):
            raise FileNotFoundError(f"{path}: a version directory's name must be its number (TF Serving's layout)")
        if must_exist and not self.fixed and not os.path.isdir(path):
            raise FileNotFoundError(f"No SavedModel at {path} (nor numbered version directories under it)")
        self.only = int(os.path.basename(path)) if self.fixed else None
        self.name = name or os.path.basename(self.base)
        self.policy = policy
        self.labels = dict(labels or {})
        self._load = load
        self._lock = threading.Lock()
        self._served: dict[int, Servable] = {}  # version → the loaded version serving requests
        self._states: dict[int, dict] = {}  # version → {"state", "error"}
        self._failed: dict[int, tuple] = {}  # version → the files' signature when its load failed
        self._load_seconds: dict[int, float] = {}  # version → how long its load took (the loaded ones)
        self._warmup_seconds: dict[int, float] = {}  # version → how long its warmup took, within its load
        self._stop = threading.Event()
        self._first_load = threading.Event()  # set once the first load has ended, loaded or not
        self._poller: threading.Thread | None = None

    # Loading.

    def on_disk(self) -> dict[int, str]:
        """Version number → directory, for every version directory holding a SavedModel now."""
        if self.fixed:
            return {self.only: os.path.join(self.base, str(self.only))}
        found = {}
        for entry in os.listdir(self.base) if os.path.isdir(self.base) else []:
            directory = os.path.join(self.base, entry)
            if _VERSION.fullmatch(entry) and os.path.exists(os.path.join(directory, "saved_model.pb")):
                found[int(entry)] = directory
        return found

    def _targets(self) -> tuple[set[int], dict[int, str]]:
        """The versions to serve (the policy's choice among those on disk not known to fail), and those on disk."""
        versions = self.on_disk()
        candidates = [v for v in versions if self._failed.get(v) != _files_signature(versions[v])]
        return self.policy.choose(candidates), versions

    def poll(self) -> None:
        """Loads the versions the policy names that are not served yet, then retires those it no longer names.

        A version is retired only after the loads: while a new version loads, or
        if it fails to, the served ones keep answering.
        """
        while True:  # a version that fails leaves its place to the next one the policy names
            targets, versions = self._targets()
            missing = sorted(targets - set(self._served), reverse=True)
            if not missing:
                break
            for target in missing:
                self._load_version(target, versions[target])
        if not targets:  # nothing servable now: keep what is served rather than go dark
            return
        with self._lock:
            for version in set(self._served) - targets:
                del self._served[version]
                self._states[version] = {"state": END, "error": ""}
                logging.info("Version %d of %s unloaded (policy: %s)", version, self.name, self.policy)

    def _load_version(self, target: int, directory: str) -> None:
        self._set_state(target, LOADING)
        files = _files_signature(directory)  # before loading: a copy may finish while the load fails
        started = time.monotonic()
        try:
            servable = self._load(directory, target)
            requests, warmup_seconds = servable.warm_up()  # before AVAILABLE, as TF Serving does
        except Exception as error:  # a broken or half-written version: keep serving the ones we have
            self._failed[target] = files
            message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            self._set_state(target, END, message)
            logging.error(
                "Version %d of %s failed to load, still serving %s: %s",
                target,
                self.name,
                sorted(self._served) or "nothing",
                message,
            )
            return
        with self._lock:
            self._served[target] = servable
            self._load_seconds[target] = time.monotonic() - started
            self._warmup_seconds[target] = warmup_seconds
            self._states[target] = {"state": AVAILABLE, "error": ""}
        if requests:
            logging.info(
                "Warmed up version %d of %s: %d requests in %.2f s", target, self.name, requests, warmup_seconds
            )
        logging.info("Serving version %d of %s", target, self.name)

    def update(self, policy: VersionPolicy, labels: dict[str, int]) -> None:
        """A new policy and labels (a model config reloaded), applied at once."""
        self.policy, self.labels = policy, dict(labels)
        self.poll()

    def start(self, poll_seconds: float, wait: bool = True) -> None:
        """Loads the highest version, then polls every ``poll_seconds`` (0: never), in a background thread.

        ``wait``: return once the first load has ended, with a ``FileNotFoundError``
        if no version loaded. Otherwise return at once, the version to load already
        ``LOADING`` in :meth:`status`; :meth:`wait_loaded` waits for it.
        """
        if not wait:
            for version in self._targets()[0]:
                self._set_state(version, LOADING)
        self._poller = threading.Thread(target=self._run, args=(poll_seconds,), daemon=True, name="poll")
        self._poller.start()
        if wait and not self.wait_loaded():
            self.stop()
            raise FileNotFoundError(self.failure())

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Waits for the first load to end; whether a version is being served."""
        self._first_load.wait(timeout)
        return bool(self._served)

    @property
    def first_load_ended(self) -> bool:
        return self._first_load.is_set()

    def failure(self) -> str:
        """Why no version is being served."""
        if not self._first_load.is_set():
            return f"{self.name} is loading"
        if not os.path.isdir(self.base):
            return f"No version of {self.name} could be loaded: {self.base} does not exist"
        failures = {v: s["error"] for v, s in self._states.items() if s["error"]}
        reason = f": {failures}" if failures else " (no numbered directory holding saved_model.pb)"
        return f"No version of {self.name} at {self.base} could be loaded{reason}"

    def stop(self) -> None:
        """Ends polling; a load under way is finished first."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join()

    def _run(self, poll_seconds: float) -> None:
        try:
            self.poll()
        except Exception as error:  # the base directory unreadable: reported by failure(), polled again
            logging.error("Loading %s: %s", self.name, error)
        finally:
            self._first_load.set()
        if poll_seconds > 0 and not self.fixed:
            self._poll_loop(poll_seconds)

    def _poll_loop(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.poll()
            except Exception as error:  # the base directory vanished for a moment: try again next time
                logging.warning("Polling %s: %s", self.base, error)

    def _set_state(self, version: int, state: str, error: str = "") -> None:
        with self._lock:
            self._states[version] = {"state": state, "error": error}

    # Answers.

    def servable(self, version: str | None = None, label: str | None = None) -> Servable:
        """The version serving a request: the one numbered ``version``, the one ``label`` names, or the highest."""
        served = dict(self._served)
        if not served:
            raise Unavailable(f"No version of {self.name} is loaded yet")
        if label is not None:
            if label not in self.labels:
                known = ", ".join(sorted(self.labels)) or "none"
                raise NotFound(f"No version of {self.name} is labelled {label!r} (labels: {known})")
            version = str(self.labels[label])
        if version is None:
            return served[max(served)]
        if not _VERSION.fullmatch(version) or int(version) not in served:
            known = self._states.get(int(version)) if _VERSION.fullmatch(version) else None
            state = known["state"] if known else "unknown"
            raise NotFound(
                f"Version {version} of {self.name} is not being served (state: {state}); "
                f"served: {', '.join(map(str, sorted(served, reverse=True)))}"
            )
        return served[int(version)]

    def served(self) -> list[Servable]:
        """The versions serving requests now, highest first."""
        served = dict(self._served)
        return [served[version] for version in sorted(served, reverse=True)]

    def status(self, version: str | None = None) -> dict:
        """TF Serving's model status answer (``GetModelStatusResponse`` in JSON)."""
        with self._lock:
            states = dict(self._states)
        if version is not None:
            if not _VERSION.fullmatch(version) or int(version) not in states:
                raise NotFound(f"Version {version} of {self.name} is not known to this server")
            states = {int(version): states[int(version)]}
        return {
            "model_version_status": [
                {
                    "version": str(number),
                    "state": value["state"],
                    "status": {"error_code": "UNKNOWN" if value["error"] else "OK", "error_message": value["error"]},
                }
                for number, value in sorted(states.items(), reverse=True)
            ]
        }

    def load_seconds(self) -> dict[int, float]:
        """Version → seconds its load took, for each version loaded since the start."""
        with self._lock:
            return dict(self._load_seconds)

    def warmup_seconds(self) -> dict[int, float]:
        """Version → seconds its warmup requests took (0: it has none), for each version loaded since the start."""
        with self._lock:
            return dict(self._warmup_seconds)

    @property
    def ready(self) -> bool:
        return bool(self._served)


def _files_signature(directory: str) -> tuple:
    """Sizes and modification times of a version's files: a failed version is retried once they change."""
    signature = []
    for root, _, files in os.walk(directory):
        for file in sorted(files):
            try:
                stat = os.stat(os.path.join(root, file))
            except OSError:
                continue
            signature.append((os.path.relpath(os.path.join(root, file), directory), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(signature))
