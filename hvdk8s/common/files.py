"""Reading the files users name (job specs, pipelines, TF Serving's config files): errors that say which file.

And YAML: a file users name as one document, manifests dumped for people to read.
"""
from __future__ import annotations

import os
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
