"""The models one server holds: one ``ModelRepository`` each, their version labels, and TF Serving's model config file.

``--model_config_file`` is TF Serving's text-format ``ModelServerConfig``
(tensorflow_serving/config/model_server_config.proto, parsed against the
``tensorflow-serving-api`` wheel's own message): a ``model_config_list``
of models, each with a name, base path, version policy and version labels.
A new config replaces the set of models as TF Serving's ``ReloadConfig``
does: models it no longer names are dropped, new ones are loaded, and one
whose base path is unchanged keeps its loaded versions; a changed version
policy only changes which versions it wants (the next poll loads the newly
wanted ones before unloading the others), as TF Serving's storage path
source aspires a new set of versions under the same model
(file_system_storage_path_source.cc, ``UpdateConfig``). A changed base path
starts the model afresh; TF Serving unaspires models by name only
(``GetDeletedServables``), so there versions of a number already loaded
stay as loaded from the old path.

A label resolves to its version when a request arrives; the version must be
loaded then (NOT_FOUND otherwise). TF Serving instead refuses a config whose
labels name unavailable versions (unless
``--allow_version_labels_for_unavailable_models``), once its models load.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvdk8s.serving.api import types
from hvdk8s.serving.server.repository import ModelRepository, Servable, VersionPolicy, load_servable

log = logging.getLogger("hvdk8s.serving")
CONFIG_MESSAGE = "tensorflow.serving.ModelServerConfig"


@dataclass(frozen=True)
class ModelConfig:
    """One served model: its name in URLs, base path, version policy and version labels."""

    name: str
    base_path: Path
    policy: VersionPolicy = VersionPolicy()
    labels: tuple[tuple[str, int], ...] = field(default=())


class Models:
    """Thread-safe: one polling thread changes the set, request threads read it."""

    def __init__(self, configs: Iterable[ModelConfig], loader: Any = load_servable):
        self._loader = loader
        self._lock = threading.Lock()
        self._repositories: dict[str, ModelRepository] = {}
        self._labels: dict[str, dict[str, int]] = {}
        self.version_changes = 0
        """Versions loaded or unloaded so far, models dropped by ``configure`` included; only ever grows (the
        server re-freezes the garbage collector when it has changed)."""
        self.configure(configs)

    @classmethod
    def of(cls, repository: ModelRepository) -> Models:
        """One model, from an existing repository."""
        models = cls([])
        models._repositories = {repository.name: repository}
        models._labels = {repository.name: {}}
        return models

    @property
    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._repositories)

    def repositories(self) -> list[ModelRepository]:
        with self._lock:
            return list(self._repositories.values())

    def configure(self, configs: Iterable[ModelConfig]) -> None:
        """Serve exactly ``configs`` from the next poll on (a model keeps its versions where its base path is
        unchanged; its new version policy applies from that poll)."""
        configs = list(configs)
        names = [c.name for c in configs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model config: model {duplicates[0]!r} is configured more than once")
        with self._lock:
            current = self._repositories
            repositories: dict[str, ModelRepository] = {}
            for c in configs:
                old = current.get(c.name)
                if old is not None and old.base_path == c.base_path:
                    old.policy = c.policy
                    repositories[c.name] = old
                else:
                    repositories[c.name] = ModelRepository(c.base_path, c.name, loader=self._loader, policy=c.policy)
            dropped = [r for name, r in current.items() if repositories.get(name) is not r]
            self.version_changes += len(dropped)
            self._repositories = repositories
            self._labels = {c.name: dict(c.labels) for c in configs}
        for repository in dropped:
            if repository.name in repositories:
                log.info("model %s: base path now %s; its versions from %s unloaded", repository.name,
                         repositories[repository.name].base_path, repository.base_path)
            else:
                log.info("model %s: no longer in the model config; unloaded", repository.name)

    def poll(self) -> None:
        for repository in self.repositories():
            try:
                changes = repository.poll()
            except Exception:  # noqa: BLE001  (one model's scan error must not stop the others')
                log.exception("model %s: polling %s failed", repository.name, repository.base_path)
                continue
            with self._lock:
                self.version_changes += changes

    def get(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        repository, version = self._resolve(name, version, label)
        if repository is None:
            spec = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise types.ServingError("NOT_FOUND", f"Servable not found for request: {spec}")
        return repository.get(name, version)

    def status(self, name: str, version: int | None = None) -> list:
        """Every version's status, or one's; a request's version label is not resolved (see ``ServingCore.status``)."""
        repository, version = self._resolve(name, version, None)
        if repository is None:
            raise types.ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
        return repository.status(name, version)

    def _resolve(self, name: str, version: int | None, label: str | None) -> tuple[ModelRepository | None, int | None]:
        with self._lock:
            repository = self._repositories.get(name)
            labels = self._labels.get(name, {})
        if label is not None:
            if label not in labels:
                raise types.unknown_label(label)
            version = labels[label]
        return repository, version


def parse_model_config(text: str, source: str) -> list[ModelConfig]:
    """The models of a text-format ``ModelServerConfig``; errors name ``source`` and the line."""
    from tensorflow_serving.config import model_server_config_pb2

    from hvdk8s.serving.server import textproto

    message = textproto.parse(text, model_server_config_pb2.ModelServerConfig(), source, CONFIG_MESSAGE)
    if message.WhichOneof("config") == "custom_model_config":
        raise ValueError(f"{source}: custom_model_config is not supported; use model_config_list")
    configs = []
    for i, model in enumerate(message.model_config_list.config):
        where = f"{source}: model_config_list.config[{i}]"
        if not model.name:
            raise ValueError(f"{where}: name is empty")
        if not model.base_path:
            raise ValueError(f"{where} ({model.name}): base_path is empty")
        if model.model_platform not in ("", "tensorflow"):
            raise ValueError(f"{where} ({model.name}): model_platform {model.model_platform!r}; "
                             "hvdk8s serve serves tensorflow SavedModels")
        try:
            policy = _policy(model.model_version_policy)
        except ValueError as err:
            raise ValueError(f"{where} ({model.name}): model_version_policy: {err}") from None
        configs.append(ModelConfig(model.name, Path(model.base_path), policy, tuple(sorted(model.version_labels.items()))))
    return configs


def _policy(proto: Any) -> VersionPolicy:
    kind = proto.WhichOneof("policy_choice")
    if kind == "specific":
        return VersionPolicy("specific", versions=tuple(sorted(proto.specific.versions)))
    if kind == "all":
        return VersionPolicy("all")
    if kind == "latest":
        return VersionPolicy("latest", proto.latest.num_versions or 1)
    return VersionPolicy()


def read_model_config(path: str | os.PathLike[str]) -> list[ModelConfig]:
    from hvdk8s.serving.server import textproto

    return parse_model_config(*textproto.read(path, "--model_config_file"))


class ConfigWatcher:
    """Re-reads the model config file every ``seconds`` (``--model_config_file_poll_wait_seconds``; 0: never).

    A changed file that parses replaces the models; one that does not, or
    that cannot be read (missing, not UTF-8), is logged in one line and the
    models stay as they are, as in TF Serving.
    """

    def __init__(self, path: str | os.PathLike[str], models: Models, seconds: float):
        self.path = Path(path)
        self.models = models
        self.seconds = seconds
        self._text = self._read()
        self._next = time.monotonic() + seconds

    def check(self) -> None:
        if self.seconds <= 0 or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.seconds
        text = self._read()
        if text == self._text:
            return
        self._text = text
        try:
            self.models.configure(parse_model_config(text, f"--model_config_file {self.path}"))
        except ValueError as err:
            log.error("model config not reloaded, serving the previous one: %s", err)
            return
        log.info("model config reloaded from %s: %s", self.path, ", ".join(self.models.names))

    def _read(self) -> str:
        from hvdk8s.serving.server import textproto

        try:
            return textproto.read(self.path, "--model_config_file")[0]
        except (FileNotFoundError, ValueError) as err:  # each names the flag and the file
            log.error("model config not reloaded, serving the previous one: %s", err)
            return getattr(self, "_text", "")
