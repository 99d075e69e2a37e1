"""The models one server serves, by name: one from ``--model``, or those of a model config file.

TF Serving serves either one model (``--model_name``, ``--model_base_path``) or
the list of a config file (``--model_config_file``, :mod:`.model_config`),
each model with its own versions (:class:`~.versions.ModelVersions`). A model
that fails to load leaves the others serving: its status says why. With
``--model_config_file_poll_wait_seconds`` the file is read again while serving,
as TF Serving does: models added are loaded, models removed stop being served,
a changed policy or labels apply at once; a file that has become unreadable or
wrong is logged and the models served stay as they are. gRPC's
``ModelService.HandleReloadConfigRequest`` applies a config sent by a client
the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from absl import logging

from tf_transformer.serving.model_config import ModelConfigError, ModelSpec, read_model_config
from tf_transformer.serving.rest_api import NotFound
from tf_transformer.serving.servable import Servable
from tf_transformer.serving.versions import ModelVersions


class ModelRegistry:
    """The served models, each a :class:`~.versions.ModelVersions`, in config order.

    Args:
      models: the models' versions, not started.
      config_file: the model config file they come from, read again by
        :meth:`reload` (``None``: the one model of ``--model``).
      load: loads one version (tests pass a stand-in).
    """

    def __init__(
        self,
        models: list[ModelVersions],
        config_file: str | None = None,
        load: Callable[[str, int], Servable] = Servable,
    ):
        self._models = {model.name: model for model in models}
        self.config_file = config_file
        self._load = load
        self._poll_seconds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def from_path(cls, path: str, name: str | None = None, load: Callable = Servable) -> ModelRegistry:
        """One model: a base directory of versions or one version's directory (``FileNotFoundError`` if neither)."""
        return cls([ModelVersions(path, name, load)], load=load)

    @classmethod
    def from_config_file(cls, path: str, load: Callable = Servable) -> ModelRegistry:
        """The models of a model config file (:class:`~.model_config.ModelConfigError` naming the line if bad)."""
        return cls([_versions(spec, load) for spec in read_model_config(path)], config_file=path, load=load)

    # The models.

    def get(self, name: str) -> ModelVersions:
        """The model named ``name``, or a :class:`~.rest_api.NotFound` naming those served."""
        model = self._models.get(name)
        if model is None:
            raise NotFound(f"No model named {name!r}; this server serves {', '.join(map(repr, self._models))}")
        return model

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def __iter__(self) -> Iterator[ModelVersions]:
        return iter(list(self._models.values()))

    @property
    def ready(self) -> bool:
        """Every model has ended its first load, and one at least serves a version."""
        models = list(self)
        return all(model.first_load_ended for model in models) and any(model.ready for model in models)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Waits for every model's first load to end; whether one at least serves a version."""
        for model in self:
            model.wait_loaded(timeout)
        return any(model.ready for model in self)

    def failure(self) -> str:
        """Why no model serves."""
        return "; ".join(model.failure() for model in self)

    # Loading, reloading, stopping.

    def start(self, poll_seconds: float, config_poll_seconds: float = 0.0) -> None:
        """Starts loading every model in the background (each polls its versions every ``poll_seconds``), and
        reads the config file again every ``config_poll_seconds`` (0: never)."""
        self._poll_seconds = poll_seconds
        for model in self:
            model.start(poll_seconds, wait=False)
        if self.config_file is not None and config_poll_seconds > 0:
            self._watcher = threading.Thread(
                target=self._watch, args=(config_poll_seconds,), daemon=True, name="model-config"
            )
            self._watcher.start()

    def reload(self) -> None:
        """Reads the config file again and applies it: new models loaded, removed ones stopped, others updated.

        A file that cannot be read or is wrong is logged; the models served stay.
        """
        try:
            specs = read_model_config(self.config_file)
        except ModelConfigError as error:
            logging.error("Model config not reloaded, still serving %s: %s", self.names, error)
            return
        self.apply(specs, self.config_file)

    def apply(self, specs: list[ModelSpec], source: str) -> None:
        """Serves the models of ``specs`` (a config from ``source``, named in the log) instead of the current ones:
        new models loaded, removed ones stopped, changed policies and labels applied, the others left as they are."""
        wanted = {spec.name: spec for spec in specs}
        with self._lock:
            models = dict(self._models)
        for name in set(models) - set(wanted):
            logging.info("Model %s is no longer in %s: stopping it", name, source)
            models.pop(name).stop()
        for name, spec in wanted.items():
            model = models.get(name)
            if model is not None and model.base == spec.base_path:
                if (model.policy, model.labels) != (spec.policy, spec.labels):
                    model.update(spec.policy, spec.labels)
                continue
            if model is not None:  # the same name at another path: a new model
                model.stop()
            logging.info("Model %s added from %s", name, source)
            models[name] = _versions(spec, self._load)
            models[name].start(self._poll_seconds, wait=False)
        with self._lock:
            self._models = {name: models[name] for name in wanted}

    def _watch(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.reload()
            except Exception:  # never let a reload end the watching
                logging.exception("Reloading %s", self.config_file)

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        for model in self:
            model.stop()


def _versions(spec: ModelSpec, load: Callable) -> ModelVersions:
    return ModelVersions(spec.base_path, spec.name, load, policy=spec.policy, labels=spec.labels, must_exist=False)
