"""Reading job specs and manifests, writing YAML: the file edges of ``hvdk8s.mpijob``."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hvdk8s.errors import UserError
from hvdk8s.mpijob import parse, validate
from hvdk8s.mpijob.render import KIND, render
from hvdk8s.mpijob.spec import JobSpec


class SpecError(UserError):
    """An invalid job spec or MPIJob: ``errors`` lists every ``path: problem``."""

    def __init__(self, source: str, errors: list[str]):
        self.source, self.errors = source, errors
        super().__init__(f"{source}: invalid:\n  " + "\n  ".join(errors))


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """One YAML document; a missing file or bad syntax is the user's to fix."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from None


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any], *, origin: str | None = None) -> JobSpec:
    """Parse a job spec (file path or mapping): unknown fields rejected,
    defaults applied, then every rule checked; all errors raised together.
    ``origin`` names a mapping's source in messages (default "job spec")."""
    if isinstance(source, (str, os.PathLike)):
        data, where = read_yaml(source), str(source)
    else:
        data, where = source, origin or "job spec"
    if is_mpijob(data):
        raise UserError(f"{where}: is an MPIJob manifest, not an hvdk8s job spec (apply it as is)")
    errors: list[str] = []
    spec = parse.from_mapping(JobSpec, data, errors)
    if spec is None or errors:
        raise SpecError(where, errors)
    spec = validate.with_defaults(spec)
    if errors := validate.check_spec(spec):
        raise SpecError(where, errors)
    # The operator's rules on the result: a failure here is an hvdk8s bug,
    # but one the user sees as an error instead of a Failed MPIJob.
    if errors := validate.check_manifest(render(spec)):
        raise SpecError(where, errors)
    return spec


def is_mpijob(data: Any) -> bool:
    """A ready MPIJob manifest, used as is, rather than an hvdk8s job spec."""
    return isinstance(data, Mapping) and data.get("kind") == KIND


def manifest_from_data(data: Any, where: str) -> dict[str, Any]:
    """An MPIJob as is (after the operator's checks), or a job spec rendered; ``where`` names the source."""
    if is_mpijob(data):
        if errors := validate.check_manifest(data):
            raise SpecError(where, errors)
        return dict(data)
    return render(load_spec(data, origin=where))


def manifest_from_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an MPIJob or job-spec file (see ``manifest_from_data``)."""
    return manifest_from_data(read_yaml(path), str(path))


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


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` in one step, so ``kubectl apply`` never reads half a file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the file from other readers
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
