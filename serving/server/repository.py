"""The versions of one model a local server holds, kept in step with its base path.

Like TensorFlow Serving's file-system source and its version policies
(``latest``: every poll loads the newest ``num_versions`` integer folders and
unloads older ones only once a newer one is available, so a broken new
version never takes the model offline; ``all``; ``specific``). A version
that fails to load is retried as TF Serving retries it: up to 5 more times, a
minute apart (the defaults of ``--max_num_load_retries`` and
``--load_retry_interval_micros``, model_servers/server.h), though at the first
poll after that minute rather than in a load thread that sleeps in between
(``Retry`` in core/loader_harness.cc). It is also retried, with its retries
afresh, whenever its files change (the folder, ``saved_model.pb``, or
anything under ``variables/`` or ``assets/``: a copy still under way); TF
Serving keeps a version whose retries are spent in error until it is no
longer aspired (core/aspired_versions_manager.cc).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hvdk8s.serving.api import types
from hvdk8s.serving.model import savedmodel

log = logging.getLogger("hvdk8s.serving")
# How ``tf.io.decode_image`` tells each format it names apart (DecodeImageV2Op's ClassifyFileFormat,
# tensorflow/core/kernels/image/decode_image_op.cc; JPEG XL by its codestream and container signatures).
IMAGE_SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "JPEG": lambda b: b.startswith(b"\xff\xd8\xff"),
    "PNG": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    "GIF": lambda b: b.startswith(b"GIF8"),
    "BMP": lambda b: b.startswith(b"BM"),
    "WebP": lambda b: len(b) > 12 and b.startswith(b"RIFF") and b[8:12] == b"WEBP",
    "JPEG XL": lambda b: b.startswith((b"\xff\x0a", b"\x00\x00\x00\x0cJXL \r\n\x87\n")),
}
_UNKNOWN_FORMAT = re.compile(r"Unknown image file format\. One of (.+?) required\.")


@functools.cache
def image_check() -> tuple[str, Callable[[bytes], bool]] | None:
    """The installed TensorFlow's refusal of unknown image bytes, and a test for the formats it names.

    TensorFlow 2.18 decodes JPEG, PNG, GIF and BMP, 2.21 also WebP and JPEG XL; its own message says
    which, so one refused decode of a non-image tells both. None (no check) if it names a format
    without a known signature: then TensorFlow alone decides. TensorFlow logs that refusal
    (``local_rendezvous.cc ... Unknown image file format``), which a user would read as their
    image being broken, so the line is dropped; and the aborted rendezvous it leaves would log
    ``ABORTED: Shutdown`` at exit unless cleared.
    """
    import tensorflow as tf

    with _stderr_without(b"Unknown image file format"):
        try:
            tf.io.decode_image(b"hvdk8s")
        except tf.errors.InvalidArgumentError as err:
            match = _UNKNOWN_FORMAT.search(str(err.message))
        else:
            return None
        finally:
            tf.experimental.async_clear_error()
    if match is None:
        return None
    names = match.group(1).split(", ")
    if any(name not in IMAGE_SIGNATURES for name in names):
        return None
    tests = [IMAGE_SIGNATURES[name] for name in names]
    return match.group(0), lambda data: any(test(data) for test in tests)


@contextlib.contextmanager
def _stderr_without(marker: bytes) -> Iterator[None]:
    """Hold what the process writes to its stderr while the block runs (file descriptor 2, where TensorFlow's
    C++ logging writes), then write it there without the lines that contain ``marker``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            os.write(2, b"".join(line for line in held if marker not in line))


@dataclass
class Servable:
    """One loaded SavedModel version: callable signatures plus their descriptions."""

    version: int
    path: Path
    signatures: Mapping[str, Any]
    inputs: dict[str, dict[str, types.InputSpec]]
    signature_defs: dict[str, Any]
    loaded: Any = field(repr=False)  # keeps the variables the signatures use alive
    image_inputs: dict[str, str] = field(default_factory=dict)  # signature -> its image-bytes input (hvdk8s exports)

    def inputs_of(self, signature: str) -> dict[str, types.InputSpec]:
        if signature not in self.inputs:
            raise types.invalid(f'Serving signature name: "{signature}" not found in signature def')
        return self.inputs[signature]

    def check(self, signature: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Refuse image bytes that ``tf.io.decode_image`` would refuse, in its words, before TensorFlow runs.

        TensorFlow 2.18 leaks about 1 KB per op call that fails (its eager
        execute error path: a ``tf.function`` that only decodes an image
        shows it), so undecodable images, everyday input from broken
        clients, would grow the server's memory without bound. Only for
        hvdk8s's own image signature, whose input is known to go to
        ``decode_image``; images that pass this check but are corrupt still
        fail inside TensorFlow.
        """
        name = self.image_inputs.get(signature)
        if name is None or name not in arrays:
            return
        known = image_check()
        for data in arrays[name].ravel():
            if not data:
                raise types.invalid("Input is empty.")
            if known and not known[1](data):
                raise types.invalid(known[0])

    def run(self, signature: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Call a signature; TensorFlow errors become ``ServingError`` with the same status code."""
        import tensorflow as tf

        fn = self.signatures[signature]
        try:
            # a host trace event per model call, as TF Serving's TRACELITERAL("RunPredict"): a profiler attached
            # over gRPC (ProfilerService) sees the calls even of a model too small for TensorFlow's op-level events
            with tf.profiler.experimental.Trace("RunSignature", signature=signature, version=self.version):
                outputs = fn(**{name: tf.constant(value) for name, value in arrays.items()})
        except tf.errors.OpError as err:
            raise types.ServingError(_CODE_NAMES.get(err.error_code, "UNKNOWN"), _op_message(err)) from None
        except (TypeError, ValueError) as err:
            raise types.invalid(str(err)) from None
        return {name: tensor.numpy() for name, tensor in outputs.items()}


def load_servable(version: int, path: Path) -> Servable:
    """Load ``path`` with plain TensorFlow, as TF Serving would (tag ``serve``)."""
    import tensorflow as tf

    staged = _legacy_placeholders_staged(path)
    loaded = tf.saved_model.load(os.fspath(staged.name if staged else path), tags=["serve"])
    if staged:
        loaded = (loaded, staged)  # the staged copy's assets stay while the version is loaded
    signatures = dict(loaded[0].signatures if staged else loaded.signatures)
    inputs = {
        name: {
            key: types.InputSpec(
                np.dtype(object) if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype),
                tuple(spec.shape.as_list()) if spec.shape.rank is not None else (),
            )
            for key, spec in fn.structured_input_signature[1].items()
        }
        for name, fn in signatures.items()
    }
    exported = savedmodel.read_metadata(path) if (path / savedmodel.METADATA_FILE).is_file() else {}
    image = exported.get("signatures", {}).get(savedmodel.SERVING_SIGNATURE) == savedmodel.IMAGE_INPUT
    image_inputs = {savedmodel.SERVING_SIGNATURE: savedmodel.IMAGE_INPUT} if image else {}
    return Servable(version, path, signatures, inputs, signature_defs(path), loaded, image_inputs)


LEGACY_PLACEHOLDER_PRODUCER = 21
"""Graphs up to this producer version wrote an unknown Placeholder shape as the scalar shape (TensorFlow's
Placeholder shape function, tensorflow/core/ops/array_ops.cc, reads it so when ``graph_def_version() <= 21``)."""


def _legacy_placeholders_staged(path: Path) -> tempfile.TemporaryDirectory | None:
    """For a SavedModel of TensorFlow 1.0 (e.g. TF Serving's ``saved_model_half_plus_three``), a staged copy whose
    scalar Placeholder shapes say "unknown", or None when there is nothing to change.

    TF Serving's C++ loader applies the legacy rule; ``tf.saved_model.load``
    imports the graph without its producer version and fails ("Shape must
    be rank 1 but is rank 0"). The copy has the rewritten saved_model.pb and
    links to the version's other files.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    changed = False
    for graph in saved.meta_graphs:
        if graph.graph_def.versions.producer > LEGACY_PLACEHOLDER_PRODUCER:
            continue
        for node in graph.graph_def.node:
            shape = node.attr["shape"].shape if node.op == "Placeholder" and "shape" in node.attr else None
            if shape is not None and not shape.unknown_rank and not shape.dim:
                shape.unknown_rank = True
                changed = True
        for signature in graph.signature_def.values():  # written without shapes then: unknown, not scalar
            for info in [*signature.inputs.values(), *signature.outputs.values()]:
                if not info.HasField("tensor_shape"):
                    info.tensor_shape.unknown_rank = True
                    changed = True
    if not changed:
        return None
    staged = tempfile.TemporaryDirectory(prefix="hvdk8s-legacy-savedmodel-")
    for child in path.iterdir():
        if child.name != "saved_model.pb":
            (Path(staged.name) / child.name).symlink_to(child.resolve())
    (Path(staged.name) / "saved_model.pb").write_bytes(saved.SerializeToString())
    return staged


def signature_defs(path: Path) -> dict[str, Any]:
    """The ``serve`` MetaGraph's SignatureDefs as JSON, field names as TF Serving prints them."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    graph = next((g for g in saved.meta_graphs if "serve" in g.meta_info_def.tags), saved.meta_graphs[0])
    return {
        name: json_format.MessageToDict(
            sig, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        for name, sig in sorted(graph.signature_def.items())
    }


LOAD_RETRIES = 5
LOAD_RETRY_SECONDS = 60.0
"""TF Serving's defaults of ``--max_num_load_retries`` and ``--load_retry_interval_micros`` (model_servers/server.h)."""


@dataclass
class _State:
    state: str  # TF Serving's ModelVersionStatus.State names
    code: str = "OK"
    message: str = ""
    stamp: tuple[int, ...] = ()  # a failed load's: its files' mtimes then
    retries: int = 0  # a failed load's: how many retries of the same files failed before it
    failed_at: float = 0.0  # a failed load's: when (the repository's clock)


@dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's ``model_version_policy`` (file_system_storage_path_source.proto): which versions to serve."""

    kind: str = "latest"  # "latest", "all" or "specific"
    num_versions: int = 1  # latest: how many of the newest
    versions: tuple[int, ...] = ()  # specific: these

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(f"version policy {self.kind!r}: expected latest, all or specific")
        if self.kind == "latest" and self.num_versions < 1:
            raise ValueError(f"num_versions: expected at least 1, got {self.num_versions}")
        if self.kind == "specific" and not self.versions:
            raise ValueError("version policy specific: no versions given")

    def pick(self, versions: list[int]) -> list[int]:
        """The versions of ``versions`` (ascending) this policy serves."""
        if self.kind == "latest":
            return versions[-self.num_versions:]
        if self.kind == "specific":
            return [v for v in versions if v in self.versions]
        return list(versions)

    def describe(self) -> str:
        if self.kind == "latest":
            return f"the newest {self.num_versions}" if self.num_versions > 1 else "the newest"
        return "every version" if self.kind == "all" else f"versions {', '.join(map(str, self.versions))}"


class ModelRepository:
    """Thread-safe for one polling thread (the only writer) and any number of request threads."""

    def __init__(
        self, base_path: str | os.PathLike[str], name: str, num_versions: int = 1, loader: Any = load_servable,
        policy: VersionPolicy | None = None, clock: Callable[[], float] = time.monotonic,
    ):
        self.base_path = Path(base_path)
        self.name = name
        self.policy = policy or VersionPolicy("latest", num_versions)
        self._loader = loader
        self._clock = clock
        self._lock = threading.Lock()
        self._servables: dict[int, Servable] = {}
        self._states: dict[int, _State] = {}
        self._dirs: dict[int, Path] = {}
        self._told_empty = False

    def poll(self) -> int:
        """Load new versions and unload superseded or deleted ones; how many versions it loaded or unloaded."""
        self._dirs = savedmodel.version_dirs(self.base_path)
        present = sorted(self._dirs)
        self._say_if_empty(present)
        usable = [v for v in present if not self._waiting(v)]
        changes = 0
        for version in self.policy.pick(usable):
            if version not in self._servables:
                changes += self._load(version)
        healthy = [v for v in present if v in self._servables]
        keep = set(self.policy.pick(healthy))
        with self._lock:
            for version in [v for v in self._servables if v not in keep]:
                del self._servables[version]
                self._states[version] = _State("END")
                changes += 1
                log.info("model %s: unloaded version %d", self.name, version)
        return changes

    def _say_if_empty(self, present: list[int]) -> None:
        """Log once (until a version appears) that there is nothing to serve yet, and where it looks."""
        if present or self._told_empty:
            self._told_empty = not present
            return
        self._told_empty = True
        where = "does not exist" if not self.base_path.is_dir() else "has no version folder"
        log.warning("model %s: %s %s yet; waiting for a version folder named by an integer (e.g. %s) "
                    "holding a SavedModel", self.name, self.base_path, where, self.base_path / "1")

    def get(self, name: str, version: int | None = None) -> Servable:
        """The requested (default: newest available) version, or NOT_FOUND as TF Serving says it."""
        with self._lock:
            servable = None
            if name == self.name:
                if version is None:
                    servable = self._servables[max(self._servables)] if self._servables else None
                else:
                    servable = self._servables.get(version)
        if servable is None:
            spec = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise types.ServingError("NOT_FOUND", f"Servable not found for request: {spec}")
        return servable

    def available(self) -> set[int]:
        with self._lock:
            return set(self._servables)

    def status(self, name: str, version: int | None = None) -> list[tuple[int, str, str, str]]:
        """(version, state, error code, message) rows for GET /v1/models/{name}[/versions/{v}]."""
        with self._lock:
            rows = [(v, s.state, s.code, s.message) for v, s in self._states.items()]
        if name != self.name or not rows:
            raise types.ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
        if version is not None:
            rows = [row for row in rows if row[0] == version]
            if not rows:
                raise types.ServingError("NOT_FOUND", f"Could not find version {version} of model {name}")
        return rows

    def _folder(self, version: int) -> Path:
        return self._dirs.get(version, self.base_path / str(version))

    def _stamp(self, version: int) -> tuple[int, ...]:
        """The mtimes that change when a version's files do: the folder, saved_model.pb, and the newest under
        variables/ and assets/ (whose files may still be copying when the version first fails)."""
        folder = self._folder(version)
        return (_mtime(folder), _mtime(folder / "saved_model.pb"),
                _newest_mtime(folder / "variables"), _newest_mtime(folder / "assets"))

    def _waiting(self, version: int) -> bool:
        """Whether a failed version is left alone this poll: its files unchanged, and its retries spent or the
        next one not yet due."""
        state = self._states.get(version)
        if state is None or state.code == "OK" or state.stamp != self._stamp(version):
            return False
        return state.retries >= LOAD_RETRIES or self._clock() - state.failed_at < LOAD_RETRY_SECONDS

    def _load(self, version: int) -> bool:
        """Whether ``version`` loaded (a failure is logged and kept in its status)."""
        stamp = self._stamp(version)
        with self._lock:
            failed = self._states.get(version)
            retries = failed.retries + 1 if failed and failed.code != "OK" and failed.stamp == stamp else 0
            self._states[version] = _State("LOADING")
        try:
            servable = self._loader(version, self._folder(version))
        except Exception as err:  # noqa: BLE001  (any load failure is reported in the model status)
            with self._lock:
                self._states[version] = _State("END", _error_code(err), f"{type(err).__name__}: {err}", stamp,
                                               retries, self._clock())
            after = (f"retry {retries + 1} of {LOAD_RETRIES} in {LOAD_RETRY_SECONDS:g} s" if retries < LOAD_RETRIES
                     else "retries spent")
            log.error("model %s: version %d failed to load (%s, or when its files change): %s",
                      self.name, version, after, err)
            return False
        with self._lock:
            self._servables[version] = servable
            self._states[version] = _State("AVAILABLE")
        log.info("model %s: serving version %d from %s", self.name, version, servable.path)
        return True


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _newest_mtime(folder: Path) -> int:
    """The newest mtime of ``folder`` and everything under it (0 if it is missing)."""
    newest = _mtime(folder)
    for root, dirs, files in os.walk(folder):
        newest = max([newest, *(_mtime(Path(root, name)) for name in [*dirs, *files])])
    return newest


def _error_code(err: Exception) -> str:
    code = getattr(err, "error_code", None)  # tf.errors.OpError
    return _CODE_NAMES.get(code, "UNKNOWN") if code is not None else "UNKNOWN"


def _op_message(err: Any) -> str:
    """The op's own message, without TensorFlow's graph-location boilerplate."""
    lines = [
        line.strip()
        for line in str(err.message).splitlines()
        if line.strip()
        and not line.startswith(("Graph execution error", "Detected at node", "<stack traces", "\t [["))
        and not line.strip().startswith("[[")
    ]
    return " ".join(lines) or str(err.message)


_CODE_NAMES = dict(enumerate(types.HTTP_STATUS, start=1))
"""google.rpc / tensorflow.error.Code numbers (stable across TensorFlow versions)."""
