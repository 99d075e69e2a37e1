"""TF Serving's model config file (``--model_config_file``): the models one server serves, read and checked.

The file is a ``ModelServerConfig`` in protobuf text format, read with
``tensorflow-serving-api``'s own message, so a file TF Serving accepts is read
here the same way::

    model_config_list {
      config {
        name: "multi30k_en_de"
        base_path: "/models/multi30k_en_de"
        model_platform: "tensorflow"
        model_version_policy { latest { num_versions: 2 } }
        version_labels { key: "stable" value: 1 }
      }
      config { name: "parser" base_path: "/models/parser" }
    }

What tft-serve does not do (``custom_model_config``, a platform other than
``tensorflow``, per-model ``logging_config``) is refused rather than ignored, and
every error names the file and the line, as the parser's own do. A relative
``base_path`` is taken from the working directory, as TF Serving takes it.
"""

from __future__ import annotations

import dataclasses
import os
import re

from tf_transformer.serving.versions import VersionPolicy


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model of a config: its name in requests, its base directory, which versions and labels."""

    name: str
    base_path: str
    policy: VersionPolicy = VersionPolicy()
    labels: dict = dataclasses.field(default_factory=dict)  # label → version


class ModelConfigError(ValueError):
    """A model config file that cannot be served; the message names the file and line."""


def read_model_config(path: str) -> list[ModelSpec]:
    """The models of the config file at ``path``, checked (:class:`ModelConfigError` naming the line if not)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ModelConfigError(f"{path}: cannot read the model config file: {error}") from None
    return parse_model_config(text, path)


def parse_model_config(text: str, path: str = "<model config>") -> list[ModelSpec]:
    """The models of a ``ModelServerConfig`` in text format (``path``: the file named in errors)."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise ModelConfigError(f"{path}:{error}") from None  # the parser's message starts "line:column : "
    if config.WhichOneof("config") == "custom_model_config":
        raise ModelConfigError(f"{path}:{_line(text, 'custom_model_config')}: custom_model_config is not served")
    if not config.model_config_list.config:
        raise ModelConfigError(f"{path}: no model (model_config_list {{ config {{ name: ... base_path: ... }} }})")
    specs, names = [], set()
    for index, model in enumerate(config.model_config_list.config):
        where = f"{path}:{_line(text, 'config', index)}"
        if not model.name:
            raise ModelConfigError(f"{where}: model {index + 1} has no name")
        if not re.fullmatch(r"[^/:]+", model.name):
            raise ModelConfigError(f"{where}: model name {model.name!r} must not hold '/' or ':' (it is in URLs)")
        if model.name in names:
            raise ModelConfigError(f"{where}: model {model.name!r} is configured twice")
        names.add(model.name)
        if not model.base_path:
            raise ModelConfigError(f"{where}: model {model.name!r} has no base_path")
        if model.model_platform not in ("", "tensorflow"):
            raise ModelConfigError(
                f"{where}: model {model.name!r} has model_platform {model.model_platform!r}; tft-serve serves "
                "TensorFlow SavedModels ('tensorflow')"
            )
        if model.HasField("logging_config"):
            raise ModelConfigError(f"{where}: model {model.name!r}: logging_config is not supported by tft-serve")
        try:
            policy = _policy(model.model_version_policy)
        except ValueError as error:
            raise ModelConfigError(f"{where}: model {model.name!r}: {error}") from None
        labels = dict(model.version_labels)
        if policy.kind == "specific" and (unserved := sorted(set(labels.values()) - set(policy.versions))):
            raise ModelConfigError(
                f"{where}: model {model.name!r} labels versions {unserved} that its specific policy does not serve"
            )
        specs.append(ModelSpec(model.name, os.path.abspath(model.base_path), policy, labels))
    return specs


def _policy(message) -> VersionPolicy:
    """A ``ServableVersionPolicy`` message as a :class:`VersionPolicy` (none set: TF Serving's default, latest 1)."""
    choice = message.WhichOneof("policy_choice")
    if choice == "latest":
        return VersionPolicy("latest", count=message.latest.num_versions or 1)
    if choice == "all":
        return VersionPolicy("all")
    if choice == "specific":
        return VersionPolicy("specific", versions=tuple(message.specific.versions))
    return VersionPolicy()


def _line(text: str, word: str, occurrence: int = 0) -> int:
    """The line (from 1) of ``word``'s ``occurrence``-th appearance as a field name in ``text``; 1 if not found."""
    found = [m.start() for m in re.finditer(rf"\b{word}\s*[:{{]", text)]
    if occurrence >= len(found):
        return 1
    return text.count("\n", 0, found[occurrence]) + 1
