"""Reading the files users name (job specs, pipelines, TF Serving's config files, models): errors that say which file.

And YAML: a file users name as one document, manifests dumped for people to read.
"""
from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hvdk8s.common.errors import UserError


def read_text(path: str | os.PathLike[str], source: str) -> str:
    """The file's UTF-8 text; ``source`` is how messages name it (its path, or ``--flag PATH``).

    A missing file is ``FileNotFoundError``; a directory, an unreadable file
    or one that is not UTF-8 text is ``ValueError``. Each message starts with
    ``source`` and says which, never a traceback from the decoder.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{source}: is a directory, not a file") from None
    except OSError as err:
        raise ValueError(f"{source}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{source}: not UTF-8 text (byte {err.start})") from None


# ---- model files -----------------------------------------------------------


def check_model_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path`` if it is a local file that can hold a Keras model, else a ``ValueError`` saying why not.

    Keras itself calls a truncated or non-zip ``.keras`` file "File not
    found", h5py a missing or non-HDF5 ``.h5`` file "Unable to synchronously
    open file", and a directory or other extension "File format not
    supported"; these are checked first, in words a user can act on.

    Args:
        path: The model file given to a loader.

    Returns:
        ``path``, as a ``Path``.

    Raises:
        ValueError: ``path`` is a directory, missing, named neither ``.keras`` nor ``.h5``/``.hdf5``, or not a
            zip archive (``.keras``) or HDF5 file (``.h5``/``.hdf5``).
    """
    file = Path(path)
    if file.is_dir():
        hint = (" It holds a SavedModel, which Keras 3 cannot load and TF Serving serves as it is: copy it into the "
                "base path as a version folder (BASE_PATH/<n>/)." if (file / "saved_model.pb").is_file() else "")
        raise ValueError(f"model {file}: is a directory; expected a .keras file (written by model.save('name.keras'))."
                         + hint)
    if not file.is_file():
        raise ValueError(f"model {file}: no such file")
    if file.suffix not in (".keras", ".h5", ".hdf5"):
        raise ValueError(f"model {file}: expected a .keras file (written by model.save('name.keras')) or a legacy "
                         f".h5/.hdf5 file; this one's name ends in {file.suffix or 'no extension'!r}")
    if file.suffix == ".keras" and not zipfile.is_zipfile(file):
        raise ValueError(f"model {file}: not a valid .keras file: a .keras file is a zip archive and this one "
                         f"({file.stat().st_size} bytes) is not a complete one (truncated, still being written, or "
                         "not written by Keras)")
    import h5py  # here: Keras's own dependency, for the one case that needs it

    if file.suffix != ".keras" and not h5py.is_hdf5(file):
        raise ValueError(f"model {file}: not a valid {file.suffix} file: a legacy Keras model is an HDF5 file and "
                         f"this one ({file.stat().st_size} bytes) is not one")
    return file


# ---- YAML files ------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last silently).

    A key a merge (``<<``) brings in may still be given again: that is what merging is for. So each mapping is
    checked once, as written, before PyYAML flattens its merges into it (which it does in place, and to an
    anchored mapping before an alias merges it elsewhere).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        if id(node) not in self._checked:
            self._checked.add(id(node))
            first: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: construct_mapping says so
                    continue
                if seen is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {seen.line + 1})", key_node.start_mark)
        super().flatten_mapping(node)


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """One YAML document; a missing file, bad syntax or a key given twice is the user's to fix."""
    try:
        text = read_text(path, str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from None


class _Dumper(yaml.SafeDumper):
    """Block style, no anchors/aliases, multi-line strings as ``|`` blocks (people read these files)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)
)


def to_yaml(*manifests: Mapping[str, Any]) -> str:
    """Manifests as YAML documents, keys in the order they were built."""
    return "---\n".join(
        yaml.dump(dict(m), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=10_000)
        for m in manifests
    )
